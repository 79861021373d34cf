import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import type { PortRange, Rule } from '../../../src/calc/desired.ts';
import {
  filterPayload,
  hookSpec,
  hooksFor,
  insertHook,
  ipsetPayload,
  ipsetPieces,
  LINES_PER_PIECE,
  renderChain,
  renderRuleBodies,
  ruleHash,
  sanitizeComment,
  setAdd,
  setCreate,
  setDel,
  setDestroy,
  setMemberLines,
  splitPorts,
} from '../../../src/dataplane/render.ts';

const ports = (...ps: (number | [number, number])[]): PortRange[] => ps.map((p) => (typeof p === 'number' ? { from: p, to: p } : { from: p[0], to: p[1] }));

const bodyCases: { name: string; input: Rule; expected: string[] }[] = [
  { name: 'no matches, accept', input: { matches: [], action: { kind: 'accept' } }, expected: ['-j ACCEPT'] },
  { name: 'drop', input: { matches: [], action: { kind: 'drop' } }, expected: ['-j DROP'] },
  { name: 'return', input: { matches: [], action: { kind: 'return' } }, expected: ['-j RETURN'] },
  { name: 'jump', input: { matches: [], action: { kind: 'jump', chain: 'cali-tw-abc' } }, expected: ['-j cali-tw-abc'] },
  { name: 'goto', input: { matches: [], action: { kind: 'goto', chain: 'cali-pi-x' } }, expected: ['-g cali-pi-x'] },
  {
    name: 'set mark',
    input: { matches: [], action: { kind: 'setMark', value: 0x10000, mask: 0x10000 } },
    expected: ['-j MARK --set-xmark 0x10000/0x10000'],
  },
  {
    name: 'set mark clearing two bits with a high mask',
    input: { matches: [], action: { kind: 'setMark', value: 0, mask: 0x30000 } },
    expected: ['-j MARK --set-xmark 0x0/0x30000'],
  },
  {
    name: 'source set',
    input: { matches: [{ kind: 'set', set: 'cali40s:abc', dir: 'src' }], action: { kind: 'accept' } },
    expected: ['-m set --match-set cali40s:abc src -j ACCEPT'],
  },
  {
    name: 'destination set',
    input: { matches: [{ kind: 'set', set: 'cali60s:abc', dir: 'dst' }], action: { kind: 'drop' } },
    expected: ['-m set --match-set cali60s:abc dst -j DROP'],
  },
  {
    name: 'ip,port set matches dst,dst',
    input: { matches: [{ kind: 'set', set: 'cali40s:np', dir: 'dst,dst' }], action: { kind: 'accept' } },
    expected: ['-m set --match-set cali40s:np dst,dst -j ACCEPT'],
  },
  {
    name: 'source and destination addresses',
    input: {
      matches: [
        { kind: 'addr', dir: 'src', cidr: '10.0.0.0/8' },
        { kind: 'addr', dir: 'dst', cidr: 'fd00::1/128' },
      ],
      action: { kind: 'accept' },
    },
    expected: ['-s 10.0.0.0/8 -d fd00::1/128 -j ACCEPT'],
  },
  {
    name: 'protocol without ports is lower case',
    input: { matches: [{ kind: 'proto', protocol: 'UDP' }], action: { kind: 'accept' } },
    expected: ['-p udp -j ACCEPT'],
  },
  {
    name: 'single port uses --dport',
    input: { matches: [{ kind: 'proto', protocol: 'TCP', dports: ports(80) }], action: { kind: 'accept' } },
    expected: ['-p tcp -m tcp --dport 80 -j ACCEPT'],
  },
  {
    name: 'single range uses --dport with a colon',
    input: { matches: [{ kind: 'proto', protocol: 'SCTP', dports: ports([1000, 2000]) }], action: { kind: 'accept' } },
    expected: ['-p sctp -m sctp --dport 1000:2000 -j ACCEPT'],
  },
  {
    name: 'ports and ranges use multiport',
    input: { matches: [{ kind: 'proto', protocol: 'TCP', dports: ports(80, [1000, 2000], 443) }], action: { kind: 'accept' } },
    expected: ['-p tcp -m multiport --dports 80,1000:2000,443 -j ACCEPT'],
  },
  {
    name: 'fifteen single ports fit one rule',
    input: {
      matches: [{ kind: 'proto', protocol: 'TCP', dports: ports(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) }],
      action: { kind: 'accept' },
    },
    expected: ['-p tcp -m multiport --dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 -j ACCEPT'],
  },
  {
    name: 'sixteen ports split into two rules, the rest as --dport',
    input: {
      matches: [
        { kind: 'set', set: 'cali40s:s', dir: 'src' },
        { kind: 'proto', protocol: 'TCP', dports: ports(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16) },
      ],
      action: { kind: 'accept' },
    },
    expected: ['-m set --match-set cali40s:s src -p tcp -m multiport --dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 -j ACCEPT', '-m set --match-set cali40s:s src -p tcp -m tcp --dport 16 -j ACCEPT'],
  },
  {
    name: 'ranges count two: seven ranges and a port fill one rule',
    input: {
      matches: [
        {
          kind: 'proto',
          protocol: 'UDP',
          dports: ports([1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12], [13, 14], 15, [16, 17]),
        },
      ],
      action: { kind: 'drop' },
    },
    expected: ['-p udp -m multiport --dports 1:2,3:4,5:6,7:8,9:10,11:12,13:14,15 -j DROP', '-p udp -m udp --dport 16:17 -j DROP'],
  },
  {
    name: 'conntrack states',
    input: { matches: [{ kind: 'ctstate', states: ['RELATED', 'ESTABLISHED'] }], action: { kind: 'accept' } },
    expected: ['-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT'],
  },
  {
    name: 'mark match',
    input: { matches: [{ kind: 'mark', value: 0x10000, mask: 0x10000 }], action: { kind: 'return' } },
    expected: ['-m mark --mark 0x10000/0x10000 -j RETURN'],
  },
  {
    name: 'mark mask with the top bit set prints unsigned',
    input: { matches: [{ kind: 'mark', value: 0, mask: 0xffff0000 }], action: { kind: 'return' } },
    expected: ['-m mark --mark 0x0/0xffff0000 -j RETURN'],
  },
];

for (const c of bodyCases) {
  test(`renderRuleBodies: ${c.name}`, () => {
    assert.deepEqual(renderRuleBodies(c.input), c.expected);
  });
}

test('renderRuleBodies refuses an empty port list instead of matching every port', () => {
  assert.throws(() => renderRuleBodies({ matches: [{ kind: 'proto', protocol: 'TCP', dports: [] }], action: { kind: 'accept' } }), RangeError);
});

test('splitPorts keeps order and never exceeds 15 slots per group', () => {
  const input = ports(...Array.from({ length: 40 }, (_, i): number | [number, number] => (i % 3 === 0 ? [i * 10, i * 10 + 5] : i * 10)));
  const groups = splitPorts(input);
  assert.deepEqual(groups.flat(), input);
  for (const g of groups) assert.ok(g.reduce((n, p) => n + (p.from === p.to ? 1 : 2), 0) <= 15);
});

test('renderChain: golden line with hash comment and human text', () => {
  const r = renderChain('cali-pi-abc', [{ matches: [{ kind: 'set', set: 'cali40s:x', dir: 'src' }], action: { kind: 'accept' }, comment: 'policy ns/p ingress rule 0' }]);
  // The hash formula is pinned: changing it rewrites every chain on upgrade.
  const expectedHash = createHash('sha256').update('cali-pi-abc\n\n-m set --match-set cali40s:x src -j ACCEPT\npolicy ns/p ingress rule 0').digest('base64url').slice(0, 16);
  assert.deepEqual(r.hashes, [expectedHash]);
  assert.deepEqual(r.lines, [`-A cali-pi-abc -m comment --comment "weir:${expectedHash} policy ns/p ingress rule 0" -m set --match-set cali40s:x src -j ACCEPT`]);
});

test('rule hashes are 16 base64url characters and stable across calls', () => {
  const rules: Rule[] = [
    { matches: [], action: { kind: 'drop' } },
    { matches: [], action: { kind: 'accept' } },
  ];
  const a = renderChain('cali-x', rules);
  const b = renderChain('cali-x', rules);
  assert.deepEqual(a, b);
  for (const h of a.hashes) assert.match(h, /^[A-Za-z0-9_-]{16}$/);
  assert.notEqual(a.hashes[0], a.hashes[1]);
});

test('inserting a rule changes its hash and every following hash, not the earlier ones', () => {
  const r = (n: number): Rule => ({ matches: [{ kind: 'proto', protocol: 'TCP', dports: ports(n) }], action: { kind: 'accept' } });
  const before = renderChain('cali-x', [r(1), r(2), r(3)]).hashes;
  const after = renderChain('cali-x', [r(1), r(9), r(2), r(3)]).hashes;
  assert.equal(after[0], before[0]);
  assert.ok(!before.includes(after[1]));
  // Rules 2 and 3 are unchanged but follow the insertion, so their hashes move.
  assert.notEqual(after[2], before[1]);
  assert.notEqual(after[3], before[2]);
});

test('the same rule in two chains gets two different hashes', () => {
  assert.notEqual(ruleHash('cali-a', '', '-j ACCEPT', ''), ruleHash('cali-b', '', '-j ACCEPT', ''));
});

test('split rules each get their own hash and line', () => {
  const many = ports(...Array.from({ length: 20 }, (_, i) => 100 + i));
  const r = renderChain('cali-x', [{ matches: [{ kind: 'proto', protocol: 'TCP', dports: many }], action: { kind: 'accept' } }]);
  assert.equal(r.lines.length, 2);
  assert.equal(new Set(r.hashes).size, 2);
});

const commentCases: { name: string; input: string; expected: string }[] = [
  { name: 'plain text kept', input: 'policy default/web ingress rule 0', expected: 'policy default/web ingress rule 0' },
  { name: 'double quotes removed', input: 'say "hi"', expected: 'say hi' },
  { name: 'single quotes, backslashes and backticks removed', input: "it's a \\ `x`", expected: 'its a x' },
  { name: 'newlines and tabs collapse to one space', input: 'a\n\tb\r\nc', expected: 'a b c' },
  { name: 'non-ASCII removed', input: 'café→x', expected: 'caf' + 'x' },
  { name: 'length bounded', input: 'x'.repeat(400), expected: 'x'.repeat(255) },
];
for (const c of commentCases) {
  test(`sanitizeComment: ${c.name}`, () => {
    assert.equal(sanitizeComment(c.input), c.expected);
  });
}

test('a long human comment keeps the whole rule comment within 255 characters', () => {
  const r = renderChain('cali-x', [{ matches: [], action: { kind: 'accept' }, comment: 'y'.repeat(500) }]);
  const comment = /--comment "([^"]*)"/.exec(r.lines[0])![1];
  assert.ok(comment.length <= 255, `comment is ${comment.length} characters`);
  assert.ok(comment.startsWith(`weir:${r.hashes[0]} yyy`));
});

test('hook rule and payload framing', () => {
  assert.equal(hookSpec('cali-FORWARD'), '-m comment --comment "weir:hook" -j cali-FORWARD');
  assert.equal(insertHook(hooksFor('wx-FORWARD', false)[0]), '-I FORWARD 1 -m comment --comment "weir:hook" -j wx-FORWARD');
  assert.equal(filterPayload([':a - [0:0]', '-A a -j ACCEPT']), '*filter\n:a - [0:0]\n-A a -j ACCEPT\nCOMMIT\n');
});

const setLineCases: { name: string; actual: string; expected: string }[] = [
  { name: 'create v4 hash:net', actual: setCreate('cali40s:a', 'hash:net', 4, 1000), expected: 'create cali40s:a hash:net family inet maxelem 1000 comment -exist' },
  { name: 'create v6 hash:ip,port', actual: setCreate('cali60s:b', 'hash:ip,port', 6, 65536), expected: 'create cali60s:b hash:ip,port family inet6 maxelem 65536 comment -exist' },
  { name: 'add ip,port member', actual: setAdd('cali40s:b', '10.0.0.1,tcp:8080'), expected: 'add cali40s:b 10.0.0.1,tcp:8080 -exist' },
  { name: 'del member', actual: setDel('cali40s:a', '10.0.0.0/8'), expected: 'del cali40s:a 10.0.0.0/8 -exist' },
  { name: 'destroy', actual: setDestroy('cali40s:a'), expected: 'destroy cali40s:a' },
];
for (const c of setLineCases) {
  test(`ipset line: ${c.name}`, () => assert.equal(c.actual, c.expected));
}

/** The kernel's name of a hashlimit table as render makes it: the base name and a hash of the
 *  match's options. */
const tableName = (base: string, options: string) => `${base}${createHash('sha256').update(options).digest('hex').slice(0, 6)}`;

test('an audit rule renders as NFLOG with threshold 1 behind the shared per-node hashlimit', () => {
  const rule: Rule = {
    matches: [
      { kind: 'ctstate', states: ['NEW'] },
      { kind: 'limit', name: 'cali-an', perSecond: 1000, burst: 2000 },
    ],
    action: { kind: 'nflog', group: 77, prefix: 'weir:AI:abc-_9', size: 128 },
  };
  const node = '--hashlimit-upto 1000/sec --hashlimit-burst 2000';
  assert.deepEqual(renderRuleBodies(rule), [
    `-m conntrack --ctstate NEW -m hashlimit ${node} --hashlimit-name ${tableName('cali-an', node)} -j NFLOG --nflog-group 77 --nflog-prefix weir:AI:abc-_9 --nflog-size 128 --nflog-threshold 1`,
  ]);
});

test('a per-source audit limit renders the node bucket first, then a bucket per source address (srcip, whole address in both families) in a bounded table', () => {
  const rule: Rule = {
    matches: [
      { kind: 'ctstate', states: ['NEW'] },
      { kind: 'limit', name: 'cali-an', perSecond: 10000, burst: 20000, perSource: { name: 'cali-as', perSecond: 100, burst: 200, tableMax: 50000, expireMs: 2000 } },
    ],
    action: { kind: 'nflog', group: 77, prefix: 'weir:DI:x', size: 128 },
  };
  const node = '--hashlimit-upto 10000/sec --hashlimit-burst 20000';
  const source = '--hashlimit-upto 100/sec --hashlimit-burst 200 --hashlimit-mode srcip --hashlimit-htable-size 8192 --hashlimit-htable-max 50000 --hashlimit-htable-expire 2000';
  const [body] = renderRuleBodies(rule);
  assert.equal(
    body,
    `-m conntrack --ctstate NEW -m hashlimit ${node} --hashlimit-name ${tableName('cali-an', node)} -m hashlimit ${source} --hashlimit-name ${tableName('cali-as', source)} -j NFLOG --nflog-group 77 --nflog-prefix weir:DI:x --nflog-size 128 --nflog-threshold 1`,
  );
  // No --hashlimit-srcmask: the default is the whole address, /32 and /128 (one pod, one bucket).
  assert.doesNotMatch(body, /srcmask/);
  // Rendering is a function of the match: the same twice, another table name for other options.
  assert.deepEqual(renderRuleBodies(rule), [body]);
  const other = renderRuleBodies({
    ...rule,
    matches: [rule.matches[0], { kind: 'limit', name: 'cali-an', perSecond: 10000, burst: 20000, perSource: { name: 'cali-as', perSecond: 50, burst: 100, tableMax: 50000, expireMs: 2000 } }],
  })[0];
  assert.equal(/--hashlimit-name (cali-an\w+)/.exec(other)?.[1], tableName('cali-an', node));
  assert.notEqual(/--hashlimit-mode srcip .*--hashlimit-name (cali-as\w+)/.exec(other)?.[1], tableName('cali-as', source));
});

test('a per-source table gets hash buckets for chains of about 8 when full, never more buckets than entries (the kernel would raise the max to them), within 16 to 65536', () => {
  const buckets = (tableMax: number) =>
    Number(
      /--hashlimit-htable-size (\d+)/.exec(
        renderRuleBodies({
          matches: [{ kind: 'limit', name: 'cali-an', perSecond: 1, burst: 2, perSource: { name: 'cali-as', perSecond: 1, burst: 2, tableMax, expireMs: 2000 } }],
          action: { kind: 'drop' },
        })[0],
      )?.[1],
    );
  assert.deepEqual([10, 50, 128, 129, 50_000, 1_000_000].map(buckets), [10, 16, 16, 32, 8192, 65536]);
});

test("a hashlimit table's name changes with its options, because the kernel keeps the options of the first rule that named a table", () => {
  const name = (perSecond: number) =>
    /--hashlimit-name (\S+)/.exec(renderRuleBodies({ matches: [{ kind: 'limit', name: 'cali-an', perSecond, burst: 2 * perSecond }], action: { kind: 'drop' } })[0])?.[1];
  assert.notEqual(name(1000), name(2000));
  assert.equal(name(1000), name(1000));
  assert.ok((name(1000) ?? '').length <= 15);
});

test('a hashlimit name the kernel would cut is refused', () => {
  assert.throws(() => renderRuleBodies({ matches: [{ kind: 'limit', name: 'abcdef-audit', perSecond: 1, burst: 2 }], action: { kind: 'drop' } }), /hashlimit name/);
});

test('an NFLOG prefix that iptables-restore would quote or cut is refused', () => {
  for (const prefix of ['', 'has space', 'quote"', 'x'.repeat(64)]) {
    assert.throws(() => renderRuleBodies({ matches: [], action: { kind: 'nflog', group: 77, prefix, size: 128 } }), /NFLOG prefix/);
  }
});

test('IPVS hook: OUTPUT position 1, taking only requests IPVS forwarded from a source that is not the node itself, to the same top chain as FORWARD', () => {
  const [forward, output] = hooksFor('cali-FORWARD', true);
  assert.deepEqual(forward, { chain: 'FORWARD', target: 'cali-FORWARD', spec: hookSpec('cali-FORWARD') });
  assert.deepEqual(output, {
    chain: 'OUTPUT',
    target: 'cali-FORWARD',
    spec: '-m ipvs --ipvs --vdir ORIGINAL -m addrtype ! --src-type LOCAL -m comment --comment "weir:hook" -j cali-FORWARD',
  });
  assert.equal(insertHook(output), `-I OUTPUT 1 ${output.spec}`);
  assert.deepEqual(hooksFor('wx-FORWARD', false), [{ chain: 'FORWARD', target: 'wx-FORWARD', spec: hookSpec('wx-FORWARD') }]);
});

test('ipsetPieces: a large set is written in pieces of bounded lines, in order, with the same text as line by line', () => {
  const members = Array.from({ length: 2 * LINES_PER_PIECE + 5 }, (_, i) => `10.${i >> 16}.${(i >> 8) & 255}.${i & 255}`);
  const lines = ['create s hash:net family inet maxelem 65536 comment -exist', setMemberLines('add', 's', members), setMemberLines('del', 's', ['10.9.9.9']), setDestroy('t')];
  const pieces = [...ipsetPieces(lines)];
  const linesOf = (p: string) => p.split('\n').length - 1;
  assert.deepEqual(pieces.map(linesOf), [1, LINES_PER_PIECE, LINES_PER_PIECE, 7]);
  assert.ok(pieces.every((p) => p.endsWith('\n')));
  const expected = [lines[0], ...members.map((m) => setAdd('s', m)), setDel('s', '10.9.9.9'), setDestroy('t')];
  assert.equal(pieces.join(''), `${expected.join('\n')}\n`);
  assert.equal(ipsetPayload(lines), pieces.join(''));
});
