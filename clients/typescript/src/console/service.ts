/**
 * The console's service panel: the `status` answer (docs/dataset-protocol.md, `status`):
 * uptime, connections per transport, requests in flight, staging, and the open connections
 * with their running requests (scans, writes, subscriptions). Rates are current: the bytes
 * moved between this answer and the one before, per second (the answer's own `bytes_per_s`
 * is an average since the connection or request began, used for the first answer).
 */
import { bytes, count, el, rate } from "./format.js";

interface Stream {
  op: string;
  dataset: string | null;
  age_s: number;
  rows: number;
  bytes: number;
  bytes_per_s: number;
}

interface Listed {
  transport: string;
  peer: string;
  user: string | null;
  yours: boolean;
  age_s: number;
  requests: number;
  rows: number;
  bytes: number;
  bytes_per_s: number;
  streams?: Stream[];
}

export interface Status {
  uptime_s?: number;
  connections?: number;
  transports?: Record<string, number>;
  requests_in_flight?: number;
  connections_listed?: Listed[];
  staged_bytes?: number;
  staged_transactions?: number;
  open_writes?: number;
  [key: string]: unknown;
}

/** Bytes seen per connection and per request at the previous answer, for current rates. */
export class Rates {
  private seen = new Map<string, { bytes: number; at: number }>();

  rate(key: string, total: number, average: number, now: number): number {
    const before = this.seen.get(key);
    this.seen.set(key, { bytes: total, at: now });
    if (!before || now <= before.at) return average;
    return Math.max(0, (total - before.bytes) / (now - before.at));
  }

  /** Forget what the latest answer no longer lists. */
  keep(keys: Set<string>): void {
    for (const k of [...this.seen.keys()]) if (!keys.has(k)) this.seen.delete(k);
  }
}

function duration(seconds: number): string {
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** The panel for one `status` answer; `rates` carries the previous answer's bytes. */
export function servicePanel(st: Status, rates: Rates, now: number, page: string): HTMLElement {
  const dl = el("dl");
  const add = (k: string, v: string) => dl.append(el("dt", {}, k), el("dd", { "data-testid": `service-${k.replaceAll(" ", "-")}` }, v));
  add("this page", page);
  if (st.uptime_s !== undefined) add("up", duration(st.uptime_s));
  if (st.connections !== undefined) {
    const per = Object.entries(st.transports ?? {})
      .filter(([, n]) => n > 0)
      .map(([t, n]) => `${t} ${n}`)
      .join(" · ");
    add("connections", `${count(st.connections)}${per ? ` (${per})` : ""}`);
  }
  if (st.requests_in_flight !== undefined) add("requests in flight", count(st.requests_in_flight));
  if (st.staged_transactions !== undefined) add("staging", `${count(st.staged_transactions)} transactions, ${bytes(st.staged_bytes ?? 0)}, ${count(st.open_writes ?? 0)} writes open`);

  const listed = st.connections_listed ?? [];
  const keys = new Set<string>();
  const body = listed.flatMap((c) => {
    const ck = `${c.transport} ${c.peer}`; // a peer's address and port name one connection
    keys.add(ck);
    const row = el(
      "tr",
      { "data-testid": "connection-row", "data-transport": c.transport, class: c.yours ? "yours" : "" },
      el("td", {}, c.transport),
      el("td", {}, c.peer),
      el("td", {}, c.user ?? ""),
      el("td", { class: "num" }, duration(c.age_s)),
      el("td", { class: "num" }, count(c.requests)),
      el("td", { class: "num" }, count(c.rows)),
      el("td", { class: "num" }, bytes(c.bytes)),
      el("td", { class: "num", "data-testid": "connection-rate" }, rate(rates.rate(ck, c.bytes, c.bytes_per_s, now))),
    );
    const streams = (c.streams ?? []).map((s, i) => {
      const sk = `${ck} ${s.op} ${s.dataset ?? ""} ${i}`;
      keys.add(sk);
      return el(
        "tr",
        { class: "stream", "data-testid": "stream-row" },
        el("td", {}, ""),
        el("td", { colspan: "2" }, `${s.op}${s.dataset ? ` ${s.dataset}` : ""}`),
        el("td", { class: "num" }, duration(s.age_s)),
        el("td", {}, ""),
        el("td", { class: "num" }, count(s.rows)),
        el("td", { class: "num" }, bytes(s.bytes)),
        el("td", { class: "num" }, rate(rates.rate(sk, s.bytes, s.bytes_per_s, now))),
      );
    });
    return [row, ...streams];
  });
  rates.keep(keys);
  const table = el(
    "table",
    { id: "connections", "data-testid": "connections" },
    el("thead", {}, el("tr", {}, ...["transport", "peer", "user", "age", "requests", "rows", "bytes", "rate"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...body),
  );
  const shown = listed.length < (st.connections ?? 0) ? ` (${listed.length} of ${st.connections} shown)` : "";
  return el("div", {}, dl, el("h3", {}, `Connections${shown}`), table);
}
