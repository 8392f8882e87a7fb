/**
 * Channels for async programs over the sans-IO engine: `AqueductConnection` binds an
 * engine to a transport (a `Link`), runs its timers with the event loop's clock, and hands
 * out channel ends whose methods return promises. The transports (WebTransport, WebSocket,
 * an in-memory pair for tests) only move bytes; everything Aqueduct is the engine's.
 */
import { Connection } from "../engine/connection.js";
import type { NewChannel } from "../engine/channels.js";
import type { Event } from "../engine/events.js";
import type { EngineConfig } from "../engine/config.js";
import {
  type Bytes,
  ChannelClosed,
  CloseCode,
  ConnectionLost,
  EndOfChannel,
  type Headers,
  LocalProtocolError,
  type Message,
  WouldBlock,
  findHeader,
  fromUtf8,
  utf8,
} from "../wire/index.js";
import { type Attachable, CODEC_HEADER, type CodecName, Handle, decodeCbor, encodeCbor } from "./codec.js";

/** What a transport driver offers the connection. */
export interface Link {
  write(streamId: number, data: Bytes, fin: boolean): void;
  reset(streamId: number): void;
  datagram(data: Bytes): void;
  close(code: number, reason: string): void;
  /** Bytes handed to the link and not sent yet. */
  backlog(): number;
}

export type TransportName = "webtransport" | "websocket" | "memory";

/** Seconds on a monotonic clock. */
export const clock = (): number => performance.now() / 1000;

/** Bytes the link may hold unsent before the engine's senders pause. */
const SEND_BUDGET = 4 * 1024 * 1024;

export interface Delivery {
  readonly value: unknown;
  readonly headers: Headers;
  readonly payload: Bytes;
}

type Waiter = () => void;

export class AqueductConnection {
  readonly engine: Connection;
  private link: Link | null = null;
  transport: TransportName;
  private waiters = new Map<number, Waiter[]>();
  private connWaiters: Waiter[] = [];
  private timer: ReturnType<typeof setTimeout> | null = null;
  private timerAt: number | null = null;
  /** The default codec the server chose (profile §4). */
  codec: CodecName = "cbor";
  peerHeaders: Headers | null = null;
  closeInfo: { code: number; reason: string; byPeer: boolean } | null = null;
  readonly entrypoint: Sender;
  /** Bytes received and sent (payload and framing), for rates. */
  bytesIn = 0;

  constructor(headers: Headers, transport: TransportName, config: Partial<EngineConfig> = {}) {
    this.transport = transport;
    const own: Array<readonly [Bytes, Bytes]> = [...headers, [CODEC_HEADER, utf8("cbor,raw")]];
    this.engine = new Connection(0, { headers: own, config });
    this.entrypoint = new Sender(null, "cbor");
    this.entrypoint.bind(this, 0);
  }

  attach(link: Link): void {
    this.link = link;
  }

  get closed(): boolean {
    return this.engine.closed;
  }

  // == what the driver reports ================================================================

  transportReady(maxDatagram: number): void {
    this.engine.handshakeDone(clock(), { maxDatagram });
    this.flush();
  }
  streamData(streamId: number, data: Bytes, fin: boolean): void {
    this.bytesIn += data.length;
    this.engine.streamData(streamId, data, fin, clock());
    this.flush();
  }
  streamReset(streamId: number): void {
    this.engine.streamReset(streamId, clock());
    this.flush();
  }
  datagramReceived(data: Bytes): void {
    this.bytesIn += data.length;
    this.engine.datagramReceived(data, clock());
    this.flush();
  }
  lost(code: number, reason: string): void {
    this.engine.connectionLost(clock(), code, reason);
    this.flush();
  }
  /** The link sent what it held: paused senders may go on. */
  drained(): void {
    if (this.link && this.engine.setTransportBacklog(this.link.backlog(), SEND_BUDGET)) this.flush();
  }

  // == the pump ==================================================================================

  /** Hand the engine's commands to the link, its events to whoever waits, arm the timer. */
  flush(): void {
    const link = this.link;
    const commands = this.engine.commands();
    if (link) {
      for (const c of commands) {
        if (c.kind === "write") link.write(c.streamId, c.data, c.fin);
        else if (c.kind === "reset") link.reset(c.streamId);
        else if (c.kind === "datagram") link.datagram(c.data);
        else link.close(c.code, c.reason);
      }
      this.engine.setTransportBacklog(link.backlog(), SEND_BUDGET);
    }
    for (const e of this.engine.events()) this.onEvent(e);
    this.armTimer();
  }

  private onEvent(e: Event): void {
    switch (e.kind) {
      case "headers": {
        this.peerHeaders = e.headers;
        const codec = findHeader(e.headers, CODEC_HEADER);
        if (codec && fromUtf8(codec) === "raw") this.codec = "raw";
        this.wakeConnection();
        return;
      }
      case "connectionTerminated":
        this.closeInfo = { code: e.code, reason: e.reason, byPeer: e.byPeer };
        if (this.timer !== null) clearTimeout(this.timer);
        this.timer = null;
        for (const list of this.waiters.values()) for (const w of list) w();
        this.waiters.clear();
        this.wakeConnection();
        return;
      default:
        this.wake(e.chanid);
    }
  }

  private wakeConnection(): void {
    const list = this.connWaiters;
    this.connWaiters = [];
    for (const w of list) w();
  }

  private wake(chanid: number): void {
    const list = this.waiters.get(chanid);
    if (!list) return;
    this.waiters.delete(chanid);
    for (const w of list) w();
  }

  /** Resolves at the next event of channel `chanid` (or the connection's end). */
  waitChannel(chanid: number): Promise<void> {
    if (this.engine.closed) return Promise.resolve();
    return new Promise((resolve) => {
      const list = this.waiters.get(chanid) ?? [];
      list.push(resolve);
      this.waiters.set(chanid, list);
    });
  }

  /** Resolves once the server's CONNECTION_HEADERS arrived; throws if the connection ended. */
  async ready(): Promise<void> {
    while (this.peerHeaders === null) {
      if (this.engine.closed) throw this.lostError();
      await new Promise<void>((resolve) => this.connWaiters.push(resolve));
    }
  }

  lostError(): ConnectionLost {
    const info = this.closeInfo;
    return new ConnectionLost(info ? `the connection closed (code ${info.code}${info.reason ? `: ${info.reason}` : ""})` : "the connection closed");
  }

  private armTimer(): void {
    const next = this.engine.nextTimer();
    if (next === this.timerAt) return;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.timerAt = next;
    if (next === null || this.engine.closed) return;
    const delay = Math.max(0, (next - clock()) * 1000);
    this.timer = setTimeout(() => {
      this.timer = null;
      this.timerAt = null;
      this.engine.handleTimer(clock());
      this.flush();
    }, delay + 1);
  }

  /** Close the connection (code 0 by default); every open channel ends with ConnectionLost. */
  close(code: number = CloseCode.NO_ERROR, reason = ""): void {
    this.engine.close(clock(), code, reason);
    this.flush();
  }

  // == messages ==================================================================================

  /** Encode `value` for a channel of `codec`: channel ends inside become attachments. */
  encode(value: unknown, codec: CodecName): { payload: Bytes; handles: Attachable[] } {
    if (codec === "raw") {
      if (!(value instanceof Uint8Array)) throw new LocalProtocolError("a raw channel sends Uint8Array values");
      return { payload: value, handles: [] };
    }
    const handles: Attachable[] = [];
    const payload = encodeCbor(value, (h) => {
      if (handles.includes(h)) throw new LocalProtocolError("a channel end may travel only once");
      handles.push(h);
      return handles.length - 1;
    });
    return { payload, handles };
  }

  /** The value of a received message; attachments it does not use are closed. */
  decode(message: Message, codec: CodecName): Delivery {
    const ends = message.attachments.map((a) => this.endFor(a.chanid, a.headers));
    const used = new Set<number>();
    const value = codec === "raw" ? message.payload : decodeCbor(message.payload, (i) => {
      const end = ends[i];
      if (end === undefined) throw new LocalProtocolError(`attachment index ${i} out of range`);
      used.add(i);
      return end;
    });
    ends.forEach((end, i) => {
      if (!used.has(i)) end.discard();
    });
    return { value, headers: message.headers, payload: message.payload };
  }

  private endFor(chanid: number, headers: Headers): Sender | Receiver {
    const codec = codecOf(headers, this.codec);
    const weSend = Math.floor(chanid / 2) % 2 === 0;
    const end = weSend ? new Sender(null, codec) : new Receiver(null, codec);
    end.bind(this, chanid);
    return end;
  }
}

function codecOf(headers: Headers, fallback: CodecName): CodecName {
  const value = findHeader(headers, CODEC_HEADER);
  if (value === undefined) return fallback;
  return fromUtf8(value) === "raw" ? "raw" : "cbor";
}

/** Pair state shared by the two ends of a channel made with {@link channel}. */
class Pair {
  constructor(
    readonly headers: Headers,
    readonly oneshot: boolean,
  ) {}
  sender!: Sender;
  receiver!: Receiver;
}

abstract class End extends Handle {
  conn: AqueductConnection | null = null;
  chanid = -1;
  /** This end was sent to the peer: it is not ours to use. */
  sent = false;
  constructor(
    readonly pair: Pair | null,
    public codec: CodecName,
  ) {
    super();
  }
  bind(conn: AqueductConnection, chanid: number): void {
    this.conn = conn;
    this.chanid = chanid;
  }
  protected bound(): AqueductConnection {
    if (this.sent) throw new LocalProtocolError("this channel end was sent to the peer");
    if (this.conn === null) throw new LocalProtocolError("send the other end of this channel first: it binds this one");
    return this.conn;
  }
  abstract discard(): void;
}

export class Sender extends End {
  private configured = false;

  /** Queue a message; waits while the queue is full (flow control holds it back). */
  async send(value: unknown, opts: { headers?: Headers } = {}): Promise<void> {
    const conn = this.bound();
    const { payload, handles } = conn.encode(value, this.codec);
    const specs: NewChannel[] = handles.map((h) => {
      const end = h as End;
      if (end.pair === null || end.conn !== null || end.sent)
        throw new LocalProtocolError("only a new channel's end (from channel() or oneshot()) can be sent");
      return { keepSender: end instanceof Receiver, oneshot: end.pair.oneshot, headers: end.pair.headers };
    });
    if (!this.configured && this.chanid !== 0) {
      conn.engine.configureSender(this.chanid, "ordered", "block", 8);
      this.configured = true;
    }
    for (;;) {
      try {
        const chanids = conn.engine.send(this.chanid, payload, clock(), { headers: opts.headers ?? [], attachments: specs });
        handles.forEach((h, i) => {
          const end = h as End;
          end.sent = true;
          const kept = end instanceof Receiver ? end.pair!.sender : end.pair!.receiver;
          kept.bind(conn, chanids[i]!);
        });
        conn.flush();
        return;
      } catch (err) {
        if (!(err instanceof WouldBlock)) throw err;
        await conn.waitChannel(this.chanid);
      }
    }
  }

  /** Finish after everything queued (idempotent). */
  finish(): void {
    const conn = this.bound();
    conn.engine.finish(this.chanid, clock());
    conn.flush();
  }

  /** Cancel: unsent messages are dropped (idempotent). */
  cancel(): void {
    if (this.conn === null || this.sent) return;
    this.conn.engine.cancel(this.chanid, clock());
    this.conn.flush();
  }

  discard(): void {
    this.cancel();
  }
}

export class Receiver extends End {
  /** The next message with its headers; throws EndOfChannel after a clean finish. */
  async recvMessage(): Promise<Delivery> {
    const conn = this.bound();
    for (;;) {
      const wait = conn.waitChannel(this.chanid);
      const message = conn.engine.recv(this.chanid, clock());
      if (message !== null) {
        conn.flush(); // acks and DEQUEUED the dequeue may have produced
        return conn.decode(message, this.codec);
      }
      if (conn.engine.closed && conn.engine.terminal(this.chanid) === null) throw conn.lostError();
      await wait;
    }
  }

  /** The next message's value. */
  async recv(): Promise<unknown> {
    return (await this.recvMessage()).value;
  }

  /** Every message until the sender finishes. */
  async *[Symbol.asyncIterator](): AsyncGenerator<Delivery> {
    for (;;) {
      try {
        yield await this.recvMessage();
      } catch (err) {
        if (err instanceof EndOfChannel) return;
        throw err;
      }
    }
  }

  /** Done with this receiver (idempotent). */
  close(): void {
    if (this.conn === null || this.sent) return;
    try {
      this.conn.engine.closeReceiver(this.chanid, clock());
    } catch (err) {
      if (!(err instanceof ChannelClosed) && !(err instanceof ConnectionLost)) throw err;
    }
    this.conn.flush();
  }

  discard(): void {
    this.close();
  }
}

/** A new channel: send one end inside a message, keep the other. */
export function channel(opts: { headers?: Headers; codec?: CodecName } = {}): [Sender, Receiver] {
  const headers: Array<readonly [Bytes, Bytes]> = [...(opts.headers ?? [])];
  if (opts.codec === "raw") headers.push([CODEC_HEADER, utf8("raw")]);
  const pair = new Pair(headers, false);
  const tx = new Sender(pair, opts.codec ?? "cbor");
  const rx = new Receiver(pair, opts.codec ?? "cbor");
  pair.sender = tx;
  pair.receiver = rx;
  return [tx, rx];
}

/** A new oneshot channel (at most one message). */
export function oneshot(opts: { headers?: Headers } = {}): [Sender, Receiver] {
  const pair = new Pair(opts.headers ?? [], true);
  const tx = new Sender(pair, "cbor");
  const rx = new Receiver(pair, "cbor");
  pair.sender = tx;
  pair.receiver = rx;
  return [tx, rx];
}
