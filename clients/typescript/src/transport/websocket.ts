/**
 * Aqueduct over WebSocket (profile §9): the multiplexer of Aqueduct over TCP (§7) inside the
 * binary messages of one WebSocket, subprotocol `aqueduct-tcp`: each frame one message.
 * For browsers, and networks, where UDP does not get through.
 */
import { AqueductConnection, type Link, clock } from "../api/connection.js";
import { DEFAULT_MUX, MuxConnection, MuxError, type MuxEvent } from "../mux/mux.js";
import { CloseCode } from "../wire/index.js";

export const WS_SUBPROTOCOL = "aqueduct-tcp";

export interface WebSocketTarget {
  /** wss://host:port/aqueduct */
  readonly url: string;
}

/** How often a link whose socket still buffers bytes looks again (WebSocket has no event
 * for its buffer draining). */
const DRAIN_POLL_MS = 10;

class WebSocketLink implements Link {
  private timer: ReturnType<typeof setTimeout> | null = null;
  private drainTimer: ReturnType<typeof setTimeout> | null = null;
  private sendQueued = false;
  constructor(
    private readonly ws: WebSocket,
    readonly mux: MuxConnection,
  ) {}

  // What the engine writes outside the socket's own events (a request the page sends) goes
  // out at the end of the current task: one send for all of a flush's writes.
  write(streamId: number, data: Uint8Array, fin: boolean): void {
    this.mux.write(streamId, data, fin);
    this.queueSend();
  }
  reset(streamId: number): void {
    this.mux.reset(streamId);
    this.queueSend();
  }
  datagram(data: Uint8Array): void {
    this.mux.sendDatagram(data);
    this.queueSend();
  }
  private queueSend(): void {
    if (this.sendQueued) return;
    this.sendQueued = true;
    queueMicrotask(() => {
      this.sendQueued = false;
      this.send();
    });
  }
  close(code: number, reason: string): void {
    this.mux.close(code, reason);
    this.send();
    this.ws.close(1000);
  }
  backlog(): number {
    return this.mux.backlog + this.ws.bufferedAmount;
  }

  /** Hand the multiplexer's frames to the socket, one message each; arm its timer. */
  send(): void {
    if (this.ws.readyState !== WebSocket.OPEN) return;
    for (const frame of this.mux.takeFrames()) this.ws.send(frame as Uint8Array<ArrayBuffer>);
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    const next = this.mux.nextTimer();
    if (next !== null) this.timer = setTimeout(() => this.onTimer(), Math.max(0, (next - clock()) * 1000) + 1);
    // Senders the engine paused on this link's backlog go on as the socket drains.
    if (this.ws.bufferedAmount > 0 && this.drainTimer === null) {
      this.drainTimer = setTimeout(() => {
        this.drainTimer = null;
        this.conn.drained();
        this.send();
      }, DRAIN_POLL_MS);
    }
  }

  onTimer(): void {
    this.timer = null;
    this.handle(this.mux.handleTimer(clock()));
  }

  handle(events: MuxEvent[]): void {
    this.send();
    for (const e of events) this.onMuxEvent(e);
    this.conn.drained(); // credit that arrived may have let the multiplexer send
  }

  conn!: AqueductConnection;

  onMuxEvent(e: MuxEvent): void {
    const conn = this.conn;
    switch (e.kind) {
      case "ready":
        conn.transportReady(e.peer.maxDatagram);
        break;
      case "stream":
        conn.streamData(e.streamId, e.data, e.fin);
        break;
      case "reset":
        conn.streamReset(e.streamId);
        break;
      case "datagram":
        conn.datagramReceived(e.data);
        break;
      case "closed":
        conn.lost(e.code, e.reason);
        this.ws.close(1000);
        break;
    }
    this.send();
  }
}

/** Open an Aqueduct connection over WebSocket; resolves once the server's SETTINGS arrived
 * (the Aqueduct handshake then runs: await `conn.ready()`). */
export function connectWebSocket(target: WebSocketTarget, conn: AqueductConnection, signal?: AbortSignal): Promise<AqueductConnection> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(target.url, [WS_SUBPROTOCOL]);
    ws.binaryType = "arraybuffer";
    const mux = new MuxConnection({ ...DEFAULT_MUX }, clock());
    const link = new WebSocketLink(ws, mux);
    link.conn = conn;
    let settled = false;
    const fail = (why: string) => {
      if (!settled) {
        settled = true;
        reject(new Error(why));
      } else conn.lost(CloseCode.INTERNAL, why);
    };
    signal?.addEventListener("abort", () => {
      if (!settled) {
        settled = true;
        reject(new Error("another transport won"));
      }
      ws.close(1000);
    });
    ws.onopen = () => {
      if (ws.protocol !== WS_SUBPROTOCOL) {
        fail(`the server did not take the WebSocket subprotocol ${WS_SUBPROTOCOL} (it answered ${JSON.stringify(ws.protocol)})`);
        ws.close(1002);
        return;
      }
      link.send(); // our SETTINGS
    };
    ws.onmessage = (msg: MessageEvent) => {
      if (!(msg.data instanceof ArrayBuffer)) {
        mux.close(CloseCode.PROTOCOL_VIOLATION, "a text WebSocket message");
        link.send();
        ws.close(1002);
        fail("the server sent a text WebSocket message");
        return;
      }
      let events: MuxEvent[];
      try {
        events = mux.receive(new Uint8Array(msg.data), clock());
      } catch (err) {
        if (!(err instanceof MuxError)) throw err;
        link.send();
        ws.close(1000);
        fail(err.message);
        return;
      }
      if (!settled && events.some((e) => e.kind === "ready")) {
        settled = true;
        conn.transport = "websocket";
        conn.attach(link);
        resolve(conn);
      }
      link.handle(events);
    };
    ws.onclose = (ev: CloseEvent) => {
      const why = `the WebSocket closed (${ev.code}${ev.reason ? `: ${ev.reason}` : ""})`;
      if (!settled) fail(why);
      else if (!conn.closed) conn.lost(CloseCode.INTERNAL, `${why} without an Aqueduct CLOSE`);
    };
    ws.onerror = () => {
      if (!settled) fail(`could not open a WebSocket to ${target.url}`);
    };
  });
}
