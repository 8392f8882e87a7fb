"""Spark across a real path (issue 15): Spark (local[2], driver and executors) runs in one
network namespace, the dataset service and the Flight baseline server in another, joined by
a veth pair at MTU 1500 (``shared/design/real-paths.md``). Writes then reads the same table
through the Flight data source (``benchmarks.spark_sources.FlightBench``) and through the
aqueduct data source over TCP and over QUIC, in one run; prints seconds and the ratio to
Flight (time / Flight time: below 1.0 is faster than Flight).

    sudo .venv/bin/python -m benchmarks.bench_realpath_spark [--rows N] [--repeat K]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bench_realpath import ROOT, require_root, spawn_in, stop, veth_link

READY = "SPARK_RESULT "
PATHS = ("aqueduct-tcp", "aqueduct-quic")


def spark_client(spec: dict[str, Any]) -> None:
    """Runs in the client namespace: the Spark job, timed per path."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from benchmarks.bench_spark import spark_session, timed

    spark = spark_session()
    df = spark.range(0, spec["rows"], numPartitions=4).selectExpr(
        "id",
        "cast(id as double) * 0.5 as x",
        "concat('row-', cast(id as string)) as s",
        "timestamp_micros(id + 1700000000000000) as ts",
    )
    results: dict[str, Any] = {}
    for label, (fmt, options) in spec["paths"].items():
        name = "t_" + "".join(c if c.isalnum() else "_" for c in label)

        def write(fmt: str = fmt, options: dict[str, str] = options, name: str = name) -> None:
            df.write.format(fmt).options(**options).mode("overwrite").save(name)

        def read(fmt: str = fmt, options: dict[str, str] = options, name: str = name) -> None:
            spark.read.format(fmt).options(**options).load(name).write.format("noop").mode(
                "overwrite"
            ).save()

        write()
        w = timed(write, spec["repeat"])
        read()
        r = timed(read, spec["repeat"])
        results[label] = {"write": w, "read": r}
        print(f"{label:14} write {w:6.2f} s   read {r:6.2f} s", file=sys.stderr, flush=True)
    spark.stop()
    print(READY + json.dumps(results), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--paths",
        nargs="+",
        default=list(PATHS),
        choices=list(PATHS),
        help="Aqueduct paths to measure (the Flight data source always runs first)",
    )
    ap.add_argument("--spark-client", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.spark_client:
        spark_client(json.loads(args.spark_client))
        return 0
    reason = require_root("bench_realpath_spark")
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from aqueduct_core.transport import make_dev_certificates

    with tempfile.TemporaryDirectory(prefix="aqueduct-rp-spark-") as tmp, veth_link(1500) as link:
        root = Path(tmp) / "root"
        tls = make_dev_certificates(Path(tmp) / "tls", ("localhost", link.server_ip))
        procs = []
        try:
            cmd = ["-m", "aqueduct_spark.cli", "serve", "--root", str(root)]
            cmd += ["--host", link.server_ip, "--port", "0", "--backend", "qh3"]
            # a veth pair between two private namespaces: no one else can reach it, and Flight
            # runs without a token too (serve refuses a non-loopback host without one otherwise)
            cmd += ["--allow-anonymous"]
            cmd += ["--cert", str(tls.cert_file), "--key", str(tls.key_file)]
            svc, banner = spawn_in(link.server_ns, cmd, "AQUEDUCT_READY ")
            procs.append(svc)
            info = json.loads(banner)
            flight_cmd = ["-m", "benchmarks.flight_server", str(root), str(tls.cert_file)]
            flight, port = spawn_in(
                link.server_ns, [*flight_cmd, str(tls.key_file), link.server_ip], "FLIGHT_READY "
            )
            procs.append(flight)
            aq = {"url": info["url"], "fingerprint": info["fingerprint"]}
            paths = {
                "flight-tls": (
                    "flightbench",
                    {"location": f"grpc+tls://{link.server_ip}:{port}", "ca": str(tls.ca_file)},
                ),
                "aqueduct-tcp": ("aqueduct", {**aq, "transport": "tcp"}),
                "aqueduct-quic": ("aqueduct", {**aq, "transport": "quic", "backend": "qh3"}),
            }
            paths = {k: v for k, v in paths.items() if k == "flight-tls" or k in args.paths}
            spec = {"rows": args.rows, "repeat": args.repeat, "paths": paths}
            out = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    link.client_ns,
                    sys.executable,
                    "-m",
                    "benchmarks.bench_realpath_spark",
                    "--spark-client",
                    json.dumps(spec),
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
                check=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            line = next(x for x in out.stdout.splitlines() if x.startswith(READY))
            results = json.loads(line[len(READY) :])
        finally:
            for proc in procs:
                stop(proc)
    base = results["flight-tls"]
    print(f"\nMTU 1500, {args.rows:,} rows, median of {args.repeat}; ratio = time / Flight time")
    for label, r in results.items():
        print(
            f"  {label:14} write {r['write']:6.2f} s {r['write'] / base['write']:5.2f}x   "
            f"read {r['read']:6.2f} s {r['read'] / base['read']:5.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
