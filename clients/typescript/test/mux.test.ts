/** The multiplexer of profile §7 as the WebSocket client speaks it (§9). */
import { describe, expect, it } from "vitest";
import { FrameType, MuxConnection, MuxError, checkHeader, DEFAULT_MUX, encodeSettings } from "../src/mux/mux.js";
import { fromHex, toHex } from "../src/wire/index.js";

const SERVER_SETTINGS = "01 00 00000032 0001 0000000000100000 0002 0000000001000000 0003 0000000000002710 0004 0000000000010000 0005 0000000000007530";
const hex = (frames: Uint8Array[]) => frames.map(toHex);

describe("the worked example of profile §7", () => {
  it("encodes a SETTINGS that sets only MAX_FRAME_SIZE", () => {
    expect(toHex(encodeSettings([[1, 1 << 20]]))).toBe("0100" + "0000000a" + "0001" + "0000000000100000");
  });

  it("opens stream 2 once the server's SETTINGS arrived, and answers a PING", () => {
    const mux = new MuxConnection(DEFAULT_MUX, 0);
    const hello = fromHex("ef505fa6600f408e 4151554544554354 0b 302e302e302d4146544552 0200");
    mux.write(2, hello, true);
    // Before the server's SETTINGS only our own SETTINGS goes out.
    const first = mux.takeFrames();
    expect(first.length).toBe(1);
    expect(first[0]![0]).toBe(FrameType.SETTINGS);
    const events = mux.receive(fromHex(SERVER_SETTINGS), 0.1);
    expect(events).toEqual([{ kind: "ready", peer: { maxFrameSize: 1 << 20, initialStreamCredit: 16 << 20, maxStreams: 10000, maxDatagram: 65536, idleTimeout: 30 } }]);
    expect(hex(mux.takeFrames())).toEqual(["0201000000260000000000000002" + toHex(hello)]);
    mux.receive(fromHex("06 00 00000008 0102030405060708"), 0.2);
    expect(hex(mux.takeFrames())).toEqual(["060100000008" + "0102030405060708"]);
  });
});

describe("frame header rules, in order", () => {
  const ours = DEFAULT_MUX;
  const code = (f: () => void) => {
    try {
      f();
    } catch (err) {
      return (err as MuxError).code;
    }
    return null;
  };
  it("a DATAGRAM with flag 0x80 and a length above MAX_DATAGRAM is a PROTOCOL_VIOLATION (rule 3 first)", () => {
    expect(code(() => checkHeader(FrameType.DATAGRAM, 0x80, ours.maxDatagram + 1, ours, true))).toBe(1);
  });
  it("a SETTINGS of 641 bytes is a LIMIT_VIOLATION (rule 4 before rule 5)", () => {
    expect(code(() => checkHeader(FrameType.SETTINGS, 0, 641, ours, false))).toBe(3);
  });
  it("anything but SETTINGS or CLOSE before SETTINGS, and a second SETTINGS", () => {
    expect(code(() => checkHeader(FrameType.STREAM, 0, 8, ours, false))).toBe(1);
    expect(code(() => checkHeader(FrameType.CLOSE, 0, 8, ours, false))).toBe(null);
    expect(code(() => checkHeader(FrameType.SETTINGS, 0, 10, ours, true))).toBe(1);
  });
  it("unknown types, and lengths that do not fit the type", () => {
    expect(code(() => checkHeader(8, 0, 0, ours, true))).toBe(1);
    expect(code(() => checkHeader(FrameType.PING, 0, 7, ours, true))).toBe(1);
    expect(code(() => checkHeader(FrameType.CREDIT, 0, 15, ours, true))).toBe(1);
    expect(code(() => checkHeader(FrameType.STREAM, 0, ours.maxFrameSize + 1, ours, true))).toBe(3);
  });
});

describe("streams and credit", () => {
  const ready = () => {
    const mux = new MuxConnection(DEFAULT_MUX, 0);
    mux.receive(fromHex(SERVER_SETTINGS), 0);
    mux.takeFrames();
    return mux;
  };
  it("grants CREDIT back to the initial credit once half of it is used (the profile's 32767 and 32768)", () => {
    const I = 65536;
    const mux = new MuxConnection({ ...DEFAULT_MUX, initialStreamCredit: I }, 0);
    mux.receive(fromHex(SERVER_SETTINGS), 0);
    mux.takeFrames();
    const frame = (n: number) => {
      const f = new Uint8Array(14 + n);
      const v = new DataView(f.buffer);
      v.setUint8(0, 2);
      v.setUint32(2, 8 + n);
      v.setUint32(10, 3);
      return f;
    };
    mux.receive(frame(I / 2 - 1), 0);
    expect(mux.takeFrames()).toEqual([]);
    mux.receive(frame(1), 0);
    const credit = mux.takeFrames();
    expect(credit.length).toBe(1);
    expect(toHex(credit[0]!)).toBe("040000000010" + "0000000000000003" + (I / 2).toString(16).padStart(16, "0"));
  });
  it("sends no more than the peer's credit, and the rest after its CREDIT", () => {
    const mux = new MuxConnection(DEFAULT_MUX, 0);
    // a server that grants 100 bytes per stream
    mux.receive(fromHex("01 00 0000000a 0002 0000000000000064"), 0);
    mux.takeFrames();
    mux.write(2, new Uint8Array(150), true);
    const first = mux.takeFrames();
    expect(first.map((f) => f.length - 14)).toEqual([100]);
    mux.receive(fromHex("04 00 00000010 0000000000000002 0000000000000064"), 0);
    const rest = mux.takeFrames();
    expect(rest.map((f) => [f.length - 14, f[1]])).toEqual([[50, 1]]);
  });
  it("a STREAM beyond its credit is a LIMIT_VIOLATION answered with CLOSE", () => {
    const mux = new MuxConnection({ ...DEFAULT_MUX, initialStreamCredit: 10 }, 0);
    mux.receive(fromHex(SERVER_SETTINGS), 0);
    mux.takeFrames();
    expect(() => mux.receive(fromHex("02 00 00000013 0000000000000003 " + "00".repeat(11)), 0)).toThrow(MuxError);
    const close = mux.takeFrames();
    expect(close.length).toBe(1);
    expect(close[0]![0]).toBe(FrameType.CLOSE);
    expect(new DataView(close[0]!.buffer).getUint32(10)).toBe(3);
  });
  it("a frame cut by the end of its WebSocket message is a PROTOCOL_VIOLATION", () => {
    const mux = ready();
    expect(() => mux.receive(fromHex("06 00 00000008 01020304"), 0)).toThrow(/cut/);
    expect(mux.closed).toBe(true);
  });
});
