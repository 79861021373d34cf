import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { Namespace, Pod, RawClusterNetworkPolicy, RawNetworkPolicy } from '../../../src/model/types.ts';
import { MAX_CHAIN_NAME, MAX_SET_NAME, makeNames } from '../../../src/calc/index.ts';
import { auditTags, cold, coldCalc, EMPTY, Mirror, NODE, clusterPolicy, diff, newCalc, pod, policy, referencedSets, rng, snapshot, world } from './fixtures.ts';
import type { World } from './fixtures.ts';
import { baselineTeamA, DB_FROM_WEB } from './walk-policies.ts';

const names = makeNames('cali');

const NAMESPACES: Namespace[] = [
  { name: 'web', labels: { team: 'a' } },
  { name: 'db', labels: { team: 'b', tier: 'data' } },
  { name: 'ops', labels: {} },
];

const POLICIES: RawNetworkPolicy[] = [
  policy('db', 'deny-all', { podSelector: {}, policyTypes: ['Ingress', 'Egress'] }),
  DB_FROM_WEB,
  policy('web', 'or-peers', {
    podSelector: { matchExpressions: [{ key: 'app', operator: 'In', values: ['web', 'api'] }] },
    ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }, { podSelector: { matchLabels: { role: 'lb' } } }] }],
    egress: [
      { to: [{ ipBlock: { cidr: '0.0.0.0/0', except: ['10.0.0.0/8'] } }, { ipBlock: { cidr: 'fd00::/8', except: ['fd00::/64'] } }], ports: [{ protocol: 'UDP', port: 53 }] },
      { to: [{ podSelector: {} }], ports: [{ port: 'http' }, { port: 8000, endPort: 8080 }] },
    ],
  }),
  policy('ops', 'not-in', {
    podSelector: { matchExpressions: [{ key: 'env', operator: 'NotIn', values: ['prod'] }] },
    ingress: [{ from: [{ namespaceSelector: { matchExpressions: [{ key: 'tier', operator: 'DoesNotExist' }] } }] }],
  }),
  policy('ops', 'broken', { podSelector: { matchLabels: { app: 'x' } }, ingress: [{ from: [{ ipBlock: { cidr: 'nonsense' } }] }] }),
];

/** ClusterNetworkPolicies the walk adds, removes and re-prioritises: every action, both tiers,
 *  pods and namespaces peers, networks, ports and named ports, one invalid. */
const CLUSTER_POLICIES: RawClusterNetworkPolicy[] = [
  clusterPolicy('admin-deny-db', {
    tier: 'Admin',
    priority: 10,
    subject: { namespaces: { matchLabels: { tier: 'data' } } },
    ingress: [
      {
        name: 'web-ok',
        action: 'Accept',
        from: [{ pods: { namespaceSelector: { matchLabels: { team: 'a' } }, podSelector: { matchLabels: { app: 'web' } } } }],
        protocols: [{ destinationNamedPort: 'sql' }],
      },
      { name: 'rest', action: 'Deny', from: [{ namespaces: {} }] },
    ],
  }),
  clusterPolicy('admin-pass', {
    tier: 'Admin',
    priority: 5,
    subject: { pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: 'web' } } } },
    ingress: [{ action: 'Pass', from: [{ namespaces: { matchLabels: { team: 'b' } } }] }],
    egress: [
      { action: 'Deny', to: [{ networks: ['10.0.0.0/8', '10.1.0.0/16', 'fd00::/8'] }], protocols: [{ udp: { destinationPort: { number: 53 } } }] },
      { action: 'Accept', to: [{ pods: { namespaceSelector: {}, podSelector: { matchLabels: { app: 'db' } } } }], protocols: [{ tcp: { destinationPort: { range: { start: 5000, end: 6000 } } } }] },
      { action: 'Accept', to: [{ networks: ['0.0.0.0/0'] }] },
    ],
  }),
  baselineTeamA('baseline-deny', { egress: [{ action: 'Deny', to: [{ pods: { namespaceSelector: { matchLabels: { team: 'b' } }, podSelector: {} } }] }] }),
  clusterPolicy('broken', { tier: 'Baseline', priority: 3, subject: { namespaces: {} }, egress: [{ action: 'Deny', to: [{ networks: ['nonsense'] }] }] }),
];

function basePods(): Pod[] {
  return [
    pod('web', 'w1', { labels: { app: 'web' }, ip4: 1, ports: [{ name: 'http', port: 80, protocol: 'TCP' }] }),
    pod('web', 'w2', { labels: { app: 'api' }, ip4: 2, nodeName: 'node-b' }),
    pod('web', 'lb', { labels: { role: 'lb' }, ip4: 3, nodeName: 'node-b', ip6: false }),
    pod('db', 'd1', { labels: { app: 'db' }, ip4: 4, ports: [{ name: 'sql', port: 5432, protocol: 'TCP' }] }),
    pod('db', 'd2', { labels: { app: 'db' }, ip4: 5, nodeName: 'node-b', ports: [{ name: 'sql', port: 5433, protocol: 'TCP' }] }),
    pod('ops', 'o1', { labels: { env: 'dev' }, ip4: 6 }),
    pod('ops', 'o2', { labels: { app: 'x', env: 'prod' }, ip4: 7 }),
  ];
}

/** A random walk of worlds: each step changes one thing, the way a cluster does. */
function randomWorlds(seed: number, steps: number): World[] {
  const r = rng(seed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)];
  const L = (...xs: Record<string, string>[]) => xs;
  let pods = new Map(basePods().map((p) => [p.uid, p]));
  let nss = new Map(NAMESPACES.map((n) => [n.name, n]));
  let pols = new Map(POLICIES.map((p) => [`${p.namespace}/${p.name}`, p]));
  let nodes = new Map([['node-a', { name: 'node-a', podCIDRs: ['10.244.1.0/24', 'fd00::/112'] }]]);
  let ports = new Map<string, string>([...pods.values()].flatMap((p) => p.ips.map((ip, i) => [ip, `veth${p.name}${i}`] as const)));
  let cnps = new Map<string, RawClusterNetworkPolicy>();
  const out: World[] = [{ pods, namespaces: nss, policies: pols, nodes, ports, clusterPolicies: cnps }];
  let next = 20;
  for (let i = 0; i < steps; i++) {
    pods = new Map(pods);
    nss = new Map(nss);
    pols = new Map(pols);
    nodes = new Map(nodes);
    ports = new Map(ports);
    cnps = new Map(cnps);
    const choice = r();
    if (r() < 0.15) {
      // A ClusterNetworkPolicy comes, goes, or moves to another priority (ties included).
      const p = pick(CLUSTER_POLICIES);
      const spec = p.spec as Record<string, unknown>;
      if (cnps.has(p.name) && r() < 0.5) cnps.delete(p.name);
      else cnps.set(p.name, { ...p, generation: next++, spec: { ...spec, priority: pick([1, 5, 10, spec.priority]) } });
    }
    // The kernel's view moves on its own: a port appears, goes or moves; this node's CIDRs change.
    if (r() < 0.15 && somePodOf(pods)) {
      const ip = pick(somePodOf(pods)!.ips);
      if (ports.has(ip) && r() < 0.5) ports.delete(ip);
      else ports.set(ip, `veth${next++}`);
    } else if (r() < 0.05) {
      if (nodes.has('node-a') && r() < 0.3) nodes.delete('node-a');
      else nodes.set('node-a', { name: 'node-a', podCIDRs: pick([['10.244.1.0/24'], ['10.244.1.0/24', 'fd00::/112'], ['10.244.0.0/16', 'fd00::/64']]) });
    }
    const somePod = pods.size ? pick([...pods.values()]) : undefined;
    if (choice < 0.25 && somePod) {
      pods.set(somePod.uid, { ...somePod, labels: pick(L({}, { app: 'web' }, { app: 'db' }, { app: 'api', env: 'prod' }, { role: 'lb' }, { app: 'x' })) });
    } else if (choice < 0.35) {
      const ns = pick(['web', 'db', 'ops', 'ghost']);
      const n = next++;
      const p = pod(ns, `p${n}`, {
        ip4: n,
        nodeName: pick(['node-a', 'node-b']),
        labels: pick(L({ app: 'web' }, { app: 'db' }, {})),
        ports: r() < 0.5 ? [{ name: 'http', port: 8080, protocol: 'TCP' }] : [],
      });
      pods.set(p.uid, p);
    } else if (choice < 0.45 && somePod) {
      pods.delete(somePod.uid);
    } else if (choice < 0.52 && somePod) {
      pods.set(somePod.uid, { ...somePod, phase: pick(['Pending', 'Running', 'Succeeded']) });
    } else if (choice < 0.57 && somePod) {
      // IP reuse: another pod takes this pod's address.
      const other = pick([...pods.values()]);
      pods.set(somePod.uid, { ...somePod, ips: other.ips });
    } else if (choice < 0.72) {
      const n = pick(NAMESPACES);
      const audit = pick([undefined, undefined, 'deny', 'all', 'off', 'bogus']);
      nss.set(n.name, { name: n.name, labels: pick(L({}, { team: 'a' }, { team: 'b' }, { team: 'b', tier: 'data' })), ...(audit ? { audit } : {}) });
    } else if (choice < 0.78) {
      nss.delete(pick(['web', 'db', 'ops']));
    } else if (choice < 0.9) {
      const p = pick(POLICIES);
      const k = `${p.namespace}/${p.name}`;
      if (pols.has(k)) pols.delete(k);
      else pols.set(k, p);
    } else {
      const k = `web/p${next++}`;
      const annotations = pick(L({}, { 'weir.dev/audit': 'all' }, { 'weir.dev/audit': 'off' }, { 'weir.dev/enforcement': 'audit' }, { 'weir.dev/enforcement': 'audit', 'weir.dev/audit': 'deny' }));
      pols.set(k, {
        ...policy('web', k.slice(4), {
          podSelector: pick([{}, { matchLabels: { app: 'web' } }]),
          ingress: [{ from: [{ namespaceSelector: pick([{}, { matchLabels: { team: 'b' } }]), podSelector: pick([{}, { matchLabels: { app: 'db' } }]) }] }],
          egress: r() < 0.5 ? [{ ports: [{ port: 'http' }] }] : undefined,
        }),
        annotations,
      });
    }
    out.push({ pods, namespaces: nss, policies: pols, nodes, ports, clusterPolicies: cnps });
  }
  return out;
}

function somePodOf(pods: ReadonlyMap<string, Pod>): Pod | undefined {
  return pods.size > 0 ? [...pods.values()][0] : undefined;
}

describe('incremental calc', () => {
  for (const seed of [1, 2, 3, 4, 5, 6, 7, 8]) {
    test(`every step of random walk ${seed} equals a cold compile of the same state, and Dirty reports every change`, () => {
      const worlds = randomWorlds(seed, 60);
      const c = newCalc();
      const mirror = new Mirror();
      mirror.update(c.desired, c.takeDirty());
      let prev = EMPTY;
      for (const [i, w] of worlds.entries()) {
        const dirty = c.applyEvents(diff(prev, w));
        mirror.update(c.desired, dirty);
        const got = snapshot(c.desired);
        assert.equal(got, cold(w), `seed ${seed} step ${i}: incremental differs from cold`);
        assert.deepEqual([...c.desired.sets.keys()].sort(), referencedSets(c.desired), `seed ${seed} step ${i}: desired sets are not the sets rules reference`);
        assert.deepEqual(auditTags(c), auditTags(coldCalc(w)), `seed ${seed} step ${i}: audit tags differ from cold`);
        assert.equal(snapshot(mirror.view(c.desired.topChain)), got, `seed ${seed} step ${i}: Dirty missed a change`);
        prev = w;
      }
    });
  }

  test('the same walk replayed reversed, split into single events and squashed ends in the same bytes', () => {
    const worlds = randomWorlds(42, 40);
    const last = worlds[worlds.length - 1];
    const want = cold(last);
    // reversed: walk from the last state back to the first, then jump to the last.
    const rev = newCalc();
    let prev = EMPTY;
    for (const w of [...worlds].reverse()) {
      rev.applyEvents(diff(prev, w));
      prev = w;
    }
    rev.applyEvents(diff(prev, last));
    assert.equal(snapshot(rev.desired), want);
    // split: one event per batch.
    const split = newCalc();
    prev = EMPTY;
    for (const w of worlds) {
      for (const e of diff(prev, w)) split.applyEvents([e]);
      prev = w;
    }
    assert.equal(snapshot(split.desired), want);
    // squashed: all events of the walk in one batch.
    const squashed = newCalc();
    const all = [];
    prev = EMPTY;
    for (const w of worlds) {
      all.push(...diff(prev, w));
      prev = w;
    }
    squashed.applyEvents(all);
    assert.equal(snapshot(squashed.desired), want);
  });
});

describe('what calc builds', () => {
  const build = (w: World) => {
    const c = newCalc();
    c.applyEvents(diff(EMPTY, w));
    return c;
  };
  const setOf = (c: ReturnType<typeof newCalc>, family: 4 | 6, key: string) => c.desired.sets.get(names.peerSet(family, key));
  // The union or-peers' ingress peers merge into.
  const ORPEERS = `union|${['pods|nssel=team in (b)|', 'pods|ns=web|role in (lb)'].sort().join('\n')}`;

  test('a pod selected by no policy is not isolated and its chains allow both ways', () => {
    const c = build(world([pod('ops', 'o1', { ip4: 6 })], NAMESPACES, []));
    const tw = c.desired.chains[4].get(names.toWorkload('ops/o1'))!;
    assert.ok(tw.some((r) => r.comment === 'ops/o1 is not isolated for ingress'));
    assert.ok(!tw.some((r) => r.action.kind === 'drop' && r.matches.length === 0));
  });

  test('OR peers make two sets (merged into one union, which alone is in the kernel); AND peers make one set of pods matching both', () => {
    const c = build(world(basePods(), NAMESPACES, POLICIES));
    // or-peers: namespaces labelled team=b (all their pods) OR pods with role=lb in web.
    assert.deepEqual([...setOf(c, 4, ORPEERS)!.members].sort(), ['10.244.1.4', '10.244.2.3', '10.244.2.5']);
    assert.deepEqual([...setOf(c, 6, ORPEERS)!.members].sort(), ['fd00::4', 'fd00::5'], 'a v4-only pod is in no v6 set');
    assert.ok(!setOf(c, 4, 'pods|nssel=team in (b)|') && !setOf(c, 4, 'pods|ns=web|role in (lb)'), 'the parts are not in the kernel');
    // from-web: pods labelled app=web in namespaces labelled team=a, on the named port sql.
    const and = setOf(c, 4, 'pods|nssel=team in (a)|app in (web)')!;
    assert.deepEqual([...and.members], ['10.244.1.1']);
  });

  test('named ports resolve against the receiving pod: ingress against the selected pods, egress against each destination', () => {
    const c = build(world(basePods(), NAMESPACES, POLICIES));
    const ingressTargets = setOf(c, 4, 'pods|ns=db|app in (db)|port=TCP/sql')!;
    assert.equal(ingressTargets.type, 'hash:ip,port');
    assert.deepEqual([...ingressTargets.members].sort(), ['10.244.1.4,tcp:5432', '10.244.2.5,tcp:5433']);
    const egressDests = setOf(c, 4, 'pods|ns=web||port=TCP/http')!;
    assert.deepEqual([...egressDests.members], ['10.244.1.1,tcp:80'], 'only pods with a container port named http');
  });

  test('ipBlock excepts are a set of their own, matched as not-a-member; a /0 needs no address match; each family gets only its own blocks', () => {
    const c = build(world(basePods(), NAMESPACES, POLICIES));
    const po = (f: 4 | 6) => c.desired.chains[f].get(names.policyEgress('web/or-peers'))!;
    const dns = { kind: 'proto', protocol: 'UDP', dports: [{ from: 53, to: 53 }] };
    const v4Except = names.peerSet(4, 'net4|10.0.0.0/8');
    const v6Except = names.peerSet(6, 'net6|fd00::/64');
    assert.deepEqual(po(4)[0].matches, [{ kind: 'set', set: v4Except, dir: 'dst', negate: true }, dns]);
    assert.deepEqual(po(6)[0].matches, [{ kind: 'addr', dir: 'dst', cidr: 'fd00::/8' }, { kind: 'set', set: v6Except, dir: 'dst', negate: true }, dns]);
    assert.deepEqual([...c.desired.sets.get(v4Except)!.members], ['10.0.0.0/8']);
    assert.deepEqual([...c.desired.sets.get(v6Except)!.members], ['fd00::/64']);
    assert.ok(!c.desired.sets.has(names.peerSet(6, 'net6|10.0.0.0/8')) && !c.desired.sets.has(names.peerSet(4, 'net4|fd00::/64')));
  });

  test('an invalid policy adds no allowance but keeps the pods it selects isolated', () => {
    const c = build(world(basePods(), NAMESPACES, POLICIES));
    const report = c.policyReports().find((r) => r.key === 'ops/broken')!;
    assert.ok(report.errors.length > 0);
    assert.equal(report.localPods, 1);
    assert.equal(c.desired.chains[4].get(names.policyIngress('ops/broken')), undefined, 'no rule, so no chain: nothing allowed by the broken policy');
    const tw = c.desired.chains[4].get(names.toWorkload('ops/o2'))!;
    assert.equal(tw[tw.length - 1].action.kind, 'drop');
    assert.deepEqual(
      tw.filter((r) => r.action.kind === 'jump' || (r.action.kind === 'setMark' && r.action.value !== 0)).map((r) => r.action),
      [{ kind: 'jump', chain: names.workloadCommon }],
      'o2 consults no allowing rule',
    );
  });

  test('pods that are not Running, or use the host network, are in no peer set; only local pods get chains', () => {
    const pods = [
      pod('db', 'pending', { labels: { app: 'db' }, ip4: 9, phase: 'Pending' }),
      pod('db', 'host', { labels: { app: 'db' }, ip4: 10, hostNetwork: true }),
      pod('db', 'run', { labels: { app: 'db' }, ip4: 11, nodeName: 'node-b' }),
      pod('web', 'w1', { labels: { app: 'web' }, ip4: 1 }),
    ];
    const c = build(world(pods, NAMESPACES, [policy('web', 'p', { podSelector: {}, ingress: [{ from: [{ namespaceSelector: {}, podSelector: { matchLabels: { app: 'db' } } }] }] })]));
    assert.deepEqual([...setOf(c, 4, 'pods|nssel=|app in (db)')!.members], ['10.244.2.11']);
    assert.ok(c.desired.chains[4].has(names.toWorkload('db/pending')), 'a local pending pod with an IP is still policed');
    assert.ok(!c.desired.chains[4].has(names.toWorkload('db/host')));
    assert.ok(!c.desired.chains[4].has(names.toWorkload('db/run')));
  });

  test('peer sets are shared by every policy that uses the same peer', () => {
    const p = (n: string) => policy('web', n, { podSelector: {}, ingress: [{ from: [{ podSelector: { matchLabels: { app: 'x' } } }] }] });
    const c = build(world(basePods(), NAMESPACES, [p('a'), p('b')]));
    assert.equal([...c.desired.sets.keys()].filter((n) => n.startsWith('cali40s:')).length, 1);
  });

  test('every chain and set name fits the kernel limits and the same input gives the same bytes', () => {
    const a = build(world(basePods(), NAMESPACES, POLICIES));
    const b = build(world([...basePods()].reverse(), [...NAMESPACES].reverse(), [...POLICIES].reverse()));
    assert.equal(snapshot(a.desired), snapshot(b.desired));
    for (const n of a.desired.sets.keys()) assert.ok(n.length <= MAX_SET_NAME, n);
    for (const f of [4, 6] as const) for (const n of a.desired.chains[f].keys()) assert.ok(n.length <= MAX_CHAIN_NAME, n);
  });

  test('a pod label change dirties only the sets and chains it affects', () => {
    const c = build(world(basePods(), NAMESPACES, POLICIES));
    const w2 = basePods().find((p) => p.name === 'w2')!;
    const dirty = c.applyEvents([{ kind: 'Pod', op: 'upsert', object: { ...w2, labels: { role: 'lb' } } }]);
    // The union (merged peers) of the peer set it joins; that set is only a part, not in the kernel.
    for (const f of [4, 6] as const) assert.ok(dirty.sets.has(names.peerSet(f, ORPEERS)));
    assert.ok(!dirty.sets.has(names.peerSet(4, 'pods|ns=web|role in (lb)')));
    for (const [name, members] of dirty.sets) {
      assert.notEqual(members, 'all', name);
      for (const m of members as Set<string>) assert.ok(w2.ips.includes(m), `${name}: ${m} is not w2's`);
    }
    assert.equal(dirty.chains[4].size + dirty.chains[6].size, 0, 'a remote pod changes no chain');
  });
});

describe('what calc reports for status and metrics', () => {
  test('policy counts follow upserts and deletes: valid, invalid, fixed, deleted', () => {
    const c = newCalc();
    const up = (name: string, spec: unknown) => c.applyEvents([{ kind: 'NetworkPolicy', op: 'upsert', object: policy('ns', name, spec) }]);
    up('a', { podSelector: {} });
    up('b', { podSelector: {}, policyTypes: ['Sideways'] });
    assert.deepEqual(c.policyCounts(), { valid: 1, invalid: 1 });
    up('b', { podSelector: {} });
    assert.deepEqual(c.policyCounts(), { valid: 2, invalid: 0 });
    up('a', { podSelector: {}, policyTypes: ['Sideways'] });
    c.applyEvents([{ kind: 'NetworkPolicy', op: 'delete', namespace: 'ns', name: 'a' }]);
    c.applyEvents([{ kind: 'NetworkPolicy', op: 'delete', namespace: 'ns', name: 'gone' }]);
    assert.deepEqual(c.policyCounts(), { valid: 1, invalid: 0 });
    const all = c.policyReports().length;
    assert.equal(all, c.policyCounts().valid + c.policyCounts().invalid);
  });

  test('enforcedPolicyReports lists only the policies that select a pod of this node, sorted', () => {
    const c = newCalc();
    c.applyEvents([
      { kind: 'Pod', op: 'upsert', object: pod('ns', 'local', { nodeName: NODE, labels: { app: 'web' } }) },
      { kind: 'Pod', op: 'upsert', object: pod('ns', 'remote', { nodeName: 'node-b', labels: { app: 'db' } }) },
      { kind: 'NetworkPolicy', op: 'upsert', object: policy('ns', 'z-web', { podSelector: { matchLabels: { app: 'web' } } }) },
      { kind: 'NetworkPolicy', op: 'upsert', object: policy('ns', 'db', { podSelector: { matchLabels: { app: 'db' } } }) },
      { kind: 'NetworkPolicy', op: 'upsert', object: policy('ns', 'all', { podSelector: {} }) },
    ]);
    assert.deepEqual(
      c.enforcedPolicyReports().map((r) => [r.key, r.localPods]),
      [
        ['ns/all', 1],
        ['ns/z-web', 1],
      ],
    );
    assert.deepEqual(
      c.enforcedPolicyReports(),
      c.policyReports().filter((r) => r.localPods > 0),
    );
  });
});
