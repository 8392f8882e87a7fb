/** The JSON form of frames in docs/vectors/*.json (the Python tests read the same form). */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import type { Frame, Headers } from "../src/wire/index.js";
import { fromHex } from "../src/wire/index.js";

export interface JsonFrame {
  type: string;
  [key: string]: unknown;
}

const headers = (pairs: unknown): Headers => (pairs as string[][]).map(([k, v]) => [fromHex(k!), fromHex(v!)] as const);

export function frameOf(spec: JsonFrame): Frame {
  switch (spec.type) {
    case "MESSAGE":
      return {
        type: "MESSAGE",
        num: spec.num as number,
        headers: headers(spec.headers),
        attachments: (spec.attachments as Array<{ chanid: number; headers: string[][] }>).map((a) => ({ chanid: a.chanid, headers: headers(a.headers) })),
        payload: fromHex(spec.payload as string),
      };
    case "VERSION":
      return { type: "VERSION", version: fromHex(spec.version as string) };
    case "CONNECTION_HEADERS":
      return { type: "CONNECTION_HEADERS", headers: headers(spec.headers) };
    case "ROUTE_TO":
      return { type: "ROUTE_TO", chanid: spec.chanid as number };
    case "SENT_UNRELIABLE":
      return { type: "SENT_UNRELIABLE", count: spec.count as number };
    case "FINISH_SENDER":
      return { type: "FINISH_SENDER", sentReliable: spec.sentReliable as number };
    case "ACK_RELIABLE":
    case "ACK_NACK_UNRELIABLE":
      return { type: spec.type, ranges: spec.ranges as number[] };
    case "DEQUEUED":
      return { type: "DEQUEUED", numBytes: spec.numBytes as number };
    case "ACK_VERSION":
    case "CANCEL_SENDER":
    case "CLOSE_RECEIVER":
    case "FORGET_CHANNEL":
      return { type: spec.type };
    default:
      throw new Error(`unknown frame type ${spec.type}`);
  }
}

/** A vector's bytes: `hex`, then `repeat.hex` `repeat.count` times. */
export function wireOf(vector: { hex: string; repeat?: { hex: string; count: number } }): Uint8Array {
  const head = fromHex(vector.hex);
  if (!vector.repeat) return head;
  const unit = fromHex(vector.repeat.hex);
  const out = new Uint8Array(head.length + unit.length * vector.repeat.count);
  out.set(head);
  for (let i = 0; i < vector.repeat.count; i++) out.set(unit, head.length + i * unit.length);
  return out;
}

/** A file of the repository's docs/vectors/. */
export function loadVectors<T>(name: string): T {
  const path = fileURLToPath(new URL(`../../../docs/vectors/${name}`, import.meta.url));
  return JSON.parse(readFileSync(path, "utf-8")) as T;
}

/** Frames compared as plain data (payload bytes as hex). */
export function plain(frames: readonly Frame[]): unknown[] {
  return JSON.parse(JSON.stringify(frames, (_k, v) => (v instanceof Uint8Array ? Array.from(v, (b) => b.toString(16).padStart(2, "0")).join("") : v)));
}
