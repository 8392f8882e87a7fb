/**
 * Aqueduct over WebTransport (profile §8): the engine's unidirectional streams are the
 * session's unidirectional streams, its datagrams the session's datagrams, and its close
 * the session's close (code and reason). The browser numbers the streams; the engine's ids
 * are only names here: ours in the engine's order, the server's in the order they arrive.
 */
import { AqueductConnection, type Link } from "../api/connection.js";
import { CloseCode, fromHex } from "../wire/index.js";

export interface WebTransportTarget {
  /** https://host:port/aqueduct */
  readonly url: string;
  /** SHA-256 hashes (hex) of the server's certificate, when it is self-signed (an ECDSA
   * P-256 certificate valid for at most 14 days, as the browser requires). */
  readonly certificateHashes?: readonly string[];
}

interface OutStream {
  writer: Promise<WritableStreamDefaultWriter<Uint8Array>>;
  /** The writes chained so far (each waits for the one before). */
  tail: Promise<void>;
}

class WebTransportLink implements Link {
  private out = new Map<number, OutStream>();
  private pending = 0;
  private datagramWriter: WritableStreamDefaultWriter<Uint8Array>;

  constructor(
    private readonly wt: WebTransport,
    private readonly conn: AqueductConnection,
  ) {
    this.datagramWriter = wt.datagrams.writable.getWriter();
  }

  write(streamId: number, data: Uint8Array, fin: boolean): void {
    let s = this.out.get(streamId);
    if (s === undefined) {
      const writer = this.wt.createUnidirectionalStream().then((w) => w.getWriter());
      s = { writer, tail: writer.then(() => undefined) };
      this.out.set(streamId, s);
    }
    const stream = s;
    this.pending += data.length;
    stream.tail = stream.tail
      .then(async () => {
        const w = await stream.writer;
        if (data.length) await w.write(data);
        if (fin) await w.close();
      })
      .catch(() => undefined) // the session's end reports the failure
      .finally(() => {
        this.pending -= data.length;
        this.conn.drained();
      });
    if (fin) this.out.delete(streamId);
  }

  reset(streamId: number): void {
    const s = this.out.get(streamId);
    if (s === undefined) return;
    this.out.delete(streamId);
    s.tail = s.tail.then(async () => {
      const w = await s.writer;
      await w.abort(new WebTransportError("reset", { streamErrorCode: 0 })).catch(() => undefined);
    });
  }

  datagram(data: Uint8Array): void {
    void this.datagramWriter.write(data).catch(() => undefined);
  }

  close(code: number, reason: string): void {
    try {
      this.wt.close({ closeCode: code, reason: reason.slice(0, 1024) });
    } catch {
      // already closed
    }
  }

  backlog(): number {
    return this.pending;
  }
}

/** Open an Aqueduct connection over WebTransport; resolves once the session is up (the
 * Aqueduct handshake then runs inside it: await `conn.ready()`). */
export async function connectWebTransport(target: WebTransportTarget, conn: AqueductConnection, signal?: AbortSignal): Promise<AqueductConnection> {
  if (typeof WebTransport === "undefined") throw new Error("this browser has no WebTransport");
  const hashes: WebTransportHash[] = (target.certificateHashes ?? []).map((h) => ({ algorithm: "sha-256", value: fromHex(h) as Uint8Array<ArrayBuffer> }));
  const wt = new WebTransport(target.url, hashes.length ? { serverCertificateHashes: hashes } : {});
  const abort = () => {
    try {
      wt.close({ closeCode: CloseCode.NO_ERROR, reason: "another transport won" });
    } catch {
      // not open yet
    }
  };
  signal?.addEventListener("abort", abort);
  await wt.ready;
  signal?.removeEventListener("abort", abort);
  conn.transport = "webtransport";
  const link = new WebTransportLink(wt, conn);
  conn.attach(link);
  void wt.closed.then(
    (info) => conn.lost(info.closeCode ?? CloseCode.NO_ERROR, info.reason ?? ""),
    (err: unknown) => conn.lost(CloseCode.INTERNAL, `the WebTransport session failed: ${String(err)}`),
  );
  void readStreams(wt, conn);
  void readDatagrams(wt, conn);
  conn.transportReady(wt.datagrams.maxDatagramSize ?? 1200);
  return conn;
}

async function readStreams(wt: WebTransport, conn: AqueductConnection): Promise<void> {
  const streams = wt.incomingUnidirectionalStreams.getReader();
  let next = 3; // the server's ids, in arrival order
  try {
    for (;;) {
      const { value, done } = await streams.read();
      if (done) return;
      const id = next;
      next += 4;
      void readStream(value, id, conn);
    }
  } catch {
    // the session ended; wt.closed reports how
  }
}

async function readStream(stream: ReadableStream<Uint8Array>, id: number, conn: AqueductConnection): Promise<void> {
  const reader = stream.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        conn.streamData(id, new Uint8Array(0), true);
        return;
      }
      if (value.length) conn.streamData(id, value, false);
    }
  } catch {
    if (!conn.closed) conn.streamReset(id);
  }
}

async function readDatagrams(wt: WebTransport, conn: AqueductConnection): Promise<void> {
  const reader = wt.datagrams.readable.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      conn.datagramReceived(value);
    }
  } catch {
    // the session ended
  }
}
