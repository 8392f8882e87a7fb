/**
 * The sans-IO Aqueduct connection: the transport feeds it what its streams and datagrams
 * bring (`streamData`, `streamReset`, `datagramReceived`, `handshakeDone`,
 * `connectionLost`) with the current time; the application calls `send`, `recv`, `finish`,
 * `cancel`, `closeReceiver`. Both take their answers from `commands()` (for the transport)
 * and `events()` (for the application), and `nextTimer()` says when to call `handleTimer`.
 * No sockets, no clock, no event loop: the same object runs over WebTransport, over the
 * multiplexer inside a WebSocket, and in memory in the tests.
 *
 * Written from docs/protocol-profile.md (§1-§4), layered like the Python engine (output ->
 * channels -> handshake -> dispatch -> connection), not translated from it.
 */
import {
  type Attachment,
  type Bytes,
  ChannelClosed,
  CloseCode,
  ConnectionLost,
  EndOfChannel,
  type Headers,
  LocalProtocolError,
  type Message,
  RemoteProtocolError,
  type Side,
} from "../wire/index.js";
import type { NewChannel } from "./channels.js";
import type { EngineConfig } from "./config.js";
import { Dispatch } from "./dispatch.js";
import type { Endpoint } from "./endpoint.js";
import { Terminal, terminalError } from "./events.js";
import type { ServerHeaders } from "./handshake.js";
import type { Mode, QueuePolicy } from "./sender.js";

export class Connection extends Dispatch {
  constructor(
    side: Side,
    opts: { config?: Partial<EngineConfig>; headers?: Headers; serverHeaders?: ServerHeaders } = {},
  ) {
    super(side, opts.config, opts.headers ?? [], opts.serverHeaders ?? null);
  }

  // == transport inputs ==========================================================================

  /** The transport closed (by the peer, an idle timeout or the network). */
  connectionLost(now: number, code: number = CloseCode.INTERNAL, reason = ""): void {
    if (this.closed) return;
    this.now = now;
    this.terminate(code, reason, true, null);
  }

  handleTimer(now: number): void {
    if (this.closed) return;
    this.now = now;
    try {
      this.runTimers(now);
      this.afterInput();
    } catch (err) {
      if (!(err instanceof RemoteProtocolError)) throw err;
      this.fail(err);
    }
  }

  updateRtt(rtt: number): void {
    this.rtt = rtt;
  }

  /** The transport holds `nbytes` not yet sent; senders pause above `budget`. True if
   * paused senders resumed (there may be new commands). */
  setTransportBacklog(nbytes: number, budget: number | null): boolean {
    this.txBacklog = nbytes;
    this.txBudget = budget;
    if (this.blocked.size === 0 || !this.transportReady()) return false;
    const blocked = [...this.blocked.values()];
    this.blocked.clear();
    for (const sm of blocked) if (sm.alive) sm.pump();
    return true;
  }

  // == application API =============================================================================

  /** Queue a message on sender `chanid`; returns the chanids minted for `attachments`. */
  send(chanid: number, payload: Bytes, now: number, opts: { headers?: Headers; attachments?: readonly NewChannel[] } = {}): number[] {
    this.now = now;
    const ep = this.appEndpoint(chanid, true);
    const sm = this.senders.get(chanid);
    if (ep.terminal !== null) throw this.terminalErrorOf(ep);
    if (sm === undefined || sm.state !== "open" || sm.finishRequested) throw new ChannelClosed("this sender already finished");
    sm.checkCanSend();
    const atts: Attachment[] = [];
    const children: number[] = [];
    for (const spec of opts.attachments ?? []) {
      const child = this.mint(spec);
      atts.push({ chanid: child, headers: spec.headers ?? [] });
      children.push(child);
    }
    sm.send({ headers: opts.headers ?? [], payload, attachments: atts, children });
    return children;
  }

  configureSender(chanid: number, mode: Mode, policy: QueuePolicy = "unbounded", maxsize = 0): void {
    this.appEndpoint(chanid, true);
    this.senders.get(chanid)?.configure(mode, policy, maxsize);
  }

  /** Finish sender `chanid` after everything queued. Idempotent. */
  finish(chanid: number, now: number): void {
    this.now = now;
    const ep = this.appEndpoint(chanid, true, true);
    ep.appDone = true;
    const sm = this.senders.get(chanid);
    if (sm && sm.state === "open" && !sm.finishRequested) sm.finish();
    this.maybeFree(ep);
  }

  /** Cancel sender `chanid`: unsent messages are dropped. Idempotent. */
  cancel(chanid: number, now: number): void {
    this.now = now;
    const ep = this.appEndpoint(chanid, true, true);
    ep.appDone = true;
    this.cancelSender(ep);
    this.maybeFree(ep);
  }

  /** The next message of receiver `chanid`, or null if none is queued yet. Throws
   * EndOfChannel after a clean finish, or the terminal error. */
  recv(chanid: number, now: number): Message | null {
    this.now = now;
    const ep = this.appEndpoint(chanid, false);
    const item = ep.shift();
    if (item !== undefined) {
      ep.buffered -= item.cost;
      for (const att of item.message.attachments) {
        const child = this.endpoints.get(att.chanid);
        if (child) child.held = true;
      }
      this.receivers.get(chanid)?.dequeued(item.cost);
      return item.message;
    }
    if (ep.terminal === null) return null;
    if (ep.terminal === Terminal.FINISHED) throw new EndOfChannel("the sender finished and every message was received");
    throw this.terminalErrorOf(ep);
  }

  /** The application is done with receiver `chanid`. Idempotent. */
  closeReceiver(chanid: number, now: number): void {
    this.now = now;
    const ep = this.appEndpoint(chanid, false, true);
    ep.appDone = true;
    const rm = this.receivers.get(chanid);
    if (rm) rm.close();
    else this.discardQueue(ep);
    this.maybeFree(ep);
  }

  terminal(chanid: number): Terminal | null {
    return this.endpoints.get(chanid)?.terminal ?? null;
  }

  channelHeaders(chanid: number): Headers {
    return this.endpoints.get(chanid)?.headers ?? [];
  }

  /** Close the connection (code 0: no error); every live handle ends with ConnectionLost. */
  close(now: number, code: number = CloseCode.NO_ERROR, reason = ""): void {
    if (this.closed) return;
    this.now = now;
    this.commandQueue.push({ kind: "close", code, reason });
    this.terminate(code, reason, false, null);
  }

  /** Bytes held: received messages waiting for the application, and sends waiting for
   * credit, per channel. */
  memory(): { received: Map<number, number>; queuedToSend: Map<number, number> } {
    const received = new Map<number, number>();
    for (const [c, ep] of this.endpoints) if (ep.buffered) received.set(c, ep.buffered);
    const queuedToSend = new Map<number, number>();
    for (const [c, sm] of this.senders) {
      const n = sm.queue.reduce((a, o) => a + o.payload.length, 0);
      if (n) queuedToSend.set(c, n);
    }
    return { received, queuedToSend };
  }

  // == helpers =======================================================================================

  private appEndpoint(chanid: number, sender: boolean, allowDone = false): Endpoint {
    const ep = this.endpoints.get(chanid);
    if (ep === undefined) {
      if (this.closed) throw new ConnectionLost("the connection is closed");
      throw new LocalProtocolError(`no channel handle ${chanid} on this connection`);
    }
    if (ep.isSender !== sender) throw new LocalProtocolError(`channel ${chanid} is not a ${sender ? "sender" : "receiver"} on this side`);
    if (ep.appDone && !allowDone) throw new ChannelClosed("this handle was already finished, cancelled or closed");
    return ep;
  }

  private terminalErrorOf(ep: Endpoint): Error {
    return terminalError(ep.terminal!, ep.detail) ?? new ChannelClosed("finished");
  }
}
