"""Worker processes of ``benchmarks.bench_transport``: Arrow Flight ``do_get`` over TLS.

``python -m benchmarks.bench_transport_flight server CERTDIR`` serves gRPC+TLS with the
development certificate (``server.pem``/``server.key``, the same one the QUIC servers use)
and prints ``READY {json}``; it serves until stdin closes. A ticket ``{"size", "count"}``
answers ``count`` record batches of one binary column holding one value of ``size`` bytes,
so each batch carries the same payload bytes as one Aqueduct message.

``python -m benchmarks.bench_transport_flight client CERTDIR PORT SERVER_PID PLAN`` verifies
the server against ``ca.pem``, runs PLAN's measurements and prints ``RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from benchmarks.bench_transport_quic import cpu_of, payload, pin

SCHEMA = pa.schema([("blob", pa.binary())])


def batch_of(size: int) -> pa.RecordBatch:
    """One row, one binary value of ``size`` bytes, built without copying the payload."""
    offsets = pa.py_buffer(pa.array([0, size], pa.int32()).buffers()[1])
    values = pa.py_buffer(payload(size))
    column = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, values])
    return pa.RecordBatch.from_arrays([column], schema=SCHEMA)


class BlobServer(fl.FlightServerBase):  # type: ignore[misc]
    def __init__(self, location: str, cert: bytes, key: bytes) -> None:
        super().__init__(location, tls_certificates=[fl.CertKeyPair(cert=cert, key=key)])
        self.batches: dict[int, pa.RecordBatch] = {}

    def do_get(self, context: Any, ticket: fl.Ticket) -> fl.RecordBatchStream:
        request = json.loads(ticket.ticket)
        size, count = int(request["size"]), int(request["count"])
        batch = self.batches.get(size)
        if batch is None:
            batch = self.batches[size] = batch_of(size)
        # A C++-driven stream of the same batch repeated (zero copy): Flight's best case.
        return fl.RecordBatchStream(pa.Table.from_batches([batch] * count, schema=SCHEMA))


def server_main(certdir: str) -> None:
    with open(f"{certdir}/server.pem", "rb") as f:
        cert = f.read()
    with open(f"{certdir}/server.key", "rb") as f:
        key = f.read()
    server = BlobServer("grpc+tls://127.0.0.1:0", cert, key)
    print("READY " + json.dumps({"port": server.port, "pid": os.getpid()}), flush=True)
    sys.stdin.read()
    server.shutdown()


def client_main(certdir: str, port: int, pid: int, plan: Any) -> None:
    with open(f"{certdir}/ca.pem", "rb") as f:
        ca = f.read()
    client = fl.FlightClient(
        f"grpc+tls://127.0.0.1:{port}", tls_root_certs=ca, override_hostname="localhost"
    )

    def measure(size: int, count: int) -> dict[str, float]:
        c0, s0 = time.process_time(), cpu_of(pid)
        start = time.perf_counter()
        reader = client.do_get(fl.Ticket(json.dumps({"size": size, "count": count}).encode()))
        received = 0
        for chunk in reader:
            column = chunk.data.column(0)
            for i in range(len(column)):
                received += column[i].as_buffer().size
        elapsed = time.perf_counter() - start
        c1, s1 = time.process_time(), cpu_of(pid)
        if received != size * count:
            raise RuntimeError(f"flight: received {received} bytes, expected {size * count}")
        gb = received / 1e9
        return {
            "MBps": received / elapsed / 1e6,
            "seconds": elapsed,
            "client_cpu_s_per_GB": (c1 - c0) / gb,
            "server_cpu_s_per_GB": (s1 - s0) / gb,
        }

    measure(1 << 20, 4)  # warm up: TLS session, gRPC channel
    samples = []
    for rep in range(plan["repeat"]):
        for size in plan["sizes"]:
            result = measure(size, max(1, plan["bytes"] // size))
            samples.append({"kind": "flight-tls", "size": size, "rep": rep, **result})
    client.close()
    print("RESULT " + json.dumps(samples), flush=True)


if __name__ == "__main__":
    cpu_arg = os.environ.get("BENCH_PIN_CPU")
    pin(int(cpu_arg) if cpu_arg else None)
    if sys.argv[1] == "server":
        server_main(sys.argv[2])
    else:
        client_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5]))
