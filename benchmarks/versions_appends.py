"""Issue 31: append latency against the length of the log, on a local root and on SeaweedFS,
with the service's default settings (no ``--maintenance``; Delta's 30-day log retention, so
every commit file stays), for :mod:`benchmarks.bench_versions`.

One dataset per log length (10, 1,000, 10,000, 50,000 versions by default), each built fast
(:func:`benchmarks.versions_data.append_versions`: one commit file and one small data file
per version, written as a Delta writer writes them, a checkpoint every 10,000 versions and at
the last, as deltalake writes them), on the local disk; the SeaweedFS copies are those
directories copied into SeaweedFS as they are (``weed filer.copy``). Then one service
per root, and the Python client appends ``--append-rows`` rows to each dataset in turn, round
after round (the order rotating), so load that comes and goes falls on every log length
alike; the first two appends to each dataset (its table loaded once by the service) are not
timed. The figure is each dataset's median, and its ratio to the 10-version one's.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.common import sample_table
from benchmarks.versions_data import append_versions

CHECKPOINT_EVERY = 10_000
UPLOAD_THREADS = 32


def build(base: Path, lengths: list[int], batch: pa.Table) -> dict[int, float]:
    """``base/appends_<n>``: a table of ``n`` versions after its version 0, per length;
    returns how long each took."""
    from deltalake import write_deltalake

    took = {}
    for n in lengths:
        start = time.perf_counter()
        table_dir = base / f"appends_{n}"
        write_deltalake(
            str(table_dir),
            batch.slice(0, 0),
            configuration={"delta.enableChangeDataFeed": "true"},
        )
        append_versions(table_dir, batch, n, checkpoint=True, checkpoint_every=CHECKPOINT_EVERY)
        took[n] = time.perf_counter() - start
        print(f"built {n} versions in {took[n]:.1f} s", flush=True)
    return took


def upload(local: Path, store: Any, names: list[str]) -> float:
    """Copy the datasets ``names`` under ``local`` to ``store``'s root (SeaweedFS) with
    SeaweedFS's own concurrent copier into its filer (the S3 gateway's bucket directory):
    PUTs through the S3 gateway managed 25-35 small files a second at load 30, this 10x
    that."""
    import subprocess

    from aqueduct_spark.testing import weed_binary

    def flag(name: str) -> str:
        return next(a.split("=", 1)[1] for a in store.proc.args if a.startswith(f"-{name}="))

    filer = f"127.0.0.1:{flag('filer.port')}.{flag('filer.port.grpc')}"
    prefix = store.root.removeprefix(f"s3://{store.bucket}").strip("/")
    start = time.perf_counter()
    for name in names:
        subprocess.run(
            [
                weed_binary(),
                "filer.copy",
                "-c",
                str(UPLOAD_THREADS),
                str(local / name),
                f"http://{filer}/buckets/{store.bucket}/{prefix}/",
            ],
            check=True,
            capture_output=True,
        )
    return time.perf_counter() - start


def rounds(svc: Any, names: list[str], count: int, batch: pa.Table) -> dict[str, list[float]]:
    """Append ``batch`` to each dataset in turn, ``count`` rounds; seconds per append."""
    client = svc.client()
    try:
        for name in names:
            for _ in range(2):  # not timed: the service loads each table once
                client.append(name, batch)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(count):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                start = time.perf_counter()
                client.append(name, batch)
                times[name].append(time.perf_counter() - start)
        return times
    finally:
        client.close()


def service_medians(log: Path, names: list[str], count: int) -> dict[str, dict[str, float]]:
    """The service's own time for each request of an append (its access log's
    ``duration_ms``), median of each dataset's first ``count`` of each kind: the part of an
    append that could grow with the log, without the client and the network around it."""
    import re

    found: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    pattern = re.compile(r"op=(begin|write|commit) dataset=(\S+) .*duration_ms=([0-9.]+)")
    for line in log.read_text().splitlines():
        m = pattern.search(line)
        if m and m.group(2) in found:
            found[m.group(2)].setdefault(m.group(1), []).append(float(m.group(3)))
    return {
        name: {op: statistics.median(ms[:count]) for op, ms in ops.items() if ms}
        for name, ops in found.items()
    }


def figures(times: dict[str, list[float]], lengths: list[int]) -> dict[str, Any]:
    base = statistics.median(times[f"appends_{lengths[0]}"])
    out = {}
    for n in lengths:
        ms = [t * 1000 for t in times[f"appends_{n}"]]
        median = statistics.median(ms)
        out[str(n)] = {
            "median_ms": median,
            "p90_ms": sorted(ms)[int(0.9 * (len(ms) - 1))],
            "ratio": median / (base * 1000),
            "ms": ms,
        }
    return out


def run(
    tmp: Path,
    lengths: list[int],
    count: int,
    rows: int,
    s3: bool,
    spark: Any = None,
    stream_batches: int = 30,
) -> dict[str, Any]:
    """The whole measurement: build, then local, then (with ``s3``) SeaweedFS. With
    ``spark``, a streaming query into the shortest and the longest log on the local root
    too (:func:`stream_commits`)."""
    from aqueduct_spark.testing import start_seaweed, start_service

    batch = sample_table(rows)
    local = tmp / "appends-root"
    result: dict[str, Any] = {"lengths": lengths, "rounds": count, "rows": rows}
    result["built_s"] = build(local, lengths, batch)
    names = [f"appends_{n}" for n in lengths]
    result["log_entries"] = {
        str(n): len(os.listdir(local / f"appends_{n}" / "_delta_log")) for n in lengths
    }
    stores = ["local", "seaweedfs"] if s3 else ["local"]
    for kind in stores:
        seaweed = None
        try:
            if kind == "local":
                root: str = str(tmp / "appends-local")
                shutil.copytree(local, root)  # the built copy stays for the upload
                args: list[str] = []
            else:
                seaweed = start_seaweed(tmp / "seaweed")
                result["upload_s"] = upload(local, seaweed, names)
                root, args = seaweed.root, seaweed.serve_args()
            load_start = os.getloadavg()[0]
            svc = start_service(root, args=args, log=tmp / f"service-{kind}.log")
            try:
                times = rounds(svc, names, count, batch)
                if spark is not None and kind == "local":
                    ends = [names[0], names[-1]]
                    result["stream"] = stream_commits(spark, svc.options, ends, stream_batches, tmp)
            finally:
                svc.stop()
            result[kind] = {
                "appends": figures(times, lengths),
                "service_ms": service_medians(tmp / f"service-{kind}.log", names, count + 2),
                "load_start": load_start,
                "load_end": os.getloadavg()[0],
            }
            line = ", ".join(
                f"{n}: {f['median_ms']:.1f} ms ({f['ratio']:.2f}x)"
                for n, f in result[kind]["appends"].items()
            )
            print(f"appends on {kind}: {line}; load {load_start:.1f}", flush=True)
        finally:
            if seaweed is not None:
                seaweed.stop()
    return result


def stream_commits(
    spark: Any, options: dict[str, str], names: list[str], batches: int, tmp: Path
) -> dict[str, Any]:
    """A streaming query (Spark's rate source into the ``aqueduct`` sink, one micro-batch
    after another) appending to each dataset for ``batches`` micro-batches with data: the
    time of each batch's write and commit (``durationMs.addBatch``), per dataset."""
    out: dict[str, Any] = {}
    for name in names:
        df = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 400)
            .load()
            .selectExpr(
                "value AS id",
                "CAST(value AS DOUBLE) * 0.5 AS x",
                "concat('row-', CAST(value AS STRING)) AS s",
                "timestamp AS ts",
            )
        )
        query = (
            df.writeStream.format("aqueduct")
            .options(**options)
            .option("checkpointLocation", str(tmp / f"stream-checkpoint-{name}"))
            .trigger(processingTime="0 seconds")
            .start(name)
        )
        try:
            deadline = time.monotonic() + 180 + 10 * batches  # Spark starts its workers
            while time.monotonic() < deadline:
                done = [p for p in query.recentProgress if p["numInputRows"]]
                if len(done) >= batches + 2 or not query.isActive:
                    break
                time.sleep(0.5)
            if not query.isActive:
                raise RuntimeError(f"the stream into {name} failed: {query.exception()}")
        finally:
            query.stop()
        ms = [float(p["durationMs"]["addBatch"]) for p in done[2 : batches + 2]]  # warm
        out[name] = {"add_batch_ms": ms, "median_ms": statistics.median(ms) if ms else None}
        print(f"stream into {name}: addBatch median {out[name]['median_ms']} ms", flush=True)
    first = out[names[0]]["median_ms"]
    for name in names:
        median = out[name]["median_ms"]
        out[name]["ratio"] = median / first if median and first else None
    return out
