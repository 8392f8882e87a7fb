// Drives Debian's headless Chromium through Playwright for the browser tests and the
// benchmark (tests/typescript/test_browser.py, benchmarks/bench_browser.py), which start the
// service and own the assertions.
//
// Usage: node run.mjs plan.json. The plan names the browser, its flags, the pages and the
// steps; each step prints one JSON line on stdout ({"step": name, ...result}). A step
// {"wait": true} first prints {"waiting": name} and then reads one JSON line from stdin
// (what the test did meanwhile, e.g. the time it committed a version).
//
// plan: {chromium, args: [..], screenshotDir, harnessDir, consoleUrl?, steps: [
//   {name, kind: "console-open" | "console-preview" | "console-version" | "console-service" | "wait" | "screenshot" |
//          "harness" | "eval", ...}]}
// consoleUrl: the console as aqueduct serve --console serves it (console-open steps);
// harnessDir: the built harness page, served here from loopback (harness and eval steps).
import { createServer } from "node:http";
import { existsSync, readFileSync } from "node:fs";
import { extname, join } from "node:path";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
const input = createInterface({ input: process.stdin });
const lines = input[Symbol.asyncIterator]();
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".json": "application/json" };

/** The harness page (the client library on window.aqueduct) from a loopback HTTP server:
 * http://127.0.0.1 is a secure context, so WebTransport is offered to it. */
function serveDir(dir) {
  const server = createServer((req, res) => {
    const path = new URL(req.url, "http://x").pathname;
    const file = join(dir, path === "/" ? "index.html" : path);
    if (!file.startsWith(dir) || !existsSync(file)) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream" });
    res.end(readFileSync(file));
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server)));
}

async function main() {
  // Playwright gives the browser a new, empty profile (--user-data-dir) of its own.
  const started = Date.now();
  const browser = await chromium.launch({
    executablePath: plan.chromium,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync", ...(plan.args ?? [])],
  });
  out({ step: "launch", ms: Date.now() - started, version: browser.version() });
  const harness = plan.harnessDir ? await serveDir(plan.harnessDir) : null;
  const consoleUrl = plan.consoleUrl ?? null;
  try {
    const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
    const page = await context.newPage();
    const log = [];
    page.on("console", (m) => log.push(`${m.type()}: ${m.text()}`));
    page.on("pageerror", (e) => log.push(`pageerror: ${e.message}`));
    for (const step of plan.steps) {
      let result;
      try {
        result = await run(step, page, harness, consoleUrl);
      } catch (err) {
        result = { error: String(err?.stack ?? err), log: log.slice(-20) };
      }
      out({ step: step.name, ...result });
    }
  } finally {
    harness?.close();
    await browser.close();
  }
}

async function run(step, page, harness, consoleUrl) {
  const timeout = step.timeoutMs ?? 20_000;
  switch (step.kind) {
    case "console-open": {
      // The console as a user opens it; its rows appear once it connected and listed.
      const t0 = Date.now();
      await page.goto((step.url ?? consoleUrl) + (step.query ?? ""));
      await page.waitForSelector('[data-testid="dataset-row"]', { timeout });
      const rows = await page.$$eval('[data-testid="dataset-row"]', (trs) => trs.map((tr) => ({ name: tr.dataset.name, version: Number(tr.children[1].textContent), cells: [...tr.children].map((td) => td.textContent) })));
      return { ms: Date.now() - t0, rows, transport: await page.evaluate(() => document.body.dataset.transport), status: await page.textContent('[data-testid="connection"]') };
    }
    case "console-preview": {
      const t0 = Date.now();
      await page.click(`[data-testid="dataset-row"][data-name="${step.dataset}"]`);
      await page.waitForFunction(([name, n]) => document.getElementById("detail-name")?.textContent === name && document.getElementById("preview")?.dataset.rows === String(n), [step.dataset, step.rows], { timeout });
      const preview = await page.$$eval('[data-testid="preview"] tbody tr', (trs) => ({ count: trs.length, first: [...trs[0].children].map((td) => td.textContent), last: [...trs[trs.length - 1].children].map((td) => td.textContent) }));
      const header = await page.$$eval('[data-testid="preview"] thead th', (ths) => ths.map((th) => th.textContent));
      const schema = await page.$$eval('[data-testid="schema"] tbody tr', (trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent)));
      const history = await page.$$eval('[data-testid="history-row"]', (trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent)));
      return { ms: Date.now() - t0, header, schema, history, ...preview };
    }
    case "console-version": {
      // The test commits a version and tells us when; we time until the page shows it.
      out({ waiting: step.name });
      const { value } = await lines.next();
      const told = JSON.parse(value);
      const sel = `[data-testid="version-${step.dataset}"]`;
      await page.waitForFunction(([s, v]) => Number(document.querySelector(s)?.textContent) >= v, [sel, told.version], { timeout, polling: "raf" });
      const seen = Date.now();
      return { afterCommitMs: seen - told.committedAt, version: Number(await page.textContent(sel)) };
    }
    case "console-service": {
      // The service panel (status, once a second): the connections and their requests.
      await page.waitForSelector('[data-testid="connection-row"]', { timeout });
      const connections = await page.$$eval('[data-testid="connection-row"]', (trs) => trs.map((tr) => ({ transport: tr.dataset.transport, yours: tr.classList.contains("yours"), cells: [...tr.children].map((td) => td.textContent) })));
      const streams = await page.$$eval('[data-testid="stream-row"]', (trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent)));
      const service = await page.$$eval("#service dd", (dds) => Object.fromEntries(dds.map((dd) => [dd.dataset.testid, dd.textContent])));
      return { connections, streams, service };
    }
    case "wait": {
      // The test does something meanwhile (blocks UDP, commits) and says when it is done.
      out({ waiting: step.name });
      const { value } = await lines.next();
      return { told: JSON.parse(value) };
    }
    case "screenshot": {
      await page.screenshot({ path: step.path, fullPage: true });
      return { path: step.path };
    }
    case "harness": {
      await page.goto(`http://127.0.0.1:${harness.address().port}/`);
      await page.waitForFunction(() => window.aqueductReady === true, null, { timeout });
      return {};
    }
    case "eval": {
      // A function body run in the harness page with `args`; it returns JSON.
      const fn = new Function("args", `return (async () => { ${step.body} })();`);
      let timer;
      const late = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`step ${step.name} gave no answer within ${timeout} ms`)), timeout);
      });
      try {
        return { value: await Promise.race([page.evaluate(fn, step.args ?? {}), late]) };
      } finally {
        clearTimeout(timer);
      }
    }
    default:
      throw new Error(`unknown step kind ${step.kind}`);
  }
}

// stdin stays open (the test holds it), so the process ends here, not when its loop empties.
main().then(
  () => {
    input.close();
    process.exit(0);
  },
  (err) => {
    out({ step: "fatal", error: String(err?.stack ?? err) });
    process.exit(1);
  },
);
