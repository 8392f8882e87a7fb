"""The end-to-end demo behind ``make demo``: everything on this machine, nothing to set up.

1. starts a dataset service (``aqueduct serve``) on a free loopback port, with a development
   certificate, over a temporary directory;
2. starts Spark in local mode;
3. writes a generated table of trips through Aqueduct;
4. reads it back with a filter (pushed down to the service);
5. runs a streaming query from one dataset to another while rows are appended;
6. prints what happened, with timings, and shuts everything down.

The service's own log (a line per request at INFO) and Spark's (its JVM's stderr: log4j, the
JVM's warnings, its Python workers' stderr) go to files, named at the end, so that the terminal
shows only the steps and their timings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from aqueduct_spark.client import Client
    from aqueduct_spark.testing import ServiceProcess

ROWS = 1_000_000
APPENDS = 5
ROWS_PER_APPEND = 2_000


def say(text: str) -> None:
    print(text, flush=True)


@contextmanager
def step(n: int, total: int, text: str) -> Iterator[None]:
    say(f"[{n}/{total}] {text} ...")
    start = time.perf_counter()
    yield
    say(f"      done in {time.perf_counter() - start:.1f} s")


def check_java() -> None:
    java = shutil.which("java") or (
        str(Path(os.environ["JAVA_HOME"]) / "bin" / "java") if os.environ.get("JAVA_HOME") else None
    )
    if java is None or not Path(java).exists():
        sys.exit(
            "aqueduct demo: Java is missing. Spark 4.3 needs Java 17: install a JDK 17 (for example "
            "'apt install openjdk-17-jre-headless') and put 'java' on PATH or set JAVA_HOME."
        )
    version = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    if '"17' not in version and '"21' not in version:
        say(
            f"warning: Spark 4.3 is tested with Java 17; found: {version.splitlines()[0] if version else '?'}"
        )


def main() -> int:
    check_java()
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's workers use this interpreter
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode: no interface warning
    total = 6
    started = time.perf_counter()
    log = service_log()
    spark_log = service_log("spark")
    try:
        with tempfile.TemporaryDirectory(prefix="aqueduct-demo-") as tmp:
            with step(1, total, "starting the dataset service on loopback"):
                svc = start_demo_service(Path(tmp) / "datasets", log)
                say(f"      {svc.url}  (certificate SHA-256 {svc.fingerprint[:23]}...)")
            try:
                with step(2, total, "starting Spark (local mode, 2 cores)"):
                    spark = start_spark(spark_log)
                try:
                    run(spark, svc, Path(tmp), total)
                finally:
                    spark.stop()
            finally:
                svc.stop()
    finally:
        say(f"\nThe service's log (a line per request): {log}")
        say(f"Spark's log: {spark_log}")
    say(
        f"All done in {time.perf_counter() - started:.0f} s. Everything ran on this machine: a QUIC "
        "service, Spark, and Delta tables in a temporary directory (now removed)."
    )
    return 0


def service_log(what: str = "service") -> Path:
    """A new file for the service's (or Spark's) log, kept after the demo (its directory is
    not)."""
    fd, path = tempfile.mkstemp(prefix=f"aqueduct-demo-{what}-", suffix=".log")
    os.close(fd)
    return Path(path)


def start_demo_service(root: Path, log: Path) -> ServiceProcess:
    """The demo's service, its log in ``log``: the access log (a line per request, one
    ``describe`` every 50 ms while the demo waits for a stream) would bury the steps."""
    from aqueduct_spark.testing import start_service

    return start_service(root, log=log)


def start_spark(log: Path) -> SparkSession:
    """Spark in local mode, its JVM's stderr in ``log``: the JVM inherits this process's
    stderr, so it is pointed at the file while the JVM starts (log4j's console lines, the
    JVM's own warnings and the stderr of Spark's Python workers then go there for good)."""
    from pyspark.sql import SparkSession

    from aqueduct_spark.datasource import register

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("aqueduct-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.maxBytesPerBatch", "2147483647")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.sql.shuffle.partitions", "2")
    )
    sys.stderr.flush()
    saved = os.dup(2)
    out = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(out, 2)
    try:
        spark = builder.getOrCreate()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(out)
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def run(spark: SparkSession, svc: ServiceProcess, tmp: Path, total: int) -> None:
    import pyarrow as pa

    opts = svc.options
    with step(3, total, f"writing {ROWS:,} generated trips through Aqueduct"):
        trips = spark.range(0, ROWS, numPartitions=4).selectExpr(
            "id as trip_id",
            "cast(rand(7) * 30 as double) as distance_km",
            "element_at(array('bike', 'bus', 'car', 'train'), cast(id % 4 + 1 as int)) as mode",
            "timestamp_micros(1767225600000000 + id * 1000000) as started",
        )
        trips.write.format("aqueduct").options(**opts).mode("overwrite").save("trips")
        info = svc.client().describe("trips")
        say(
            f"      dataset 'trips': version {info.version}, {info.rows:,} rows, {info.bytes / 1e6:.1f} MB as Delta"
        )

    with step(4, total, "reading it back with a filter (distance > 25 km, pushed to the service)"):
        long_trips = (
            spark.read.format("aqueduct")
            .options(**opts)
            .option("pushDownPredicate", "true")  # safe: this DataFrame serves one query
            .load("trips")
            .filter("distance_km > 25")
            .groupBy("mode")
            .count()
            .orderBy("mode")
        )
        for row in long_trips.collect():
            say(f"      {row['mode']:6} {row['count']:>8,} long trips")

    with step(
        5, total, f"streaming 'events' into 'events_copy' while {APPENDS} batches are appended"
    ):
        client = svc.client()
        schema = pa.schema([("event_id", pa.int64()), ("kind", pa.string())])
        client.create("events", schema)
        stream = (
            spark.readStream.format("aqueduct")
            .options(**opts)
            .option("startingVersion", "earliest")
            .load("events")
            .writeStream.format("aqueduct")
            .options(**opts)
            .option("checkpointLocation", str(tmp / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
        )
        copy = Restartable(lambda: stream.start("events_copy"))
        try:
            latencies = []
            for i in range(APPENDS):
                ids = pa.array(range(i * ROWS_PER_APPEND, (i + 1) * ROWS_PER_APPEND), pa.int64())
                batch = pa.record_batch([ids, pa.array(["click"] * len(ids))], schema=schema)
                sent = time.perf_counter()
                client.append("events", batch)
                wait_for_rows(client, "events_copy", (i + 1) * ROWS_PER_APPEND, 60, copy)
                latencies.append(time.perf_counter() - sent)
                say(
                    f"      append {i + 1}: {ROWS_PER_APPEND:,} rows in the copy after {latencies[-1]:.2f} s"
                )
        finally:
            copy.query.stop()
        ids = svc.client().read("events_copy", columns=["event_id"]).column("event_id")
        expected = APPENDS * ROWS_PER_APPEND
        unique = len(ids.unique())
        if len(ids) != expected or unique != expected:
            raise RuntimeError(
                f"'events_copy' holds {len(ids):,} rows ({unique:,} distinct events), "
                f"expected each of the {expected:,} events once"
            )
        say(f"      'events_copy' holds {len(ids):,} rows: every event exactly once")

    with step(6, total, "what happened"):
        history = svc.client().offsets("events_copy")["versions"]
        say(
            f"      the stream committed {len(history)} micro-batches, each atomically and idempotently"
        )
        say(
            f"      median append-to-copy time {sorted(latencies)[len(latencies) // 2]:.2f} s "
            "(push notifications, 200 ms trigger)"
        )


SLOW_WORKER = "Python worker failed to connect back"
"""Spark's error when a Python worker it started did not connect back within 10 s (fixed in
Spark 4.3): a busy machine, not a fault of the query; it heals when the query starts again."""


class Restartable:
    """A streaming query that starts again from its checkpoint (exactly once all the same)
    when Spark gave up on one of its Python workers starting, at most ``restarts`` times."""

    def __init__(self, start: Callable[[], StreamingQuery], restarts: int = 3) -> None:
        self._start = start
        self.restarts = restarts
        self.query = start()

    def check(self) -> None:
        """Raise if the query failed for good; start it again if it can heal."""
        if self.query.isActive:
            return
        error = self.query.exception()
        if error is None or SLOW_WORKER not in str(error) or self.restarts == 0:
            raise RuntimeError(f"the streaming query stopped: {error}")
        self.restarts -= 1
        say("      (a Python worker of Spark's was slow to start on this busy machine:")
        say("       the stream starts again from its checkpoint)")
        self.query = self._start()


def wait_for_rows(
    client: Client, name: str, rows: int, timeout: float, copy: Restartable | None = None
) -> None:
    from aqueduct_spark.protocol import DatasetNotFound

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if client.describe(name).rows >= rows:
                return
        except DatasetNotFound:
            pass
        if copy is not None:
            copy.check()
        time.sleep(0.05)
    raise TimeoutError(f"{name} did not reach {rows} rows within {timeout} s")


if __name__ == "__main__":
    sys.exit(main())
