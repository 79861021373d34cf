// The client of the new-connection benchmark, run inside a simulated pod's network namespace.
// It is a small C program (compiled once with the machine's cc into .cache/peers/): a connect
// through an unpoliced veth pair is cheaper than a Node.js event loop's own share of every
// sample, which would hide the very rules being measured (figures: docs/performance.md).
//   lat  IP PORT COUNT TIMEOUT_MS PAUSE_US COUNT sequential connects, PAUSE_US apart; one line
//                                          per connect: the µs from connect() to the
//                                          handshake's end, or "x REASON" for a failure. The
//                                          pause (spinning) spreads the samples, so that one
//                                          scheduling hiccup of the busy machine lands on a
//                                          few samples, not on the p99's share of a burst
//   rate IP PORT INFLIGHT DURATION_MS TIMEOUT_MS
//                                          INFLIGHT connects at once for DURATION_MS; prints
//                                          "ok N fail M ms T"
//   serve PORT REPLY                       the server: accepts on [::]:PORT (both families),
//                                          sends REPLY and closes, as fast as the kernel hands
//                                          it connections (the pods' Node.js servers cannot
//                                          keep up with the rate runs: their accept queue
//                                          overflowed and SYNs were dropped); prints "ready"
// Every socket is closed with an RST (SO_LINGER 0), so the client leaves no TIME_WAIT behind
// and never runs out of ports; conntrack entries die with the turn's namespaces.

import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { cacheDir } from './env.ts';

const SOURCE = String.raw`
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static struct sockaddr_storage addr;
static socklen_t addrlen;

static void parse(const char *ip, int port) {
  memset(&addr, 0, sizeof addr);
  struct sockaddr_in *a4 = (struct sockaddr_in *)&addr;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&addr;
  if (inet_pton(AF_INET, ip, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(port);
    addrlen = sizeof *a4;
  } else if (inet_pton(AF_INET6, ip, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(port);
    addrlen = sizeof *a6;
  } else {
    fprintf(stderr, "bad address %s\n", ip);
    exit(2);
  }
}

/* A non-blocking connect under way, or -1. */
static int start(void) {
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr *)&addr, addrlen) == 0 || errno == EINPROGRESS) return fd;
  close(fd);
  return -1;
}

static void rst_close(int fd) {
  struct linger l = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close(fd);
}

static int result(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  return err;
}

static int lat(int count, int timeout_ms, int pause_us) {
  for (int i = 0; i < count; i++) {
    /* A busy wait, not a sleep: after a sleep the CPU comes back cold and every connect pays
       for the wakeup (the baseline's p50 doubled). */
    long long until = now_ns() + pause_us * 1000LL;
    while (i > 0 && now_ns() < until) {
    }
    long long t0 = now_ns();
    int fd = start();
    if (fd < 0) {
      printf("x %s\n", strerror(errno));
      continue;
    }
    struct pollfd p = {fd, POLLOUT, 0};
    int n = poll(&p, 1, timeout_ms);
    long long t1 = now_ns();
    int err = n == 1 ? result(fd) : ETIMEDOUT;
    if (err == 0) printf("%.1f\n", (t1 - t0) / 1000.0);
    else printf("x %s\n", strerror(err));
    rst_close(fd);
  }
  return 0;
}

static int rate(int inflight, int duration_ms, int timeout_ms) {
  struct pollfd *p = calloc(inflight, sizeof *p);
  long long *since = calloc(inflight, sizeof *since);
  long long ok = 0, fail = 0, t0 = now_ns(), end = t0 + duration_ms * 1000000LL;
  for (int i = 0; i < inflight; i++) {
    p[i].fd = start();
    p[i].events = POLLOUT;
    since[i] = now_ns();
  }
  while (now_ns() < end) {
    poll(p, inflight, 10);
    long long now = now_ns();
    for (int i = 0; i < inflight; i++) {
      int done = p[i].fd < 0 || p[i].revents != 0 || now - since[i] > timeout_ms * 1000000LL;
      if (!done) continue;
      if (p[i].fd >= 0) {
        if (p[i].revents != 0 && result(p[i].fd) == 0) ok++;
        else fail++;
        rst_close(p[i].fd);
      } else fail++;
      p[i].fd = start();
      p[i].revents = 0;
      since[i] = now;
    }
  }
  for (int i = 0; i < inflight; i++)
    if (p[i].fd >= 0) rst_close(p[i].fd);
  printf("ok %lld fail %lld ms %.1f\n", ok, fail, (now_ns() - t0) / 1e6);
  return 0;
}

static int serve(int port, const char *reply) {
  signal(SIGPIPE, SIG_IGN);
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0), off = 0, on = 1;
  setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  struct sockaddr_in6 a = {0};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  a.sin6_addr = in6addr_any;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4096) != 0) {
    perror("bind/listen");
    return 1;
  }
  printf("ready\n");
  fflush(stdout);
  size_t len = strlen(reply);
  for (;;) {
    int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) continue;
    send(c, reply, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    close(c);
  }
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOFBF, 1 << 20);
  if (argc == 4 && strcmp(argv[1], "serve") == 0) return serve(atoi(argv[2]), argv[3]);
  if (argc == 7 && strcmp(argv[1], "lat") == 0) {
    parse(argv[2], atoi(argv[3]));
    return lat(atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
  }
  if (argc == 7 && strcmp(argv[1], "rate") == 0) {
    parse(argv[2], atoi(argv[3]));
    return rate(atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
  }
  fprintf(stderr, "usage: connect-loop lat IP PORT COUNT TIMEOUT_MS PAUSE_US | rate IP PORT INFLIGHT DURATION_MS TIMEOUT_MS | serve PORT REPLY\n");
  return 2;
}
`;

/** Compiles the client once per source version; returns the binary's path. */
export function buildConnectLoop(): string {
  const hash = createHash('sha256').update(SOURCE).digest('hex').slice(0, 12);
  const dir = cacheDir('connect-loop');
  const bin = `${dir}/connect-loop-${hash}`;
  if (existsSync(bin)) return bin;
  mkdirSync(dir, { recursive: true });
  writeFileSync(`${bin}.c`, SOURCE);
  const r = spawnSync('cc', ['-O2', '-Wall', '-o', bin, `${bin}.c`], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`cc failed to build the connect client (the bench needs a C compiler: apt-get install gcc):\n${r.stderr ?? r.error}`);
  return bin;
}

function run(netns: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn('ip', ['netns', 'exec', netns, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c) => (out += c));
    child.stderr.on('data', (c) => (err += c));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`connect-loop ${args.join(' ')} in ${netns}: exit ${code}: ${err}`))));
  });
}

export interface LatencyRun {
  /** Microseconds of every successful connect. */
  readonly samples: number[];
  readonly failures: number;
  readonly reasons: Map<string, number>;
}

/** COUNT sequential connects from inside netns to ip:port, pauseUs apart. */
export async function connectLatency(bin: string, netns: string, ip: string, port: number, count: number, timeoutMs = 1000, pauseUs = 250): Promise<LatencyRun> {
  const out = await run(netns, [bin, 'lat', ip, String(port), String(count), String(timeoutMs), String(pauseUs)]);
  const samples: number[] = [];
  const reasons = new Map<string, number>();
  let failures = 0;
  for (const line of out.split('\n')) {
    if (!line) continue;
    if (line.startsWith('x ')) {
      failures++;
      reasons.set(line.slice(2), (reasons.get(line.slice(2)) ?? 0) + 1);
    } else samples.push(Number(line));
  }
  return { samples, failures, reasons };
}

/** Successful new connections per second with `inflight` connects always under way. */
export async function connectRate(
  bin: string,
  netns: string,
  ip: string,
  port: number,
  inflight: number,
  durationMs: number,
  timeoutMs = 1000,
): Promise<{ perSecond: number; ok: number; fail: number }> {
  const out = await run(netns, [bin, 'rate', ip, String(port), String(inflight), String(durationMs), String(timeoutMs)]);
  const m = /ok (\d+) fail (\d+) ms ([\d.]+)/.exec(out);
  if (!m) throw new Error(`connect-loop rate: unreadable output ${out}`);
  return { perSecond: (Number(m[1]) * 1000) / Number(m[3]), ok: Number(m[1]), fail: Number(m[2]) };
}
