// Runs in the harness page (window.aqueduct) for benchmarks/bench_browser.py: one read of
// a dataset by the TypeScript client over one transport, every value checked (id = i,
// name = "r" + i, x = i / 4). args: {transport, endpoints, dataset}. The time runs from
// the request for the plan to the last batch checked: what a page that reads and uses the
// rows waits for. The connection is opened before the clock starts.
const A = window.aqueduct;
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
  for (let i = 0; i < b.numRows; i++) {
    const v = rows + i;
    if (Number(id[i]) !== v || x[i] !== v / 4 || name.get(i) !== "r" + v) bad++;
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
