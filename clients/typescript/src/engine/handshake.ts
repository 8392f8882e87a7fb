/**
 * The Aqueduct handshake (profile §2): VERSION, ACK_VERSION and CONNECTION_HEADERS, and the
 * flow-control negotiation of §4 (both sides advertise `aqueduct-flow-9d04b2`, or it is off;
 * a server may grant the entrypoint less, `aqueduct-entry-window-19ea45`). Input that comes
 * before the transport's handshake completes is held; bytes before the peer's headers are
 * capped.
 */
import {
  type Bytes,
  CloseCode,
  ENTRYPOINT,
  type Headers,
  RemoteProtocolError,
  Side,
  Truncated,
  encodeFrames,
  encodeVarint,
  equalBytes,
  fromUtf8,
  pullVarint,
  utf8,
} from "../wire/index.js";
import { ChannelTables } from "./channels.js";
import type { EngineConfig } from "./config.js";
import { Endpoint } from "./endpoint.js";
import { ReceiverSM } from "./receiver.js";

export const FLOW_HEADER = utf8("aqueduct-flow-9d04b2");
export const ENTRY_WINDOW_HEADER = utf8("aqueduct-entry-window-19ea45");

/** A server's connection headers, chosen from the client's (throw to refuse the client). */
export type ServerHeaders = (clientHeaders: Headers) => Headers;

/** The window the peer advertised under `key`, or null if it does not take part. */
export function parseWindow(headers: Headers, key: Bytes = FLOW_HEADER): number | null {
  for (const [k, value] of headers) {
    if (!equalBytes(k, key)) continue;
    let window = 0;
    let end = -1;
    try {
      [window, end] = pullVarint(value, 0);
    } catch (err) {
      if (!(err instanceof Truncated) && !(err instanceof RemoteProtocolError)) throw err;
    }
    if (end !== value.length || window < 1) {
      const name = key === ENTRY_WINDOW_HEADER ? "entrypoint window" : "flow-control window";
      throw new RemoteProtocolError(`malformed ${name} header ${fromUtf8(value)}`);
    }
    return window;
  }
  return null;
}

const ACK_VERSION_BYTES = encodeFrames({ type: "ACK_VERSION" });

export class Handshake extends ChannelTables {
  private ownHeadersValue: Headers;
  private handshakeCompleteFlag = false;
  /** Input that arrived before the start, replayed by start(). */
  protected early: Array<() => void> = [];
  private earlyBytes = 0;
  sentAckVersion = false;
  private needAckVersion = false;
  private sentHeaders = false;
  peerHeaders: Headers | null = null;

  constructor(
    side: Side,
    config: Partial<EngineConfig> | undefined,
    headers: Headers,
    private readonly serverHeaders: ServerHeaders | null,
  ) {
    super(side, config);
    this.ownHeadersValue = headers;
  }

  /** The transport's handshake completed (QUIC's, WebTransport's, or the multiplexer's
   * SETTINGS). `maxDatagram`: the largest datagram payload; 0 or `datagrams: false` means
   * the transport has none. */
  handshakeDone(now: number, opts: { datagrams?: boolean; maxDatagram?: number } = {}): void {
    if (this.closed || this.handshakeCompleteFlag) return;
    this.now = now;
    this.handshakeCompleteFlag = true;
    if (opts.maxDatagram !== undefined) this.maxDatagram = opts.maxDatagram;
    if (opts.datagrams === false) this.maxDatagram = 0;
    this.start();
  }

  get handshakeConfirmed(): boolean {
    return this.handshakeCompleteFlag;
  }
  /** The peer's CONNECTION_HEADERS arrived. */
  get handshakeComplete(): boolean {
    return this.peerHeaders !== null;
  }
  get ownHeaders(): Headers {
    return this.ownHeadersValue;
  }

  private start(): void {
    if (this.earlyOk) {
      this.pumpAll();
      return;
    }
    this.earlyOk = true;
    this.schedule(this.config.handshakeTimeout, () => this.handshakeTimer());
    if (this.side === Side.CLIENT) {
      const hello = encodeFrames({ type: "CONNECTION_HEADERS", headers: this.withFlow(this.ownHeadersValue) });
      const data = new Uint8Array(this.versionBytes.length + hello.length);
      data.set(this.versionBytes);
      data.set(hello, this.versionBytes.length);
      this.write(this.openStream(), data, true);
      this.sentHeaders = true;
    }
    const early = this.early;
    this.early = [];
    for (const replay of early) replay();
    this.pumpAll();
  }

  /** Bytes before the peer's CONNECTION_HEADERS are capped; false once over the cap. */
  protected countEarly(nbytes: number): boolean {
    if (this.peerHeaders !== null) return true;
    this.earlyBytes += nbytes;
    if (this.earlyBytes <= this.config.maxEarlyBytes) return true;
    this.fail(
      new RemoteProtocolError(
        `more than ${this.config.maxEarlyBytes} bytes arrived before the peer's CONNECTION_HEADERS`,
        CloseCode.LIMIT_VIOLATION,
      ),
    );
    return false;
  }

  private withFlow(headers: Headers): Headers {
    const window = this.config.flowWindow;
    if (window === null) return headers;
    const out: Array<readonly [Bytes, Bytes]> = [...headers, [FLOW_HEADER, encodeVarint(window)]];
    const entry = this.config.entryWindow;
    if (this.side === Side.SERVER && entry !== null && entry < window) out.push([ENTRY_WINDOW_HEADER, encodeVarint(entry)]);
    return out;
  }

  protected onVersion(version: Bytes): void {
    if (!equalBytes(version, this.config.version))
      throw new RemoteProtocolError(
        `unsupported Aqueduct version ${JSON.stringify(fromUtf8(version))} (we speak ${JSON.stringify(fromUtf8(this.config.version))})`,
        CloseCode.UNSUPPORTED_VERSION,
      );
    if (!this.sentAckVersion) {
      this.sentAckVersion = true;
      this.needAckVersion = true;
    }
  }

  /** The peer's CONNECTION_HEADERS: negotiate flow control; a server answers with its own
   * and opens the entrypoint. The routed frames that waited are the caller's to release. */
  protected onHeaders(headers: Headers): void {
    if (this.peerHeaders !== null) throw new RemoteProtocolError("a second CONNECTION_HEADERS");
    this.peerHeaders = headers;
    const peerWindow = parseWindow(headers);
    if (peerWindow === null && this.config.requireFlowControl)
      throw new RemoteProtocolError(
        "the peer does not take part in flow control (no aqueduct-flow header); this endpoint requires it",
        CloseCode.LIMIT_VIOLATION,
      );
    if (peerWindow !== null && this.config.flowWindow !== null) {
      this.peerWindow = peerWindow;
      this.ownWindow = this.config.flowWindow;
      const entry = parseWindow(headers, ENTRY_WINDOW_HEADER);
      const sender = this.senders.get(ENTRYPOINT);
      if (entry !== null && this.side === Side.CLIENT && sender) sender.windowCap = entry;
    } else {
      this.peerWindow = null;
    }
    if (this.side === Side.SERVER) {
      let own = this.ownHeadersValue;
      if (this.serverHeaders) {
        try {
          own = this.serverHeaders(headers);
        } catch (err) {
          throw new RemoteProtocolError(`connection refused by the server: ${String(err)}`, CloseCode.INTERNAL);
        }
      }
      this.ownHeadersValue = this.withFlow(own);
      const rm = new ReceiverSM(this, ENTRYPOINT, false);
      this.receivers.set(ENTRYPOINT, rm);
      const cap = this.config.entryWindow;
      if (this.ownWindow !== null && cap !== null && cap < this.ownWindow) rm.windowCap = cap;
      this.endpoints.set(ENTRYPOINT, new Endpoint(ENTRYPOINT, false, true, true));
    }
    this.eventQueue.push({ kind: "headers", headers });
  }

  private handshakeTimer(): void {
    if (this.peerHeaders === null)
      throw new RemoteProtocolError(`no CONNECTION_HEADERS within ${this.config.handshakeTimeout} s`, CloseCode.HANDSHAKE_TIMEOUT);
  }

  /** Send ACK_VERSION and (server) CONNECTION_HEADERS, merged into one stream. */
  protected afterInput(): void {
    if (!this.needAckVersion && (this.sentHeaders || this.side === Side.CLIENT)) return;
    const parts: Bytes[] = [];
    if (this.needAckVersion) {
      this.needAckVersion = false;
      parts.push(ACK_VERSION_BYTES);
    }
    if (this.side === Side.SERVER && this.peerHeaders !== null && !this.sentHeaders) {
      this.sentHeaders = true;
      parts.push(encodeFrames({ type: "CONNECTION_HEADERS", headers: this.ownHeadersValue }));
    }
    if (parts.length) {
      if (!this.gotAckVersion) parts.unshift(this.versionBytes);
      let n = 0;
      for (const p of parts) n += p.length;
      const data = new Uint8Array(n);
      let pos = 0;
      for (const p of parts) {
        data.set(p, pos);
        pos += p.length;
      }
      this.write(this.openStream(), data, true);
    }
  }

  protected override dropState(detail: string): void {
    super.dropState(detail);
    this.early = [];
  }
}
