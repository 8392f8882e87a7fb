"""The Aqueduct dataset protocol, version 1 (specified in ``docs/dataset-protocol.md``).

Requests are CBOR maps sent on the entrypoint channel; each carries the channel(s) for its
answer as attachments. Replies on a oneshot are ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"code": ..., "message": ...}}``. Arrow data travels on raw
channels, one IPC record batch message per Aqueduct message, with the Arrow schema in the
channel headers and per-batch CBOR metadata in the message headers.

This module is shared by the service and the client: constants, the error classes (one per
status code, rebuilt as the same class on the client), the Arrow payload codec and the
filter encoding.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import cbor2
import pyarrow as pa
import pyarrow.compute as pc

from aqueduct_core.errors import AqueductError

PROTOCOL_VERSION = 1

# Connection headers (spec style: short name, dash, 6 hex digits).
H_VERSION = b"aqds-version-4b1f0a"
H_TOKEN = b"aqds-token-4b1f0a"
# Channel headers of data channels (set by the channel's creator, the client).
H_SCHEMA = b"aqds-schema-4b1f0a"
"""Arrow IPC schema of the batches on the channel."""
H_COMPRESSION = b"aqds-compression-4b1f0a"
"""IPC body compression: none, lz4 or zstd."""
# Message headers of data messages.
H_BATCH = b"aqds-batch-4b1f0a"
"""CBOR {"rows": n, "seq": i} for each batch."""
H_ERROR = b"aqds-error-4b1f0a"
"""CBOR {"code", "message"}: the sender failed; this is its last message (the channel is then
finished, not cancelled: a cancel could drop this very message)."""

COMPRESSIONS = ("none", "lz4", "zstd")
MAX_BATCH_BYTES = 64 * 1024 * 1024
"""A batch larger than this is refused; writers split bigger batches first."""


# -- errors ---------------------------------------------------------------------------


class DatasetError(AqueductError):
    """An error answered by the dataset service. ``code`` is its wire status."""

    code = "INTERNAL"

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = dict(details or {})


class DatasetNotFound(DatasetError):
    """No dataset of that name. Create it (or write with mode append/overwrite), or check
    the name with ``aqueduct ls``."""

    code = "NOT_FOUND"


class DatasetExists(DatasetError):
    """A dataset of that name exists already (create / mode errorifexists)."""

    code = "ALREADY_EXISTS"


class SchemaMismatch(DatasetError):
    """The data's columns or types do not match the dataset's; the message lists each
    differing column."""

    code = "SCHEMA_MISMATCH"


class Unauthenticated(DatasetError):
    """The connection did not present the service's token (option ``token``)."""

    code = "UNAUTHENTICATED"


class Conflict(DatasetError):
    """A concurrent commit changed the dataset in a way this commit cannot be applied on
    top of (e.g. two overwrites). Retry the write."""

    code = "CONFLICT"


class InvalidRequest(DatasetError):
    """The request is malformed or asks for something impossible (bad name, bad filter,
    unknown operation, batch too large, data that is not Arrow)."""

    code = "INVALID_REQUEST"


class VersionNotFound(DatasetError):
    """Time travel to a version or timestamp the dataset does not have."""

    code = "VERSION_NOT_FOUND"


class DataLoss(DatasetError):
    """Data files of the requested version are gone (vacuumed). With streaming,
    ``failOnDataLoss=false`` skips ahead instead."""

    code = "DATA_LOSS"


class Unavailable(DatasetError):
    """The service is shutting down or overloaded; retry later."""

    code = "UNAVAILABLE"


class InternalError(DatasetError):
    """The service failed unexpectedly; its log has the details."""

    code = "INTERNAL"


ERRORS: dict[str, type[DatasetError]] = {
    cls.code: cls
    for cls in (
        DatasetNotFound,
        DatasetExists,
        SchemaMismatch,
        Unauthenticated,
        Conflict,
        InvalidRequest,
        VersionNotFound,
        DataLoss,
        Unavailable,
        InternalError,
    )
}


def error_to_wire(exc: DatasetError) -> dict[str, Any]:
    return {"code": exc.code, "message": exc.message, "details": exc.details}


def error_from_wire(value: Any) -> DatasetError:
    """Rebuild the service's error as the same class (unknown codes: InternalError)."""
    if not isinstance(value, Mapping):
        return InternalError(f"malformed error from the service: {value!r}")
    cls = ERRORS.get(str(value.get("code")), InternalError)
    details = value.get("details")
    return cls(str(value.get("message", "")), details if isinstance(details, Mapping) else None)


def ok(result: Any) -> dict[str, Any]:
    return {"ok": True, "result": result}


def fail(exc: DatasetError) -> dict[str, Any]:
    return {"ok": False, "error": error_to_wire(exc)}


def unwrap(reply: Any) -> Any:
    """The result of a reply, or raise the service's error."""
    if not isinstance(reply, Mapping) or "ok" not in reply:
        raise InternalError(f"malformed reply from the service: {reply!r:.200}")
    if reply["ok"]:
        return reply.get("result")
    raise error_from_wire(reply.get("error"))


# -- Arrow payloads -------------------------------------------------------------------


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


# -- filters --------------------------------------------------------------------------
#
# A filter is a list of conjunctive predicates, each a list [op, column, value?] where
# column is a list of field names (a path into structs) and value a CBOR value (ints,
# floats, strings, bytes, booleans, datetimes, dates, Decimals; a list for "in").

UNARY_OPS = ("is_null", "is_not_null")
BINARY_OPS = ("==", "!=", "<", "<=", ">", ">=", "<=>", "in", "starts_with", "ends_with", "contains")
NOT = "not"


def _field(path: Sequence[str]) -> pc.Expression:
    if not path or not all(isinstance(p, str) for p in path):
        raise InvalidRequest(f"filter column must be a non-empty list of names, got {path!r}")
    return pc.field(*path) if len(path) > 1 else pc.field(path[0])


def _scalar(value: Any) -> Any:
    if isinstance(
        value, decimal.Decimal | dt.datetime | dt.date | bool | int | float | str | bytes
    ):
        return value
    if value is None:
        return None
    raise InvalidRequest(f"unsupported filter value {value!r}")


def predicate_to_expression(pred: Any) -> pc.Expression:
    if not isinstance(pred, list | tuple) or not pred:
        raise InvalidRequest(f"malformed filter predicate {pred!r}")
    op = pred[0]
    if op == NOT:
        if len(pred) != 2:
            raise InvalidRequest(f"'not' takes one predicate, got {pred!r}")
        return ~predicate_to_expression(pred[1])
    if op in UNARY_OPS:
        if len(pred) != 2:
            raise InvalidRequest(f"{op!r} takes a column only, got {pred!r}")
        f = _field(pred[1])
        return f.is_null() if op == "is_null" else f.is_valid()
    if op not in BINARY_OPS or len(pred) != 3:
        raise InvalidRequest(
            f"unknown filter {pred!r}: operators are {', '.join((*BINARY_OPS, *UNARY_OPS, NOT))}"
        )
    f, value = _field(pred[1]), pred[2]
    if op == "in":
        if not isinstance(value, list | tuple):
            raise InvalidRequest(f"'in' needs a list of values, got {value!r}")
        values = [_scalar(v) for v in value]
        present = [v for v in values if v is not None]
        # SQL: x IN (...) is NULL when x is NULL, or when nothing matched and the list holds
        # a NULL; pyarrow's isin says false there, which NOT would turn into true.
        unknown = pc.scalar(pa.scalar(None, pa.bool_()))
        matched = f.isin(present) if present else pc.scalar(False)
        if None in values:
            matched = pc.if_else(matched, pc.scalar(True), unknown)
        return pc.if_else(f.is_valid(), matched, unknown)
    value = _scalar(value)
    if op == "<=>":  # null-safe equality
        return f.is_null() if value is None else (f == value) & f.is_valid()
    if value is None:  # a comparison with NULL is unknown (not false: NOT must keep it out)
        return pc.scalar(pa.scalar(None, pa.bool_()))
    if op == "==":
        return f == value
    if op == "!=":
        return f != value
    if op == "<":
        return f < value
    if op == "<=":
        return f <= value
    if op == ">":
        return f > value
    if op == ">=":
        return f >= value
    if op == "starts_with":
        return pc.starts_with(f, pattern=value)
    if op == "ends_with":
        return pc.ends_with(f, pattern=value)
    return pc.match_substring(f, pattern=value)


def filters_to_expression(filters: Any) -> pc.Expression | None:
    """The AND of the predicates, or None for no filter."""
    if filters is None:
        return None
    if not isinstance(filters, list | tuple):
        raise InvalidRequest(f"filters must be a list of predicates, got {filters!r}")
    expr: pc.Expression | None = None
    for pred in filters:
        e = predicate_to_expression(pred)
        expr = e if expr is None else expr & e
    return expr
