// Runs in the harness page (window.aqueduct): the TypeScript client against the service
// over one transport. args: {transport, endpoints, dataset, rows, target}. Every value of
// the dataset is checked: id = i, name = "r" + i, x = i / 4.
const A = window.aqueduct;
const started = performance.now();
const c = await A.DatasetClient.connect({ transport: args.transport, endpoints: args.endpoints });
const connectedMs = performance.now() - started;
const names = (await c.list()).map((d) => d.name);
const info = await c.describe(args.dataset);
let rows = 0;
let bad = 0;
for await (const b of c.readBatches(args.dataset)) {
  const id = b.getChild("id").toArray();
  const x = b.getChild("x").toArray();
  const name = b.getChild("name");
  for (let i = 0; i < b.numRows; i++) {
    const v = Number(id[i]);
    if (v !== rows + i || x[i] !== v / 4 || name.get(i) !== "r" + v) bad++;
  }
  rows += b.numRows;
}
const notes = c.subscribe(args.target)[Symbol.asyncIterator]();
const first = (await notes.next()).value;
const { arrow } = A;
const table = new arrow.Table({
  id: arrow.vectorFromArray([7n, 8n], new arrow.Int64()),
  name: arrow.vectorFromArray([args.transport, "written in a browser"], new arrow.Utf8()),
});
const written = await c.write(args.target, table);
const pushed = (await notes.next()).value;
const history = (await c.history(args.target)).versions.map((v) => [v.version, v.action, v.rows]);
let refused = null;
try {
  await c.describe("no_such_dataset");
} catch (err) {
  refused = [err.name, err.code];
}
const transport = c.transport;
c.close();
return { transport, connectedMs, names, version: info.version, rows, bad, first, written, pushed, history, refused };
