"""Issue 29 benchmark: a browser reads a dataset. The TypeScript client in Debian's headless
Chromium (playwright-core, ``clients/typescript``) reads a dataset of 1,000,000 rows from
one ``aqueduct serve --web`` over WebTransport and over WebSocket, every value checked,
against the project's Python client reading the same dataset from the same service over
QUIC (its default transport) with every value checked too.

    python -m benchmarks.bench_browser [--rows N] [--repeat K] [--quick] [--json out.json]

Loopback (127.0.0.1): browser, service and Python client share this machine's 2 cores. A
read is timed from the request for the plan to the last batch checked (the connection is
opened first); rows/s = rows / that time, median of ``--repeat`` reads per path. CPU
seconds per GB of Arrow data: the browser's processes (Chromium's renderer, network
service and the rest, from /proc) or the Python client's process, and the service's, over
all the reads of one path. ``--quick`` reads 20,000 rows once: a smoke run, not figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.bench_realpath_spark import tree_cpu as cpu_seconds
from benchmarks.browser_driver import CHROMIUM, Browser, build, endpoints, sample, spki_hash
from benchmarks.common import machine, write_json

HERE = Path(__file__).resolve().parent
BROWSER_PATHS = ("webtransport", "websocket")


def check(table: pa.Table) -> int:
    """Rows of a read that are not what was written (id = i, name = "r" + i, x = i / 4)."""
    n = table.num_rows
    ids = table.column("id").to_numpy()
    want = np.arange(n, dtype=np.int64)
    bad = ids != want
    bad |= table.column("x").to_numpy() != want / 4
    names = pc.binary_join_element_wise("r", pc.cast(table.column("id"), pa.string()), "")
    bad |= ~pc.equal(table.column("name"), names).to_numpy(zero_copy_only=False)
    return int(bad.sum())


def python_reads(service: Any, rows: int, repeat: int) -> dict[str, Any]:
    """The Python client over QUIC, in this process, timed as the browser is."""
    from aqueduct_core.transport import TransportConfig

    client = service.client(transport=TransportConfig(transport="quic"))
    client.list()  # connected before the clock starts
    times, checks, bad, got = [], [], 0, 0
    cpu0, svc0 = time.process_time(), cpu_seconds(service.proc.pid)
    for _ in range(repeat):
        started = time.perf_counter()
        table = client.read("bench")
        read = time.perf_counter()
        bad += check(table)
        times.append(time.perf_counter() - started)
        checks.append(time.perf_counter() - read)
        got = table.num_rows
    cpu, svc = time.process_time() - cpu0, cpu_seconds(service.proc.pid) - svc0
    client.close()
    return {
        "seconds": times,
        "check_seconds": checks,
        "rows": got,
        "bad": bad,
        "client_cpu": cpu,
        "server_cpu": svc,
    }


def browser_reads(service: Any, tmp: Path, repeat: int) -> dict[str, dict[str, Any]]:
    """Both browser paths in one Chromium run: CPU is read between the reads of a path."""
    if CHROMIUM is None:
        raise SystemExit(
            "chromium is not installed: make bench installs it (apt-get install chromium)"
        )
    ts = build()
    body = (HERE / "browser_read.js").read_text(encoding="utf-8")
    steps: list[dict[str, Any]] = [{"name": "harness", "kind": "harness"}]
    for over in BROWSER_PATHS:
        read = {"kind": "eval", "body": body, "timeoutMs": 600_000,
                "args": {"transport": over, "endpoints": endpoints(service), "dataset": "bench"}}  # fmt: skip
        steps.append({**read, "name": f"{over} warm"})  # the page's code compiled, caches warm
        steps.append({"name": f"{over} start", "kind": "wait"})
        steps += [{**read, "name": f"{over} {k}"} for k in range(repeat)]
        steps.append({"name": f"{over} end", "kind": "wait"})
    plan = {
        "chromium": CHROMIUM,
        "args": [f"--ignore-certificate-errors-spki-list={spki_hash(service)}"],
        "harnessDir": str(ts / "dist" / "harness"),
        "steps": steps,
    }
    browser = Browser(plan, tmp / "plan.json")
    marks: dict[str, tuple[float, float]] = {}
    try:
        for msg in browser.steps():
            if "waiting" in msg:
                marks[msg["waiting"]] = (
                    cpu_seconds(browser.proc.pid),
                    cpu_seconds(service.proc.pid),
                )
                browser.tell({})
            elif "step" in msg:
                print(f"  {msg['step']}: {msg.get('value', msg.get('error', ''))}", flush=True)
        results = browser.finish()
    finally:
        browser.stop()
    out = {}
    for over in BROWSER_PATHS:
        reads = [results[f"{over} {k}"] for k in range(repeat)]
        for r in [results[f"{over} warm"], *reads]:
            if "error" in r:
                raise RuntimeError(f"{over}: {r['error']}")
        values = [r["value"] for r in reads]
        (b0, s0), (b1, s1) = marks[f"{over} start"], marks[f"{over} end"]
        out[over] = {
            "seconds": [v["ms"] / 1000 for v in values],
            "check_seconds": [v["checkMs"] / 1000 for v in values],
            "rows": values[-1]["rows"],
            "bad": sum(v["bad"] for v in values),
            "transport": values[-1]["transport"],
            "wire_bytes": values[-1]["wire"],
            "batches": values[-1]["batches"],
            "client_cpu": b1 - b0,
            "server_cpu": s1 - s0,
        }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from aqueduct_spark.testing import start_service

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20,000 rows, one read per path")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeat = 20_000, 1
    results: dict[str, Any] = {
        "machine": machine(),
        "rows": args.rows,
        "repeat": args.repeat,
        "command": "python -m benchmarks.bench_browser " + " ".join(argv or sys.argv[1:]),
        "load_before": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="aqueduct-browser-") as tmp:
        service = start_service(Path(tmp) / "root", args=["--web"])
        try:
            client = service.client()
            table = sample(args.rows)
            client.write("bench", table)
            client.close()
            results["arrow_bytes"] = table.nbytes
            paths = {"python-quic": python_reads(service, args.rows, args.repeat)}
            paths.update(browser_reads(service, Path(tmp), args.repeat))
        finally:
            service.stop()
    results["load_after"] = os.getloadavg()
    gb = results["arrow_bytes"] * args.repeat / 1e9
    base = statistics.median(paths["python-quic"]["seconds"])
    for name, r in paths.items():
        if r["rows"] != args.rows or r["bad"]:
            raise SystemExit(f"{name}: read {r['rows']:,} rows, {r['bad']} wrong")
        s = statistics.median(r["seconds"])
        r.update(
            median_s=s,
            rows_per_s=args.rows / s,
            vs_python=base / s,
            client_cpu_per_GB=r["client_cpu"] / gb,
            server_cpu_per_GB=r["server_cpu"] / gb,
        )
    results["paths"] = paths
    print(
        f"\n{args.rows:,} rows ({results['arrow_bytes'] / 1e6:.0f} MB of Arrow), every value "
        f"checked, median of {args.repeat}; load {results['load_before'][0]:.1f} at the start, "
        f"{results['load_after'][0]:.1f} at the end"
    )
    print(f"{'path':14} {'s':>6} {'rows/s':>11} {'x python':>9} {'client CPU s/GB':>16} {'server CPU s/GB':>16}")  # fmt: skip
    for name, r in paths.items():
        print(
            f"{name:14} {r['median_s']:6.2f} {r['rows_per_s']:11,.0f} {r['vs_python']:9.2f} "
            f"{r['client_cpu_per_GB']:16.1f} {r['server_cpu_per_GB']:16.1f}"
        )
    write_json(args.json, results)
    return results


def section(data: dict[str, Any]) -> list[str]:
    """The report's section (``benchmarks.run_all``)."""
    lines = [
        "## Loopback: a browser reads a dataset (issue 29)",
        "",
        f"The TypeScript client in Debian's headless Chromium reads {data['rows']:,} rows "
        f"(id, name, x; {data['arrow_bytes'] / 1e6:.0f} MB of Arrow) from one `aqueduct serve "
        "--web` over WebTransport and over WebSocket, every value checked in the page; "
        "*python-quic* is the project's Python client reading the same dataset from the same "
        "service over QUIC, every value checked too. Loopback: browser, service and client "
        f"share the 2 cores. Median of {data['repeat']} reads, timed from the plan request to "
        "the last batch checked (the page's own check included: *check s*). CPU s/GB: the "
        "browser's processes (or the Python client) and the service, per GB of Arrow. "
        "`benchmarks/bench_browser.py`.",
        "",
        "| path | s | rows/s | vs Python over QUIC | check s | client CPU s/GB | server CPU s/GB |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in data["paths"].items():
        check_s = statistics.median(r["check_seconds"]) if "check_seconds" in r else None
        lines.append(
            f"| {name} | {r['median_s']:.2f} | {r['rows_per_s']:,.0f} | {r['vs_python']:.2f}x | "
            f"{'' if check_s is None else f'{check_s:.2f}'} | {r['client_cpu_per_GB']:.1f} | "
            f"{r['server_cpu_per_GB']:.1f} |"
        )
    return [*lines, ""]


def summary_rows(data: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Rows of the report's summary: (issue, comparison, this run, target, verdict)."""
    rows = []
    for name in BROWSER_PATHS:
        r = data["paths"][name]
        rows.append(
            (
                "29",
                f"Chromium reads {data['rows']:,} rows over {name}, every value checked",
                f"{r['rows_per_s']:,.0f} rows/s = {r['vs_python']:.2f}x the Python client "
                "over QUIC",
                "report",
                "reported",
            )
        )
    return rows


if __name__ == "__main__":
    main()
