/**
 * The sender state machine (profile §3 "Sender", oneshots, §4 credit). OPEN -> FINISHING
 * (FINISH sent) or CANCELLING (CANCEL sent) -> destroyed by CLOSE_RECEIVER or FORGET.
 *
 * Messages wait in `queue` until the channel has credit; transport and number are chosen
 * only when a message leaves it (the transport before the number: an unreliable message too
 * big for a datagram goes on a stream, numbered in the reliable space, G13).
 */
import {
  type Attachment,
  type Bytes,
  CloseCode,
  type Headers,
  LocalProtocolError,
  RemoteProtocolError,
  WouldBlock,
  ackNackRuns,
  ackReliableRuns,
  concatBytes,
  costOf,
  encodeFrames,
  messageHead,
} from "../wire/index.js";
import type { EngineConfig } from "./config.js";
import { type Lineage, msgKey } from "./lineage.js";
import { RangeSet } from "./rangeset.js";

/** Payloads up to this size are joined with their frame head into one write. */
const SMALL_WRITE = 16 * 1024;

/** How a sender puts messages on the wire; the receiver never sees the mode. */
export type Mode = "ordered" | "unordered" | "unreliable" | "oneshot";
/** What a send does when `maxsize` messages already wait for credit. */
export type QueuePolicy = "unbounded" | "block" | "drop_oldest";
export type SendState = "open" | "finishing" | "cancelling" | "receiver gone";

export interface Outgoing {
  readonly headers: Headers;
  readonly payload: Bytes;
  readonly attachments: readonly Attachment[];
  readonly children: number[];
}

/** What a sender uses of its connection (the connection is the one implementation). */
export interface SenderHost {
  readonly config: EngineConfig;
  readonly lineage: Lineage;
  readonly canSendData: boolean;
  readonly peerWindow: number | null;
  readonly maxDatagram: number;
  transportReady(): boolean;
  blockSender(sm: SenderSM): void;
  creditStalled(): void;
  senderReady(chanid: number): void;
  seqPrefix(chanid: number): Bytes;
  routeSent(chanid: number): void;
  openStream(): number;
  write(streamId: number, data: Bytes, fin?: boolean): void;
  ctrlWrite(sm: { chanid: number; ctrlStream: number | null }, data: Bytes, fin?: boolean): void;
  reset(streamId: number): void;
  sendDatagram(data: Bytes): void;
  schedule(delay: number, callback: () => void): void;
}

export class SenderSM {
  mode: Mode;
  state: SendState = "open";
  alive = true;
  queue: Outgoing[] = [];
  policy: QueuePolicy = "unbounded";
  maxsize = 0;
  finishRequested = false;
  nextRel = 0;
  nextUnrel = 0;
  private unflushedUnrel = 0;
  private declaredAny = false;
  private flushArmed = false;
  private acked = new RangeSet();
  private ackedBase = 0;
  private unrelCursor = 0;
  private unrelCosts = new Map<number, number>();
  private orderedStream: number | null = null;
  ctrlStream: number | null = null;
  /** Reliable message number -> its own stream, until acked (reset on cancel). */
  private msgStreams = new Map<number, number>();
  outstanding = 0;
  /** Credit below the peer's window: the entrypoint's, when the server grants less. */
  windowCap: number | null = null;
  private stalled = false;

  constructor(
    readonly conn: SenderHost,
    readonly chanid: number,
    readonly oneshot: boolean,
  ) {
    this.mode = oneshot ? "oneshot" : "ordered";
  }

  // -- application side -----------------------------------------------------------------

  configure(mode: Mode, policy: QueuePolicy, maxsize: number): void {
    if (this.oneshot) throw new LocalProtocolError("a oneshot sender has no mode to choose");
    if (policy !== "unbounded" && maxsize < 1) throw new LocalProtocolError("a bounded queue needs maxsize >= 1");
    if (policy === "drop_oldest" && mode !== "unreliable")
      throw new LocalProtocolError("drop-oldest queues are for unreliable senders only");
    this.mode = mode;
    this.policy = policy;
    this.maxsize = maxsize;
  }

  /** Throw WouldBlock before anything is minted for a send that cannot be queued. */
  checkCanSend(): void {
    if (this.oneshot && (this.nextRel || this.queue.length))
      throw new LocalProtocolError("a oneshot sender sends exactly one message");
    if (this.policy === "block" && this.queue.length >= this.maxsize)
      throw new WouldBlock("the sender's queue is full; wait for room");
  }

  send(out: Outgoing): void {
    if (this.policy === "drop_oldest" && this.queue.length >= this.maxsize) {
      const evicted = this.queue.shift()!;
      this.conn.lineage.loseAll(evicted.children);
    }
    this.queue.push(out);
    this.pump();
  }

  finish(): void {
    this.finishRequested = true;
    if (this.queue.length === 0) this.finishNow();
  }

  /** Drop unsent messages, reset message streams, CANCEL on a stream never reset (G15). */
  cancel(): void {
    if (this.state !== "open") return;
    this.dropQueue();
    this.resetMessageStreams();
    this.flushUnreliable();
    this.conn.ctrlWrite(this, encodeFrames({ type: "CANCEL_SENDER" }), true);
    this.state = "cancelling";
  }

  // -- the pump ---------------------------------------------------------------------------

  /** Move queued messages to the wire while credit and the transport allow. */
  pump(): void {
    const conn = this.conn;
    if (!conn.canSendData) return;
    let window = conn.peerWindow;
    if (window !== null && this.windowCap !== null) window = Math.min(window, this.windowCap);
    const queue = this.queue;
    while (queue.length && this.state === "open") {
      if (!conn.transportReady()) {
        conn.blockSender(this);
        break;
      }
      const out = queue[0]!;
      let unreliable = false;
      let head: Bytes | null = null;
      if (this.mode === "unreliable") {
        head = messageHead(this.nextUnrel, out.headers, out.attachments, out.payload.length);
        unreliable = conn.seqPrefix(this.chanid).length + head.length + out.payload.length <= conn.maxDatagram;
      }
      const num = unreliable ? this.nextUnrel : this.nextRel;
      if (!unreliable) head = messageHead(num, out.headers, out.attachments, out.payload.length);
      const cost = costOf(head!.length + out.payload.length, out.attachments.length);
      if (window !== null && this.outstanding && this.outstanding + cost > window) {
        // The progress rule: a message may always go when nothing is outstanding.
        if (!this.stalled) {
          this.stalled = true;
          conn.creditStalled();
        }
        break;
      }
      queue.shift();
      this.stalled = false;
      if (window !== null) this.outstanding += cost;
      conn.lineage.numbered(this.chanid, msgKey(unreliable, num), out.children);
      if (unreliable) {
        this.nextUnrel++;
        if (window !== null) this.unrelCosts.set(num, cost);
        conn.sendDatagram(concatBytes([conn.seqPrefix(this.chanid), head!, out.payload]));
        conn.routeSent(this.chanid);
        this.unflushedUnrel++;
        if (!this.flushArmed) {
          this.flushArmed = true;
          conn.schedule(conn.config.sentUnreliableDelay, () => this.flushTimer());
        }
      } else {
        this.nextRel++;
        this.writeReliable(num, head!, out.payload);
      }
      if (this.policy === "block" && queue.length === this.maxsize - 1) conn.senderReady(this.chanid);
    }
    if (this.finishRequested && queue.length === 0 && this.state === "open") this.finishNow();
  }

  private writeReliable(num: number, head: Bytes, payload: Bytes): void {
    const conn = this.conn;
    let sid: number;
    let fin: boolean;
    if (this.mode === "ordered") {
      if (this.orderedStream === null) {
        sid = this.orderedStream = conn.openStream();
        head = concatBytes([conn.seqPrefix(this.chanid), head]);
        conn.routeSent(this.chanid);
      } else {
        sid = this.orderedStream;
      }
      fin = false;
    } else {
      sid = conn.openStream();
      head = concatBytes([conn.seqPrefix(this.chanid), head]);
      conn.routeSent(this.chanid);
      this.msgStreams.set(num, sid);
      fin = true;
    }
    if (payload.length <= SMALL_WRITE) {
      conn.write(sid, concatBytes([head, payload]), fin);
    } else {
      conn.write(sid, head);
      conn.write(sid, payload, fin);
    }
    if (this.oneshot) this.state = "finishing"; // message 0 means "finished with 1"
  }

  private flushTimer(): void {
    this.flushArmed = false;
    if (this.alive && this.state === "open") this.flushUnreliable();
  }

  private flushUnreliable(): void {
    if (this.unflushedUnrel) {
      this.conn.ctrlWrite(this, encodeFrames({ type: "SENT_UNRELIABLE", count: this.unflushedUnrel }));
      this.unflushedUnrel = 0;
      this.declaredAny = true;
    }
  }

  private finishNow(): void {
    const conn = this.conn;
    this.state = "finishing";
    if (this.oneshot) {
      conn.ctrlWrite(this, encodeFrames({ type: "FINISH_SENDER", sentReliable: 0 }), true);
      return;
    }
    this.flushUnreliable();
    const frame = encodeFrames({ type: "FINISH_SENDER", sentReliable: this.nextRel });
    if (this.orderedStream !== null && !this.declaredAny) {
      // With no SENT_UNRELIABLE ever sent, FINISH may ride at the tail of the ordered stream.
      conn.write(this.orderedStream, frame, true);
      this.orderedStream = null;
      if (this.ctrlStream !== null) {
        conn.write(this.ctrlStream, new Uint8Array(0), true);
        this.ctrlStream = null;
      }
    } else {
      conn.ctrlWrite(this, frame, true);
      if (this.orderedStream !== null) {
        conn.write(this.orderedStream, new Uint8Array(0), true);
        this.orderedStream = null;
      }
    }
  }

  // -- frames from the receiver ------------------------------------------------------------

  onAckReliable(ranges: readonly number[]): void {
    const lineage = this.conn.lineage;
    const node = lineage.nodes.get(this.chanid);
    for (const [start, stop] of ackReliableRuns(this.ackedBase, ranges)) {
      if (stop > this.nextRel) throw new RemoteProtocolError(`ACK_RELIABLE acks message ${stop - 1}, never sent`);
      if (this.acked.overlaps(start, stop)) throw new RemoteProtocolError("ACK_RELIABLE acks a message twice");
      this.acked.addRange(start, stop);
      if (this.msgStreams.size) for (let n = start; n < stop; n++) this.msgStreams.delete(n);
      if (node && node.unacked.size) for (let n = start; n < stop; n++) lineage.ack(this.chanid, msgKey(false, n));
    }
    this.ackedBase = this.acked.firstGap(this.ackedBase);
    this.acked.discardBelow(this.ackedBase);
  }

  onAckNack(ranges: readonly number[]): void {
    const total = ranges.reduce((a, b) => a + b, 0);
    if (this.unrelCursor + total > this.nextUnrel)
      throw new RemoteProtocolError("ACK_NACK_UNRELIABLE decides messages never sent");
    const lineage = this.conn.lineage;
    let released = 0;
    for (const [start, stop, acked] of ackNackRuns(this.unrelCursor, ranges)) {
      for (let n = start; n < stop; n++) {
        const cost = this.unrelCosts.get(n) ?? 0;
        this.unrelCosts.delete(n);
        if (acked) lineage.ack(this.chanid, msgKey(true, n));
        else {
          released += cost;
          lineage.nack(this.chanid, msgKey(true, n));
        }
      }
    }
    this.unrelCursor += total;
    if (released) {
      this.outstanding -= released;
      this.pump();
    }
  }

  onDequeued(numBytes: number): void {
    if (numBytes > this.outstanding)
      throw new RemoteProtocolError(
        `DEQUEUED reports ${numBytes} bytes but only ${this.outstanding} are outstanding`,
        CloseCode.LIMIT_VIOLATION,
      );
    this.outstanding -= numBytes;
    this.pump();
  }

  /** CLOSE_RECEIVER: every number not yet acked is nacked. */
  nackEverything(): void {
    const lineage = this.conn.lineage;
    const node = lineage.nodes.get(this.chanid);
    if (node) for (const key of [...node.unacked.keys()]) lineage.nack(this.chanid, key);
  }

  /** FORGET for a held sender: stop; its CLOSE will settle what was sent. */
  receiverGone(): void {
    this.state = "receiver gone";
    this.dropQueue();
  }

  // -- teardown ------------------------------------------------------------------------------

  private dropQueue(): void {
    const lost = this.queue.flatMap((out) => out.children);
    this.queue = [];
    if (lost.length) this.conn.lineage.loseAll(lost);
  }

  private resetMessageStreams(): void {
    if (this.orderedStream !== null) {
      this.conn.reset(this.orderedStream);
      this.orderedStream = null;
    }
    for (const sid of this.msgStreams.values()) this.conn.reset(sid);
    this.msgStreams.clear();
  }

  /** Release streams and the queue when the machine is destroyed; returns the children of
   * unsent messages (lost locally). */
  teardown(resetCtrl: boolean): number[] {
    this.alive = false;
    const lost = this.queue.flatMap((out) => out.children);
    this.queue = [];
    this.resetMessageStreams();
    if (this.ctrlStream !== null) {
      if (resetCtrl) this.conn.reset(this.ctrlStream);
      else this.conn.write(this.ctrlStream, new Uint8Array(0), true);
      this.ctrlStream = null;
    }
    return lost;
  }
}
