"""Issue 6 benchmark: read a ~1 GB dataset through the dataset service (Python client) and,
in the same run, through Arrow Flight (``pyarrow.flight``, TLS) from a minimal Flight server
over the same Delta table. Prints MB/s (Arrow bytes per second) and the ratio.

    python -m benchmarks.bench_service [--rows N] [--repeat K] [--quick] [--json out.json]

Servers run in their own processes; the client in this one (2 cores: one each).
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow.flight as fl

from aqueduct_core.engine import EngineConfig
from aqueduct_core.transport import ClientTLS, TransportConfig, make_dev_certificates
from aqueduct_spark.client import Client
from aqueduct_spark.service.store import Store
from benchmarks.common import (
    machine,
    median_time,
    sample_table,
    spawn,
    spawn_service,
    stop,
    write_json,
)

DATASET = "bench"


def make_dataset(root: Path, rows: int) -> int:
    """Write the dataset straight through the store (setup, not measured)."""
    store = Store(str(root))
    txn = uuid.uuid4().hex
    chunk = 2_000_000
    first = sample_table(0)
    writer = store.open_stage(DATASET, txn, "setup", first.schema)
    for start in range(0, rows, chunk):
        for batch in sample_table(min(chunk, rows - start), start).to_batches(max_chunksize=65536):
            writer.write(batch)
    staged = writer.close()
    store.commit(DATASET, "overwrite", first.schema, [], staged)
    return store.describe(DATASET).bytes


def read_aqueduct(url: str, fingerprint: str, backend: str) -> int:
    client = Client(
        url,
        tls=ClientTLS(fingerprint=fingerprint),
        transport=TransportConfig(backend=backend, engine=EngineConfig(flow_window=16 << 20)),  # type: ignore[arg-type]
    )
    try:
        return sum(b.nbytes for b in client.read_batches(DATASET))
    finally:
        client.close()


def read_flight(port: int, ca: Path) -> int:
    client = fl.FlightClient(f"grpc+tls://127.0.0.1:{port}", tls_root_certs=ca.read_bytes())
    info = client.get_flight_info(fl.FlightDescriptor.for_path(DATASET))
    total = 0
    for endpoint in info.endpoints:
        reader = client.do_get(endpoint.ticket)
        for chunk in reader:
            total += chunk.data.nbytes
    client.close()
    return total


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=25_000_000, help="rows (25M ~ 1.1 GB of Arrow)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2M rows, 2 repetitions")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeat = 2_000_000, 2
    results: dict[str, Any] = {"machine": machine(), "rows": args.rows, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="aqueduct-bench-") as tmp:
        root = Path(tmp) / "root"
        certs = make_dev_certificates(root / ".aqueduct-tls")
        print(f"writing {args.rows:,} rows ...", flush=True)
        make_dataset(root, args.rows)
        procs = []
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
            )
            procs.append(flight)
            arrow_bytes = read_flight(int(port), certs.ca_file)  # warm the page cache
            results["arrow_bytes"] = arrow_bytes
            t, _ = median_time(lambda: read_flight(int(port), certs.ca_file), args.repeat)
            results["runs"]["flight-tls"] = {"seconds": t, "MBps": arrow_bytes / t / 1e6}
            for backend in ("aioquic", "qh3"):
                svc, info = spawn_service(root, backend)
                procs.append(svc)
                read_aqueduct(info["url"], info["fingerprint"], backend)  # warm up
                t, got = median_time(
                    lambda info=info, backend=backend: read_aqueduct(
                        info["url"], info["fingerprint"], backend
                    ),
                    args.repeat,
                )
                assert got == arrow_bytes, (got, arrow_bytes)
                results["runs"][f"aqueduct-{backend}"] = {
                    "seconds": t,
                    "MBps": arrow_bytes / t / 1e6,
                }
                stop(svc)
        finally:
            for proc in procs:
                stop(proc)
    flight_rate = results["runs"]["flight-tls"]["MBps"]
    print(f"\n{'path':22} {'s':>7} {'MB/s':>8} {'vs Flight TLS':>14}")
    for name, run in results["runs"].items():
        run["vs_flight"] = run["MBps"] / flight_rate
        print(f"{name:22} {run['seconds']:7.2f} {run['MBps']:8.0f} {run['vs_flight']:13.2f}x")
    best = max(r["vs_flight"] for n, r in results["runs"].items() if n.startswith("aqueduct"))
    results["best_vs_flight"] = best
    print(f"\nbest Aqueduct / Flight TLS = {best:.2f}x (target >= 0.80x)")
    print(
        f"({results['arrow_bytes'] / 1e9:.2f} GB of Arrow data, {args.rows:,} rows, median of {args.repeat})"
    )
    write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
