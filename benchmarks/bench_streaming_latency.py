"""Streaming latency: from an append through the Python client to the row's arrival in a
Spark ``memory`` sink, with push notifications versus polling (issue 8).

Run it as ``python -m benchmarks.bench_streaming_latency [--appends 40] [--json out.json]``
(a script, not a test). It starts its own dataset service and a ``local[2]`` Spark session,
then for each mode runs one query ``readStream.format("aqueduct")`` -> ``memory`` with
``trigger(processingTime="0 seconds")`` (as fast as possible; Spark waits 10 ms between
triggers that find no data) and appends one row at a time:

- ``push``: ``pushNotifications=true`` (the default): the service pushes each new version
  over the subscription; ``latestOffset`` waits on it.
- ``poll``: ``pushNotifications=false`` with ``pollInterval`` at its default (1 s).

A row "arrives" when the micro-batch that contains it has been committed to the memory sink:
the end of that batch's trigger (``timestamp + durationMs.triggerExecution`` from the query
progress, the JVM clock of the same machine), found with a streaming query listener, not by
polling the sink. Latency is arrival minus the moment ``append()`` was called (so it includes
the append's own commit, reported separately). Appends are spaced by a random pause
(0.2-1.2 s) so they land at random phases of the poll cycle; each waits for the previous row
to arrive. The first appends warm Spark's Python workers up and are not counted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import queue
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WARMUP = 3


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "samples": len(values),
        "median": statistics.median(values),
        "p95": percentile(values, 0.95),
        "min": min(values),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


def run_mode(
    spark: Any,
    svc: Any,
    name: str,
    options: dict[str, str],
    appends: int,
    rng: random.Random,
    events: queue.Queue[dict[str, Any]],
) -> dict[str, Any]:
    import pyarrow as pa

    client = svc.client()
    dataset = f"latency_{name}"
    schema = pa.schema([("id", pa.int64())])
    client.create(dataset, schema)
    client.append(dataset, pa.table({"id": [-1]}, schema=schema))
    query = (
        spark.readStream.format("aqueduct")
        .options(**svc.options, **options)
        .load(dataset)
        .writeStream.format("memory")
        .queryName(f"latency_{name}")
        .trigger(processingTime="0 seconds")
        .start()
    )
    latencies, append_times = [], []
    try:
        while query.status["message"] == "Initializing sources":
            time.sleep(0.05)
        time.sleep(1.0)
        while not events.empty():
            events.get_nowait()
        for i in range(WARMUP + appends):
            time.sleep(rng.uniform(0.2, 1.2))
            t0 = time.time()
            result = client.append(dataset, pa.table({"id": [i]}, schema=schema))
            t1 = time.time()
            version = int(result["version"])
            deadline = time.monotonic() + 60
            while True:
                event = events.get(timeout=max(0.1, deadline - time.monotonic()))
                if event["query"] == str(query.id) and event["end_version"] >= version:
                    break
            if i >= WARMUP:
                latencies.append(event["arrival"] - t0)
                append_times.append(t1 - t0)
        got = sorted(r.id for r in spark.table(f"latency_{name}").collect())
        assert got == list(range(WARMUP + appends)), f"rows lost or repeated: {got}"
    finally:
        query.stop()
    out = summary(latencies)
    out["append_median"] = statistics.median(append_times)
    out["options"] = options
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=40, help="timed appends per mode")
    parser.add_argument("--quick", action="store_true", help="10 appends per mode (smoke run)")
    parser.add_argument("--modes", default="push,poll", help="comma-separated: push, poll")
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    appends = 10 if args.quick else args.appends

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.listener import StreamingQueryListener

    from aqueduct_spark.datasource import register
    from aqueduct_spark.testing import start_service

    events: queue.Queue[dict[str, Any]] = queue.Queue()

    class Arrivals(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            if not p.numInputRows:
                return
            start = dt.datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp()
            end = json.loads(p.sources[0].endOffset)
            events.put(
                {
                    "query": str(p.id),
                    "arrival": start + p.durationMs["triggerExecution"] / 1000,
                    "end_version": int(end["version"]) - (1 if int(end["file"]) == 0 else 0),
                }
            )

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    with tempfile.TemporaryDirectory(prefix="aqueduct-latency-") as tmp:
        svc = start_service(Path(tmp) / "root")
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("aqueduct-streaming-latency")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")  # keep the logs readable
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.execution.arrow.maxBytesPerBatch", "2147483647")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        spark.streams.addListener(Arrivals())
        rng = random.Random(args.seed)
        modes = {
            "push": {"pushNotifications": "true"},
            "poll": {"pushNotifications": "false"},  # pollInterval: its default, 1 s
        }
        results: dict[str, Any] = {}
        try:
            for name in args.modes.split(","):
                print(f"{name}: {appends} appends ...", flush=True)
                results[name] = run_mode(spark, svc, name, modes[name], appends, rng, events)
        finally:
            spark.stop()
            svc.stop()

    print()
    print(f"{'mode':<6} {'n':>3} {'median s':>9} {'p95 s':>7} {'min s':>7} {'max s':>7}  append s")
    for name, r in results.items():
        print(
            f"{name:<6} {r['samples']:>3} {r['median']:>9.3f} {r['p95']:>7.3f} "
            f"{r['min']:>7.3f} {r['max']:>7.3f}  {r['append_median']:.3f}"
        )
    notes = (
        "Trigger processingTime 0 s; memory sink; one 1-row append at a time, spaced 0.2-1.2 s "
        "at random; latency from the append() call to the end of the micro-batch holding the "
        "row. poll uses pollInterval=1s (the default). local[2] on a shared 2-core machine."
    )
    print(notes)
    if args.json:
        from benchmarks.common import machine, write_json

        write_json(args.json, {"modes": results, "notes": notes, "machine": machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
