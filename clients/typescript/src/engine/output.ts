/**
 * What a connection hands out: transport commands, application events and timers. The
 * bottom layer of the engine's Connection (output -> channels -> handshake -> dispatch ->
 * connection, each using only those below). Time is only ever the `now` an input brought.
 */
import { type Bytes, RemoteProtocolError, Side, encodeFrames } from "../wire/index.js";
import { DEFAULT_CONFIG, type EngineConfig } from "./config.js";
import type { Command, Event } from "./events.js";
import type { SenderSM } from "./sender.js";

interface Timer {
  when: number;
  seq: number;
  callback: () => void;
}

/** A binary min-heap of timers ordered by (when, seq). */
class TimerHeap {
  private items: Timer[] = [];
  private seq = 0;
  get size(): number {
    return this.items.length;
  }
  peek(): Timer | undefined {
    return this.items[0];
  }
  private less(a: Timer, b: Timer): boolean {
    return a.when < b.when || (a.when === b.when && a.seq < b.seq);
  }
  push(when: number, callback: () => void): void {
    const items = this.items;
    items.push({ when, seq: this.seq++, callback });
    let i = items.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.less(items[i]!, items[p]!)) break;
      [items[i], items[p]] = [items[p]!, items[i]!];
      i = p;
    }
  }
  pop(): Timer | undefined {
    const items = this.items;
    const top = items[0];
    const last = items.pop();
    if (items.length && last) {
      items[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < items.length && this.less(items[l]!, items[m]!)) m = l;
        if (r < items.length && this.less(items[r]!, items[m]!)) m = r;
        if (m === i) break;
        [items[i], items[m]] = [items[m]!, items[i]!];
        i = m;
      }
    }
    return top;
  }
  clear(): void {
    this.items = [];
  }
}

export class Output {
  readonly config: EngineConfig;
  now = 0;
  closed = false;
  protected commandQueue: Command[] = [];
  protected eventQueue: Event[] = [];
  private timers = new TimerHeap();
  /** We may send: the handshake started. */
  protected earlyOk = false;
  gotAckVersion = false;
  private nextStream: number;
  readonly openStreams = new Set<number>();
  maxDatagram: number;
  rtt: number | null = null;
  txBacklog = 0;
  txBudget: number | null = null;
  protected blocked = new Map<number, SenderSM>();
  private creditStalls = 0;
  private transportStalls = 0;
  protected readonly versionBytes: Bytes;
  private routeCache = new Map<number, Bytes>();

  constructor(
    readonly side: Side,
    config?: Partial<EngineConfig>,
  ) {
    this.config = { ...DEFAULT_CONFIG, ...config };
    this.nextStream = side === Side.CLIENT ? 2 : 3;
    this.maxDatagram = this.config.maxDatagramSize;
    this.versionBytes = encodeFrames({ type: "VERSION", version: this.config.version });
  }

  // == outputs ===============================================================================

  /** Take the transport commands produced so far, in order. */
  commands(): Command[] {
    const out = this.commandQueue;
    this.commandQueue = [];
    return out;
  }

  /** Take the application events produced so far, in order. */
  events(): Event[] {
    const out = this.eventQueue;
    this.eventQueue = [];
    return out;
  }

  /** When handleTimer should next be called (seconds, the clock inputs bring), or null. */
  nextTimer(): number | null {
    return this.timers.peek()?.when ?? null;
  }

  // == used by the state machines ============================================================

  get canSendData(): boolean {
    return this.earlyOk && !this.closed;
  }

  transportReady(): boolean {
    return this.txBudget === null || this.txBacklog < this.txBudget;
  }

  blockSender(sm: SenderSM): void {
    if (!this.blocked.has(sm.chanid)) this.transportStalls++;
    this.blocked.set(sm.chanid, sm);
  }

  creditStalled(): void {
    this.creditStalls++;
  }

  /** How often our senders waited: for the peer's credit, for the transport. */
  flowStalls(): { credit: number; transport: number } {
    return { credit: this.creditStalls, transport: this.transportStalls };
  }

  openStream(): number {
    const sid = this.nextStream;
    this.nextStream += 4;
    this.openStreams.add(sid);
    return sid;
  }

  write(streamId: number, data: Bytes, fin = false): void {
    this.commandQueue.push({ kind: "write", streamId, data, fin });
    this.txBacklog += data.length;
    if (fin) this.openStreams.delete(streamId);
  }

  reset(streamId: number): void {
    this.commandQueue.push({ kind: "reset", streamId });
    this.openStreams.delete(streamId);
  }

  sendDatagram(data: Bytes): void {
    this.commandQueue.push({ kind: "datagram", data });
    this.txBacklog += data.length;
  }

  /** What starts a frame sequence routed to `chanid`: [VERSION] ROUTE_TO. */
  seqPrefix(chanid: number): Bytes {
    let route = this.routeCache.get(chanid);
    if (route === undefined) {
      route = encodeFrames({ type: "ROUTE_TO", chanid });
      if (this.routeCache.size < 4096) this.routeCache.set(chanid, route);
    }
    if (this.gotAckVersion) return route;
    const out = new Uint8Array(this.versionBytes.length + route.length);
    out.set(this.versionBytes);
    out.set(route, this.versionBytes.length);
    return out;
  }

  schedule(delay: number, callback: () => void): void {
    this.timers.push(this.now + delay, callback);
  }

  scheduleAt(when: number, callback: () => void): void {
    this.timers.push(when, callback);
  }

  protected runTimers(now: number): void {
    while (this.timers.size && this.timers.peek()!.when <= now && !this.closed) this.timers.pop()!.callback();
  }

  unreliableDeadline(): number {
    const cfg = this.config;
    return Math.min(Math.max(2 * (this.rtt ?? 0), cfg.unreliableDeadlineMin), cfg.unreliableDeadlineMax);
  }

  senderReady(chanid: number): void {
    this.eventQueue.push({ kind: "senderReady", chanid });
  }

  // == the end ===============================================================================

  /** A violation by the peer (or a timeout): close with its code, never throw. */
  protected fail(error: RemoteProtocolError): void {
    if (this.closed) return;
    this.commandQueue.push({ kind: "close", code: error.code, reason: error.message });
    this.terminate(error.code, error.message, false, error);
  }

  protected terminate(code: number, reason: string, byPeer: boolean, error: Error | null): void {
    this.closed = true;
    this.dropState(`${reason || "closed"} (close code ${code})`);
    this.eventQueue.push({ kind: "connectionTerminated", code, reason, byPeer, error });
  }

  /** The connection ended: drop this layer's state (each layer above extends it). */
  protected dropState(_detail: string): void {
    this.blocked.clear();
    this.timers.clear();
    this.openStreams.clear();
  }
}
