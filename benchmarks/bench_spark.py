"""Issue 7 benchmark: Spark reads and writes the same ~10M-row table (int64, double, string,
timestamp) through the aqueduct source (each backend), a minimal Arrow Flight Python source
over the same data, and in-executor Delta reads/writes (the floor). Prints times and ratios.

    python -m benchmarks.bench_spark [--rows N] [--repeat K] [--quick] [--json out.json]

Spark runs local[2] in this process with spark.sql.execution.arrow.maxBytesPerBatch set to
2147483647 (pitfall 16 of the API brief); the service and the Flight server each run in
their own process and share the 2 cores with Spark.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine, spawn, spawn_service, stop, write_json

ROOT_DIR = Path(__file__).resolve().parents[1]


def spark_session(master: str = "local[2]") -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Executors import the baseline sources from the benchmarks package.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT_DIR), os.environ.get("PYTHONPATH")])
    )
    from pyspark.sql import SparkSession

    from aqueduct_spark.datasource import register
    from benchmarks.spark_sources import DeltaFloor, FlightBench

    spark = (
        SparkSession.builder.master(master)
        .appName("aqueduct-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # keep the logs readable
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.maxBytesPerBatch", "2147483647")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(FlightBench)
    spark.dataSource.register(DeltaFloor)
    return spark


def timed(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1M rows, 1 repetition")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeat = 1_000_000, 1
    from aqueduct_core.transport import make_dev_certificates

    results: dict[str, Any] = {"machine": machine(), "rows": args.rows, "read": {}, "write": {}}
    spark = spark_session()
    procs = []
    with tempfile.TemporaryDirectory(prefix="aqueduct-sparkbench-") as tmp:
        root = Path(tmp) / "root"
        certs = make_dev_certificates(root / ".aqueduct-tls")
        try:
            flight, port = spawn(
                [
                    "-m",
                    "benchmarks.flight_server",
                    str(root),
                    str(certs.cert_file),
                    str(certs.key_file),
                ],
                "FLIGHT_READY ",
                env={"PYTHONPATH": str(ROOT_DIR)},
            )
            procs.append(flight)
            services = {}
            for backend in ("aioquic", "qh3"):
                svc, info = spawn_service(root, backend)
                procs.append(svc)
                services[backend] = info
            df = spark.range(0, args.rows, numPartitions=4).selectExpr(
                "id",
                "cast(id as double) * 0.5 as x",
                "concat('row-', cast(id as string)) as s",
                "timestamp_micros(id + 1700000000000000) as ts",
            )
            paths: dict[str, tuple[str, dict[str, str]]] = {
                "floor (in-executor Delta)": ("deltafloor", {"root": str(root)}),
                "flight-tls": (
                    "flightbench",
                    {"location": f"grpc+tls://127.0.0.1:{port}", "ca": str(certs.ca_file)},
                ),
            }
            for backend, info in services.items():
                paths[f"aqueduct-{backend}"] = (
                    "aqueduct",
                    {"url": info["url"], "fingerprint": info["fingerprint"], "backend": backend},
                )
            # Aqueduct over TLS/TCP (issue 15): the qh3 service also listens on TCP.
            paths["aqueduct-tcp"] = (
                "aqueduct",
                {**paths["aqueduct-qh3"][1], "transport": "tcp"},
            )
            for label, (fmt, options) in paths.items():
                name = "t_" + "".join(c if c.isalnum() else "_" for c in label)

                def write(
                    fmt: str = fmt, options: dict[str, str] = options, name: str = name
                ) -> None:
                    df.write.format(fmt).options(**options).mode("overwrite").save(name)

                def read(
                    fmt: str = fmt, options: dict[str, str] = options, name: str = name
                ) -> None:
                    spark.read.format(fmt).options(**options).load(name).write.format("noop").mode(
                        "overwrite"
                    ).save()

                write()  # warm up (workers, connections) and create the table
                results["write"][label] = timed(write, args.repeat)
                read()
                results["read"][label] = timed(read, args.repeat)
                print(
                    f"{label:28} write {results['write'][label]:6.2f} s   read {results['read'][label]:6.2f} s",
                    flush=True,
                )
        finally:
            for proc in procs:
                stop(proc)
            spark.stop()
    report(results)
    write_json(args.json, results)
    return results


def report(results: dict[str, Any]) -> None:
    print(
        f"\n{results['rows']:,} rows; times are medians; ratio = time / baseline time (lower is better)"
    )
    for kind in ("read", "write"):
        flight = results[kind]["flight-tls"]
        floor = results[kind]["floor (in-executor Delta)"]
        print(f"\n{kind:6} {'path':28} {'s':>7} {'vs Flight':>10} {'vs floor':>9}")
        for label, t in results[kind].items():
            print(f"{'':6} {label:28} {t:7.2f} {t / flight:9.2f}x {t / floor:8.2f}x")
        best = min(t for label, t in results[kind].items() if label.startswith("aqueduct"))
        results[f"{kind}_best_vs_flight"] = best / flight
        results[f"{kind}_best_vs_floor"] = best / floor
        print(
            f"  best aqueduct {kind}: {best / flight:.2f}x Flight (target <= 1.10), {best / floor:.2f}x floor (target <= 1.50)"
        )


if __name__ == "__main__":
    main()
