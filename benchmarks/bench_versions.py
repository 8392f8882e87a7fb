"""Issue 18: a dataset of many small versions, as a streaming sink leaves it. Reports

- a Spark batch read (``count()``) of 200k rows in 2,000 files (one file per version) against
  the same rows in one file, both through the service (target <= 3x);
- a stream from the earliest of those 2,000 versions catching up (``availableNow`` into a
  ``noop`` sink; target <= 10 s), from ``start()`` to the query's end, and the part of it
  that is the one micro-batch (``triggerExecution``);
- append latency (the Python client's ``append`` of 100 rows) at version 10 against version
  10,000, with the service's table maintenance on (``serve --maintenance``: checkpoints every
  100 versions, log cleanup, compaction; target <= 1.2x).

    python -m benchmarks.bench_versions [--versions 2000] [--rows 200000]
        [--append-versions 10000] [--appends 20] [--repeat 3] [--quick] [--json out.json]
        [--skip read stream append] [--log-retention-hours H]

How the datasets are built (:mod:`benchmarks.versions_data`): version 0 by ``deltalake``, then
one commit file per version with one ``add`` of a new Parquet file, written directly, with
the statistics the service computes. For the append figure the 9,990 versions between
version 10 and 10,000 are built the same way under the running service (reusing one data
file's bytes under new names), then ``deltalake`` writes a checkpoint at the last of them, as
a writer with checkpoints would have left it. Spark runs ``local[2]`` in this process; the
service in its own process; all share the 2 cores, so the load average is reported with
every figure.
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

from benchmarks.common import machine, sample_table, write_json
from benchmarks.versions_data import append_versions, build_versions

SETTLE_S = 180
"""At most this long for maintenance to compact the bulk-built versions' files."""


def load() -> float:
    return os.getloadavg()[0]


def batch_read(spark: Any, opts: dict[str, str], repeat: int) -> dict[str, Any]:
    """Spark count of the many-file and the one-file dataset, alternated, medians."""
    times: dict[str, list[float]] = {"many": [], "one": []}
    counts = {}
    for name in ("many", "one"):  # warm up: Python workers, connections
        counts[name] = spark.read.format("aqueduct").options(**opts).load(name).count()
    partitions = {
        name: spark.read.format("aqueduct").options(**opts).load(name).rdd.getNumPartitions()
        for name in ("many", "one")
    }
    for _ in range(repeat):
        for name in ("many", "one"):
            start = time.perf_counter()
            spark.read.format("aqueduct").options(**opts).load(name).count()
            times[name].append(time.perf_counter() - start)
    many, one = statistics.median(times["many"]), statistics.median(times["one"])
    return {
        "rows": counts,
        "partitions": partitions,
        "times": times,
        "many_s": many,
        "one_s": one,
        "ratio": many / one,
        "load": load(),
    }


def stream_catch_up(spark: Any, opts: dict[str, str], tmp: Path, repeat: int) -> dict[str, Any]:
    """A stream from the earliest version to the latest (availableNow), timed from start()."""
    runs = []
    for k in range(repeat):
        for name in ("many", "one"):
            start = time.perf_counter()
            query = (
                spark.readStream.format("aqueduct")
                .options(**opts)
                .option("startingVersion", "earliest")
                .load(name)
                .writeStream.format("noop")
                .option("checkpointLocation", str(tmp / f"checkpoint-{name}-{k}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            took = time.perf_counter() - start
            progress = query.recentProgress
            runs.append(
                {
                    "dataset": name,
                    "s": took,
                    "rows": sum(int(p["numInputRows"]) for p in progress),
                    "batches": len(progress),
                    "trigger_s": sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000,
                    "load": load(),
                }
            )
            print(f"stream {name}: {took:.2f} s, {runs[-1]}", flush=True)
    many = [r for r in runs if r["dataset"] == "many"]
    one = [r for r in runs if r["dataset"] == "one"]
    return {
        "runs": runs,
        "many_s": statistics.median(r["s"] for r in many),
        "many_trigger_s": statistics.median(r["trigger_s"] for r in many),
        "one_s": statistics.median(r["s"] for r in one),
        "one_trigger_s": statistics.median(r["trigger_s"] for r in one),
    }


def log_entries(table_dir: Path) -> int:
    return len(os.listdir(table_dir / "_delta_log"))


def append_latency(
    svc: Any, root: Path, versions: int, appends: int, log_cleanup: bool = False
) -> dict[str, Any]:
    """Median append latency at version 10 and at version ``versions`` (maintenance on).
    With ``log_cleanup`` (the service keeps a short log: ``--log-retention-hours``) the
    settling also waits for the service to delete the expired commit files, which it does
    after its next checkpoint (up to 100 appends)."""
    client = svc.client()
    batch = sample_table(100)
    client.create("appends", batch.schema)
    while client.describe("appends").version < 10:
        client.append("appends", batch)

    def measure() -> list[float]:
        out = []
        for _ in range(appends):
            start = time.perf_counter()
            client.append("appends", batch)
            out.append(time.perf_counter() - start)
        return out

    early = measure()
    at_early = client.describe("appends").version
    start = time.perf_counter()
    last = append_versions(root / "appends", batch, versions - at_early, checkpoint=True)
    built = time.perf_counter() - start
    # The service's maintenance finds 10,000 uncompacted small files (a service that had
    # maintained the table all along would have compacted them 50 at a time): let it
    # compact them before measuring, appending as a stream would meanwhile.
    start = time.perf_counter()
    settle_appends = 0
    while time.perf_counter() - start < SETTLE_S:
        client.append("appends", batch)
        settle_appends += 1
        if client.describe("appends").files < 1000 and (
            not log_cleanup or log_entries(root / "appends") < 1000
        ):
            break
    settled = time.perf_counter() - start
    late = measure()
    return {
        "early_version": 10,
        "late_version": last,
        "built_s": built,
        "settle_s": settled,
        "settle_appends": settle_appends,
        "files_after": client.describe("appends").files,
        "log_entries": log_entries(root / "appends"),
        "early_ms": [t * 1000 for t in early],
        "late_ms": [t * 1000 for t in late],
        "early_median_ms": statistics.median(early) * 1000,
        "late_median_ms": statistics.median(late) * 1000,
        "ratio": statistics.median(late) / statistics.median(early),
        "load": load(),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--versions", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--append-versions", type=int, default=10_000)
    parser.add_argument("--appends", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="200 versions, 1,000 appended")
    parser.add_argument("--skip", nargs="*", default=[], choices=["read", "stream", "append"])
    parser.add_argument(
        "--log-retention-hours",
        type=float,
        help="the service's log retention (its default: 720 h, so the 10,000 commit files stay)",
    )
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.quick:
        args.versions, args.rows, args.append_versions = 200, 20_000, 1000
        args.appends, args.repeat = 5, 1
    from aqueduct_spark.testing import start_service
    from benchmarks.bench_spark import spark_session

    results: dict[str, Any] = {
        "machine": machine(),
        "versions": args.versions,
        "rows": args.rows,
        "load_start": load(),
        "maintenance": True,
    }
    with tempfile.TemporaryDirectory(prefix="aqueduct-versions-") as tmp_dir:
        tmp = Path(tmp_dir)
        root = tmp / "root"
        per = args.rows // args.versions
        data = sample_table(per * args.versions)
        start = time.perf_counter()
        build_versions(
            root / "many",
            data.schema,
            [data.slice(i * per, per) for i in range(args.versions)],
        )
        build_versions(root / "one", data.schema, [data])
        results["build_s"] = time.perf_counter() - start
        print(f"built {args.versions} versions in {results['build_s']:.1f} s", flush=True)
        retention = args.log_retention_hours
        serve_args = ["--maintenance"]
        if retention is not None:
            serve_args += ["--log-retention-hours", str(retention)]
            results["log_retention_hours"] = retention
        svc = start_service(root, args=serve_args)
        try:
            if not {"read", "stream"} <= set(args.skip):
                spark = spark_session()
                try:
                    if "read" not in args.skip:
                        results["read"] = batch_read(spark, svc.options, args.repeat)
                        print(f"read: {results['read']}", flush=True)
                    if "stream" not in args.skip:
                        results["stream"] = stream_catch_up(spark, svc.options, tmp, args.repeat)
                finally:
                    spark.stop()
            if "append" not in args.skip:  # last: its maintenance would load the reads
                results["append"] = append_latency(
                    svc, root, args.append_versions, args.appends, retention is not None
                )
                print(f"append: {results['append']}", flush=True)
        finally:
            svc.stop()
    results["load_end"] = load()
    report(results)
    write_json(args.json, results)
    return results


def report(r: dict[str, Any]) -> None:
    print(f"\n{r['versions']} versions, {r['rows']:,} rows; load {r['load_start']:.1f} at start")
    if "read" in r:
        rd = r["read"]
        print(
            f"batch read: {rd['many_s']:.2f} s in {r['versions']} files against "
            f"{rd['one_s']:.2f} s in one file = {rd['ratio']:.2f}x (target <= 3x), "
            f"{rd['partitions']['many']} Spark partitions, load {rd['load']:.1f}"
        )
    if "stream" in r:
        st = r["stream"]
        print(
            f"stream from the earliest version: {st['many_s']:.2f} s (micro-batch "
            f"{st['many_trigger_s']:.2f} s; the one-version dataset {st['one_s']:.2f} s) "
            "(target <= 10 s)"
        )
    if "append" in r:
        ap = r["append"]
        print(
            f"append: {ap['early_median_ms']:.0f} ms at version 10, {ap['late_median_ms']:.0f} "
            f"ms at version {ap['late_version']} = {ap['ratio']:.2f}x (target <= 1.2x), "
            f"{ap['log_entries']} entries in _delta_log, load {ap['load']:.1f}"
        )


def section(data: dict[str, Any]) -> list[str]:
    """The report's section (``benchmarks.run_all``)."""
    lines = [
        "## Loopback: many small versions, reads, stream catch-up, appends (issue 18)",
        "",
        f"{data['versions']} versions of {data['rows'] // data['versions']} rows each "
        f"({data['rows']:,} rows), built by writing their commit files directly "
        "(`benchmarks/versions_data.py`); one service with `--maintenance`, Spark `local[2]`, "
        f"all on this machine's 2 cores (load {data['load_start']:.1f} at the start, "
        f"{data['load_end']:.1f} at the end).",
        "",
        "| figure | this run | target | load |",
        "|---|---|---|---|",
    ]
    for label, value, target, load_ in rows(data):
        lines.append(f"| {label} | {value} | {target} | {load_} |")
    return [*lines, ""]


def rows(data: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    out = []
    if "read" in data:
        rd = data["read"]
        out.append(
            (
                f"Spark count, {data['versions']} files / the same rows in one file",
                f"{rd['ratio']:.2f}x ({rd['many_s']:.2f} s in {rd['partitions']['many']} "
                f"partitions / {rd['one_s']:.2f} s)",
                "<= 3x",
                f"{rd['load']:.1f}",
            )
        )
    if "stream" in data:
        st = data["stream"]
        out.append(
            (
                f"stream from the earliest of {data['versions']} versions (availableNow)",
                f"{st['many_s']:.2f} s (its micro-batch {st['many_trigger_s']:.2f} s; "
                f"one version: {st['one_s']:.2f} s)",
                "<= 10 s",
                f"{max(r['load'] for r in st['runs']):.1f}",
            )
        )
    if "append" in data:
        ap = data["append"]
        out.append(
            (
                f"append latency, version {ap['late_version']:,} / version 10",
                f"{ap['ratio']:.2f}x ({ap['late_median_ms']:.0f} / {ap['early_median_ms']:.0f} ms)",
                "<= 1.2x",
                f"{ap['load']:.1f}",
            )
        )
    return out


def summary_rows(data: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Rows of the report's summary: (issue, comparison, this run, target, verdict)."""
    limits = {"<= 3x": 3.0, "<= 10 s": 10.0, "<= 1.2x": 1.2}
    out = []
    for label, value, target, _ in rows(data):
        figure = float(value.split("x")[0].split(" s")[0])
        ok = figure <= limits[target]
        out.append(("18", label, value, target, "met" if ok else "**behind**"))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
