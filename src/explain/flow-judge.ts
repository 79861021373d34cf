// Whether a connection already running would be dropped if it began now: its first packet, as
// the FORWARD hook sees it, walked through calc's chains (evaluate.ts). The opt-in cut of
// existing connections (agent/connection-cut.ts) deletes those the new rules drop. Pure.

import type { Calculator } from '../calc/index.ts';
import type { DesiredDataplane } from '../calc/desired.ts';
import type { Names } from '../calc/names.ts';
import type { Family, Protocol } from '../model/types.ts';
import { type Packet, type Walk, walk } from './evaluate.ts';

/** A connection's first packet after any DNAT (a Service's): what the policy chains judge. */
export interface FlowPacket {
  readonly family: Family;
  readonly protocol: Protocol;
  readonly src: string;
  readonly dst: string;
  readonly dport: number;
}

export interface FlowJudgeContext {
  readonly desired: DesiredDataplane;
  readonly fromWorkloadDispatch: string;
  readonly toWorkloadDispatch: string;
  /** The pod bridge (--pod-bridge), when the chains name it. */
  readonly podBridge?: string;
  /** Whether an address is a local pod's. */
  readonly isLocal: (ip: string) => boolean;
  /** The bridge port a local address is bound to (source binding). */
  readonly portOf: (ip: string) => string | undefined;
}

/** Which ends' rules count: the egress of the source, the ingress of the destination. */
export interface JudgedEnds {
  readonly source: boolean;
  readonly destination: boolean;
}

/** Whether the rules of the ends asked about drop the connection as a new one. A drop by the
 *  other end's rules does not count: that end did not ask for its connections to be cut. */
export function droppedByRulesOf(ctx: FlowJudgeContext, flow: FlowPacket, ends: JudgedEnds): boolean {
  const srcLocal = ctx.isLocal(flow.src);
  const port = srcLocal ? ctx.portOf(flow.src) : undefined;
  const packet: Packet = {
    family: flow.family,
    src: flow.src,
    dst: flow.dst,
    protocol: flow.protocol,
    dport: flow.dport,
    ctstate: 'NEW',
    mark: 0,
    ...(srcLocal && ctx.podBridge ? { inIface: ctx.podBridge } : {}),
    ...(ctx.isLocal(flow.dst) && ctx.podBridge ? { outIface: ctx.podBridge } : {}),
    ...(port !== undefined ? { bridgePortIn: port } : {}),
  };
  const chains = ctx.desired.chains[flow.family];
  const w = walk(chains, ctx.desired.topChain, packet, ctx.desired.sets);
  if (w.verdict !== 'drop') return false;
  const half = dispatchOfDrop(w);
  if (half === ctx.fromWorkloadDispatch) {
    if (ends.source) return true;
    // The source's egress dropped it first: would the destination's ingress drop it too?
    return ends.destination && walk(chains, ctx.toWorkloadDispatch, packet, ctx.desired.sets).verdict === 'drop';
  }
  return half === ctx.toWorkloadDispatch && ends.destination;
}

/** The chain the top chain's last jump went to before the drop: the half (egress or ingress
 *  dispatch) that dropped it. Gotos below it leave it off the drop's own stack. */
function dispatchOfDrop(w: Walk): string | undefined {
  let chain: string | undefined;
  for (const h of w.hits) if (h.stack.length === 1 && h.rule.action.kind === 'jump') chain = h.rule.action.chain;
  return chain;
}

/** A judge by a Calculator's chains as they are now, for the agent's cut: its local pods and
 *  their bridge ports as calc holds them. */
export function judgeByCalc(calc: Calculator, names: Pick<Names, 'fromWorkloadDispatch' | 'toWorkloadDispatch'>, podBridge?: string): (flow: FlowPacket, ends: JudgedEnds) => boolean {
  const localPods = new Set(calc.localPodAddresses());
  const ctx: FlowJudgeContext = {
    desired: calc.desired,
    fromWorkloadDispatch: names.fromWorkloadDispatch,
    toWorkloadDispatch: names.toWorkloadDispatch,
    ...(podBridge ? { podBridge } : {}),
    isLocal: (ip) => localPods.has(ip),
    portOf: (ip) => calc.bridgePortOf(ip),
  };
  return (flow, ends) => droppedByRulesOf(ctx, flow, ends);
}
