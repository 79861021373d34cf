// Records the pcap fixtures of test/unit/audit/ from the real kernel (run by hand, as root):
//   node test/kernel/audit-fixtures.ts
// Two namespaces, the NFLOG rule of the audit issue in the receiver's INPUT, tcpdump reading
// the group exactly as the audit reader runs it (-U -B 16384 -w -), and one new connection of
// each kind the parser must decode, in this order (every source port fixed, 10.99.0.1 /
// fd99::1 to 10.99.0.2 / fd99::2):
//   1. TCP IPv4 40001 -> 8080      2. UDP IPv4 40002 -> 5353
//   3. TCP IPv6 40001 -> 8080      4. UDP IPv6 40002 -> 5353
//   5. UDP IPv6 40003 -> 5354 behind a hop-by-hop and a destination options header
//   6. UDP IPv4 40004 -> 5355 with IP options (header length 24)
//   7. ICMP echo request           8. ICMPv6 echo request
// Node sends 1-4; Python 3 sends 5-8 (ancillary IPv6 option headers, IP_OPTIONS and raw ICMP
// sockets, which Node does not have). The byte-swapped and nanosecond variants are derived
// from this capture by the unit tests themselves.

import { execa } from 'execa';
import { writeFile } from 'node:fs/promises';
import { deleteAllNs, uniquePrefix } from '../../src/sim/netns.ts';
import { createNflogPair } from './audit-netns.ts';

const OUT = new URL('../unit/audit/fixtures/nflog-le.pcap', import.meta.url);
const NODE = process.execPath;

const SEND_NODE = `
import net from 'node:net'; import dgram from 'node:dgram';
const [host, fam] = [process.argv[1], Number(process.argv[2])];
await new Promise((r) => { const s = net.connect({ host, port: 8080, localPort: 40001 }); s.on('error', r); s.on('connect', () => { s.destroy(); r(); }); });
await new Promise((r) => { const s = dgram.createSocket(fam === 6 ? 'udp6' : 'udp4'); s.bind(40002, () => s.send('hi', 5353, host, () => { s.close(); r(); })); });
`;

const SEND_PYTHON = `
import socket, struct, sys, time
h4, h6 = sys.argv[1], sys.argv[2]
padn = bytes([0, 0, 1, 4, 0, 0, 0, 0])
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(('', 40003))
s.sendmsg([b'ext'], [(socket.IPPROTO_IPV6, socket.IPV6_HOPOPTS, padn), (socket.IPPROTO_IPV6, socket.IPV6_DSTOPTS, padn)], 0, (h6, 5354)); s.close()
time.sleep(0.05)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('', 40004))
s.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, bytes([1, 1, 1, 0])); s.sendto(b'opt', (h4, 5355)); s.close()
time.sleep(0.05)
def csum(b):
    t = sum(struct.unpack('!%dH' % (len(b) // 2), b)); t = (t >> 16) + (t & 0xffff); t += t >> 16
    return ~t & 0xffff
echo = struct.pack('!BBHHH', 8, 0, 0, 0x77, 1) + b'weir'
echo = echo[:2] + struct.pack('!H', csum(echo)) + echo[4:]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); s.sendto(echo, (h4, 0)); s.close()
time.sleep(0.05)
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s.sendto(struct.pack('!BBHHH', 128, 0, 0, 0x77, 1) + b'weir', (h6, 0)); s.close()
`;

const prefix = uniquePrefix('wfx');
try {
  const pair = await createNflogPair(prefix, 77);
  const dump = execa('ip', ['netns', 'exec', pair.b, 'tcpdump', '-i', `nflog:${pair.group}`, '-U', '-B', '16384', '-w', '-'], { encoding: 'buffer', reject: false });
  await new Promise<void>((resolve) => dump.stderr!.on('data', (d: Buffer) => d.toString().includes('listening on') && resolve()));
  const inA = (cmd: string, args: string[]) => execa('ip', ['netns', 'exec', pair.a, cmd, ...args]);
  await inA(NODE, ['--input-type=module', '-e', SEND_NODE, pair.b4, '4']);
  await inA(NODE, ['--input-type=module', '-e', SEND_NODE, pair.b6, '6']);
  await inA('python3', ['-c', SEND_PYTHON, pair.b4, pair.b6]);
  await new Promise((r) => setTimeout(r, 300));
  dump.kill('SIGINT');
  const r = await dump;
  await writeFile(OUT, r.stdout as Uint8Array);
  console.log(Buffer.from(r.stderr as Uint8Array).toString());
  console.log((await execa('tcpdump', ['-r', OUT.pathname, '-n', '-v'], { reject: false })).stdout);
} finally {
  await deleteAllNs(prefix);
}
