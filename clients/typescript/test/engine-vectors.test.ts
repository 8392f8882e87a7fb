/** The client engine's conversations of docs/vectors/engine.json, replayed on the TypeScript
 * engine step by step (tests/core/test_vectors.py replays them on the Python engine). */
import { describe, expect, it } from "vitest";
import { Connection } from "../src/engine/index.js";
import { AqueductError, EndOfChannel, Side, fromHex, toHex } from "../src/wire/index.js";
import { loadVectors } from "./json-frames.js";

type Json = Record<string, unknown>;
interface Step extends Json {
  at: number;
  do: string;
  commands: Json[];
  events: Json[];
  result?: unknown;
}
interface Scenario {
  name: string;
  config?: { flow_window?: number | null; handshake_timeout?: number };
  headers?: string[][];
  steps: Step[];
}

const pairs = (p: unknown) => ((p ?? []) as string[][]).map(([k, v]) => [fromHex(k!), fromHex(v!)] as const);
const hexPairs = (h: ReadonlyArray<readonly [Uint8Array, Uint8Array]>) => h.map(([k, v]) => [toHex(k), toHex(v)]);

/** Run one step; what it did, in the JSON form. */
function step(conn: Connection, s: Step): Json {
  const now = s.at;
  let result: unknown = undefined;
  const chanid = s.chanid as number;
  const errorName = (err: unknown) => {
    if (err instanceof AqueductError) return `error:${err.name}`;
    throw err;
  };
  switch (s.do) {
    case "handshake_done":
      conn.handshakeDone(now, { maxDatagram: (s.max_datagram as number | undefined) ?? 1200 });
      break;
    case "stream":
      conn.streamData(s.id as number, fromHex(s.hex as string), (s.fin as boolean | undefined) ?? false, now);
      break;
    case "datagram":
      conn.datagramReceived(fromHex(s.hex as string), now);
      break;
    case "reset":
      conn.streamReset(s.id as number, now);
      break;
    case "timer":
      conn.handleTimer(now);
      break;
    case "send":
      try {
        result = conn.send(chanid, fromHex((s.payload as string | undefined) ?? ""), now, {
          headers: pairs(s.headers),
          attachments: ((s.attach ?? []) as Json[]).map((a) => ({
            keepSender: a.keep_sender as boolean,
            oneshot: (a.oneshot as boolean | undefined) ?? false,
            headers: pairs(a.headers),
          })),
        });
      } catch (err) {
        result = errorName(err);
      }
      break;
    case "recv":
      try {
        const m = conn.recv(chanid, now);
        result = m === null ? "none" : { payload: toHex(m.payload), headers: hexPairs(m.headers), attachments: m.attachments.map((a) => a.chanid) };
      } catch (err) {
        result = err instanceof EndOfChannel ? "end" : errorName(err);
      }
      break;
    case "finish":
      conn.finish(chanid, now);
      break;
    case "cancel":
      conn.cancel(chanid, now);
      break;
    case "close_receiver":
      conn.closeReceiver(chanid, now);
      break;
    default:
      throw new Error(`unknown step ${s.do}`);
  }
  const commands: Json[] = [];
  for (const c of conn.commands()) {
    const last = commands[commands.length - 1];
    if (c.kind === "write") {
      // Consecutive writes to one stream count as one: the bytes per stream are what matter.
      if (last && last.write === c.streamId && !last.fin) {
        last.hex = (last.hex as string) + toHex(c.data);
        last.fin = c.fin;
      } else commands.push({ write: c.streamId, hex: toHex(c.data), fin: c.fin });
    } else if (c.kind === "reset") commands.push({ reset: c.streamId });
    else if (c.kind === "datagram") commands.push({ datagram: toHex(c.data) });
    else commands.push({ close: c.code });
  }
  const events: Json[] = conn.events().map((e) => {
    switch (e.kind) {
      case "headers":
        return { headers: hexPairs(e.headers) };
      case "message":
        return { message: e.chanid };
      case "senderReady":
        return { sender_ready: e.chanid };
      case "terminated":
        return { terminated: e.chanid, terminal: e.terminal };
      case "connectionTerminated":
        return { closed: e.code, by_peer: e.byPeer };
    }
  });
  const out: Json = { commands, events };
  if (result !== undefined) out.result = result;
  return out;
}

const { scenarios } = loadVectors<{ scenarios: Scenario[] }>("engine.json");

describe("engine vectors", () => {
  it.each(scenarios)("$name", (scenario) => {
    const conn = new Connection(Side.CLIENT, {
      config: {
        flowWindow: scenario.config?.flow_window === undefined ? 16 * 1024 * 1024 : scenario.config.flow_window,
        handshakeTimeout: scenario.config?.handshake_timeout ?? 10,
      },
      headers: pairs(scenario.headers),
    });
    for (const s of scenario.steps) {
      const want: Json = { commands: s.commands, events: s.events };
      if (s.result !== undefined) want.result = s.result;
      expect([s.do, s.at, step(conn, s)]).toEqual([s.do, s.at, want]);
    }
  });
});
