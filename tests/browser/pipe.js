// Headless Chromium as a dumb pipe to an Aqueduct service (tests/browser/test_chromium_pipe.py).
//
// The Python test builds every byte the client sends with the project's own engine and
// multiplexer, and decodes every byte the service answers; the page only carries them over
// the browser's own WebTransport or WebSocket, as a browser client would. So the test proves
// the service's side of profile §8 and §9 against the real browser, not a second
// implementation of Aqueduct in JavaScript.
//
// Usage: node pipe.js plan.json  ->  prints one JSON line: what the page saw.
// plan: {chromium, origin, config (fetch origin/aqueduct.json first), sessions: [{kind: "webtransport", url, hashes: [hex], streams:
//        [[base64, fin]], datagrams: [base64], quietMs, maxMs, waitFor, close: {closeCode, reason}}
//        | {kind: "websocket", url, protocols: [..], messages: [base64], quietMs, maxMs, waitFor}]}
// A session ends once `waitFor` (text) was among the bytes received and nothing more came
// for quietMs, or after maxMs: the answer's arrival, not a quiet time, ends it (a loaded
// service may take longer than any quiet time to answer).
const fs = require('fs');
const { chromium } = require('playwright-core');

async function main() {
  const plan = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const browser = await chromium.launch({
    executablePath: plan.chromium,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', ...(plan.args || [])],
  });
  try {
    const page = await browser.newPage();
    // A page from http://localhost is a secure context (WebTransport needs one). It must
    // come from a real loopback server: a page Playwright made up has no address, and
    // Chromium's local network access checks then block its requests to 127.0.0.1.
    await page.goto(plan.origin + '/');
    // What a console page does first: where is the service?
    const config = plan.config ? await page.evaluate(async () => (await fetch('./aqueduct.json')).json()) : null;
    const results = [];
    for (const session of plan.sessions) {
      results.push(await page.evaluate(session.kind === 'webtransport' ? webtransport : websocket, session));
    }
    process.stdout.write(JSON.stringify({ userAgent: await page.evaluate(() => navigator.userAgent), config, results }) + '\n');
  } finally {
    await browser.close();
  }
}

// Runs in the page.
async function webtransport(s) {
  const b64 = (u8) => btoa(String.fromCharCode(...u8));
  const bytes = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const hex = (h) => Uint8Array.from(h.match(/../g).map((x) => parseInt(x, 16)));
  const out = { streams: [], datagrams: [], events: [] };
  let last = Date.now();
  let seen = ''; // every byte received, as latin-1: what s.waitFor looks for
  let t;
  try {
    t = new WebTransport(s.url, {
      serverCertificateHashes: s.hashes.map((h) => ({ algorithm: 'sha-256', value: hex(h) })),
    });
    await t.ready;
    out.events.push('ready');
  } catch (e) {
    out.error = String(e);
    return out;
  }
  t.closed.then((info) => out.events.push('closed ' + JSON.stringify(info)),
    (e) => out.events.push('closed with error ' + String(e)));
  (async () => {
    const streams = t.incomingUnidirectionalStreams.getReader();
    for (;;) {
      const { value, done } = await streams.read();
      if (done) return;
      const entry = { chunks: [], fin: false, error: null };
      out.streams.push(entry);
      (async () => {
        const reader = value.getReader();
        try {
          for (;;) {
            const r = await reader.read();
            if (r.done) { entry.fin = true; return; }
            entry.chunks.push(b64(r.value));
            seen += String.fromCharCode(...r.value);
            last = Date.now();
          }
        } catch (e) { entry.error = String(e); }
      })();
    }
  })().catch((e) => out.events.push('incoming streams: ' + String(e)));
  (async () => {
    const reader = t.datagrams.readable.getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      out.datagrams.push(b64(value));
      last = Date.now();
    }
  })().catch(() => {});
  const writers = [];
  for (const [data, fin] of s.streams) {
    const stream = await t.createUnidirectionalStream();
    const writer = stream.getWriter();
    await writer.write(bytes(data));
    if (fin) await writer.close(); else writers.push(writer);
  }
  const dgw = t.datagrams.writable.getWriter();
  for (const d of s.datagrams || []) await dgw.write(bytes(d));
  out.maxDatagramSize = t.datagrams.maxDatagramSize;
  const start = Date.now();
  while ((!seen.includes(s.waitFor || '') || Date.now() - last < s.quietMs) && Date.now() - start < s.maxMs) {
    await new Promise((r) => setTimeout(r, 20));
  }
  if (s.close) {
    t.close(s.close);
    await Promise.race([t.closed.catch(() => {}), new Promise((r) => setTimeout(r, 1000))]);
  } else if (s.awaitClose) {
    await Promise.race([t.closed.catch(() => {}), new Promise((r) => setTimeout(r, s.maxMs))]);
  }
  return out;
}

// Runs in the page.
async function websocket(s) {
  const b64 = (u8) => btoa(String.fromCharCode(...u8));
  const bytes = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const out = { messages: [], events: [] };
  let last = Date.now();
  let seen = '';
  const ws = new WebSocket(s.url, s.protocols);
  ws.binaryType = 'arraybuffer';
  ws.onmessage = (m) => {
    if (typeof m.data === 'string') out.events.push('text message');
    else {
      out.messages.push(b64(new Uint8Array(m.data)));
      seen += String.fromCharCode(...new Uint8Array(m.data));
    }
    last = Date.now();
  };
  ws.onclose = (e) => out.events.push(`close ${e.code} ${e.reason}`);
  try {
    await new Promise((resolve, reject) => {
      ws.onopen = resolve;
      ws.onerror = () => reject(new Error('websocket error'));
    });
  } catch (e) {
    out.error = String(e);
    await new Promise((r) => setTimeout(r, 100));
    return out;
  }
  out.protocol = ws.protocol;
  for (const m of s.messages) ws.send(bytes(m));
  const start = Date.now();
  while ((!seen.includes(s.waitFor || '') || Date.now() - last < s.quietMs) && Date.now() - start < s.maxMs) {
    await new Promise((r) => setTimeout(r, 20));
  }
  ws.close(1000);
  await new Promise((r) => setTimeout(r, 100));
  return out;
}

main().catch((e) => { process.stderr.write(String(e && e.stack || e) + '\n'); process.exit(1); });
