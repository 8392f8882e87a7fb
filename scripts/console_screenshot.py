"""The screenshot of the live console in docs/browser.md, taken as a user sees it.

Starts ``aqueduct serve --console`` on a fresh root with two small datasets (one with a few
versions), opens the console in Debian's headless Chromium through Playwright
(``tests/browser/screenshot.js``), selects a dataset and writes the page as a PNG.

    python scripts/console_screenshot.py [--console-dir DIR] [--out docs/browser-console.png]

The console's page must be built first (``cd clients/typescript && npm ci && npm run build``,
or give --console-dir). Needs chromium (``apt-get install chromium``) and node.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

from aqueduct_spark.testing import start_service

HERE = Path(__file__).resolve().parent
BROWSER = HERE.parent / "tests" / "browser"


def rides(start: int, n: int) -> pa.Table:
    ids = range(start, start + n)
    cities = ["Oslo", "Lyon", "Porto", "Turku", "Graz"]
    return pa.table(
        {
            "ride_id": pa.array(ids, pa.int64()),
            "city": [cities[i % 5] for i in ids],
            "distance_km": pa.array([round(1 + (i * 37 % 200) / 10, 1) for i in ids]),
            "fare_eur": pa.array([round(3.5 + (i * 53 % 400) / 10, 2) for i in ids]),
            "paid": [i % 7 != 0 for i in ids],
        }
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--console-dir", default=None, help="the console's built files")
    ap.add_argument("--out", default=str(HERE.parent / "docs" / "browser-console.png"))
    args = ap.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("chromium is not installed: apt-get install chromium")
    if not (BROWSER / "node_modules" / "playwright-core").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=BROWSER, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--console-dir", args.console_dir] if args.console_dir else []
        svc = start_service(Path(tmp) / "root", args=["--console", *extra])
        try:
            c = svc.client()
            c.overwrite("rides", rides(0, 20_000))
            for day in range(3):  # a few versions, for the history
                c.append("rides", rides(20_000 + 1000 * day, 1000))
            c.overwrite("sensors", pa.table({"sensor": ["a1", "b2"], "celsius": [21.5, 19.0]}))
            c.close()
            assert svc.console is not None
            port = svc.console.rstrip("/").rsplit(":", 1)[1]
            plan = {
                "chromium": chromium,
                "url": f"http://localhost:{port}/",  # plain HTTP from this machine
                "out": str(Path(args.out).resolve()),
                "select": "rides",
            }
            (Path(tmp) / "plan.json").write_text(json.dumps(plan))
            done = subprocess.run(
                ["node", str(BROWSER / "screenshot.js"), str(Path(tmp) / "plan.json")],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode != 0:
                sys.exit(f"the browser failed: {done.stderr}")
            print(done.stdout.strip())
            print(f"wrote {args.out}")
        finally:
            svc.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
