"""Issues 18 and 31: datasets of many small versions, as a streaming sink leaves them. Reports

- a Spark batch read (``count()``) of 200k rows in 2,000 files (one file per version) against
  the same rows in one file, both through the service (target <= 3x);
- a stream from the earliest of those 2,000 versions catching up (``availableNow`` into a
  ``noop`` sink; target <= 10 s), from ``start()`` to the query's end, and the part of it
  that is the one micro-batch (``triggerExecution``);
- append latency against the length of the log (issue 31; :mod:`benchmarks.versions_appends`):
  the Python client's append of 400 rows to datasets of 10, 1,000, 10,000 and 50,000
  versions, with the service's default settings (no maintenance, Delta's 30-day log
  retention: every commit file stays), on a local root and on SeaweedFS (targets: 50,000 /
  10 <= 1.5x on each; issue 18's 10,000 / 10 <= 1.2x on the local root); and a streaming
  query's commit time (Spark's ``addBatch``, one micro-batch after another) into the
  10-version and the 50,000-version dataset.

    python -m benchmarks.bench_versions [--versions 2000] [--rows 200000]
        [--append-lengths 10 1000 10000 50000] [--append-rounds 20] [--stream-batches 30]
        [--repeat 3] [--quick] [--json out.json] [--skip read stream append s3 stream-commit]

How the read and stream datasets are built (:mod:`benchmarks.versions_data`): version 0 by
``deltalake``, then one commit file per version with one ``add`` of a new Parquet file,
written directly, with the statistics the service computes. Spark runs ``local[2]`` in this
process; the services in their own processes; all share the 2 cores, so the load average is
reported with every figure.
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

from benchmarks import versions_appends
from benchmarks.common import machine, sample_table, write_json
from benchmarks.versions_data import build_versions


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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--versions", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--append-lengths", type=int, nargs="+", default=[10, 1000, 10_000, 50_000])
    parser.add_argument("--append-rounds", type=int, default=20)
    parser.add_argument("--append-rows", type=int, default=400)
    parser.add_argument("--stream-batches", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--quick", action="store_true", help="200 versions; logs of 10 and 1,000; 5 rounds"
    )
    choices = ["read", "stream", "append", "s3", "stream-commit"]
    parser.add_argument("--skip", nargs="*", default=[], choices=choices)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.quick:
        args.versions, args.rows, args.append_lengths = 200, 20_000, [10, 1000]
        args.append_rounds, args.repeat, args.stream_batches = 5, 1, 5
    from benchmarks.bench_spark import spark_session

    results: dict[str, Any] = {
        "machine": machine(),
        "versions": args.versions,
        "rows": args.rows,
        "load_start": load(),
        "maintenance": True,
    }
    skip = set(args.skip)
    with tempfile.TemporaryDirectory(prefix="aqueduct-versions-") as tmp_dir:
        tmp = Path(tmp_dir)
        spark = None
        try:
            if not {"read", "stream"} <= skip:
                spark = spark_session()
                read_and_stream(spark, tmp, args, results)
            if "append" not in skip:  # last: the bulk logs would load the reads
                if spark is None and "stream-commit" not in skip:
                    spark = spark_session()
                results["appends"] = versions_appends.run(
                    tmp,
                    args.append_lengths,
                    args.append_rounds,
                    args.append_rows,
                    s3="s3" not in skip,
                    spark=None if "stream-commit" in skip else spark,
                    stream_batches=args.stream_batches,
                )
        finally:
            if spark is not None:
                spark.stop()
    results["load_end"] = load()
    report(results)
    write_json(args.json, results)
    return results


def read_and_stream(spark: Any, tmp: Path, args: Any, results: dict[str, Any]) -> None:
    """Issue 18's reads: the 2,000-version dataset against one file, through one service
    with ``--maintenance``."""
    from aqueduct_spark.testing import start_service

    root = tmp / "root"
    per = args.rows // args.versions
    data = sample_table(per * args.versions)
    start = time.perf_counter()
    build_versions(
        root / "many", data.schema, [data.slice(i * per, per) for i in range(args.versions)]
    )
    build_versions(root / "one", data.schema, [data])
    results["build_s"] = time.perf_counter() - start
    print(f"built {args.versions} versions in {results['build_s']:.1f} s", flush=True)
    svc = start_service(root, args=["--maintenance"])
    try:
        if "read" not in args.skip:
            results["read"] = batch_read(spark, svc.options, args.repeat)
            print(f"read: {results['read']}", flush=True)
        if "stream" not in args.skip:
            results["stream"] = stream_catch_up(spark, svc.options, tmp, args.repeat)
    finally:
        svc.stop()


def report(r: dict[str, Any]) -> None:
    print(f"\n{r['versions']} versions, {r['rows']:,} rows; load {r['load_start']:.1f} at start")
    for _, label, value, target, load_ in rows(r):
        print(f"{label}: {value} (target {target}), load {load_}")


def section(data: dict[str, Any]) -> list[str]:
    """The report's section (``benchmarks.run_all``)."""
    lines = [
        "## Loopback: many small versions, reads, stream catch-up, appends (issues 18, 31)",
        "",
        f"{data['versions']} versions of {data['rows'] // data['versions']} rows each "
        f"({data['rows']:,} rows), built by writing their commit files directly "
        "(`benchmarks/versions_data.py`); one service with `--maintenance` for the reads, Spark "
        f"`local[2]`, all on this machine's 2 cores (load {data['load_start']:.1f} at the "
        f"start, {data['load_end']:.1f} at the end).",
        "",
    ]
    appends = data.get("appends")
    if appends:
        lines += [
            f"Appends (issue 31): {appends['rows']} rows per append through the Python client, "
            f"median of {appends['rounds']} rounds over the datasets in turn, the service's "
            "default settings (no `--maintenance`: every commit file and data file stays); "
            "`_delta_log` entries: "
            + ", ".join(f"{int(n):,}" for n in appends["log_entries"].values())
            + ".",
            "",
            "| root | " + " | ".join(f"{int(n):,} versions" for n in appends["lengths"]) + " |",
            "|---|" + "---|" * len(appends["lengths"]),
        ]
        for kind in ("local", "seaweedfs"):
            if kind in appends:
                service = appends[kind].get("service_ms", {})
                cells = [
                    f"{f['median_ms']:.1f} ms ({f['ratio']:.2f}x)"
                    + (
                        f"; service begin/write/commit {_ops(service[f'appends_{n}'])} ms"
                        if f"appends_{n}" in service
                        else ""
                    )
                    for n, f in appends[kind]["appends"].items()
                ]
                lines.append(
                    f"| {kind} (load {appends[kind]['load_start']:.1f}) | {' | '.join(cells)} |"
                )
        lines.append("")
    lines += ["| figure | this run | target | load |", "|---|---|---|---|"]
    for _, label, value, target, load_ in rows(data):
        lines.append(f"| {label} | {value} | {target} | {load_} |")
    return [*lines, ""]


def _ops(ms: dict[str, float]) -> str:
    return "/".join(f"{ms.get(op, 0):.1f}" for op in ("begin", "write", "commit"))


def rows(data: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(issue, comparison, figure, target, load) of each target the run measured."""
    out = []
    if "read" in data:
        rd = data["read"]
        out.append(
            (
                "18",
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
                "18",
                f"stream from the earliest of {data['versions']} versions (availableNow)",
                f"{st['many_s']:.2f} s (its micro-batch {st['many_trigger_s']:.2f} s; "
                f"one version: {st['one_s']:.2f} s)",
                "<= 10 s",
                f"{max(r['load'] for r in st['runs']):.1f}",
            )
        )
    if "append" in data:  # runs stored before issue 31 (10,000 versions, --maintenance)
        ap = data["append"]
        out.append(
            (
                "18",
                f"append latency, version {ap['late_version']:,} / version 10",
                f"{ap['ratio']:.2f}x ({ap['late_median_ms']:.0f} / {ap['early_median_ms']:.0f} ms)",
                "<= 1.2x",
                f"{ap['load']:.1f}",
            )
        )
    appends = data.get("appends")
    if appends:
        first, last = str(appends["lengths"][0]), str(appends["lengths"][-1])
        targets = [("31", kind, last, "<= 1.5x") for kind in ("local", "seaweedfs")]
        if "10000" in appends.get("local", {}).get("appends", {}):
            targets.insert(0, ("18", "local", "10000", "<= 1.2x"))
        for issue, kind, n, target in targets:
            if kind not in appends:
                continue
            f, base = appends[kind]["appends"][n], appends[kind]["appends"][first]
            out.append(
                (
                    issue,
                    f"append latency ({kind} root, default settings), version {int(n):,} / "
                    f"version {int(first):,}",
                    f"{f['ratio']:.2f}x ({f['median_ms']:.1f} / {base['median_ms']:.1f} ms)",
                    target,
                    f"{appends[kind]['load_start']:.1f}",
                )
            )
        stream = appends.get("stream")
        if stream:
            short, long_ = list(stream)
            s, lg = stream[short], stream[long_]
            out.append(
                (
                    "31",
                    f"streaming commit (Spark addBatch), {long_.split('_')[-1]} versions / "
                    f"{short.split('_')[-1]}",
                    f"{lg['ratio']:.2f}x ({lg['median_ms']:.0f} / {s['median_ms']:.0f} ms)",
                    "<= 1.5x",
                    f"{appends['local']['load_start']:.1f}",
                )
            )
    return out


def summary_rows(data: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Rows of the report's summary: (issue, comparison, this run, target, verdict)."""
    limits = {"<= 3x": 3.0, "<= 10 s": 10.0, "<= 1.2x": 1.2, "<= 1.5x": 1.5}
    out = []
    for issue, label, value, target, _ in rows(data):
        figure = float(value.split("x")[0].split(" s")[0])
        ok = figure <= limits[target]
        out.append((issue, label, value, target, "met" if ok else "**behind**"))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
