/**
 * Connecting: WebTransport first, WebSocket as the fallback, raced as Happy Eyeballs races
 * address families (RFC 8305), the same idea as the Python client's `auto`: WebTransport
 * starts at once; WebSocket starts when WebTransport fails or after `raceDelay` seconds;
 * the first transport up wins and the other is abandoned. The winner is remembered per
 * service for ten minutes, and tried alone first next time.
 */
import { AqueductConnection } from "../api/connection.js";
import type { EngineConfig } from "../engine/config.js";
import type { Headers } from "../wire/index.js";
import { type WebSocketTarget, connectWebSocket } from "./websocket.js";
import { type WebTransportTarget, connectWebTransport } from "./webtransport.js";

export interface Endpoints {
  readonly webtransport?: WebTransportTarget | null;
  readonly websocket?: WebSocketTarget | null;
}

export type TransportChoice = "auto" | "webtransport" | "websocket";

export interface DialOptions {
  readonly transport?: TransportChoice;
  /** Seconds WebTransport has alone before WebSocket joins the race (0.25). */
  readonly raceDelay?: number;
  /** Seconds to wait for the transport and the Aqueduct handshake (10). */
  readonly timeout?: number;
  readonly config?: Partial<EngineConfig>;
}

const remembered = new Map<string, { transport: "webtransport" | "websocket"; until: number }>();
const REMEMBER_MS = 10 * 60 * 1000;

/** An Aqueduct connection to `endpoints`, its handshake done. */
export async function dial(endpoints: Endpoints, headers: Headers, opts: DialOptions = {}): Promise<AqueductConnection> {
  const choice = opts.transport ?? "auto";
  const wt = choice !== "websocket" ? endpoints.webtransport : null;
  const ws = choice !== "webtransport" ? endpoints.websocket : null;
  if (!wt && !ws) throw new Error(`no endpoint for transport ${choice}`);
  const key = `${wt?.url ?? ""}|${ws?.url ?? ""}`;
  const timeoutMs = (opts.timeout ?? 10) * 1000;
  const attempts: Array<{ abort: AbortController; conn: AqueductConnection }> = [];
  const start = (kind: "webtransport" | "websocket"): Promise<AqueductConnection> => {
    const conn = new AqueductConnection(headers, kind, opts.config);
    const abort = new AbortController();
    attempts.push({ abort, conn });
    return kind === "webtransport" ? connectWebTransport(wt!, conn, abort.signal) : connectWebSocket(ws!, conn, abort.signal);
  };
  const won = remembered.get(key);
  const first: "webtransport" | "websocket" =
    won && won.until > Date.now() && (won.transport === "webtransport" ? wt : ws) ? won.transport : wt && typeof WebTransport !== "undefined" ? "webtransport" : "websocket";
  const second = first === "webtransport" ? (ws ? "websocket" : null) : wt && typeof WebTransport !== "undefined" ? "webtransport" : null;

  const conn = await new Promise<AqueductConnection>((resolve, reject) => {
    const errors: string[] = [];
    let running = 0;
    let secondStarted = false;
    let done = false;
    const deadline = setTimeout(() => finish(null, `no transport connected within ${timeoutMs / 1000} s`), timeoutMs);
    const finish = (c: AqueductConnection | null, why?: string) => {
      if (done) return;
      done = true;
      clearTimeout(deadline);
      clearTimeout(raceTimer);
      for (const a of attempts) if (a.conn !== c) a.abort.abort();
      if (c) resolve(c);
      else reject(new Error(`could not reach the Aqueduct service: ${why ?? errors.join("; ")}`));
    };
    const launch = (kind: "webtransport" | "websocket") => {
      running++;
      start(kind).then(
        (c) => finish(c),
        (err: unknown) => {
          running--;
          errors.push(`${kind}: ${err instanceof Error ? err.message : String(err)}`);
          if (!secondStarted && second) startSecond();
          else if (running === 0) finish(null);
        },
      );
    };
    const startSecond = () => {
      if (secondStarted || done || !second) return;
      secondStarted = true;
      launch(second);
    };
    const raceTimer = setTimeout(startSecond, choice === "auto" ? (opts.raceDelay ?? 0.25) * 1000 : timeoutMs);
    launch(first);
  });
  remembered.set(key, { transport: conn.transport as "webtransport" | "websocket", until: Date.now() + REMEMBER_MS });
  const timer = setTimeout(() => conn.close(4, "no CONNECTION_HEADERS in time"), timeoutMs);
  try {
    await conn.ready();
  } finally {
    clearTimeout(timer);
  }
  return conn;
}

/** Forget which transport won (tests; a network that changed). */
export function forgetWinners(): void {
  remembered.clear();
}
