/**
 * The channel tables: creating, attaching, ending and forgetting channels. Each channel has
 * two objects, its state machine (sender.ts, receiver.ts) and the application's Endpoint;
 * peer-created channels that ended leave a tombstone (G19), channels we created a lineage
 * node (lineage.ts), and peer-created channels not attached yet are capped.
 */
import {
  type Attachment,
  CloseCode,
  ENTRYPOINT,
  type Headers,
  type Message,
  RemoteProtocolError,
  Side,
  encodeFrames,
  messageCost,
} from "../wire/index.js";
import type { EngineConfig } from "./config.js";
import { Endpoint } from "./endpoint.js";
import { Terminal } from "./events.js";
import { Lineage, type LineageNode } from "./lineage.js";
import { Output } from "./output.js";
import { RangeSet } from "./rangeset.js";
import { ReceiverSM } from "./receiver.js";
import { SenderSM } from "./sender.js";

/** A channel to create and attach to an outgoing message. `keepSender`: our side keeps the
 * sender half (the peer receives); otherwise the peer gets the sender. */
export interface NewChannel {
  readonly keepSender: boolean;
  readonly oneshot?: boolean;
  readonly headers?: Headers;
}

const FORGET_BYTES = encodeFrames({ type: "FORGET_CHANNEL" });
const space = (chanid: number) => chanid % 8;
const index = (chanid: number) => Math.floor(chanid / 8);
const bit = (chanid: number, n: number) => Math.floor(chanid / 2 ** n) % 2;

export class ChannelTables extends Output {
  protected nextIndex = [0, 0, 0, 0, 0, 0, 0, 0];
  protected tombstones = Array.from({ length: 8 }, () => new RangeSet());
  protected attachedEver = Array.from({ length: 8 }, () => new RangeSet());
  private forgetLog = new Map<number, number>();
  readonly senders = new Map<number, SenderSM>();
  readonly receivers = new Map<number, ReceiverSM>();
  readonly endpoints = new Map<number, Endpoint>();
  readonly lineage: Lineage;
  protected unattached = 0;
  protected unattachedBytes = 0;
  /** Credit the peer grants each of our senders; null without flow control. */
  peerWindow: number | null;
  /** Credit we grant each of the peer's senders, once both sides advertised it. */
  ownWindow: number | null = null;

  constructor(side: Side, config?: Partial<EngineConfig>) {
    super(side, config);
    this.lineage = new Lineage((chanid, node) => this.onLost(chanid, node));
    this.peerWindow = this.config.flowWindow === null ? null : 1;
    if (side === Side.CLIENT) {
      this.senders.set(ENTRYPOINT, new SenderSM(this, ENTRYPOINT, false));
      this.endpoints.set(ENTRYPOINT, new Endpoint(ENTRYPOINT, true, true, true));
      this.lineage.add(ENTRYPOINT, true, true);
      this.nextIndex[0] = 1;
    }
  }

  /** Is the sender of `chanid` on our side? */
  protected weSend(chanid: number): boolean {
    return bit(chanid, 1) === this.side;
  }
  /** Did we create `chanid`? */
  protected ours(chanid: number): boolean {
    return chanid % 2 === this.side;
  }

  // == used by the state machines ============================================================

  routeSent(chanid: number): void {
    const node = this.lineage.nodes.get(chanid);
    if (node) node.routeToSent = true;
  }

  /** Write on the channel's control stream, opening it with ROUTE_TO first (G21). */
  ctrlWrite(sm: { chanid: number; ctrlStream: number | null }, data: Uint8Array, fin = false): void {
    if (sm.ctrlStream === null) {
      sm.ctrlStream = this.openStream();
      const prefix = this.seqPrefix(sm.chanid);
      const joined = new Uint8Array(prefix.length + data.length);
      joined.set(prefix);
      joined.set(data, prefix.length);
      data = joined;
      this.routeSent(sm.chanid);
    }
    this.write(sm.ctrlStream, data, fin);
    if (fin) sm.ctrlStream = null;
  }

  /** A receiver accepted `frame`: create its attachments and queue it. */
  messageArrived(rm: ReceiverSM, frame: Message): number {
    const ep = this.endpoints.get(rm.chanid)!;
    for (const att of frame.attachments) this.attach(att);
    const cost = this.ownWindow !== null ? messageCost(frame) : frame.payload.length;
    ep.queue.push({ message: frame, cost });
    ep.buffered += cost;
    if (!ep.attached) {
      this.unattachedBytes += cost;
      if (this.unattachedBytes > this.config.maxPendingBytes)
        throw new RemoteProtocolError("too many bytes buffered in channels that are not attached yet", CloseCode.LIMIT_VIOLATION);
    }
    if (ep.held) this.eventQueue.push({ kind: "message", chanid: rm.chanid });
    return cost;
  }

  /** Final acks and CLOSE_RECEIVER, then the machine goes (finish, cancel, app close). */
  receiverClosed(rm: ReceiverSM, terminal: Terminal): void {
    this.ctrlWrite(rm, rm.finalAcks(), true);
    this.receivers.delete(rm.chanid);
    const ep = this.endpoints.get(rm.chanid)!;
    this.setTerminal(ep, terminal);
    if (terminal !== Terminal.FINISHED) this.discardQueue(ep);
    this.smDestroyed(rm.chanid);
  }

  // == channel state ===========================================================================

  protected mint(spec: NewChannel): number {
    const oneshot = spec.oneshot ?? false;
    const senderBit = spec.keepSender ? this.side : 1 - this.side;
    const sp = this.side + 2 * senderBit + (oneshot ? 4 : 0);
    const idx = this.nextIndex[sp]!;
    this.nextIndex[sp] = idx + 1;
    const chanid = sp + 8 * idx;
    if (spec.keepSender) this.senders.set(chanid, new SenderSM(this, chanid, oneshot));
    else this.receivers.set(chanid, new ReceiverSM(this, chanid, oneshot));
    this.endpoints.set(chanid, new Endpoint(chanid, spec.keepSender, true, true, spec.headers ?? []));
    this.lineage.add(chanid, spec.keepSender, false);
    return chanid;
  }

  /** State for a channel the peer created, from ROUTE_TO or from an attachment. */
  protected createRemote(chanid: number, attached: boolean): Endpoint {
    if (this.senders.size + this.receivers.size >= this.config.maxChannels)
      throw new RemoteProtocolError(
        `more than ${this.config.maxChannels} live channels on one connection (channels stay until the peer closes its end)`,
        CloseCode.LIMIT_VIOLATION,
      );
    if (!attached && this.unattached >= this.config.maxPendingChannels)
      throw new RemoteProtocolError("too many channels that are not attached yet", CloseCode.LIMIT_VIOLATION);
    const oneshot = bit(chanid, 2) === 1;
    const weSend = this.weSend(chanid);
    let rm: ReceiverSM | null = null;
    if (weSend) {
      this.senders.set(chanid, new SenderSM(this, chanid, oneshot));
      // The peer kept the receiver: what we attach on this channel needs no ancestry.
      this.lineage.add(chanid, true, true);
    } else {
      rm = new ReceiverSM(this, chanid, oneshot);
      this.receivers.set(chanid, rm);
    }
    const ep = new Endpoint(chanid, weSend, attached);
    this.endpoints.set(chanid, ep);
    if (!attached) {
      this.unattached++;
      // Send-back ROUTE_TO on our receiver's control stream (G21, refined: not from a
      // sender), so a creator that no longer knows the channel answers FORGET.
      if (rm) this.ctrlWrite(rm, new Uint8Array(0));
    }
    return ep;
  }

  protected attach(att: Attachment): void {
    const chanid = att.chanid;
    if (this.ours(chanid)) throw new RemoteProtocolError(`attachment ${chanid} was not created by the message's sender`);
    const sp = space(chanid);
    const idx = index(chanid);
    if (this.attachedEver[sp]!.has(idx)) throw new RemoteProtocolError(`chanid ${chanid} attached twice`);
    this.attachedEver[sp]!.add(idx);
    let ep = this.endpoints.get(chanid);
    if (ep === undefined) {
      if (this.tombstones[sp]!.has(idx)) {
        // Destroyed and forgotten before its message arrived: it can only be lost.
        ep = new Endpoint(chanid, this.weSend(chanid), true);
        ep.setTerminal(Terminal.LOST_IN_TRANSIT);
        this.endpoints.set(chanid, ep);
      } else {
        ep = this.createRemote(chanid, true);
      }
    } else if (!ep.attached) {
      ep.attached = true;
      this.unattached--;
      this.unattachedBytes -= ep.buffered;
    }
    ep.headers = att.headers;
  }

  protected smDestroyed(chanid: number): void {
    if (!this.ours(chanid)) this.tombstones[space(chanid)]!.add(index(chanid));
    this.lineage.smGone(chanid);
    const ep = this.endpoints.get(chanid);
    if (ep) this.maybeFree(ep);
  }

  protected maybeFree(ep: Endpoint): void {
    const chanid = ep.chanid;
    if (!ep.appDone || this.senders.has(chanid) || this.receivers.has(chanid)) return;
    if (this.endpoints.delete(chanid) && !ep.attached) {
      this.unattached--;
      this.unattachedBytes -= ep.buffered;
    }
  }

  protected setTerminal(ep: Endpoint, terminal: Terminal): void {
    if (ep.setTerminal(terminal)) this.eventQueue.push({ kind: "terminated", chanid: ep.chanid, terminal });
  }

  /** FORGET from the creator to our sender (G28, refined): a held handle only stops (the
   * CLOSE with the final acks is still in flight); otherwise the channel is lost. */
  protected senderForgotten(sm: SenderSM): void {
    const ep = this.endpoints.get(sm.chanid)!;
    if (!ep.held) this.forgotten(sm.chanid);
    else if (sm.state === "open") {
      sm.receiverGone();
      this.setTerminal(ep, Terminal.RECEIVER_DROPPED);
    }
  }

  /** CLOSE_RECEIVER: every number not yet acked is nacked. */
  protected senderClosed(sm: SenderSM): void {
    sm.nackEverything();
    const ep = this.endpoints.get(sm.chanid)!;
    this.setTerminal(ep, sm.state === "finishing" ? Terminal.FINISHED : Terminal.RECEIVER_DROPPED);
    this.senders.delete(sm.chanid);
    this.blocked.delete(sm.chanid);
    const lost = sm.teardown(false);
    this.smDestroyed(sm.chanid);
    if (lost.length) this.lineage.loseAll(lost);
  }

  /** FORGET from the creator of a channel we did not create: a held handle ignores it;
   * otherwise the channel is lost, silently. */
  protected forgotten(chanid: number): void {
    const ep = this.endpoints.get(chanid);
    if (ep === undefined || ep.held) return;
    this.setTerminal(ep, Terminal.LOST_IN_TRANSIT);
    this.destroySilently(chanid);
  }

  /** Destroy a peer-created channel, and those in its queue, without CLOSE or CANCEL. */
  private destroySilently(root: number): void {
    const work = [root];
    while (work.length) {
      const chanid = work.pop()!;
      const ep = this.endpoints.get(chanid);
      const sm = this.senders.get(chanid);
      const rm = this.receivers.get(chanid);
      if (sm) {
        this.senders.delete(chanid);
        sm.teardown(true);
      } else if (rm) {
        this.receivers.delete(chanid);
        rm.abandon();
        if (rm.ctrlStream !== null) this.reset(rm.ctrlStream);
      }
      if (ep) {
        this.setTerminal(ep, Terminal.LOST_IN_TRANSIT);
        for (const item of ep.items()) work.push(...item.message.attachments.map((a) => a.chanid));
        ep.clearQueue();
        if (chanid === root && ep.attached) ep.buffered = 0;
        else ep.appDone = true;
      }
      if (sm || rm) this.smDestroyed(chanid);
      else if (ep) this.maybeFree(ep);
    }
  }

  protected cancelSender(ep: Endpoint): void {
    const sm = this.senders.get(ep.chanid);
    if (sm && sm.state === "open") {
      sm.cancel();
      this.setTerminal(ep, Terminal.CANCELLED);
    }
  }

  /** Messages the application will never take: end their attachments normally. */
  protected discardQueue(first: Endpoint): void {
    const work = [first];
    while (work.length) {
      const current = work.pop()!;
      const items = current.items();
      current.clearQueue();
      if (!current.attached) this.unattachedBytes -= current.buffered;
      current.buffered = 0;
      for (const item of items) {
        for (const att of item.message.attachments) {
          const child = this.endpoints.get(att.chanid);
          if (child === undefined || child.appDone) continue;
          child.appDone = true;
          if (child.isSender) this.cancelSender(child);
          else {
            this.receivers.get(child.chanid)?.close();
            work.push(child);
          }
          this.maybeFree(child);
        }
      }
    }
  }

  /** lose(X) for a channel we created: its local effects. */
  private onLost(chanid: number, node: LineageNode): number[] {
    let lost: number[] = [];
    const sm = this.senders.get(chanid);
    if (sm) {
      this.senders.delete(chanid);
      this.blocked.delete(chanid);
      lost = sm.teardown(true);
    } else {
      const rm = this.receivers.get(chanid);
      if (rm) {
        this.receivers.delete(chanid);
        rm.abandon();
        if (rm.ctrlStream !== null) this.reset(rm.ctrlStream);
      }
    }
    const ep = this.endpoints.get(chanid);
    if (ep) {
      this.setTerminal(ep, Terminal.LOST_IN_TRANSIT);
      this.discardQueue(ep);
      this.maybeFree(ep);
    }
    if (node.routeToSent) this.forget(chanid);
    return lost;
  }

  /** FORGET_CHANNEL on a fresh stream, at most once per channel per interval (G20). */
  protected forget(chanid: number): void {
    const last = this.forgetLog.get(chanid);
    if (last !== undefined && this.now - last < this.config.forgetInterval) return;
    if (this.forgetLog.size === 0) this.schedule(this.config.forgetInterval, () => this.pruneForgetLog());
    this.forgetLog.set(chanid, this.now);
    const prefix = this.seqPrefix(chanid);
    const data = new Uint8Array(prefix.length + FORGET_BYTES.length);
    data.set(prefix);
    data.set(FORGET_BYTES, prefix.length);
    this.write(this.openStream(), data, true);
  }

  private pruneForgetLog(): void {
    const horizon = this.now - this.config.forgetInterval;
    for (const [c, t] of this.forgetLog) if (t <= horizon) this.forgetLog.delete(c);
    if (this.forgetLog.size) this.schedule(this.config.forgetInterval, () => this.pruneForgetLog());
  }

  protected pumpAll(): void {
    for (const sm of [...this.senders.values()]) if (sm.alive && sm.queue.length) sm.pump();
  }

  protected override dropState(detail: string): void {
    super.dropState(detail);
    for (const ep of [...this.endpoints.values()]) {
      if (ep.terminal !== Terminal.FINISHED) {
        ep.clearQueue();
        ep.buffered = 0;
      }
      this.setTerminal(ep, Terminal.CONNECTION_LOST);
      ep.detail = ep.detail || detail;
      if (ep.appDone || !ep.held) this.endpoints.delete(ep.chanid);
    }
    for (const sm of this.senders.values()) sm.alive = false;
    for (const rm of this.receivers.values()) if (rm.alive) rm.abandon();
    this.senders.clear();
    this.receivers.clear();
    this.lineage.nodes.clear();
    this.forgetLog.clear();
    this.unattached = this.unattachedBytes = 0;
  }
}
