/**
 * Every Aqueduct frame (profile §1, "Frames") and its encoding. Frames are plain objects
 * tagged by `type`, named as the spec names them.
 */
import { CloseCode, LocalProtocolError, RemoteProtocolError } from "./errors.js";
import { checkAckNack, checkAckReliable } from "./ranges.js";
import {
  type Bytes,
  DEFAULT_LIMITS,
  type Headers,
  Truncated,
  type WireLimits,
  Writer,
  equalBytes,
  pullHeaders,
  pullLength,
  pullVarint,
  pushHeaders,
  utf8,
} from "./primitives.js";

export const MAGIC = Uint8Array.of(239, 80, 95, 166, 96, 15, 64, 142);
export const HUMAN_TEXT = utf8("AQUEDUCT");
export const DEFAULT_VERSION = utf8("0.0.0-AFTER");
export const MAX_VERSION_STRING = 255;

export const Tag = {
  VERSION: 239,
  ACK_VERSION: 1,
  CONNECTION_HEADERS: 2,
  ROUTE_TO: 3,
  MESSAGE: 4,
  SENT_UNRELIABLE: 5,
  FINISH_SENDER: 6,
  CANCEL_SENDER: 7,
  ACK_RELIABLE: 8,
  ACK_NACK_UNRELIABLE: 9,
  CLOSE_RECEIVER: 10,
  FORGET_CHANNEL: 11,
  DEQUEUED: 12,
} as const;

export interface Attachment {
  readonly chanid: number;
  readonly headers: Headers;
}

export type Frame =
  | { readonly type: "VERSION"; readonly version: Bytes }
  | { readonly type: "ACK_VERSION" }
  | { readonly type: "CONNECTION_HEADERS"; readonly headers: Headers }
  | { readonly type: "ROUTE_TO"; readonly chanid: number }
  | Message
  | { readonly type: "SENT_UNRELIABLE"; readonly count: number }
  | { readonly type: "FINISH_SENDER"; readonly sentReliable: number }
  | { readonly type: "CANCEL_SENDER" }
  | { readonly type: "ACK_RELIABLE"; readonly ranges: readonly number[] }
  | { readonly type: "ACK_NACK_UNRELIABLE"; readonly ranges: readonly number[] }
  | { readonly type: "CLOSE_RECEIVER" }
  | { readonly type: "FORGET_CHANNEL" }
  | { readonly type: "DEQUEUED"; readonly numBytes: number };

export interface Message {
  readonly type: "MESSAGE";
  readonly num: number;
  readonly headers: Headers;
  readonly attachments: readonly Attachment[];
  readonly payload: Bytes;
}

/** A MESSAGE decoded up to its payload length (the stream parser gathers the payload). */
export interface MessageHead {
  readonly num: number;
  readonly headers: Headers;
  readonly attachments: readonly Attachment[];
  readonly payloadLen: number;
}

export type FrameType = Frame["type"];
export const PRELUDE: ReadonlySet<FrameType> = new Set(["VERSION", "ACK_VERSION", "CONNECTION_HEADERS"]);
export const DATAGRAM_FRAMES: ReadonlySet<FrameType> = new Set(["VERSION", "ROUTE_TO", "MESSAGE"]);

export function message(num: number, payload: Bytes = new Uint8Array(), headers: Headers = [], attachments: readonly Attachment[] = []): Message {
  return { type: "MESSAGE", num, headers, attachments, payload };
}

/** What every message adds to its flow-control cost (profile §4, flow control item 2). */
export const MESSAGE_OVERHEAD = 128;
/** What each attachment adds to a message's flow-control cost. */
export const ATTACHMENT_COST = 4096;

/** The one cost formula both sides count with: the MESSAGE's encoding from its tag to the
 * end of its payload, plus 128, plus 4096 per attachment. */
export function costOf(encoded: number, attachments: number): number {
  return encoded + MESSAGE_OVERHEAD + ATTACHMENT_COST * attachments;
}

/** The encoding of a MESSAGE up to (not including) its payload bytes. */
export function messageHead(num: number, headers: Headers, attachments: readonly Attachment[], payloadLen: number): Bytes {
  const w = new Writer(16);
  w.byte(Tag.MESSAGE);
  w.varint(num);
  pushHeaders(w, headers);
  if (attachments.length) {
    const inner = new Writer();
    for (const att of attachments) {
      inner.varint(att.chanid);
      pushHeaders(inner, att.headers);
    }
    w.varbytes(inner.finish());
  } else {
    w.byte(0);
  }
  w.varint(payloadLen);
  return w.finish();
}

export function messageCost(m: Message): number {
  return costOf(messageHead(m.num, m.headers, m.attachments, m.payload.length).length + m.payload.length, m.attachments.length);
}

export function pushFrame(w: Writer, frame: Frame): void {
  switch (frame.type) {
    case "VERSION":
      if (frame.version.length > MAX_VERSION_STRING) throw new LocalProtocolError("version string too long");
      w.bytes(MAGIC);
      w.bytes(HUMAN_TEXT);
      w.varbytes(frame.version);
      return;
    case "ACK_VERSION":
      w.byte(Tag.ACK_VERSION);
      return;
    case "CONNECTION_HEADERS":
      w.byte(Tag.CONNECTION_HEADERS);
      pushHeaders(w, frame.headers);
      return;
    case "ROUTE_TO":
      w.byte(Tag.ROUTE_TO);
      w.varint(frame.chanid);
      return;
    case "MESSAGE":
      w.bytes(messageHead(frame.num, frame.headers, frame.attachments, frame.payload.length));
      w.bytes(frame.payload);
      return;
    case "SENT_UNRELIABLE":
      w.byte(Tag.SENT_UNRELIABLE);
      w.varint(frame.count);
      return;
    case "FINISH_SENDER":
      w.byte(Tag.FINISH_SENDER);
      w.varint(frame.sentReliable);
      return;
    case "CANCEL_SENDER":
      w.byte(Tag.CANCEL_SENDER);
      return;
    case "ACK_RELIABLE":
    case "ACK_NACK_UNRELIABLE": {
      if (frame.type === "ACK_RELIABLE") {
        checkAckReliable(frame.ranges, LocalProtocolError);
        w.byte(Tag.ACK_RELIABLE);
      } else {
        checkAckNack(frame.ranges, LocalProtocolError);
        w.byte(Tag.ACK_NACK_UNRELIABLE);
      }
      const inner = new Writer();
      for (const v of frame.ranges) inner.varint(v);
      w.varbytes(inner.finish());
      return;
    }
    case "CLOSE_RECEIVER":
      w.byte(Tag.CLOSE_RECEIVER);
      return;
    case "FORGET_CHANNEL":
      w.byte(Tag.FORGET_CHANNEL);
      return;
    case "DEQUEUED":
      w.byte(Tag.DEQUEUED);
      w.varint(frame.numBytes);
      return;
  }
}

export function encodeFrames(...frames: Frame[]): Bytes {
  const w = new Writer();
  for (const f of frames) pushFrame(w, f);
  return w.finish();
}

// -- decoding ----------------------------------------------------------------------------

function pullVersion(data: Bytes, pos: number): [Frame, number] {
  const end = pos + MAGIC.length + HUMAN_TEXT.length;
  if (end > data.length) throw new Truncated();
  if (!equalBytes(data.subarray(pos, pos + MAGIC.length), MAGIC))
    throw new RemoteProtocolError("VERSION frame has bad magic bytes", CloseCode.UNSUPPORTED_VERSION);
  if (!equalBytes(data.subarray(pos + MAGIC.length, end), HUMAN_TEXT))
    throw new RemoteProtocolError("VERSION frame lacks the AQUEDUCT text", CloseCode.UNSUPPORTED_VERSION);
  const [n, start] = pullVarint(data, end);
  if (n > MAX_VERSION_STRING)
    throw new RemoteProtocolError(`VERSION string of ${n} bytes is not a version we speak`, CloseCode.UNSUPPORTED_VERSION);
  if (start + n > data.length) throw new Truncated();
  return [{ type: "VERSION", version: data.slice(start, start + n) }, start + n];
}

function pullRanges(data: Bytes, pos: number, limits: WireLimits): [number[], number] {
  const [n, start] = pullLength(data, pos, limits.maxListBytes, "range list");
  const end = start + n;
  if (end > data.length) throw new Truncated();
  const inner = data.subarray(start, end);
  const values: number[] = [];
  let ipos = 0;
  try {
    while (ipos < n) {
      const [v, next] = pullVarint(inner, ipos);
      values.push(v);
      ipos = next;
    }
  } catch (err) {
    if (err instanceof Truncated) throw new RemoteProtocolError("range varint overruns its list");
    throw err;
  }
  return [values, end];
}

function pullAttachments(data: Bytes, pos: number, limits: WireLimits): [Attachment[], number] {
  const [n, start] = pullLength(data, pos, limits.maxListBytes, "attachment list");
  const end = start + n;
  if (end > data.length) throw new Truncated();
  const inner = data.subarray(start, end);
  const atts: Attachment[] = [];
  const seen = new Set<number>();
  let ipos = 0;
  try {
    while (ipos < n) {
      const [chanid, p1] = pullVarint(inner, ipos);
      const [headers, p2] = pullHeaders(inner, p1, limits);
      if (seen.has(chanid)) throw new RemoteProtocolError(`MESSAGE attaches chanid ${chanid} twice`);
      seen.add(chanid);
      atts.push({ chanid, headers });
      ipos = p2;
    }
  } catch (err) {
    if (err instanceof Truncated) throw new RemoteProtocolError("attachment overruns the attachment list");
    throw err;
  }
  return [atts, end];
}

/** Decode a MESSAGE after its tag, stopping after the payload length. */
export function pullMessageHead(data: Bytes, pos: number, limits: WireLimits): [MessageHead, number] {
  const [num, p1] = pullVarint(data, pos);
  const [headers, p2] = pullHeaders(data, p1, limits);
  const [attachments, p3] = pullAttachments(data, p2, limits);
  const [payloadLen, p4] = pullLength(data, p3, limits.maxPayloadBytes, "MESSAGE payload");
  return [{ num, headers, attachments, payloadLen }, p4];
}

/** Decode one complete frame at `pos`; throws Truncated if `data` ends early. */
export function pullFrame(data: Bytes, pos: number, limits: WireLimits = DEFAULT_LIMITS, flowControl = false): [Frame, number] {
  if (pos >= data.length) throw new Truncated();
  const tag = data[pos++]!;
  switch (tag) {
    case Tag.MESSAGE: {
      const [head, start] = pullMessageHead(data, pos, limits);
      const end = start + head.payloadLen;
      if (end > data.length) throw new Truncated();
      return [{ type: "MESSAGE", num: head.num, headers: head.headers, attachments: head.attachments, payload: data.slice(start, end) }, end];
    }
    case Tag.ROUTE_TO: {
      const [chanid, end] = pullVarint(data, pos);
      return [{ type: "ROUTE_TO", chanid }, end];
    }
    case Tag.ACK_RELIABLE: {
      const [ranges, end] = pullRanges(data, pos, limits);
      checkAckReliable(ranges);
      return [{ type: "ACK_RELIABLE", ranges }, end];
    }
    case Tag.ACK_NACK_UNRELIABLE: {
      const [ranges, end] = pullRanges(data, pos, limits);
      checkAckNack(ranges);
      return [{ type: "ACK_NACK_UNRELIABLE", ranges }, end];
    }
    case Tag.SENT_UNRELIABLE: {
      const [count, end] = pullVarint(data, pos);
      return [{ type: "SENT_UNRELIABLE", count }, end];
    }
    case Tag.FINISH_SENDER: {
      const [sentReliable, end] = pullVarint(data, pos);
      return [{ type: "FINISH_SENDER", sentReliable }, end];
    }
    case Tag.CANCEL_SENDER:
      return [{ type: "CANCEL_SENDER" }, pos];
    case Tag.CLOSE_RECEIVER:
      return [{ type: "CLOSE_RECEIVER" }, pos];
    case Tag.FORGET_CHANNEL:
      return [{ type: "FORGET_CHANNEL" }, pos];
    case Tag.ACK_VERSION:
      return [{ type: "ACK_VERSION" }, pos];
    case Tag.CONNECTION_HEADERS: {
      const [headers, end] = pullHeaders(data, pos, limits);
      return [{ type: "CONNECTION_HEADERS", headers }, end];
    }
    case Tag.VERSION:
      return pullVersion(data, pos - 1);
    case Tag.DEQUEUED: {
      if (!flowControl) throw new RemoteProtocolError("DEQUEUED (tag 12) without negotiated flow control");
      const [numBytes, end] = pullVarint(data, pos);
      return [{ type: "DEQUEUED", numBytes }, end];
    }
    default:
      throw new RemoteProtocolError(`unknown frame tag ${tag}`);
  }
}

/** Decode exactly one frame from `data` (tests and tools). */
export function decodeFrame(data: Bytes, limits: WireLimits = DEFAULT_LIMITS, flowControl = false): Frame {
  let frame: Frame;
  let pos: number;
  try {
    [frame, pos] = pullFrame(data, 0, limits, flowControl);
  } catch (err) {
    if (err instanceof Truncated) throw new RemoteProtocolError("frame truncated");
    throw err;
  }
  if (pos !== data.length) throw new RemoteProtocolError(`${data.length - pos} bytes after the frame`);
  return frame;
}
