/**
 * Primitives of profile §1: varint (1-9 bytes, the 9th byte carrying 8 bits with no flag),
 * varbytes, header data.
 *
 * Decoders take a view and a position and return `[value, newPosition]`. They throw
 * {@link Truncated} when the data ends early (a stream parser then waits for more bytes; at
 * the end of a stream or datagram it is a protocol error) and {@link RemoteProtocolError} for
 * anything malformed.
 *
 * Numbers: every integer field of a frame is a u64 on the wire. This package decodes them as
 * JavaScript numbers, which are exact up to 2^53 - 1; a larger value in a frame is refused
 * with LIMIT_VIOLATION (code 3): no conforming peer of ours reaches it (message numbers stay
 * within 2^20 of their cursor, G31; counts and indices grow by one). {@link pullVarintBig}
 * and {@link encodeVarint} handle the whole u64 range for tools and tests.
 */
import { CloseCode, LocalProtocolError, RemoteProtocolError } from "./errors.js";

export type Bytes = Uint8Array;
/** Header data: a multimap of byte keys to byte values, order and duplicates kept. */
export type Headers = ReadonlyArray<readonly [Bytes, Bytes]>;

export const MAX_U64 = (1n << 64n) - 1n;

/** Internal signal: the input ended in the middle of an item. Never escapes the parsers. */
export class Truncated extends Error {
  override name = "Truncated";
}
const TRUNCATED = new Truncated("truncated");

/** Size limits enforced while decoding (profile §6). Exceeding one is close code 3. */
export interface WireLimits {
  readonly maxHeaderBytes: number;
  readonly maxPayloadBytes: number;
  readonly maxListBytes: number;
}
export const DEFAULT_LIMITS: WireLimits = {
  maxHeaderBytes: 64 * 1024,
  maxPayloadBytes: 64 * 1024 * 1024,
  maxListBytes: 64 * 1024,
};

const encoder = new TextEncoder();
const decoder = new TextDecoder();
/** UTF-8 bytes of a string (header keys and values are bytes on the wire). */
export const utf8 = (text: string): Bytes => encoder.encode(text);
export const fromUtf8 = (data: Bytes): string => decoder.decode(data);

export function toHex(data: Bytes): string {
  let out = "";
  for (const b of data) out += b.toString(16).padStart(2, "0");
  return out;
}
export function fromHex(hex: string): Bytes {
  const clean = hex.replace(/\s+/g, "");
  if (clean.length % 2 || /[^0-9a-fA-F]/.test(clean)) throw new Error(`not hex: ${hex}`);
  const out = new Uint8Array(clean.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(clean.slice(2 * i, 2 * i + 2), 16);
  return out;
}
export function equalBytes(a: Bytes, b: Bytes): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
export function concatBytes(parts: readonly Bytes[]): Bytes {
  if (parts.length === 1) return parts[0]!;
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let pos = 0;
  for (const p of parts) {
    out.set(p, pos);
    pos += p.length;
  }
  return out;
}

/** A growable byte buffer that frames are pushed into. */
export class Writer {
  private buf: Uint8Array;
  length = 0;
  constructor(capacity = 64) {
    this.buf = new Uint8Array(capacity);
  }
  private room(n: number): void {
    const need = this.length + n;
    if (need <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < need) size *= 2;
    const grown = new Uint8Array(size);
    grown.set(this.buf.subarray(0, this.length));
    this.buf = grown;
  }
  byte(b: number): void {
    this.room(1);
    this.buf[this.length++] = b;
  }
  bytes(data: Bytes): void {
    this.room(data.length);
    this.buf.set(data, this.length);
    this.length += data.length;
  }
  varint(value: number | bigint): void {
    if (typeof value === "number" && value >= 0 && value < 0x80 && Number.isInteger(value)) {
      this.byte(value);
      return;
    }
    this.bytes(encodeVarint(value));
  }
  varbytes(data: Bytes): void {
    this.varint(data.length);
    this.bytes(data);
  }
  /** The bytes pushed so far (a copy: the writer may be reused). */
  finish(): Bytes {
    return this.buf.slice(0, this.length);
  }
}

/** Number of bytes {@link encodeVarint} produces for `value`. */
export function varintSize(value: number): number {
  if (value < 0x80) return 1;
  let n = 1;
  while (value >= 0x80 && n < 8) {
    value = Math.floor(value / 128);
    n++;
  }
  return n === 8 && value >= 0x80 ? 9 : n;
}

/** The minimal 1-9 byte encoding of an unsigned 64-bit integer. */
export function encodeVarint(value: number | bigint): Bytes {
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value) || value < 0)
      throw new LocalProtocolError(`varint must be an integer in [0, 2^53), got ${value}`);
    if (value < 0x80) return Uint8Array.of(value);
    value = BigInt(value);
  }
  if (value < 0n || value > MAX_U64) throw new LocalProtocolError(`varint out of range: ${value}`);
  const out: number[] = [];
  for (let i = 0; i < 8; i++) {
    if (value < 0x80n) {
      out.push(Number(value));
      return Uint8Array.from(out);
    }
    out.push(Number(value & 0x7fn) | 0x80);
    value >>= 7n;
  }
  out.push(Number(value)); // 9th byte: the top 8 bits, no continuation flag
  return Uint8Array.from(out);
}

/** Decode a varint at `pos` over the whole u64 range. Overlong forms are rejected. */
export function pullVarintBig(data: Bytes, pos: number): [bigint, number] {
  let value = 0n;
  let shift = 0n;
  for (let i = 0; i < 9; i++) {
    if (pos >= data.length) throw TRUNCATED;
    const byte = data[pos++]!;
    if (i === 8) {
      if (byte === 0) throw new RemoteProtocolError("overlong varint (9th byte is zero)");
      return [value | (BigInt(byte) << 56n), pos];
    }
    value |= BigInt(byte & 0x7f) << shift;
    shift += 7n;
    if (byte < 0x80) {
      if (byte === 0 && i > 0) throw new RemoteProtocolError("overlong varint (last byte is zero)");
      return [value, pos];
    }
  }
  throw new Error("unreachable");
}

/** Decode a varint at `pos` as a number; above 2^53 - 1 it is refused (see the module doc). */
export function pullVarint(data: Bytes, pos: number): [number, number] {
  if (pos >= data.length) throw TRUNCATED;
  let byte = data[pos]!;
  if (byte < 0x80) return [byte, pos + 1];
  let value = byte & 0x7f;
  let mul = 128;
  let i = pos + 1;
  // Up to 7 bytes (49 bits) exactly in a double; beyond, take the careful road.
  for (let k = 1; k < 7; k++) {
    if (i >= data.length) throw TRUNCATED;
    byte = data[i++]!;
    value += (byte & 0x7f) * mul;
    mul *= 128;
    if (byte < 0x80) {
      if (byte === 0) throw new RemoteProtocolError("overlong varint (last byte is zero)");
      return [value, i];
    }
  }
  const [big, end] = pullVarintBig(data, pos);
  if (big > BigInt(Number.MAX_SAFE_INTEGER))
    throw new RemoteProtocolError(
      `a varint of ${big} is beyond 2^53 - 1, the largest integer this implementation holds`,
      CloseCode.LIMIT_VIOLATION,
    );
  return [Number(big), end];
}

/** Decode a varbytes length and check it against `limit` (close code 3). */
export function pullLength(data: Bytes, pos: number, limit: number, what: string): [number, number] {
  const [n, end] = pullVarint(data, pos);
  if (n > limit)
    throw new RemoteProtocolError(
      `${what} of ${n} bytes exceeds the limit of ${limit} bytes`,
      CloseCode.LIMIT_VIOLATION,
    );
  return [n, end];
}

export function pullVarbytes(data: Bytes, pos: number, limit: number, what: string): [Bytes, number] {
  const [n, start] = pullLength(data, pos, limit, what);
  const end = start + n;
  if (end > data.length) throw TRUNCATED;
  return [data.subarray(start, end), end];
}

export function pushHeaders(w: Writer, headers: Headers): void {
  if (headers.length === 0) {
    w.byte(0);
    return;
  }
  const inner = new Writer();
  for (const [key, value] of headers) {
    inner.varbytes(key);
    inner.varbytes(value);
  }
  w.varbytes(inner.finish());
}

export function encodeHeaders(headers: Headers): Bytes {
  const w = new Writer();
  pushHeaders(w, headers);
  return w.finish();
}

export function pullHeaders(data: Bytes, pos: number, limits: WireLimits): [Headers, number] {
  const [n, start] = pullLength(data, pos, limits.maxHeaderBytes, "header block");
  const end = start + n;
  if (end > data.length) throw TRUNCATED;
  const inner = data.subarray(start, end);
  const items: Bytes[] = [];
  let ipos = 0;
  try {
    while (ipos < n) {
      // The block's length bounds every item: one running past it is malformed (code 1).
      const [item, next] = pullVarbytes(inner, ipos, Number.MAX_SAFE_INTEGER, "header item");
      items.push(item.slice());
      ipos = next;
    }
  } catch (err) {
    if (err instanceof Truncated) throw new RemoteProtocolError("header item overruns its header block");
    throw err;
  }
  if (items.length % 2) throw new RemoteProtocolError("header block holds an odd number of items");
  const headers: Array<readonly [Bytes, Bytes]> = [];
  for (let i = 0; i < items.length; i += 2) headers.push([items[i]!, items[i + 1]!]);
  return [headers, end];
}

/** Header pairs from strings or bytes (a caller's convenience). */
export function toHeaders(pairs: Iterable<readonly [string | Bytes, string | Bytes]>): Headers {
  const out: Array<readonly [Bytes, Bytes]> = [];
  for (const [k, v] of pairs) out.push([typeof k === "string" ? utf8(k) : k, typeof v === "string" ? utf8(v) : v]);
  return out;
}

/** The first value of `key` in `headers`, or undefined. */
export function findHeader(headers: Headers, key: string | Bytes): Bytes | undefined {
  const want = typeof key === "string" ? utf8(key) : key;
  for (const [k, v] of headers) if (equalBytes(k, want)) return v;
  return undefined;
}
