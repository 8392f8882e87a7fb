/**
 * Frame-sequence parsers for streams (incremental) and datagrams (whole), profile §1:
 * `sequence := prelude* [ROUTE_TO routed*]`; a datagram holds only VERSION, ROUTE_TO and
 * MESSAGE. Malformed input throws RemoteProtocolError and nothing else.
 *
 * A MESSAGE whose payload is still arriving is gathered as a list of chunks, joined once
 * when it completes: each byte is copied once, and a peer that announces megabytes and
 * sends a few bytes makes us hold a few bytes.
 */
import { RemoteProtocolError } from "./errors.js";
import {
  DATAGRAM_FRAMES,
  type Frame,
  type FrameType,
  type MessageHead,
  PRELUDE,
  Tag,
  pullFrame,
  pullMessageHead,
} from "./frames.js";
import { type Bytes, DEFAULT_LIMITS, Truncated, type WireLimits, concatBytes } from "./primitives.js";

class Grammar {
  route: number | null = null;
  versionFirst = false;
  count = 0;

  check(type: FrameType, chanid?: number): void {
    if (this.count === 0) this.versionFirst = type === "VERSION";
    this.count++;
    if (PRELUDE.has(type)) {
      if (this.route !== null) throw new RemoteProtocolError(`${type} after ROUTE_TO`);
    } else if (type === "ROUTE_TO") {
      if (this.route !== null) throw new RemoteProtocolError("a second ROUTE_TO in one frame sequence");
      this.route = chanid!;
    } else if (this.route === null) {
      throw new RemoteProtocolError(`${type} with no ROUTE_TO before it`);
    }
  }
}

/** Incremental parser of the frame sequence on one unidirectional stream. */
export class StreamParser {
  private grammar = new Grammar();
  private buf: Bytes = new Uint8Array(0);
  /** The MESSAGE whose payload is being gathered. */
  head: MessageHead | null = null;
  private chunks: Bytes[] = [];
  private need = 0;

  constructor(
    readonly limits: WireLimits = DEFAULT_LIMITS,
    public flowControl = false,
  ) {}

  get route(): number | null {
    return this.grammar.route;
  }
  get versionFirst(): boolean {
    return this.grammar.versionFirst;
  }
  /** Bytes of an incomplete frame head held (a payload being gathered is not counted). */
  get fragmentBytes(): number {
    return this.buf.length;
  }
  get midFrame(): boolean {
    return this.buf.length > 0 || this.head !== null;
  }

  /** Take `data` if it is all payload of the MESSAGE being gathered and does not complete
   * it; false (taking nothing) otherwise, and then {@link feed} must be called. */
  absorb(data: Bytes): boolean {
    if (this.head === null || data.length >= this.need) return false;
    this.chunks.push(data.slice());
    this.need -= data.length;
    return true;
  }

  feed(data: Bytes): Frame[] {
    if (this.absorb(data)) return [];
    const frames: Frame[] = [];
    let view = data;
    const head = this.head;
    if (head !== null) {
      const take = Math.min(this.need, view.length);
      this.chunks.push(view.slice(0, take));
      this.need -= take;
      if (this.need) return frames;
      const payload = concatBytes(this.chunks);
      this.head = null;
      this.chunks = [];
      frames.push({ type: "MESSAGE", num: head.num, headers: head.headers, attachments: head.attachments, payload });
      view = view.subarray(take);
    }
    if (this.buf.length) view = concatBytes([this.buf, view]);
    let pos = 0;
    const end = view.length;
    while (pos < end) {
      let frame: Frame;
      try {
        if (view[pos] === Tag.MESSAGE) {
          const [mhead, ppos] = pullMessageHead(view, pos + 1, this.limits);
          const stop = ppos + mhead.payloadLen;
          if (stop <= end) {
            frame = { type: "MESSAGE", num: mhead.num, headers: mhead.headers, attachments: mhead.attachments, payload: view.slice(ppos, stop) };
            pos = stop;
          } else {
            // Payload incomplete: gather it from later chunks; check placement now.
            this.grammar.check("MESSAGE");
            this.head = mhead;
            this.chunks = [view.slice(ppos, end)];
            this.need = stop - end;
            this.buf = new Uint8Array(0);
            return frames;
          }
        } else {
          [frame, pos] = pullFrame(view, pos, this.limits, this.flowControl);
        }
      } catch (err) {
        if (err instanceof Truncated) break;
        throw err;
      }
      this.grammar.check(frame.type, frame.type === "ROUTE_TO" ? frame.chanid : undefined);
      frames.push(frame);
    }
    this.buf = view.slice(pos, end);
    return frames;
  }

  /** The stream ended cleanly; ending mid-frame is a protocol error. */
  finish(): void {
    if (this.midFrame) throw new RemoteProtocolError("stream ended in the middle of a frame");
  }
}

/** Parse one datagram: its frames, and whether it began with VERSION. */
export function parseDatagram(data: Bytes, limits: WireLimits = DEFAULT_LIMITS, flowControl = false): [Frame[], boolean] {
  const grammar = new Grammar();
  const frames: Frame[] = [];
  let pos = 0;
  while (pos < data.length) {
    let frame: Frame;
    try {
      [frame, pos] = pullFrame(data, pos, limits, flowControl);
    } catch (err) {
      if (err instanceof Truncated) throw new RemoteProtocolError("datagram ends in the middle of a frame");
      throw err;
    }
    if (!DATAGRAM_FRAMES.has(frame.type)) throw new RemoteProtocolError(`${frame.type} is not allowed in a datagram`);
    grammar.check(frame.type, frame.type === "ROUTE_TO" ? frame.chanid : undefined);
    frames.push(frame);
  }
  return [frames, grammar.versionFirst];
}
