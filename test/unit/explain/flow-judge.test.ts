import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Calculator, makeNames } from '../../../src/calc/index.ts';
import type { CalcConfig } from '../../../src/calc/config.ts';
import { type FlowPacket, judgeByCalc } from '../../../src/explain/flow-judge.ts';
import type { CalcEvent, Pod } from '../../../src/model/types.ts';

const names = makeNames('cali');
const CFG: CalcConfig = { nodeName: 'node-b', names, families: [4, 6], marks: { accept: 0x10000, pass: 0x20000 }, podBridge: 'cni0', allowAction: 'ACCEPT', sourceBinding: true };

function pod(key: string, node: string, ips: string[], labels: Record<string, string>): Pod {
  const [namespace, name] = key.split('/');
  return { uid: `uid-${key}`, namespace, name, labels, nodeName: node, hostNetwork: false, phase: 'Running', terminating: false, ips, ports: [] };
}

const A1 = pod('alpha/a1', 'node-a', ['10.244.1.11'], { app: 'web' });
const A2 = pod('alpha/a2', 'node-b', ['10.244.2.12'], { app: 'db' });
const B1 = pod('beta/b1', 'node-a', ['10.244.1.21'], { app: 'web' });

function base(nsAnnotation?: string): CalcEvent[] {
  return [
    { kind: 'Namespace', op: 'upsert', object: { name: 'alpha', labels: { team: 'a' }, ...(nsAnnotation !== undefined ? { cutExisting: nsAnnotation } : {}) } },
    { kind: 'Namespace', op: 'upsert', object: { name: 'beta', labels: { team: 'b' } } },
    { kind: 'Node', op: 'upsert', object: { name: 'node-a', podCIDRs: ['10.244.1.0/24'] } },
    { kind: 'Node', op: 'upsert', object: { name: 'node-b', podCIDRs: ['10.244.2.0/24'] } },
    ...[A1, A2, B1].map((object): CalcEvent => ({ kind: 'Pod', op: 'upsert', object })),
    { kind: 'PodInterface', op: 'upsert', object: { ip: '10.244.2.12', port: 'veth-a2' } },
  ];
}

const ownNamespace = (annotations?: Record<string, string>): CalcEvent => ({
  kind: 'NetworkPolicy',
  op: 'upsert',
  object: {
    namespace: 'alpha',
    name: 'own-namespace',
    uid: 'np-1',
    generation: 1,
    spec: { podSelector: { matchLabels: { app: 'db' } }, ingress: [{ from: [{ podSelector: {} }] }] },
    ...(annotations ? { annotations } : {}),
  },
});

function judge(calc: Calculator, flow: FlowPacket, ends = { source: false, destination: true }): boolean {
  return judgeByCalc(calc, names, 'cni0')(flow, ends);
}

const tcp = (src: string, dst: string, dport = 8080): FlowPacket => ({ family: 4, protocol: 'TCP', src, dst, dport });

describe('cutting existing connections: which pods opt in, and which connections their rules drop', () => {
  test('a policy with weir.dev/cut-existing opts in the local pods it selects; without it, nothing does', () => {
    const calc = new Calculator(CFG);
    calc.applyEvents([...base(), ownNamespace()]);
    assert.deepEqual(calc.cutTargets(false), []);
    assert.deepEqual(calc.cutTargets(true), ['10.244.2.12']);
    calc.applyEvents([ownNamespace({ 'weir.dev/cut-existing': 'true' })]);
    assert.deepEqual(calc.cutTargets(false), ['10.244.2.12']);
    calc.applyEvents([{ kind: 'NetworkPolicy', op: 'delete', namespace: 'alpha', name: 'own-namespace' }]);
    assert.deepEqual(calc.cutTargets(false), []);
  });

  test('a ClusterNetworkPolicy with the annotation opts in the local pods of its subject, until it is deleted', () => {
    const calc = new Calculator(CFG);
    const admin = (annotations?: Record<string, string>): CalcEvent => ({
      kind: 'ClusterNetworkPolicy',
      op: 'upsert',
      object: {
        name: 'deny-beta',
        uid: 'cnp-1',
        generation: 1,
        spec: { tier: 'Admin', priority: 1, subject: { namespaces: {} }, ingress: [{ action: 'Deny', from: [{ namespaces: { matchLabels: { team: 'b' } } }] }] },
        ...(annotations ? { annotations } : {}),
      },
    });
    calc.applyEvents([...base(), admin()]);
    assert.deepEqual(calc.cutTargets(false), []);
    calc.applyEvents([admin({ 'weir.dev/cut-existing': 'true' })]);
    assert.deepEqual(calc.cutTargets(false), ['10.244.2.12']);
    assert.equal(judge(calc, tcp('10.244.1.21', '10.244.2.12')), true, 'b1 -> a2 is denied by the Admin tier');
    assert.equal(judge(calc, tcp('10.244.1.11', '10.244.2.12')), false);
    calc.applyEvents([{ kind: 'ClusterNetworkPolicy', op: 'delete', name: 'deny-beta' }]);
    assert.deepEqual(calc.cutTargets(false), []);
  });

  test('a policy whose annotation is neither true nor false is invalid, as for every weir.dev annotation of a policy', () => {
    const calc = new Calculator(CFG);
    calc.applyEvents([...base(), ownNamespace({ 'weir.dev/cut-existing': 'yes' })]);
    const [change] = calc.takePolicyChanges();
    assert.deepEqual(change.policy?.errors, [{ path: 'metadata.annotations["weir.dev/cut-existing"]', message: 'must be true or false, got "yes"' }]);
  });

  test("a namespace's annotation opts in its local pods; false opts out, anything else in", () => {
    for (const [value, expected] of [
      ['true', ['10.244.2.12']],
      ['false', []],
      ['yes', ['10.244.2.12']],
    ] as const) {
      const calc = new Calculator(CFG);
      calc.applyEvents(base(value));
      assert.deepEqual(calc.cutTargets(false), expected, value);
    }
  });

  test('a connection is judged as a new one: dropped when the ingress rules deny it, kept when they allow it', () => {
    const calc = new Calculator(CFG);
    calc.applyEvents([...base(), ownNamespace()]);
    assert.equal(judge(calc, tcp('10.244.1.21', '10.244.2.12')), true, 'b1 -> a2 is denied');
    assert.equal(judge(calc, tcp('10.244.1.11', '10.244.2.12')), false, 'a1 -> a2 is allowed');
    assert.equal(judge(calc, tcp('10.244.1.21', '10.244.2.12'), { source: true, destination: false }), false, "only the source's rules asked about");
  });

  test("the source's egress drop counts only for a source that opted in; the destination's ingress is then judged alone", () => {
    const calc = new Calculator(CFG);
    const denyEgress: CalcEvent = {
      kind: 'NetworkPolicy',
      op: 'upsert',
      object: { namespace: 'alpha', name: 'no-egress', uid: 'np-2', generation: 1, spec: { podSelector: { matchLabels: { app: 'db' } }, policyTypes: ['Egress'] } },
    };
    const a3 = pod('alpha/a3', 'node-b', ['10.244.2.13'], { app: 'other' });
    calc.applyEvents([...base(), denyEgress, { kind: 'Pod', op: 'upsert', object: a3 }, { kind: 'PodInterface', op: 'upsert', object: { ip: '10.244.2.13', port: 'veth-a3' } }]);
    assert.equal(judge(calc, tcp('10.244.2.12', '10.244.2.13'), { source: true, destination: false }), true);
    assert.equal(judge(calc, tcp('10.244.2.12', '10.244.2.13'), { source: false, destination: true }), false, "a3's ingress allows it");
  });
});
