/**
 * The live console (`aqueduct serve --console`): datasets with their versions, schema and
 * size; a preview of any dataset's first rows; its history; the service's activity; new
 * versions as they are committed, pushed by `subscribe` (no polling). Read-only: it sends
 * list, describe, plan, scan, offsets, status and subscribe, nothing that writes.
 *
 * The page learns where the service is from `aqueduct.json` beside it (the endpoints and the
 * WebTransport certificate's hash). A token, when the service asks for one, is typed into
 * the page and kept in memory, or in this tab's sessionStorage if the user asks; it never
 * enters the page's address.
 */
import type { Schema } from "apache-arrow";
import { DatasetClient, type DatasetInfo } from "../dataset/client.js";
import { DatasetError } from "../dataset/errors.js";
import type { Endpoints, TransportChoice } from "../transport/dial.js";
import { bytes, count, el, rate, rows, when } from "./format.js";
import { Rates, type Status, servicePanel } from "./service.js";

interface ConsoleConfig extends Endpoints {
  /** The service asks for a token (it was started with --token or a tokens file). */
  readonly token_required?: boolean;
}

/** The endpoints `aqueduct.json` names (profile §10). */
function configFrom(json: Record<string, unknown>): ConsoleConfig {
  const wt = (json.webtransport ?? null) as { url?: string; hashes?: string[]; certificateHashes?: string[] } | null;
  const ws = (json.websocket ?? null) as { url?: string } | null;
  return {
    webtransport: wt?.url ? { url: wt.url, certificateHashes: wt.certificateHashes ?? wt.hashes ?? [] } : null,
    websocket: ws?.url ? { url: ws.url } : null,
    token_required: Boolean(json.token_required),
  };
}

const PREVIEW_ROWS = 1000;
/** Live subscriptions held at once: each is a request the service counts until it ends
 * (--max-requests, 64 per connection), and the console's own requests need room too. */
const MAX_SUBSCRIPTIONS = 32;
const TOKEN_KEY = "aqueduct-console-token";

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;

class ConsoleApp {
  private client: DatasetClient | null = null;
  private token: string | null = sessionStorage.getItem(TOKEN_KEY);
  private datasets = new Map<string, DatasetInfo>();
  private subscribed = new Set<string>();
  private selected: string | null = null;
  private lastBytes = 0;
  private lastAt = performance.now();
  private inRate = 0;
  private rates = new Rates();

  constructor(private readonly config: ConsoleConfig) {}

  async start(): Promise<void> {
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const input = $<HTMLInputElement>("token");
      this.token = input.value;
      input.value = "";
      if ($<HTMLInputElement>("token-keep").checked) sessionStorage.setItem(TOKEN_KEY, this.token);
      $("token-form").hidden = true;
      void this.connect();
    });
    if (this.config.token_required && !this.token) {
      this.askToken("");
      return;
    }
    await this.connect();
  }

  private askToken(why: string): void {
    this.status(why || "this service asks for a token", true);
    $("token-form").hidden = false;
    $<HTMLInputElement>("token").focus();
  }

  private status(text: string, error = false): void {
    const conn = $("conn");
    conn.textContent = text;
    conn.classList.toggle("error", error);
  }

  private async connect(): Promise<void> {
    this.client?.close();
    this.subscribed.clear();
    const transport = (new URLSearchParams(location.search).get("transport") ?? "auto") as TransportChoice;
    this.status(`connecting (${transport})…`);
    try {
      this.client = await DatasetClient.connect({ endpoints: this.config, token: this.token, transport });
      document.body.dataset.transport = this.client.transport;
      this.status(`connected over ${this.client.transport}`);
      await this.refresh();
      setInterval(() => this.tick(), 1000);
      setInterval(() => void this.refresh().catch(() => undefined), 10_000);
    } catch (err) {
      if (err instanceof DatasetError && (err.code === "UNAUTHENTICATED" || err.code === "PERMISSION_DENIED")) {
        sessionStorage.removeItem(TOKEN_KEY);
        this.askToken(`${err.message}`);
        return;
      }
      this.status(`could not connect: ${err instanceof Error ? err.message : String(err)}`, true);
    }
  }

  /** Once a second: the connection line and the service panel. */
  private tick(): void {
    const client = this.client;
    if (!client) return;
    const now = performance.now();
    const got = client.conn.bytesIn;
    this.inRate = ((got - this.lastBytes) * 1000) / Math.max(1, now - this.lastAt);
    this.lastBytes = got;
    this.lastAt = now;
    if (client.conn.closed) {
      const info = client.conn.closeInfo;
      this.status(`disconnected (code ${info?.code ?? "?"}${info?.reason ? `: ${info.reason}` : ""}); reload to reconnect`, true);
      return;
    }
    this.status(`connected over ${client.transport} · ${this.datasets.size} datasets · ${this.subscribed.size} live · in ${rate(this.inRate)}`);
    void this.service().catch(() => undefined);
  }

  private async service(): Promise<void> {
    const st = (await this.client!.status()) as Status;
    const page = `${this.client!.transport}, ${rate(this.inRate)} in, ${this.subscribed.size} subscriptions`;
    $("service").replaceChildren(servicePanel(st, this.rates, performance.now() / 1000, page));
  }

  private async refresh(): Promise<void> {
    const list = await this.client!.list();
    for (const info of list) this.datasets.set(info.name, info);
    this.renderList();
    for (const info of list) if (this.subscribed.size < MAX_SUBSCRIPTIONS && !this.subscribed.has(info.name)) void this.follow(info.name);
    if (this.selected === null && list.length) await this.select(list[0]!.name);
  }

  /** Push: each version the service announces for `name` as it is committed. */
  private async follow(name: string): Promise<void> {
    this.subscribed.add(name);
    try {
      for await (const note of this.client!.subscribe(name)) {
        const known = this.datasets.get(name);
        if (known && note.version > known.version) {
          const info = await this.client!.describe(name);
          this.datasets.set(name, info);
          this.renderList(name);
          if (this.selected === name) await this.select(name, true);
        }
      }
    } catch {
      // the dataset was dropped, or the connection ended
    } finally {
      this.subscribed.delete(name);
    }
  }

  private renderList(fresh?: string): void {
    const body = $("datasets").querySelector("tbody")!;
    body.replaceChildren(
      ...[...this.datasets.values()]
        .sort((a, b) => a.name.localeCompare(b.name))
        .map((d) => {
          const tr = el(
            "tr",
            { "data-testid": "dataset-row", "data-name": d.name, class: `${d.name === this.selected ? "selected" : ""} ${d.name === fresh ? "fresh" : ""}` },
            el("td", {}, d.name),
            el("td", { class: "num", "data-testid": `version-${d.name}` }, String(d.version)),
            el("td", { class: "num" }, count(d.rows)),
            el("td", { class: "num" }, bytes(d.bytes)),
            el("td", { class: "num" }, count(d.files)),
            el("td", {}, when(d.updated)),
          );
          tr.addEventListener("click", () => void this.select(d.name));
          return tr;
        }),
    );
  }

  private async select(name: string, update = false): Promise<void> {
    this.selected = name;
    if (!update) this.renderList();
    const client = this.client!;
    const info = this.datasets.get(name) ?? (await client.describe(name));
    const schema = await DatasetClient.schemaOf(info.schema);
    $("detail").hidden = false;
    $("detail-name").textContent = name;
    $("detail-meta").textContent = `version ${info.version} · ${count(info.rows)} rows · ${bytes(info.bytes)} in ${count(info.files)} files · created ${when(info.created)} · updated ${when(info.updated)}${info.partition_by.length ? ` · partitioned by ${info.partition_by.join(", ")}` : ""}`;
    $("schema").querySelector("tbody")!.replaceChildren(...schema.fields.map((f) => el("tr", {}, el("td", {}, f.name), el("td", {}, String(f.type)), el("td", {}, f.nullable ? "yes" : "no"))));
    await Promise.all([this.preview(name, schema), this.history(name)]);
  }

  private async preview(name: string, schema: Schema): Promise<void> {
    const table = $("preview");
    const started = performance.now();
    const body: HTMLTableRowElement[] = [];
    for await (const batch of this.client!.readBatches(name, { limit: PREVIEW_ROWS })) {
      if (this.selected !== name) return;
      for (const r of rows(batch, schema)) body.push(el("tr", {}, ...r.map((v) => el("td", {}, v))));
    }
    table.querySelector("thead")!.replaceChildren(el("tr", {}, ...schema.fields.map((f) => el("th", {}, f.name))));
    table.querySelector("tbody")!.replaceChildren(...body);
    table.dataset.rows = String(body.length);
    $("preview-note").textContent = `first ${count(body.length)} rows, read in ${Math.round(performance.now() - started)} ms`;
  }

  private async history(name: string): Promise<void> {
    const { versions } = await this.client!.history(name);
    $("history").querySelector("tbody")!.replaceChildren(
      ...versions
        .slice()
        .reverse()
        .map((v) =>
          el("tr", { "data-testid": "history-row" }, el("td", { class: "num" }, String(v.version)), el("td", {}, when(v.timestamp)), el("td", {}, v.action ?? v.operation), el("td", { class: "num" }, count(v.rows)), el("td", { class: "num" }, bytes(v.bytes))),
        ),
    );
  }
}

async function main(): Promise<void> {
  let config: ConsoleConfig;
  try {
    const response = await fetch("./aqueduct.json", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    config = configFrom((await response.json()) as Record<string, unknown>);
  } catch (err) {
    $("conn").textContent = `no aqueduct.json beside this page (${String(err)}): open the console at the address aqueduct serve --console prints`;
    $("conn").classList.add("error");
    return;
  }
  await new ConsoleApp(config).start();
}

void main();
