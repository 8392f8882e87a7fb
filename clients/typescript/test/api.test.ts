/** The async channel layer over a real engine pair in memory: the client's
 * AqueductConnection and a server engine played by the test (CBOR requests with a oneshot
 * reply, a raw data channel under flow control, a write, a connection lost). */
import { decode, encode, type TagDecoder } from "cbor2";
import { afterEach, describe, expect, it } from "vitest";
import { AqueductConnection, type Link, channel, clock, oneshot } from "../src/api/connection.js";
import { Connection } from "../src/engine/index.js";
import { ConnectionLost, EndOfChannel, Side, type Message } from "../src/wire/index.js";

type App = (server: Connection, request: Record<string, unknown>, message: Message) => void;

/** A client connection wired to a server engine; `app` answers each request. */
function pair(app: App, window = 16 << 20) {
  const server = new Connection(Side.SERVER, { config: { flowWindow: window } });
  const client = new AqueductConnection([], "memory", { flowWindow: window });
  let pumping = false;
  const pumpServer = () => {
    if (pumping) return;
    pumping = true;
    try {
      for (;;) {
        const commands = server.commands();
        for (const e of server.events()) if (e.kind === "message" && e.chanid === 0) serve();
        const more = server.commands();
        if (!commands.length && !more.length) break;
        for (const c of [...commands, ...more]) {
          if (c.kind === "write") queueMicrotask(() => client.streamData(c.streamId, c.data, c.fin));
          else if (c.kind === "close") queueMicrotask(() => client.lost(c.code, c.reason));
        }
      }
    } finally {
      pumping = false;
    }
  };
  const serve = () => {
    for (;;) {
      const m = server.recv(0, clock());
      if (m === null) return;
      const request = decode(m.payload, {
        tags: new Map<number, TagDecoder>([[44045, (t) => ({ handle: m.attachments[Number(t.contents)]!.chanid })]]),
      }) as Record<string, unknown>;
      app(server, request, m);
    }
  };
  const link: Link = {
    write: (sid, data, fin) => {
      server.streamData(sid, data, fin, clock());
      pumpServer();
    },
    reset: (sid) => {
      server.streamReset(sid, clock());
      pumpServer();
    },
    datagram: () => undefined,
    close: (code, reason) => server.connectionLost(clock(), code, reason),
    backlog: () => 0,
  };
  client.attach(link);
  server.handshakeDone(clock());
  client.transportReady(1200);
  pumpServer();
  const timer = setInterval(() => {
    server.handleTimer(clock());
    pumpServer();
  }, 5);
  timers.push(timer);
  return { client, server, pump: pumpServer };
}
const timers: ReturnType<typeof setInterval>[] = [];
afterEach(() => timers.splice(0).forEach(clearInterval));

const handle = (v: unknown) => (v as { handle: number }).handle;

describe("the async channel layer", () => {
  it("sends a request with a oneshot reply and gets the answer", async () => {
    const { client, pump } = pair((server, req) => {
      server.send(handle(req.reply), encode({ ok: true, result: { echo: req.n } }), clock());
      pump();
    });
    await client.ready();
    const [reply, answer] = oneshot();
    await client.entrypoint.send({ op: "echo", n: 42, reply });
    expect(await answer.recv()).toEqual({ ok: true, result: { echo: 42 } });
    await expect(answer.recv()).rejects.toThrow(EndOfChannel);
  });

  it("streams raw messages on a data channel through a small flow-control window", async () => {
    const sizes = [3000, 5000, 100, 7000, 1];
    const { client, pump } = pair((server, req) => {
      const out = handle(req.out);
      sizes.forEach((n, i) => server.send(out, new Uint8Array(n).fill(i), clock()));
      server.finish(out, clock());
      pump();
    }, 8192);
    await client.ready();
    const [tx, rx] = channel({ codec: "raw" });
    await client.entrypoint.send({ op: "scan", out: tx });
    const got: number[] = [];
    for await (const d of rx) {
      expect((d.value as Uint8Array).every((b) => b === got.length)).toBe(true);
      got.push((d.value as Uint8Array).length);
    }
    expect(got).toEqual(sizes);
  });

  it("writes on a channel whose receiver the server holds, and sees the peer cancel", async () => {
    const received: number[] = [];
    let data = -1;
    const { client, server, pump } = pair((srv, req) => {
      data = handle(req.data);
      pump();
    });
    await client.ready();
    const [tx, rx] = channel({ codec: "raw" });
    await client.entrypoint.send({ op: "write", data: rx });
    for (let i = 0; i < 5; i++) await tx.send(new Uint8Array(10).fill(i));
    await new Promise((r) => setTimeout(r, 20));
    for (let m = server.recv(data, clock()); m !== null; m = server.recv(data, clock())) received.push(m.payload[0]!);
    expect(received).toEqual([0, 1, 2, 3, 4]);
    server.closeReceiver(data, clock());
    pump();
    await new Promise((r) => setTimeout(r, 20));
    await expect(tx.send(new Uint8Array(1))).rejects.toThrow(/receiver dropped/);
  });

  it("ends every open channel with ConnectionLost when the connection is lost", async () => {
    const { client } = pair(() => undefined);
    await client.ready();
    const [reply, answer] = oneshot();
    await client.entrypoint.send({ op: "never", reply });
    setTimeout(() => client.lost(0, "gone"), 10);
    await expect(answer.recv()).rejects.toThrow(ConnectionLost);
  });
});
