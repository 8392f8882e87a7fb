/**
 * The multiplexer of "Aqueduct over TCP" (profile §7), sans-IO, as a WebSocket client
 * speaks it (profile §9: each frame travels as one binary message, and a received message
 * holds whole frames). Frames: a 6-byte header (type, flags, u32 big-endian length) and a
 * body; SETTINGS first, streams numbered as in QUIC with per-stream credit, datagrams,
 * PING for liveness, CLOSE with a code and a reason.
 *
 * Integers on this wire are u64 big-endian; ids, credits and codes stay below 2^53 here,
 * and a larger value from the peer is refused like any value out of its range.
 */
import { CloseCode, RemoteProtocolError } from "../wire/index.js";

export const FrameType = { SETTINGS: 1, STREAM: 2, RESET: 3, CREDIT: 4, DATAGRAM: 5, PING: 6, CLOSE: 7 } as const;
export const Setting = { MAX_FRAME_SIZE: 1, INITIAL_STREAM_CREDIT: 2, MAX_STREAMS: 3, MAX_DATAGRAM: 4, IDLE_TIMEOUT_MS: 5 } as const;
const NAMES = ["?", "SETTINGS", "STREAM", "RESET", "CREDIT", "DATAGRAM", "PING", "CLOSE"];
/** The flags each type defines. */
const FLAGS = [-1, 0, 1, 0, 0, 0, 1, 0];
export const HEADER_SIZE = 6;
export const MIN_FRAME_SIZE = 16384;
export const MAX_FRAME_SIZE = 2 ** 24 - 1;
export const MIN_STREAMS = 100;
export const MAX_REASON = 1024;
const MAX_VALUE = 2 ** 53 - 1; // what a JavaScript number holds exactly (the format allows 2^62 - 1)
/** Bytes of one stream per frame: streams take turns. */
const TURN = 256 * 1024;

export interface MuxSettings {
  readonly maxFrameSize: number;
  readonly initialStreamCredit: number;
  readonly maxStreams: number;
  readonly maxDatagram: number;
  /** Seconds; 0: none. */
  readonly idleTimeout: number;
}
export const DEFAULT_MUX: MuxSettings = {
  maxFrameSize: 1 << 20,
  initialStreamCredit: 16 << 20,
  maxStreams: 10_000,
  maxDatagram: 65536,
  idleTimeout: 30,
};

export type MuxEvent =
  | { readonly kind: "ready"; readonly peer: MuxSettings }
  | { readonly kind: "stream"; readonly streamId: number; readonly data: Uint8Array; readonly fin: boolean }
  | { readonly kind: "reset"; readonly streamId: number }
  | { readonly kind: "datagram"; readonly data: Uint8Array }
  | { readonly kind: "closed"; readonly code: number; readonly reason: string; readonly byPeer: boolean };

export class MuxError extends RemoteProtocolError {
  override name = "MuxError";
}

function u64(view: DataView, pos: number): number {
  const hi = view.getUint32(pos);
  const lo = view.getUint32(pos + 4);
  if (hi >= 2 ** 21) return Number.POSITIVE_INFINITY; // beyond 2^53: out of every range here
  return hi * 2 ** 32 + lo;
}
function putU64(view: DataView, pos: number, value: number): void {
  view.setUint32(pos, Math.floor(value / 2 ** 32));
  view.setUint32(pos + 4, value >>> 0);
}

export function encodeFrame(type: number, flags: number, body: Uint8Array = new Uint8Array(0)): Uint8Array {
  const out = new Uint8Array(HEADER_SIZE + body.length);
  const view = new DataView(out.buffer);
  view.setUint8(0, type);
  view.setUint8(1, flags);
  view.setUint32(2, body.length);
  out.set(body, HEADER_SIZE);
  return out;
}

export function encodeSettings(values: ReadonlyArray<readonly [number, number]>): Uint8Array {
  const body = new Uint8Array(values.length * 10);
  const view = new DataView(body.buffer);
  values.forEach(([id, value], i) => {
    view.setUint16(i * 10, id);
    putU64(view, i * 10 + 2, value);
  });
  return encodeFrame(FrameType.SETTINGS, 0, body);
}

/** The peer's SETTINGS body; absent settings take their defaults. */
export function parseSettings(body: Uint8Array): MuxSettings {
  const view = new DataView(body.buffer, body.byteOffset, body.byteLength);
  const seen = new Map<number, number>();
  for (let pos = 0; pos < body.length; pos += 10) {
    const id = view.getUint16(pos);
    if (seen.has(id)) throw new MuxError(`setting ${id} given twice`);
    seen.set(id, u64(view, pos + 2));
  }
  const frame = seen.get(Setting.MAX_FRAME_SIZE) ?? MIN_FRAME_SIZE;
  const credit = seen.get(Setting.INITIAL_STREAM_CREDIT) ?? 65536;
  const streams = seen.get(Setting.MAX_STREAMS) ?? MIN_STREAMS;
  const datagram = seen.get(Setting.MAX_DATAGRAM) ?? 0;
  const idle = seen.get(Setting.IDLE_TIMEOUT_MS) ?? 0;
  let bad: string | null = null;
  if (!(frame >= MIN_FRAME_SIZE && frame <= MAX_FRAME_SIZE)) bad = `MAX_FRAME_SIZE ${frame} not in [16384, 2^24-1]`;
  else if (!(credit >= 1 && credit <= MAX_VALUE)) bad = `INITIAL_STREAM_CREDIT ${credit} out of range`;
  else if (!(streams >= MIN_STREAMS && streams <= MAX_VALUE)) bad = `MAX_STREAMS ${streams} out of range`;
  else if (datagram > frame) bad = `MAX_DATAGRAM ${datagram} above MAX_FRAME_SIZE ${frame}`;
  else if (!(idle <= MAX_VALUE)) bad = `IDLE_TIMEOUT_MS ${idle} out of range`;
  if (bad) throw new MuxError(bad);
  return { maxFrameSize: frame, initialStreamCredit: credit, maxStreams: streams, maxDatagram: datagram, idleTimeout: idle / 1000 };
}

/** The checks of a frame header, in the profile's order (the first broken rule decides). */
export function checkHeader(type: number, flags: number, length: number, ours: MuxSettings, peerReady: boolean): void {
  const allowed = FLAGS[type];
  if (allowed === undefined || allowed < 0) throw new MuxError(`unknown frame type 0x${type.toString(16)}`);
  const name = NAMES[type];
  if (!peerReady) {
    if (type !== FrameType.SETTINGS && type !== FrameType.CLOSE) throw new MuxError(`${name} before SETTINGS`);
  } else if (type === FrameType.SETTINGS) throw new MuxError("a second SETTINGS frame");
  if (flags & ~allowed) throw new MuxError(`${name} flags 0x${flags.toString(16)}`);
  if (length > ours.maxFrameSize) throw new MuxError(`${name} frame of ${length} bytes, limit ${ours.maxFrameSize}`, CloseCode.LIMIT_VIOLATION);
  if (type === FrameType.STREAM || type === FrameType.CLOSE) {
    if (length < 8) throw new MuxError(`${name} frame shorter than 8`);
  } else if (type === FrameType.DATAGRAM) {
    if (length > ours.maxDatagram || !ours.maxDatagram)
      throw new MuxError(`DATAGRAM of ${length} bytes, limit ${ours.maxDatagram}`, CloseCode.LIMIT_VIOLATION);
  } else if (type === FrameType.SETTINGS) {
    if (length > 640) throw new MuxError("SETTINGS frame too large", CloseCode.LIMIT_VIOLATION);
    if (length % 10) throw new MuxError("SETTINGS not whole entries");
  } else if (length !== (type === FrameType.PING ? 8 : 16)) throw new MuxError(`${name} body of ${length} bytes`);
}

interface SendStream {
  readonly sid: number;
  chunks: Uint8Array[];
  queued: number;
  credit: number;
  fin: boolean;
  inRing: boolean;
}

/** The client end of the multiplexer. */
export class MuxConnection {
  peer: MuxSettings | null = null;
  closed = false;
  private frames: Uint8Array[] = [];
  private recv = new Map<number, { received: number; limit: number }>();
  private peerHighest = -1;
  private send = new Map<number, SendStream>();
  private openCount = 0;
  private waiting: SendStream[] = [];
  private ring: SendStream[] = [];
  private wireHighest = -1;
  private lastRx: number;
  private pingSent: number;
  private pingOut: Uint8Array | null = null;
  private pingSeq = 0;
  /** Datagrams dropped (larger than the peer accepts). */
  datagramsDropped = 0;

  constructor(
    readonly settings: MuxSettings = DEFAULT_MUX,
    now = 0,
  ) {
    this.lastRx = now;
    this.pingSent = now;
    this.frames.push(
      encodeSettings([
        [Setting.MAX_FRAME_SIZE, settings.maxFrameSize],
        [Setting.INITIAL_STREAM_CREDIT, settings.initialStreamCredit],
        [Setting.MAX_STREAMS, settings.maxStreams],
        [Setting.MAX_DATAGRAM, settings.maxDatagram],
        [Setting.IDLE_TIMEOUT_MS, Math.round(settings.idleTimeout * 1000)],
      ]),
    );
  }

  /** Frames to send, each one WebSocket message, in order. */
  takeFrames(): Uint8Array[] {
    this.pump();
    const out = this.frames;
    this.frames = [];
    return out;
  }

  // == receiving ===============================================================================

  /** One WebSocket message: whole frames, one or more. Throws MuxError (CLOSE queued). */
  receive(message: Uint8Array, now: number): MuxEvent[] {
    if (this.closed) return [];
    this.lastRx = now;
    const events: MuxEvent[] = [];
    try {
      const view = new DataView(message.buffer, message.byteOffset, message.byteLength);
      let pos = 0;
      if (message.length === 0) throw new MuxError("an empty WebSocket message");
      while (pos < message.length) {
        if (message.length - pos < HEADER_SIZE) throw new MuxError("a frame cut by the end of its WebSocket message");
        const type = view.getUint8(pos);
        const flags = view.getUint8(pos + 1);
        const length = view.getUint32(pos + 2);
        checkHeader(type, flags, length, this.settings, this.peer !== null);
        const start = pos + HEADER_SIZE;
        if (start + length > message.length) throw new MuxError("a frame cut by the end of its WebSocket message");
        this.frame(type, flags, message.subarray(start, start + length), events);
        pos = start + length;
        if (this.closed) break;
      }
    } catch (err) {
      if (!(err instanceof MuxError)) throw err;
      this.close(err.code, err.message);
      events.push({ kind: "closed", code: err.code, reason: err.message, byPeer: false });
      throw err;
    }
    return events;
  }

  private frame(type: number, flags: number, body: Uint8Array, events: MuxEvent[]): void {
    const view = new DataView(body.buffer, body.byteOffset, body.byteLength);
    switch (type) {
      case FrameType.SETTINGS: {
        this.peer = parseSettings(body);
        this.openWaiting();
        events.push({ kind: "ready", peer: this.peer });
        return;
      }
      case FrameType.STREAM: {
        const sid = u64(view, 0);
        const data = body.subarray(8);
        const fin = (flags & 1) === 1;
        const rs = this.peerStream(sid, "STREAM");
        if (rs === null) return;
        rs.received += data.length;
        if (rs.received > rs.limit)
          throw new MuxError(`stream ${sid}: ${rs.received} bytes beyond its credit of ${rs.limit}`, CloseCode.LIMIT_VIOLATION);
        if (fin) this.recv.delete(sid);
        else {
          const I = this.settings.initialStreamCredit;
          const left = rs.limit - rs.received;
          if (left <= Math.floor(I / 2)) {
            const inc = I - left;
            rs.limit += inc;
            const b = new Uint8Array(16);
            const v = new DataView(b.buffer);
            putU64(v, 0, sid);
            putU64(v, 8, inc);
            this.frames.push(encodeFrame(FrameType.CREDIT, 0, b));
          }
        }
        events.push({ kind: "stream", streamId: sid, data, fin });
        return;
      }
      case FrameType.RESET: {
        const sid = u64(view, 0);
        if (this.peerStream(sid, "RESET") === null) return;
        this.recv.delete(sid);
        events.push({ kind: "reset", streamId: sid });
        return;
      }
      case FrameType.CREDIT: {
        const sid = u64(view, 0);
        const inc = u64(view, 8);
        if (sid % 4 !== 2 || sid > this.wireHighest) throw new MuxError(`CREDIT for stream ${sid}, which we did not open`);
        if (inc < 1) throw new MuxError("CREDIT of 0");
        const s = this.send.get(sid);
        if (s === undefined) return; // ended: the CREDIT crossed its FIN
        s.credit += inc;
        if (s.credit > MAX_VALUE) throw new MuxError(`stream ${sid}: credit above 2^62-1`, CloseCode.LIMIT_VIOLATION);
        this.activate(s);
        return;
      }
      case FrameType.DATAGRAM:
        events.push({ kind: "datagram", data: body });
        return;
      case FrameType.PING:
        if (flags & 1) {
          if (this.pingOut && body.every((b, i) => b === this.pingOut![i])) this.pingOut = null;
        } else {
          this.frames.push(encodeFrame(FrameType.PING, 1, body.slice()));
        }
        return;
      case FrameType.CLOSE: {
        const code = u64(view, 0);
        const reason = new TextDecoder().decode(body.subarray(8, 8 + MAX_REASON));
        this.end();
        events.push({ kind: "closed", code, reason, byPeer: true });
        return;
      }
    }
  }

  /** The receive state of a peer stream, or null for one that ended (reset after FIN). */
  private peerStream(sid: number, what: string): { received: number; limit: number } | null {
    if (sid % 4 !== 3 || sid > MAX_VALUE) throw new MuxError(`${what} on stream ${sid}: not the server's parity`);
    let rs = this.recv.get(sid);
    if (rs) return rs;
    if (sid <= this.peerHighest) throw new MuxError(`${what} on stream ${sid}, which ended`);
    if (this.recv.size >= this.settings.maxStreams)
      throw new MuxError(`the server opened more than ${this.settings.maxStreams} streams`, CloseCode.LIMIT_VIOLATION);
    this.peerHighest = sid;
    rs = { received: 0, limit: this.settings.initialStreamCredit };
    this.recv.set(sid, rs);
    return rs;
  }

  // == sending ===================================================================================

  write(sid: number, data: Uint8Array, fin = false): void {
    if (this.closed) return;
    let s = this.send.get(sid);
    if (s === undefined) {
      s = { sid, chunks: [], queued: 0, credit: this.peer?.initialStreamCredit ?? 0, fin: false, inRing: false };
      this.send.set(sid, s);
      this.waiting.push(s);
      this.openWaiting();
    }
    if (data.length) {
      s.chunks.push(data);
      s.queued += data.length;
    }
    if (fin) s.fin = true;
    if (this.isOpen(s)) this.activate(s);
  }

  reset(sid: number): void {
    const s = this.send.get(sid);
    if (s === undefined) return;
    this.send.delete(sid);
    s.chunks = [];
    s.queued = 0;
    if (!this.isOpen(s)) {
      this.waiting = this.waiting.filter((w) => w !== s);
      return;
    }
    this.ring = this.ring.filter((r) => r !== s);
    const b = new Uint8Array(16);
    putU64(new DataView(b.buffer), 0, sid);
    this.frames.push(encodeFrame(FrameType.RESET, 0, b));
    this.streamEnded();
  }

  /** False when the datagram is larger than the peer accepts (it is dropped). */
  sendDatagram(data: Uint8Array): boolean {
    if (this.closed || !this.peer || data.length > this.peer.maxDatagram) {
      this.datagramsDropped++;
      return false;
    }
    this.frames.push(encodeFrame(FrameType.DATAGRAM, 0, data));
    return true;
  }

  /** CLOSE (code, reason of at most 1024 bytes); nothing is sent after it. */
  close(code: number, reason = ""): void {
    if (this.closed) return;
    let bytes = new TextEncoder().encode(reason);
    if (bytes.length > MAX_REASON) {
      let cut = MAX_REASON;
      while (cut > 0 && (bytes[cut]! & 0xc0) === 0x80) cut--; // at a character boundary
      bytes = bytes.subarray(0, cut);
    }
    const body = new Uint8Array(8 + bytes.length);
    putU64(new DataView(body.buffer), 0, code);
    body.set(bytes, 8);
    this.frames = [encodeFrame(FrameType.CLOSE, 0, body)];
    this.end();
  }

  private end(): void {
    this.closed = true;
    this.send.clear();
    this.ring = [];
    this.waiting = [];
  }

  private isOpen(s: SendStream): boolean {
    return s.sid <= this.wireHighest && !this.waiting.includes(s);
  }

  /** Streams wait, in order, for the peer's SETTINGS and a free slot of its MAX_STREAMS. */
  private openWaiting(): void {
    if (!this.peer) return;
    while (this.waiting.length && this.openCount < this.peer.maxStreams) {
      const s = this.waiting.shift()!;
      s.credit = this.peer.initialStreamCredit;
      this.openCount++;
      this.wireHighest = Math.max(this.wireHighest, s.sid);
      this.activate(s);
    }
  }

  private streamEnded(): void {
    this.openCount--;
    this.openWaiting();
  }

  private activate(s: SendStream): void {
    if (!s.inRing && ((s.queued && s.credit) || (s.fin && !s.queued))) {
      s.inRing = true;
      this.ring.push(s);
    }
  }

  /** Stream data into frames, the streams taking turns, each within its credit. */
  private pump(): void {
    if (!this.peer || this.closed) return;
    const maxBody = Math.min(this.peer.maxFrameSize - 8, TURN);
    while (this.ring.length) {
      const s = this.ring.shift()!;
      s.inRing = false;
      const n = Math.min(s.queued, s.credit, maxBody);
      const parts: Uint8Array[] = [];
      let left = n;
      while (left > 0) {
        const c = s.chunks[0]!;
        if (c.length <= left) {
          parts.push(c);
          s.chunks.shift();
          left -= c.length;
        } else {
          parts.push(c.subarray(0, left));
          s.chunks[0] = c.subarray(left);
          left = 0;
        }
      }
      s.queued -= n;
      s.credit -= n;
      const fin = s.fin && s.queued === 0;
      const frame = new Uint8Array(HEADER_SIZE + 8 + n);
      const view = new DataView(frame.buffer);
      view.setUint8(0, FrameType.STREAM);
      view.setUint8(1, fin ? 1 : 0);
      view.setUint32(2, 8 + n);
      putU64(view, 6, s.sid);
      let pos = HEADER_SIZE + 8;
      for (const p of parts) {
        frame.set(p, pos);
        pos += p.length;
      }
      this.frames.push(frame);
      if (fin) {
        this.send.delete(s.sid);
        this.streamEnded();
      } else this.activate(s);
    }
  }

  /** Bytes queued and not yet framed (the engine's senders pause above a budget). */
  get backlog(): number {
    let n = 0;
    for (const s of this.send.values()) n += s.queued;
    return n;
  }

  // == liveness ==================================================================================

  private idle(): number {
    const ours = this.settings.idleTimeout;
    const theirs = this.peer?.idleTimeout ?? 0;
    if (!ours) return theirs;
    if (!theirs) return ours;
    return Math.min(ours, theirs);
  }

  nextTimer(): number | null {
    if (this.closed || !this.peer) return null;
    const idle = this.idle();
    if (!idle) return null;
    const interval = Math.min(10, idle / 3);
    return Math.min(this.lastRx + idle, this.pingOut ? this.pingSent + idle : this.pingSent + interval);
  }

  /** PING every interval; CLOSE 6 when nothing arrived, or a PING stayed unanswered, for
   * the idle timeout. */
  handleTimer(now: number): MuxEvent[] {
    if (this.closed || !this.peer) return [];
    const idle = this.idle();
    if (!idle) return [];
    if (now - this.lastRx >= idle || (this.pingOut && now - this.pingSent >= idle)) {
      const reason = "the server sent nothing for the idle timeout";
      this.close(CloseCode.IDLE_TIMEOUT, reason);
      return [{ kind: "closed", code: CloseCode.IDLE_TIMEOUT, reason, byPeer: false }];
    }
    if (!this.pingOut && now - this.pingSent >= Math.min(10, idle / 3)) {
      const body = new Uint8Array(8);
      putU64(new DataView(body.buffer), 0, ++this.pingSeq);
      this.pingOut = body;
      this.pingSent = now;
      this.frames.push(encodeFrame(FrameType.PING, 0, body));
    }
    return [];
  }
}
