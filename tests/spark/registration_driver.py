"""A Spark application that uses format("aqueduct") without registering anything: run by
test_registration.py in a fresh process, from a directory outside the repository.

Arguments: a JSON object of source options and the dataset to read. Prints one JSON line:
the rows read on the main thread, and what a write from another thread did, before and after
the one-line remedy docs/troubleshooting.md gives."""

from __future__ import annotations

import json
import sys
import threading

from pyspark.sql import SparkSession


def main() -> None:
    options, dataset = json.loads(sys.argv[1]), sys.argv[2]
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("aqueduct-registration")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    out: dict[str, object] = {}
    try:
        out["rows"] = spark.read.format("aqueduct").options(**options).load(dataset).count()
    except Exception as exc:
        out["rows"] = f"{type(exc).__name__}: {str(exc)[:500]}"

    def write_from_a_thread() -> None:
        def write() -> str:
            try:
                df = spark.range(3)
                df.write.format("aqueduct").options(**options).mode("append").save(dataset + "_t")
                return "ok"
            except Exception as exc:
                return f"{type(exc).__name__}: {str(exc)[:500]}"

        out["thread"] = write()
        # The remedy of docs/troubleshooting.md (DATA_SOURCE_NOT_FOUND): the thread's JVM
        # side has no active session, and Spark looks Python data sources up in that one.
        spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)
        out["thread_remedied"] = write()

    worker = threading.Thread(target=write_from_a_thread)
    worker.start()
    worker.join()
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
