/** The shared golden vectors of docs/vectors/wire.json, against the TypeScript codec (the
 * Python codec passes the same file in tests/core/test_vectors.py). */
import { describe, expect, it } from "vitest";
import {
  RemoteProtocolError,
  Side,
  StreamParser,
  creatorOf,
  decodeFrame,
  encodeFrames,
  encodeVarint,
  fromHex,
  indexOf,
  isOneshot,
  messageCost,
  parseDatagram,
  pullVarint,
  pullVarintBig,
  senderOf,
  toHex,
} from "../src/wire/index.js";
import { type JsonFrame, frameOf, loadVectors, plain, wireOf } from "./json-frames.js";

interface Vectors {
  varint: Array<{ value: string; hex: string }>;
  varint_rejected: Array<{ hex: string }>;
  chanid: Array<{ hex: string; creator: string; sender: string; oneshot: boolean; index: number }>;
  frames: Array<{ frame: JsonFrame; hex: string }>;
  message_cost: Array<{ frame: JsonFrame; cost: number }>;
  sequences: Array<{ name: string; hex: string; frames: JsonFrame[]; datagram: boolean; flow_control?: boolean }>;
  malformed: Array<{ hex: string; repeat?: { hex: string; count: number }; code: number; why: string; where: string[]; flow_control?: boolean }>;
}
const V = loadVectors<Vectors>("wire.json");

function codeOf(fn: () => unknown): number | string {
  try {
    fn();
  } catch (err) {
    if (err instanceof RemoteProtocolError) return err.code;
    return `not a protocol error: ${String(err)}`;
  }
  return "no error";
}

describe("varints", () => {
  it.each(V.varint)("$value", ({ value, hex }) => {
    const big = BigInt(value);
    expect(toHex(encodeVarint(big))).toBe(hex);
    expect(pullVarintBig(fromHex(hex), 0)).toEqual([big, hex.length / 2]);
    if (big <= BigInt(Number.MAX_SAFE_INTEGER)) {
      expect(toHex(encodeVarint(Number(big)))).toBe(hex);
      expect(pullVarint(fromHex(hex), 0)).toEqual([Number(big), hex.length / 2]);
    } else {
      // Beyond what a JavaScript number holds exactly: refused as a limit, never rounded.
      expect(codeOf(() => pullVarint(fromHex(hex), 0))).toBe(3);
    }
  });
  it.each(V.varint_rejected)("overlong $hex", ({ hex }) => {
    expect(codeOf(() => pullVarintBig(fromHex(hex), 0))).toBe(1);
    expect(codeOf(() => pullVarint(fromHex(hex), 0))).toBe(1);
  });
});

it.each(V.chanid)("chanid $hex", ({ hex, creator, sender, oneshot, index }) => {
  const chanid = parseInt(hex, 16);
  const side = (s: string) => (s === "client" ? Side.CLIENT : Side.SERVER);
  expect(creatorOf(chanid)).toBe(side(creator));
  expect(senderOf(chanid)).toBe(side(sender));
  expect(isOneshot(chanid)).toBe(oneshot);
  expect(indexOf(chanid)).toBe(index);
});

it.each(V.frames)("frame $hex", ({ frame, hex }) => {
  const f = frameOf(frame);
  expect(toHex(encodeFrames(f))).toBe(hex);
  expect(plain([decodeFrame(fromHex(hex), undefined, true)])).toEqual(plain([f]));
});

it.each(V.message_cost)("message cost $cost", ({ frame, cost }) => {
  const m = frameOf(frame);
  if (m.type !== "MESSAGE") throw new Error("not a message");
  expect(messageCost(m)).toBe(cost);
});

it.each(V.sequences)("sequence: $name", ({ hex, frames, datagram, flow_control }) => {
  const wire = fromHex(hex);
  const want = frames.map(frameOf);
  expect(toHex(encodeFrames(...want))).toBe(hex);
  for (let cut = 0; cut <= wire.length; cut++) {
    const parser = new StreamParser(undefined, flow_control ?? false);
    const got = [...parser.feed(wire.subarray(0, cut)), ...parser.feed(wire.subarray(cut))];
    parser.finish();
    expect(plain(got)).toEqual(plain(want));
  }
  const bytewise = new StreamParser(undefined, flow_control ?? false);
  const got = [];
  for (let i = 0; i < wire.length; i++) got.push(...bytewise.feed(wire.subarray(i, i + 1)));
  expect(plain(got)).toEqual(plain(want));
  if (datagram) expect(plain(parseDatagram(wire, undefined, flow_control ?? false)[0])).toEqual(plain(want));
});

it.each(V.malformed)("malformed: $why", (vector) => {
  const wire = wireOf(vector);
  const flow = vector.flow_control ?? false;
  for (const where of vector.where) {
    const code = codeOf(() => {
      if (where === "frame") decodeFrame(wire, undefined, flow);
      else if (where === "datagram") parseDatagram(wire, undefined, flow);
      else {
        const parser = new StreamParser(undefined, flow);
        parser.feed(wire);
        parser.finish();
      }
    });
    expect([where, code]).toEqual([where, vector.code]);
  }
});
