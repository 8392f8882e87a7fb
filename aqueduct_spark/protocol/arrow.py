"""The Arrow payload codec: schemas in channel headers, one IPC record batch message per
Aqueduct message, and the per-batch and error message headers (§6 of
``docs/dataset-protocol.md``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import cbor2
import pyarrow as pa

from .errors import DatasetError, InvalidRequest, error_to_wire
from .headers import COMPRESSIONS, H_BATCH, H_ERROR


def schema_to_bytes(schema: pa.Schema) -> bytes:
    return bytes(schema.serialize())


def schema_from_bytes(data: bytes | bytearray | memoryview) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidRequest(f"not an Arrow IPC schema: {exc}") from exc


def ipc_options(compression: str) -> pa.ipc.IpcWriteOptions:
    if compression not in COMPRESSIONS:
        raise InvalidRequest(f"unknown compression {compression!r}: use one of {COMPRESSIONS}")
    return pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)


class _Collect:
    """A write-only file for pyarrow that keeps what is written."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> int:
        self.chunks.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def batch_to_payload(batch: pa.RecordBatch, options: pa.ipc.IpcWriteOptions) -> Any:
    """One IPC record batch message, without the schema (it is in the channel headers).
    Compressed bodies (lz4, zstd) when ``options`` asks for them."""
    if options.compression is None:
        return batch.serialize()
    sink = _Collect()
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), batch.schema, options=options) as w:
        w.write_batch(batch.slice(0, 0))  # the schema goes out with the first batch...
        sink.chunks.clear()  # ...and the reader has it from the headers already
        w.write_batch(batch)
        message = b"".join(sink.chunks)
    return message


def batch_from_payload(data: Any, schema: pa.Schema) -> pa.RecordBatch:
    """Decode a data message (zero-copy on the payload buffer)."""
    try:
        batch = pa.ipc.read_record_batch(pa.py_buffer(data), schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, ValueError) as exc:
        raise InvalidRequest(f"a data message is not an Arrow record batch: {exc}") from exc
    return batch


def batch_header(rows: int, seq: int) -> tuple[bytes, bytes]:
    return (H_BATCH, cbor2.dumps({"rows": rows, "seq": seq}))


def error_header(exc: DatasetError) -> tuple[bytes, bytes]:
    return (H_ERROR, cbor2.dumps(error_to_wire(exc)))


def find_header(headers: Iterable[tuple[bytes, bytes]], key: bytes) -> bytes | None:
    for k, v in headers:
        if k == key:
            return v
    return None
