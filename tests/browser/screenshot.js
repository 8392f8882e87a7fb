// A screenshot of the live console in headless Chromium (scripts/console_screenshot.py).
//
// Usage: node screenshot.js plan.json. plan: {chromium, url, out, select}: opens the console
// at url, waits for its dataset list, clicks the dataset `select`, waits for the preview,
// and writes the page to `out` (PNG). Prints one JSON line: what the page said.
const fs = require('fs');
const { chromium } = require('playwright-core');

async function main() {
  const plan = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const browser = await chromium.launch({
    executablePath: plan.chromium,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
    await page.goto(plan.url);
    await page.waitForSelector('[data-testid=dataset-row]', { timeout: 30000 });
    await page.click(`[data-testid=dataset-row][data-name="${plan.select}"]`);
    await page.waitForFunction(() => Number(document.querySelector('#preview')?.dataset.rows) > 0,
      null, { timeout: 30000 });
    await page.waitForTimeout(300); // the service panel's status answer
    await page.screenshot({ path: plan.out, fullPage: false });
    const connection = await page.textContent('[data-testid=connection]');
    process.stdout.write(JSON.stringify({ connection, userAgent: await page.evaluate(() => navigator.userAgent) }) + '\n');
  } finally {
    await browser.close();
  }
}

main().catch((err) => { console.error(err); process.exit(1); });
