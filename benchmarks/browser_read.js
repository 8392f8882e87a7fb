// Runs in the harness page (window.aqueduct) for benchmarks/bench_browser.py: one read of
// a dataset by the TypeScript client over one transport, every value checked (id = i,
// name = "r" + i, x = i / 4). args: {transport, endpoints, dataset}. The time runs from
// the request for the plan to the last batch checked: what a page that reads and uses the
// rows waits for. The connection is opened before the clock starts.
const A = window.aqueduct;
// name[i] = "r" + i, checked on the UTF-8 bytes as they arrived (decoding a million
// strings to compare them would time the check, not the read).
const nameIs = (bytes, start, end, v) => {
  if (bytes[start] !== 114) return false; // "r"
  let k = end - 1;
  do {
    if (k <= start || bytes[k--] !== 48 + (v % 10)) return false;
    v = Math.floor(v / 10);
  } while (v > 0);
  return k === start;
};
const t0 = performance.now();
const c = await A.DatasetClient.connect({ transport: args.transport, endpoints: args.endpoints });
const connectMs = performance.now() - t0;
const wire0 = c.conn.bytesIn;
const started = performance.now();
let rows = 0;
let bad = 0;
let batches = 0;
let checkMs = 0;
for await (const b of c.readBatches(args.dataset)) {
  const c0 = performance.now();
  const id = b.getChild("id").toArray();
  const x = b.getChild("x").toArray();
  const name = b.getChild("name");
  if (name.data.length !== 1) throw new Error(`a batch's name column came in ${name.data.length} pieces`);
  const { valueOffsets, values } = name.data[0];
  for (let i = 0; i < b.numRows; i++) {
    const v = rows + i;
    if (Number(id[i]) !== v || x[i] !== v / 4 || !nameIs(values, valueOffsets[i], valueOffsets[i + 1], v)) bad++;
  }
  rows += b.numRows;
  batches++;
  checkMs += performance.now() - c0;
}
const ms = performance.now() - started;
const wire = c.conn.bytesIn - wire0;
const transport = c.transport;
c.close();
return { transport, rows, bad, batches, ms, checkMs, connectMs, wire };
