/**
 * The receiver state machine (profile §3 "Receiver", oneshots, §4 credit), moved only
 * through TRANSITIONS:
 *
 *     OPEN --FINISH_SENDER--> FINISH_PENDING --COMPLETE--> CLOSED
 *     OPEN --CANCEL_SENDER or APP_CLOSE--> CLOSED <--APP_CLOSE-- FINISH_PENDING
 *     OPEN or FINISH_PENDING --ABANDON--> ABANDONED
 *
 * "Received means acked": every message is acked within the ack delay and before
 * CLOSE_RECEIVER (G17), all on one control stream, which also carries DEQUEUED.
 */
import {
  CloseCode,
  type Message,
  RemoteProtocolError,
  Writer,
  encodeAckNackRuns,
  encodeAckReliable,
  encodeFrames,
  pushFrame,
  type Bytes,
} from "../wire/index.js";
import type { EngineConfig } from "./config.js";
import { Terminal } from "./events.js";
import { RangeSet } from "./rangeset.js";

export type RecvState = "open" | "finish pending" | "closed" | "abandoned";
export type RecvInput =
  | "MESSAGE"
  | "SENT_UNRELIABLE"
  | "FINISH_SENDER"
  | "CANCEL_SENDER"
  | "complete"
  | "application close"
  | "abandon";

/** Every allowed (state, input) and where it leads; any other pair is refused. */
export const TRANSITIONS: ReadonlyMap<string, RecvState> = new Map([
  ["open|MESSAGE", "open"],
  ["open|SENT_UNRELIABLE", "open"],
  ["open|FINISH_SENDER", "finish pending"],
  ["open|CANCEL_SENDER", "closed"],
  ["open|application close", "closed"],
  ["open|abandon", "abandoned"],
  ["finish pending|MESSAGE", "finish pending"],
  ["finish pending|complete", "closed"],
  ["finish pending|application close", "closed"],
  ["finish pending|abandon", "abandoned"],
]);
const FROM_PEER: ReadonlySet<RecvInput> = new Set(["MESSAGE", "SENT_UNRELIABLE", "FINISH_SENDER", "CANCEL_SENDER"]);
const REFUSED: Partial<Record<RecvInput, string>> = {
  SENT_UNRELIABLE: "SENT_UNRELIABLE after FINISH_SENDER or CANCEL_SENDER",
  FINISH_SENDER: "a second FINISH_SENDER, or FINISH after CANCEL",
  CANCEL_SENDER: "a second CANCEL_SENDER, or CANCEL after FINISH",
};

/** What a receiver uses of its connection. */
export interface ReceiverHost {
  readonly config: EngineConfig;
  readonly now: number;
  readonly ownWindow: number | null;
  unreliableDeadline(): number;
  schedule(delay: number, callback: () => void): void;
  scheduleAt(when: number, callback: () => void): void;
  ctrlWrite(sm: { chanid: number; ctrlStream: number | null }, data: Bytes, fin?: boolean): void;
  messageArrived(rm: ReceiverSM, frame: Message): number;
  receiverClosed(rm: ReceiverSM, terminal: Terminal): void;
}

export class ReceiverSM {
  state: RecvState = "open";
  /** Reliable numbers received at or above relBase. */
  private received = new RangeSet();
  /** Lowest reliable number not yet acked (the ACK_RELIABLE base, G8). */
  private relBase = 0;
  private relUnacked: number[] = [];
  /** Unreliable numbers below this are decided (the ACK_NACK base, G9). */
  private unrelCursor = 0;
  private unrelPending = new RangeSet();
  /** Unreliable numbers below this are known to have been sent (G14). */
  private unrelKnown = 0;
  private unrelDeclared = 0;
  private deadlines: Array<[number, number]> = [];
  private deadlineArmed = false;
  private ackArmed = false;
  private finishCount: number | null = null;
  ctrlStream: number | null = null;
  /** Flow control: bytes received minus bytes reported dequeued. */
  inFlight = 0;
  private unreported = 0;
  private deqArmed = false;
  /** A window below the connection's for this channel (a server's entrypoint). */
  windowCap: number | null = null;

  constructor(
    readonly conn: ReceiverHost,
    readonly chanid: number,
    readonly oneshot: boolean,
  ) {}

  get alive(): boolean {
    return this.state === "open" || this.state === "finish pending";
  }

  private move(input: RecvInput): void {
    const next = TRANSITIONS.get(`${this.state}|${input}`);
    if (next === undefined) {
      if (FROM_PEER.has(input)) throw new RemoteProtocolError(REFUSED[input] ?? `${input} in receiver state ${this.state}`);
      throw new Error(`engine bug: ${input} in receiver state ${this.state}`);
    }
    this.state = next;
  }

  /** The application closed it (or its carrying message was discarded): final acks, CLOSE. */
  close(): void {
    this.move("application close");
    this.conn.receiverClosed(this, Terminal.CLOSED);
  }

  /** Destroyed without CLOSE: timers fall silent; the control stream is the connection's. */
  abandon(): void {
    this.move("abandon");
  }

  // -- frames from the sender ---------------------------------------------------------------

  onMessage(frame: Message, datagram: boolean, reserved = 0): void {
    this.move("MESSAGE");
    const n = frame.num;
    if (datagram) {
      if (this.oneshot) throw new RemoteProtocolError("a oneshot message arrived in a datagram");
      if (n < this.unrelCursor) return; // decided already: a nacked message is never delivered
      if (this.unrelPending.has(n)) throw new RemoteProtocolError(`duplicate unreliable MESSAGE_NUM ${n}`);
      if (this.finishCount !== null && n >= this.unrelDeclared)
        throw new RemoteProtocolError("unreliable MESSAGE_NUM beyond the declared total");
      this.checkGap(n, this.unrelCursor, "unreliable");
      this.unrelPending.add(n);
      this.raiseKnown(n + 1);
    } else {
      if (n < this.relBase || this.received.has(n)) throw new RemoteProtocolError(`duplicate reliable MESSAGE_NUM ${n}`);
      if (this.finishCount !== null && n >= this.finishCount)
        throw new RemoteProtocolError(`MESSAGE_NUM ${n} is beyond FINISH_SENDER's count`);
      if (this.oneshot && n !== 0) throw new RemoteProtocolError("a oneshot channel carries only message 0");
      this.checkGap(n, this.relBase, "reliable");
      this.received.add(n);
      this.relUnacked.push(n);
    }
    const cost = this.conn.messageArrived(this, frame);
    this.charge(cost, reserved, false);
    if (this.oneshot) {
      this.finishCount = 1; // message 0 means "finished with 1"
      if (this.state === "open") this.move("FINISH_SENDER");
      this.checkComplete();
      return;
    }
    if (!this.ackArmed) {
      this.ackArmed = true;
      this.conn.schedule(this.conn.config.ackDelay, () => this.ackTimer());
    }
    if (this.finishCount !== null) this.checkComplete();
  }

  onSentUnreliable(count: number): void {
    if (this.oneshot) throw new RemoteProtocolError("SENT_UNRELIABLE on a oneshot channel");
    this.move("SENT_UNRELIABLE");
    this.unrelDeclared += count;
    if (this.unrelDeclared > Number.MAX_SAFE_INTEGER) throw new RemoteProtocolError("SENT_UNRELIABLE total overflows");
    if (count) this.checkGap(this.unrelDeclared - 1, this.unrelCursor, "unreliable");
    this.raiseKnown(this.unrelDeclared);
  }

  /** G31: a number at most maxMessageGap beyond the lowest undecided one. */
  private checkGap(n: number, cursor: number, space: string): void {
    const limit = this.conn.config.maxMessageGap;
    if (n - cursor >= limit)
      throw new RemoteProtocolError(
        `${space} MESSAGE_NUM ${n} is ${n - cursor} beyond the lowest undecided number ${cursor}; at most ${limit} are allowed (G31)`,
        CloseCode.LIMIT_VIOLATION,
      );
  }

  /** The head of a MESSAGE costing `cost` arrived, its payload still coming: charge now. */
  reserve(cost: number): void {
    this.charge(cost, 0, true);
  }

  private charge(cost: number, already: number, unfinished: boolean): void {
    const window = this.window();
    if (window === null) return;
    this.inFlight += cost - already;
    if (this.inFlight > window && this.inFlight !== cost) {
      const what = unfinished ? "an unfinished message" : "a message";
      throw new RemoteProtocolError(
        `sender exceeded the flow-control window with ${what} (${this.inFlight} > ${window})`,
        CloseCode.LIMIT_VIOLATION,
      );
    }
  }

  private window(): number | null {
    const window = this.conn.ownWindow;
    if (window === null || this.windowCap === null) return window;
    return Math.min(window, this.windowCap);
  }

  /** An unfinished message charged by reserve() was dropped (its stream reset). */
  release(cost: number): void {
    if (this.conn.ownWindow !== null) this.inFlight -= cost;
  }

  onFinish(count: number): void {
    this.move("FINISH_SENDER");
    if (this.oneshot && count > 1) throw new RemoteProtocolError("FINISH_SENDER > 1 on a oneshot channel");
    if (Math.max(this.received.top(), this.relBase) > count)
      throw new RemoteProtocolError("FINISH_SENDER count below a received MESSAGE_NUM");
    if (this.unrelKnown > this.unrelDeclared)
      throw new RemoteProtocolError("unreliable messages beyond SENT_UNRELIABLE's total");
    this.finishCount = count;
    this.checkComplete();
  }

  onCancel(): void {
    this.move("CANCEL_SENDER");
    this.conn.receiverClosed(this, Terminal.CANCELLED);
  }

  // -- completion ---------------------------------------------------------------------------

  private checkComplete(): void {
    if (this.state !== "finish pending") return;
    if (this.received.firstGap(this.relBase) < this.finishCount!) return;
    if (this.unrelPending.firstGap(this.unrelCursor) < this.unrelDeclared) return; // never nack early
    this.move("complete");
    this.conn.receiverClosed(this, Terminal.FINISHED);
  }

  // -- unreliable deadlines ----------------------------------------------------------------

  private raiseKnown(upto: number): void {
    if (upto <= this.unrelKnown) return;
    this.unrelKnown = upto;
    this.deadlines.push([this.conn.now + this.conn.unreliableDeadline(), upto]);
    if (!this.deadlineArmed) {
      this.deadlineArmed = true;
      this.conn.scheduleAt(this.deadlines[0]![0], () => this.deadlineTimer());
    }
  }

  private deadlineTimer(): void {
    this.deadlineArmed = false;
    if (!this.alive) return;
    const now = this.conn.now;
    let upto = this.unrelCursor;
    while (this.deadlines.length && this.deadlines[0]![0] <= now) upto = Math.max(upto, this.deadlines.shift()![1]);
    const w = new Writer();
    this.pushAcks(w, upto);
    if (w.length) this.conn.ctrlWrite(this, w.finish());
    if (this.deadlines.length) {
      this.deadlineArmed = true;
      this.conn.scheduleAt(this.deadlines[0]![0], () => this.deadlineTimer());
    }
    this.checkComplete();
  }

  // -- acks -----------------------------------------------------------------------------------

  private ackTimer(): void {
    this.ackArmed = false;
    if (!this.alive) return;
    const w = new Writer();
    this.pushAcks(w);
    if (w.length) this.conn.ctrlWrite(this, w.finish());
  }

  /** Ack every received message, and decide unreliable numbers below `decideUpto`. */
  private pushAcks(w: Writer, decideUpto = 0): void {
    if (this.relUnacked.length) {
      pushFrame(w, { type: "ACK_RELIABLE", ranges: encodeAckReliable(this.relBase, this.relUnacked) });
      this.relUnacked = [];
      this.relBase = this.received.firstGap(this.relBase);
      this.received.discardBelow(this.relBase);
    }
    const cursor = this.unrelCursor;
    const upto = this.unrelPending.firstGap(Math.max(cursor, decideUpto));
    if (upto > cursor) {
      const acked = this.unrelPending.rangesWithin(cursor, upto);
      pushFrame(w, { type: "ACK_NACK_UNRELIABLE", ranges: encodeAckNackRuns(cursor, upto, acked) });
      this.unrelPending.discardBelow(upto);
      this.unrelCursor = upto;
    }
  }

  /** Acks for everything received, then CLOSE_RECEIVER (G17). */
  finalAcks(): Bytes {
    const w = new Writer();
    this.pushAcks(w, this.unrelPending.top());
    pushFrame(w, { type: "CLOSE_RECEIVER" });
    return w.finish();
  }

  // -- flow control ---------------------------------------------------------------------------

  /** The application took `cost` bytes: report them (at half the window, or after a delay). */
  dequeued(cost: number): void {
    const window = this.window();
    if (window === null || !this.alive) return;
    this.unreported += cost;
    if (this.unreported * 2 >= window) this.reportDequeued();
    else if (!this.deqArmed) {
      this.deqArmed = true;
      this.conn.schedule(this.conn.config.dequeuedDelay, () => this.deqTimer());
    }
  }

  private deqTimer(): void {
    this.deqArmed = false;
    if (this.alive && this.unreported) this.reportDequeued();
  }

  private reportDequeued(): void {
    const n = this.unreported;
    this.unreported = 0;
    this.inFlight -= n;
    this.conn.ctrlWrite(this, encodeFrames({ type: "DEQUEUED", numBytes: n }));
  }
}
