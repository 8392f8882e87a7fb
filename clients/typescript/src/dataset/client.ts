/**
 * A client of the Aqueduct dataset service (docs/dataset-protocol.md) for browsers: list,
 * describe, history, scan and read (Arrow record batches, decoded by apache-arrow), write
 * (begin, write, commit), and subscribe (new versions pushed as they are committed). One
 * connection, WebTransport or WebSocket (transport/dial.ts).
 */
import type { RecordBatch, Schema, Table } from "apache-arrow";
import { encode } from "cbor2";
import { type AqueductConnection, Receiver, channel, oneshot } from "../api/connection.js";
import { type DialOptions, type Endpoints, dial } from "../transport/dial.js";
import { type Bytes, EndOfChannel, type Headers, findHeader, utf8 } from "../wire/index.js";
import { decodeCbor } from "../api/codec.js";
import { batchMessages, decodeBatches, readSchema, schemaMessage } from "./arrow.js";
import { DatasetError, errorFromWire, unwrap } from "./errors.js";

export const H_VERSION = "aqds-version-4b1f0a";
export const H_TOKEN = "aqds-token-4b1f0a";
export const H_SCHEMA = "aqds-schema-4b1f0a";
export const H_COMPRESSION = "aqds-compression-4b1f0a";
export const H_BATCH = "aqds-batch-4b1f0a";
export const H_ERROR = "aqds-error-4b1f0a";

export interface DatasetInfo {
  name: string;
  version: number;
  schema: Uint8Array;
  partition_by: string[];
  rows: number;
  bytes: number;
  files: number;
  created: Date | null;
  updated: Date | null;
}

export interface VersionInfo {
  version: number;
  timestamp: Date | string | null;
  operation: string;
  rows: number;
  bytes: number;
  data_change: boolean;
  action?: string;
  rows_removed?: number | null;
  detail?: string;
}

export type Split = Record<string, unknown>;

export interface Plan {
  dataset: string;
  version: number;
  schema: Uint8Array;
  splits: Split[];
  rows: number;
  bytes: number;
  tasks?: number[][];
}

export interface ClientOptions extends DialOptions {
  readonly endpoints: Endpoints;
  /** The bearer token, if the service requires one (sent inside TLS, in a connection header). */
  readonly token?: string | null;
  /** Seconds to wait for a reply (60). */
  readonly requestTimeout?: number;
}

export class DatasetClient {
  private constructor(
    readonly conn: AqueductConnection,
    private readonly timeout: number,
  ) {}

  static async connect(opts: ClientOptions): Promise<DatasetClient> {
    const headers: Array<readonly [Bytes, Bytes]> = [[utf8(H_VERSION), utf8("1")]];
    if (opts.token) headers.push([utf8(H_TOKEN), utf8(opts.token)]);
    const conn = await dial(opts.endpoints, headers, opts);
    return new DatasetClient(conn, opts.requestTimeout ?? 60);
  }

  /** What carries the connection: webtransport or websocket. */
  get transport(): string {
    return this.conn.transport;
  }

  close(): void {
    try {
      this.conn.entrypoint.finish();
    } catch {
      // the connection is gone already
    }
    this.conn.close();
  }

  /** One request and its reply's result (throws the service's error). */
  async call(op: string, fields: Record<string, unknown> = {}): Promise<unknown> {
    const [reply, answer] = oneshot();
    await this.conn.entrypoint.send({ op, ...fields, reply });
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        answer.close();
        reject(new DatasetError("UNAVAILABLE", `no answer to ${JSON.stringify(op)} within ${this.timeout} s`));
      }, this.timeout * 1000);
    });
    try {
      return unwrap(await Promise.race([answer.recv(), timeout]));
    } catch (err) {
      if (err instanceof EndOfChannel) throw new DatasetError("UNAVAILABLE", `the service ended ${op} without an answer`);
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  async ping(): Promise<void> {
    await this.call("ping");
  }

  async list(): Promise<DatasetInfo[]> {
    const r = (await this.call("list")) as { datasets: DatasetInfo[] };
    return r.datasets;
  }

  async describe(dataset: string, opts: { version?: number; timestamp?: string } = {}): Promise<DatasetInfo> {
    return (await this.call("describe", { dataset, ...opts })) as DatasetInfo;
  }

  /** The dataset's versions, oldest first (op `offsets`). */
  async history(dataset: string, sinceVersion?: number): Promise<{ latest: number; versions: VersionInfo[] }> {
    return (await this.call("offsets", { dataset, since_version: sinceVersion ?? null })) as { latest: number; versions: VersionInfo[] };
  }

  async status(): Promise<Record<string, unknown>> {
    return (await this.call("status")) as Record<string, unknown>;
  }

  async plan(dataset: string, opts: { version?: number; columns?: string[]; filters?: unknown[]; minTasks?: number } = {}): Promise<Plan> {
    return (await this.call("plan", {
      dataset,
      version: opts.version ?? null,
      columns: opts.columns ?? null,
      filters: opts.filters ?? null,
      min_tasks: opts.minTasks ?? null,
    })) as Plan;
  }

  /** The record batches of some splits (a plan's task), cast by the service to `schema`. */
  async *scan(
    splits: Split[],
    schema: Uint8Array,
    opts: { columns?: string[]; filters?: unknown[]; batchRows?: number } = {},
  ): AsyncGenerator<RecordBatch> {
    const headers: Headers = [
      [utf8(H_SCHEMA), schema],
      [utf8(H_COMPRESSION), utf8("none")],
    ];
    const [tx, rx] = channel({ headers, codec: "raw" });
    await this.conn.entrypoint.send({
      op: "scan",
      dataset: splits[0]?.dataset ?? null,
      ...(splits.length === 1 ? { split: splits[0] } : { splits }),
      columns: opts.columns ?? null,
      filters: opts.filters ?? null,
      batch_rows: opts.batchRows ?? null,
      out: tx,
    });
    try {
      yield* decodeBatches(schema, dataMessages(rx));
    } finally {
      rx.close();
    }
  }

  /** The dataset's rows as record batches, at most `limit` rows (all by default). */
  async *readBatches(dataset: string, opts: { version?: number; columns?: string[]; filters?: unknown[]; limit?: number } = {}): AsyncGenerator<RecordBatch> {
    const plan = await this.plan(dataset, opts);
    let left = opts.limit ?? Number.POSITIVE_INFINITY;
    const tasks = plan.tasks ?? plan.splits.map((_, i) => [i]);
    for (const task of tasks) {
      if (left <= 0) return;
      for await (const batch of this.scan(task.map((i) => plan.splits[i]!), plan.schema, opts)) {
        if (batch.numRows > left) {
          yield batch.slice(0, left);
          left = 0;
          return;
        }
        left -= batch.numRows;
        yield batch;
        if (left <= 0) return;
      }
    }
  }

  /** New versions of `dataset` as they are committed: the first note is the latest version,
   * then each commit (coalesced: a slow reader sees the newest), and heartbeats. */
  async *subscribe(dataset: string, heartbeat = 5): AsyncGenerator<{ version: number; heartbeat: number }> {
    const [tx, rx] = channel();
    await this.conn.entrypoint.send({ op: "subscribe", dataset, heartbeat, out: tx });
    try {
      for await (const d of rx) {
        const error = findHeader(d.headers, H_ERROR);
        if (error !== undefined) throw errorFromWire(decodeCbor(error, () => null));
        yield d.value as { version: number; heartbeat: number };
      }
    } finally {
      rx.close();
    }
  }

  /** Append (or overwrite, or create) `table` as one commit; returns the new version. */
  async write(dataset: string, table: Table, mode: "append" | "overwrite" | "create" = "append"): Promise<{ version: number; rows: number }> {
    const schema = schemaMessage(table.schema);
    const begun = (await this.call("begin", { dataset, mode, schema, partition_by: [] })) as {
      txn: string;
      schema: Uint8Array;
      partition_by: string[];
    };
    const [tx, rx] = channel({ headers: [[utf8(H_SCHEMA), begun.schema]], codec: "raw" });
    const [reply, answer] = oneshot();
    await this.conn.entrypoint.send({
      op: "write",
      dataset,
      txn: begun.txn,
      task: `browser-${Math.random().toString(16).slice(2, 14)}`,
      partition_by: begun.partition_by,
      data: rx,
      reply,
    });
    const staged = await (async () => {
      try {
        let seq = 0;
        for (const message of batchMessages(table)) {
          const rows = table.batches[seq]!.numRows;
          await tx.send(message, { headers: [[utf8(H_BATCH), encode({ rows, seq })]] });
          seq++;
        }
        tx.finish();
      } catch (err) {
        tx.cancel();
        throw err;
      }
      return unwrap(await answer.recv()) as { staged: unknown[] };
    })();
    const committed = (await this.call("commit", {
      dataset,
      mode,
      schema: begun.schema,
      partition_by: begun.partition_by,
      staged: staged.staged,
    })) as { version: number; rows: number };
    return committed;
  }

  /** The Arrow schema inside a DatasetInfo or Plan. */
  static schemaOf(message: Uint8Array): Promise<Schema> {
    return readSchema(message);
  }
}

/** The payloads of a data channel; an error message (aqds-error-4b1f0a) is thrown. */
async function* dataMessages(rx: Receiver): AsyncGenerator<Uint8Array> {
  for await (const d of rx) {
    const error = findHeader(d.headers, H_ERROR);
    if (error !== undefined) throw errorFromWire(decodeCbor(error, () => null));
    yield d.payload;
  }
}
