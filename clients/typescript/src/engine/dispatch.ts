/**
 * Frames in: parsing each stream and datagram, routing its frames, charging their bytes.
 * Prelude frames go to the handshake at once; routed frames wait, per sequence and in order,
 * for the peer's CONNECTION_HEADERS, then have their direction checked against the chanid's
 * bits before they reach a state machine. A MESSAGE still arriving is charged when its head
 * arrives, so memory grows only with what we granted, never with what a peer announces.
 */
import {
  type Bytes,
  CloseCode,
  type Frame,
  type Headers,
  type MessageHead,
  RemoteProtocolError,
  type Side,
  StreamParser,
  costOf,
  parseDatagram,
} from "../wire/index.js";
import type { EngineConfig } from "./config.js";
import { Handshake, type ServerHeaders } from "./handshake.js";
import type { ReceiverSM } from "./receiver.js";

const SENDER_FRAMES = new Set(["MESSAGE", "SENT_UNRELIABLE", "FINISH_SENDER", "CANCEL_SENDER"]);

/** One incoming frame sequence (a stream or a datagram) and its routing state. */
class FrameSequence {
  route = -1;
  ignore = false;
  checked = false;
  pending: Frame[] = [];
  /** Bytes of an incomplete frame head the parser holds, as last counted. */
  fragment = 0;
  reservedHead: MessageHead | null = null;
  /** [receiver charged, bytes, also counted as loose bytes] for reservedHead. */
  reserved: [ReceiverSM | null, number, boolean] | null = null;
  constructor(readonly parser: StreamParser | null) {}
  get datagram(): boolean {
    return this.parser === null;
  }
}

export class Dispatch extends Handshake {
  private waiting: FrameSequence[] = [];
  private incoming = new Map<number, FrameSequence>();
  private loosePartial = 0;

  constructor(side: Side, config: Partial<EngineConfig> | undefined, headers: Headers, serverHeaders: ServerHeaders | null) {
    super(side, config, headers, serverHeaders);
  }

  // == transport inputs ========================================================================

  /** Bytes of a stream arrived. */
  streamData(streamId: number, data: Bytes, fin: boolean, now: number): void {
    if (this.closed) return;
    if (this.peerHeaders === null && !this.countEarly(data.length)) return;
    if (!this.earlyOk) {
      this.early.push(() => this.streamDataNow(streamId, data, fin, this.now));
      return;
    }
    this.streamDataNow(streamId, data, fin, now);
  }

  private streamDataNow(streamId: number, data: Bytes, fin: boolean, now: number): void {
    if (this.closed) return;
    this.now = now;
    let seq = this.incoming.get(streamId);
    if (seq && !fin && seq.parser && seq.parser.head === seq.reservedHead && seq.parser.absorb(data)) return;
    try {
      if (seq === undefined) {
        seq = new FrameSequence(new StreamParser(this.config.limits, this.config.flowWindow !== null));
        this.incoming.set(streamId, seq);
      }
      const parser = seq.parser!;
      if (data.length) {
        this.process(seq, parser.feed(data));
        if (parser.head !== seq.reservedHead) this.charge(seq);
        if (parser.fragmentBytes !== seq.fragment) this.countFragment(seq, parser.fragmentBytes);
      }
      if (fin) {
        this.incoming.delete(streamId);
        parser.finish();
      }
      this.afterInput();
    } catch (err) {
      if (!(err instanceof RemoteProtocolError)) throw err;
      this.fail(err);
    }
  }

  /** The peer reset a stream: a partial frame is dropped, earlier frames stand. */
  streamReset(streamId: number, now: number): void {
    if (this.closed) return;
    if (!this.earlyOk) {
      this.early.push(() => this.streamReset(streamId, this.now));
      return;
    }
    this.now = now;
    const seq = this.incoming.get(streamId);
    if (seq) {
      this.incoming.delete(streamId);
      this.uncharge(seq);
    }
  }

  datagramReceived(data: Bytes, now: number): void {
    if (this.closed) return;
    if (this.peerHeaders === null && !this.countEarly(data.length)) return;
    if (!this.earlyOk) {
      this.early.push(() => this.datagramNow(data, this.now));
      return;
    }
    this.datagramNow(data, now);
  }

  private datagramNow(data: Bytes, now: number): void {
    if (this.closed) return;
    this.now = now;
    try {
      const [frames] = parseDatagram(data, this.config.limits, this.config.flowWindow !== null);
      if (frames.length) {
        this.process(new FrameSequence(null), frames);
        this.afterInput();
      }
    } catch (err) {
      if (!(err instanceof RemoteProtocolError)) throw err;
      this.fail(err);
    }
  }

  // == routing ===================================================================================

  private process(seq: FrameSequence, frames: Frame[]): void {
    for (const frame of frames) {
      if (!seq.checked) {
        seq.checked = true;
        if (frame.type !== "VERSION" && !this.sentAckVersion)
          throw new RemoteProtocolError("a frame sequence without VERSION arrived before we sent ACK_VERSION");
      }
      if (frame.type === "VERSION") this.onVersion(frame.version);
      else if (frame.type === "ACK_VERSION") this.gotAckVersion = true;
      else if (frame.type === "CONNECTION_HEADERS") {
        this.onHeaders(frame.headers);
        this.releaseWaiting();
      } else if (this.peerHeaders === null) {
        if (seq.pending.length === 0) this.waiting.push(seq);
        seq.pending.push(frame);
      } else {
        this.routed(seq, frame);
      }
    }
  }

  private releaseWaiting(): void {
    const waiting = this.waiting;
    this.waiting = [];
    for (const seq of waiting) {
      const frames = seq.pending;
      seq.pending = [];
      for (const f of frames) this.routed(seq, f);
    }
    this.pumpAll();
  }

  private routed(seq: FrameSequence, frame: Frame): void {
    let reserved = 0;
    if (seq.reserved !== null && frame.type === "MESSAGE") {
      // The unfinished MESSAGE charged by charge() is complete: this is it.
      const [charged, cost, loose] = seq.reserved;
      reserved = cost;
      seq.reserved = null;
      if (loose) this.loosePartial -= cost;
      if (charged === null || charged !== this.receivers.get(seq.route)) {
        charged?.release(cost);
        reserved = 0;
      }
    }
    if (frame.type === "ROUTE_TO") {
      seq.route = frame.chanid;
      this.resolve(seq, seq.route);
      return;
    }
    const chanid = seq.route;
    const weSend = this.weSend(chanid);
    if (frame.type === "FORGET_CHANNEL") {
      if (this.ours(chanid)) throw new RemoteProtocolError("FORGET_CHANNEL for a channel the peer did not create");
    } else if (SENDER_FRAMES.has(frame.type)) {
      if (weSend) throw new RemoteProtocolError(`${frame.type} routed to a channel we send on`);
    } else if (!weSend) {
      throw new RemoteProtocolError(`${frame.type} routed to a channel we receive on`);
    } else if (frame.type === "DEQUEUED" && this.ownWindow === null) {
      throw new RemoteProtocolError("DEQUEUED (tag 12) without negotiated flow control");
    }
    if (frame.type === "FORGET_CHANNEL") {
      // The creator declares the channel gone; this reaches a retained endpoint even when
      // the tombstone hides the state machine.
      const sm = weSend ? this.senders.get(chanid) : undefined;
      if (sm) this.senderForgotten(sm);
      else this.forgotten(chanid);
      return;
    }
    if (seq.ignore) return;
    if (weSend) {
      const sm = this.senders.get(chanid);
      if (sm === undefined) this.missing(seq, chanid);
      else if (frame.type === "ACK_RELIABLE") sm.onAckReliable(frame.ranges);
      else if (frame.type === "ACK_NACK_UNRELIABLE") sm.onAckNack(frame.ranges);
      else if (frame.type === "DEQUEUED") sm.onDequeued(frame.numBytes);
      else this.senderClosed(sm);
      return;
    }
    const rm = this.receivers.get(chanid);
    if (rm === undefined) this.missing(seq, chanid);
    else if (frame.type === "MESSAGE") rm.onMessage(frame, seq.datagram, reserved);
    else if (frame.type === "SENT_UNRELIABLE") rm.onSentUnreliable(frame.count);
    else if (frame.type === "FINISH_SENDER") rm.onFinish(frame.sentReliable);
    else rm.onCancel();
  }

  /** ROUTE_TO: find (or, for peer-created channels, create) the channel state. */
  private resolve(seq: FrameSequence, chanid: number): void {
    const sp = chanid % 8;
    const table: Map<number, unknown> = this.weSend(chanid) ? this.senders : this.receivers;
    if (this.ours(chanid)) {
      if (Math.floor(chanid / 8) >= this.nextIndex[sp]!)
        throw new RemoteProtocolError(`ROUTE_TO names chanid ${chanid}, never allocated`);
      if (!table.has(chanid)) this.missing(seq, chanid);
    } else if (this.tombstones[sp]!.has(Math.floor(chanid / 8))) {
      seq.ignore = true; // late frames for a destroyed channel (G19)
    } else if (!table.has(chanid)) {
      this.createRemote(chanid, false);
    }
  }

  /** No state for the routed channel: FORGET if we created it, else ignore. */
  private missing(seq: FrameSequence, chanid: number): void {
    seq.ignore = true;
    if (this.ours(chanid)) this.forget(chanid);
  }

  // == memory ======================================================================================

  private charge(seq: FrameSequence): void {
    const head = seq.parser!.head;
    if (head === null) {
      seq.reservedHead = null;
      return;
    }
    if (this.peerHeaders === null) return; // routes are not resolved yet; countEarly counts
    seq.reservedHead = head;
    const cost = costOf(head.payloadLen, head.attachments.length); // the head's bytes aside
    const rm = seq.ignore ? null : (this.receivers.get(seq.route) ?? null);
    const loose = rm === null || !this.endpoints.get(rm.chanid)!.attached;
    seq.reserved = [rm, cost, loose];
    rm?.reserve(cost);
    if (loose) {
      this.loosePartial += cost;
      if (this.unattachedBytes + this.loosePartial > this.config.maxPendingBytes)
        throw new RemoteProtocolError("too many bytes of unfinished messages for channels that are not attached", CloseCode.LIMIT_VIOLATION);
    }
  }

  private countFragment(seq: FrameSequence, nbytes: number): void {
    const grew = nbytes > seq.fragment;
    this.loosePartial += nbytes - seq.fragment;
    seq.fragment = nbytes;
    if (grew && this.unattachedBytes + this.loosePartial > this.config.maxPendingBytes)
      throw new RemoteProtocolError("too many bytes of unfinished frames across streams", CloseCode.LIMIT_VIOLATION);
  }

  private uncharge(seq: FrameSequence): void {
    this.loosePartial -= seq.fragment;
    seq.fragment = 0;
    if (seq.reserved === null) return;
    const [charged, cost, loose] = seq.reserved;
    seq.reserved = null;
    charged?.release(cost);
    if (loose) this.loosePartial -= cost;
  }

  protected override dropState(detail: string): void {
    super.dropState(detail);
    this.incoming.clear();
    this.waiting = [];
  }
}
