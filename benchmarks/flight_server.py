"""A minimal Arrow Flight server over the same Delta tables as the dataset service: the
baseline the benchmarks compare with.

It uses the dataset service's own store (same planning, same Parquet decoding, same staging
and commit), so the comparison is Flight/gRPC+TLS against Aqueduct/QUIC and nothing else:

- ``get_flight_info(path=[dataset])``: one endpoint per split of the latest version;
- ``do_get(ticket)``: the split's record batches;
- ``do_put(cmd={dataset, txn, task})``: stages the uploaded batches, answers the staged files;
- ``do_action("commit", {dataset, mode, staged})``: commits them in one Delta commit.

Run: ``python -m benchmarks.flight_server ROOT CERT KEY [HOST [CODEC]]`` (prints
``FLIGHT_READY <port>``; HOST defaults to 127.0.0.1; CODEC, ``zstd`` or ``lz4``, compresses
what ``do_get`` sends).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from aqueduct_spark.protocol import Split, StagedFile
from aqueduct_spark.service.store import Store


class DeltaFlightServer(fl.FlightServerBase):
    def __init__(
        self, root: str, location: str, cert: bytes, key: bytes, compression: str | None = None
    ) -> None:
        super().__init__(location, tls_certificates=[fl.CertKeyPair(cert=cert, key=key)])
        self.store = Store(root)
        self.options = pa.ipc.IpcWriteOptions(compression=compression) if compression else None

    def get_flight_info(self, context: Any, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        name = descriptor.path[0].decode()
        plan = self.store.plan(name)
        endpoints = [
            fl.FlightEndpoint(json.dumps(s.to_dict(), default=str).encode(), [])
            for s in plan.splits
        ]
        return fl.FlightInfo(plan.schema, descriptor, endpoints, plan.rows, plan.bytes)

    def do_get(self, context: Any, ticket: fl.Ticket) -> fl.RecordBatchStream:
        split = Split.from_dict(json.loads(ticket.ticket))
        batches = self.store.scan(split)
        first = next(batches, None)
        if first is None:
            schema = self.store.plan(split.dataset, version=split.version).schema
            empty = pa.Table.from_batches([], schema=schema)
            return fl.RecordBatchStream(empty, options=self.options)

        def all_batches() -> Any:
            yield first
            yield from batches

        return fl.GeneratorStream(first.schema, all_batches(), options=self.options)

    def do_put(
        self,
        context: Any,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        cmd = json.loads(descriptor.command)
        stage = self.store.open_stage(cmd["dataset"], cmd["txn"], cmd["task"], reader.schema)
        try:
            for chunk in reader:
                stage.write(chunk.data)
            staged = stage.close()
        except BaseException:
            stage.abort()
            raise
        writer.write(pa.py_buffer(json.dumps([f.to_dict() for f in staged]).encode()))

    def do_action(self, context: Any, action: fl.Action) -> Any:
        if action.type != "commit":
            raise fl.FlightServerError(f"unknown action {action.type}")
        body = json.loads(action.body.to_pybytes())
        staged = [StagedFile.from_dict(f) for f in body["staged"]]
        schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(body["schema"])))
        result = self.store.commit(body["dataset"], body["mode"], schema, [], staged)
        yield fl.Result(json.dumps({"version": result.version, "rows": result.rows}).encode())


class PlainFlightServer(fl.FlightServerBase):
    """Flight written the plain way, as a user would: deltalake lists the table's files,
    pyarrow's dataset scanner reads each (one endpoint per file), C++ end to end with no
    Python per batch. ``compression`` (``zstd``, ``lz4``) turns Arrow IPC body compression
    on, as a Flight server's ``IpcWriteOptions`` can."""

    def __init__(
        self, root: str, location: str, cert: bytes, key: bytes, compression: str | None = None
    ) -> None:
        super().__init__(location, tls_certificates=[fl.CertKeyPair(cert=cert, key=key)])
        self.root = root
        self.options = pa.ipc.IpcWriteOptions(compression=compression) if compression else None

    def get_flight_info(self, context: Any, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        import pyarrow.parquet as pq
        from deltalake import DeltaTable

        name = descriptor.path[0].decode()
        files = DeltaTable(f"{self.root}/{name}").file_uris()
        schema = pq.read_schema(files[0])
        endpoints = [fl.FlightEndpoint(uri.encode(), []) for uri in files]
        return fl.FlightInfo(schema, descriptor, endpoints, -1, -1)

    def do_get(self, context: Any, ticket: fl.Ticket) -> fl.RecordBatchStream:
        import pyarrow.dataset as ds

        reader = ds.dataset(ticket.ticket.decode(), format="parquet").scanner(batch_size=65536)
        return fl.RecordBatchStream(reader.to_reader(), options=self.options)


def main() -> None:
    root, cert, key = sys.argv[1:4]
    host = sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1"
    codec = sys.argv[5] if len(sys.argv) > 5 else None
    with open(cert, "rb") as c, open(key, "rb") as k:
        server = DeltaFlightServer(root, f"grpc+tls://{host}:0", c.read(), k.read(), codec)
    print(f"FLIGHT_READY {server.port}", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
