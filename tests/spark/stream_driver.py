"""A Spark driver running one streaming query from an aqueduct dataset to another, for the
fault tests (which SIGKILL it) and the latency benchmark.

    python tests/spark/stream_driver.py '{"url": ..., "fingerprint": ..., "source": ...,
        "sink": ..., "checkpoint": ..., "trigger": "continuous" | "availableNow",
        "read": {...more source options}, "pause": "write:1" | "commit:3" | null,
        "markers": "/dir"}'

It prints ``STARTED`` once the query runs and ``DONE`` when an availableNow query ends.
``pause`` makes the sink stop dead at a point of one micro-batch (after a task staged its
data, or after the sink's commit, before Spark records the batch), touching
``<markers>/<point>-<batch>`` first so the test knows when to kill this process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def faulty_source(base: type) -> type:
    """The data source with a sink that can pause forever at a chosen point. Defined in a
    function: cloudpickle ships it by value to Spark's Python workers."""
    from aqueduct_spark.datasource.stream_writer import AqueductStreamWriter

    def pause(point: str, batch: Any) -> None:
        if os.environ.get("AQ_FAULT_PAUSE") == f"{point}:{batch}":
            Path(os.environ["AQ_FAULT_MARKERS"], f"{point}-{batch}").touch()
            time.sleep(3600)

    class PausingWriter(AqueductStreamWriter):
        def write(self, iterator: Any) -> Any:
            message = super().write(iterator)
            pause("write", message.batch_id)
            return message

        def commit(self, messages: Any, batchId: int) -> None:
            super().commit(messages, batchId)
            pause("commit", batchId)

    class PausingSource(base):  # type: ignore[misc]
        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return PausingWriter(self.opts, schema, overwrite, begin=not self.unpickled)

    return PausingSource


def main() -> None:
    spec = json.loads(sys.argv[1])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["AQ_FAULT_PAUSE"] = spec.get("pause") or ""
    os.environ["AQ_FAULT_MARKERS"] = spec.get("markers") or "."
    sys.path.insert(0, str(Path(__file__).parent))
    from pyspark.sql import SparkSession

    from aqueduct_spark.datasource import AqueductDataSource

    spark = (
        SparkSession.builder.master("local[2,2]")
        .appName("aqueduct-stream-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.maxBytesPerBatch", "2147483647")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(faulty_source(AqueductDataSource))
    service = {"url": spec["url"], "fingerprint": spec["fingerprint"]}
    df = (
        spark.readStream.format("aqueduct")
        .options(**service, **spec.get("read", {}))
        .load(spec["source"])
    )
    writer = (
        df.writeStream.format("aqueduct")
        .options(**service)
        .option("checkpointLocation", spec["checkpoint"])
    )
    if spec.get("trigger") == "availableNow":
        writer = writer.trigger(availableNow=True)
    query = writer.start(spec["sink"])
    print("STARTED", query.id, flush=True)
    query.awaitTermination()
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
