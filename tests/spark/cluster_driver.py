"""A Spark driver on a standalone cluster, for the cluster test (tests/spark/test_cluster.py).

    python tests/spark/cluster_driver.py '{"master": "spark://...", "url": ..., "fingerprint":
        ..., "batch": "<dataset>", "rows": N, "source": ..., "sink": ..., "checkpoint": ...,
        "stop": "/path/of/a/stop/file"}'

First a batch job: writes ``rows`` rows to ``batch`` through the data source on the cluster's
executors and reads them back, printing ``BATCH {"count": .., "distinct": ..}``. Then a
stream from ``source`` to ``sink`` (``STARTED``), which it restarts from its checkpoint if it
fails (``FAILED <message>``, as an operator's supervisor would), until the stop file appears
(``DONE``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    spec = json.loads(sys.argv[1])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from aqueduct_spark.datasource import register

    spark = (
        SparkSession.builder.master(spec["master"])
        .appName("aqueduct-cluster-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "1g")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.maxBytesPerBatch", "2147483647")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    service = {"url": spec["url"], "fingerprint": spec["fingerprint"]}

    df = spark.range(spec["rows"], numPartitions=4).select(
        F.col("id"), F.concat(F.lit("row-"), F.col("id").cast("string")).alias("s")
    )
    df.write.format("aqueduct").options(**service).mode("append").save(spec["batch"])
    back = spark.read.format("aqueduct").options(**service).load(spec["batch"])
    counts = back.agg(F.count("*").alias("n"), F.countDistinct("id").alias("d")).first()
    print("BATCH", json.dumps({"count": counts["n"], "distinct": counts["d"]}), flush=True)

    def start() -> object:
        return (
            spark.readStream.format("aqueduct")
            .options(**service, startingVersion="earliest")
            .load(spec["source"])
            .writeStream.format("aqueduct")
            .options(**service)
            .option("checkpointLocation", spec["checkpoint"])
            .trigger(processingTime="1 second")
            .start(spec["sink"])
        )

    query = start()
    print("STARTED", flush=True)
    stop = Path(spec["stop"])
    while not stop.exists():
        if not query.isActive:  # type: ignore[attr-defined]
            message = str(query.exception()).splitlines()[0]  # type: ignore[attr-defined]
            print("FAILED", message, flush=True)
            query = start()
        time.sleep(0.5)
    query.stop()  # type: ignore[attr-defined]
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
