"""The Arrow payload codec: schemas in channel headers, one IPC record batch message per
Aqueduct message, and the per-batch and error message headers (§6 of
``docs/dataset-protocol.md``)."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import cbor2
import pyarrow as pa

from aqueduct_core.wire.frames import Gather, coalesce

from .compression import Compression
from .errors import DatasetError, InvalidRequest, error_to_wire
from .headers import H_BATCH, H_ERROR
from .ipc_meta import declared


def schema_to_bytes(schema: pa.Schema) -> bytes:
    return bytes(schema.serialize())


def schema_from_bytes(data: bytes | bytearray | memoryview) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidRequest(f"not an Arrow IPC schema: {exc}") from exc


def ipc_options(compression: str) -> pa.ipc.IpcWriteOptions:
    """The IPC write options of a fixed setting: none, lz4, zstd or zstd:LEVEL."""
    try:
        setting = Compression.parse(compression)
    except ValueError as exc:
        raise InvalidRequest(
            f"unknown compression {compression!r}: {exc}; give one of those"
        ) from exc
    if setting.auto:
        raise InvalidRequest("compression 'auto' chooses per batch; give a fixed setting here")
    return setting.options()


_I32 = struct.Struct("<i")


class _Parts:
    """A write-only file for pyarrow that keeps what is written without copying it.

    pyarrow's IPC writer hands every body buffer to a Python file as a ``pyarrow.Buffer``
    (a view of the record batch's own memory, or of the compressed buffer it made, which
    that object keeps alive) and only the small pieces (length prefix, metadata, padding)
    as ``bytes``. Anything else is copied, so no part can alias memory pyarrow reuses."""

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.closed = False

    def write(self, data: Any) -> int:
        self.parts.append(data if type(data) is bytes or type(data) is pa.Buffer else bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> Gather:
        """What was written since the last call, small pieces joined."""
        parts, self.parts = self.parts, []
        return Gather(coalesce(parts))


@functools.lru_cache(maxsize=32)
def _empty_of(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)


def _empty(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of no rows to write first, whose buffers are empty: an empty slice of
    ``batch`` would write (and compress) its whole string data buffer. Dictionary columns
    (never in a data channel) keep the slice, whose dictionary is the batch's own."""
    if any(pa.types.is_dictionary(t) for t in batch.schema.types):
        return batch.slice(0, 0)
    return _empty_of(batch.schema)


def batch_to_payload(batch: pa.RecordBatch, options: pa.ipc.IpcWriteOptions) -> Gather:
    """One IPC record batch message, without the schema (it is in the channel headers), as
    a :class:`~aqueduct_core.wire.frames.Gather`: its metadata, then the batch's buffers
    where they lie (compressed buffers where pyarrow made them, for lz4 and zstd), so the
    transport reads them without another copy. ``bytes(payload)`` is the message whole,
    byte for byte what ``batch.serialize()`` gives uncompressed."""
    sink = _Parts()
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), batch.schema, options=options) as w:
        w.write_batch(_empty(batch))  # the schema goes out with the first batch...
        sink.parts.clear()  # ...and the reader has it from the headers already
        w.write_batch(batch)
        message = sink.take()
    return message


@dataclass(frozen=True, slots=True)
class DataMessage:
    """A data message parsed but not decoded: what decoding it will allocate is known first.

    ``size`` is what the message counts against a batch limit (``--max-batch-bytes``,
    ``maxBatchBytes``): its length, or for a compressed body the size its buffers declare
    they decompress to, whichever is larger. Check it before :meth:`decode`: a few KiB of
    zstd can declare gigabytes, and pyarrow allocates and decompresses whatever is declared.
    """

    message: pa.ipc.Message
    size: int
    compressed: bool
    codec: str = "none"
    """How its body is compressed: ``none``, ``lz4`` or ``zstd``."""

    def decode(self, schema: pa.Schema, *, check: str = "offsets") -> pa.RecordBatch:
        """The record batch (zero-copy on the payload unless compressed), checked to be
        what it claims, before anything reads through it. pyarrow's reader checks nothing,
        and ``RecordBatch.validate()`` only that the buffers are large enough for the rows
        a batch claims; the offsets of strings, binaries and lists are values in a buffer,
        and a batch whose offsets lie is read past its buffers by whatever uses it.

        ``check``: ``offsets`` (the default: a scan at the client) checks those too, every
        string seen as binary (the same layout); ``full`` (every write at the service) also
        checks strings as UTF-8, the Delta and Parquet type, which Rust readers check.
        ``sizes``: the basic check alone. What each costs: ``benchmarks.bench_batch_check``
        (a ~1 MB batch of 21,000 rows with a string and a list column, load 22: sizes 9 us,
        offsets 181 us, full 685 us). Against one batch's Parquet write, measured apart at
        load 8, full validation was 0.6% on the taxi table and 4-6% on short strings."""
        try:
            batch = pa.ipc.read_record_batch(self.message, schema)
            batch.validate(full=check == "full")
            if check == "offsets":
                for column in batch.columns:
                    as_binary = _strings_as_binary(column.type)
                    (column if as_binary is None else column.view(as_binary)).validate(full=True)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InvalidRequest(f"a data message is not an Arrow record batch: {exc}") from exc
        return batch


@functools.lru_cache(maxsize=256)
def _strings_as_binary(t: pa.DataType) -> pa.DataType | None:
    """``t`` with every string type in it as the binary type of the same layout (whose full
    validation checks offsets, not UTF-8); None if it holds no string."""
    swap = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary()}
    swap[pa.string_view()] = pa.binary_view()
    if t in swap:
        return swap[t]
    if pa.types.is_map(t):
        key, item = _strings_as_binary(t.key_type), _strings_as_binary(t.item_type)
        if key is None and item is None:
            return None
        return pa.map_(key or t.key_type, item or t.item_type, t.keys_sorted)
    if pa.types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        types = [_strings_as_binary(f.type) for f in fields]
        if all(x is None for x in types):
            return None
        return pa.struct([f.with_type(x or f.type) for f, x in zip(fields, types, strict=True)])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        item = _strings_as_binary(t.value_type)
        if item is None:
            return None
        field = t.value_field.with_type(item)
        if pa.types.is_fixed_size_list(t):
            return pa.list_(field, t.list_size)
        return pa.large_list(field) if pa.types.is_large_list(t) else pa.list_(field)
    return None  # no strings, or a type not mapped here (a union): checked in full


def read_data_message(data: Any) -> DataMessage:
    """Parse a data message (one encapsulated IPC record batch message) and read what it
    declares, without decoding or decompressing anything. InvalidRequest if it is not a
    well-formed record batch message. A :class:`Gather` (a local channel's, never one from
    the network) is joined first."""
    if isinstance(data, Gather):
        data = bytes(data)
    try:
        message = pa.ipc.read_message(data if type(data) is pa.Buffer else pa.py_buffer(data))
        if message.type != "record batch":
            raise InvalidRequest(
                f"a data message must be an Arrow record batch message, not a {message.type} "
                "message; send each batch as one IPC record batch message, dictionaries "
                "decoded (the schema travels in the channel headers)"
            )
        found = declared(message.metadata, message.body)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InvalidRequest(f"a data message is not an Arrow record batch: {exc}") from exc
    size = len(data)
    if found.compressed:
        size = max(size, message.metadata.size + found.decoded)
    return DataMessage(message, size, found.compressed, found.codec)


def payload_size(payload: Any) -> int:
    """What a message :func:`batch_to_payload` made counts against a receiver's limit, as
    :func:`read_data_message` will count it there: its length, or for a compressed body
    the size it declares, read from its parts without joining them."""
    if not isinstance(payload, Gather):
        return read_data_message(payload).size
    head = payload.parts[0] if payload.parts else b""
    if len(head) < 8 or _I32.unpack_from(head, 0)[0] != -1:
        return read_data_message(payload).size  # not the shape pyarrow writes: parse it whole
    length = _I32.unpack_from(head, 4)[0]
    metadata = head[8 : 8 + length]
    if len(metadata) != length:
        return read_data_message(payload).size
    body = Gather([head[8 + length :], *payload.parts[1:]])
    try:
        found = declared(metadata, body)
    except ValueError as exc:
        raise InvalidRequest(f"a data message is not an Arrow record batch: {exc}") from exc
    size = len(payload)
    return max(size, length + found.decoded) if found.compressed else size


def payloads_within(
    batch: pa.RecordBatch,
    options: pa.ipc.IpcWriteOptions,
    limit: int,
    too_large: Callable[[int], DatasetError],
    chunk_bytes: int | None = None,
) -> Iterator[tuple[pa.RecordBatch, Any]]:
    """``batch`` as data messages of at most ``limit`` bytes each, as the receiver counts
    them (:func:`read_data_message`: a compressed message at its decompressed size), in
    slices of about ``chunk_bytes`` (default: ``limit``); each slice with its message. A
    slice over the limit is halved; a single row over it raises ``too_large(size)`` before
    anything of it is sent (the receiver would refuse it, or lose the connection over it)."""
    todo = list(_slices(batch, min(chunk_bytes or limit, limit)))
    todo.reverse()
    while todo:
        piece = todo.pop()
        payload = batch_to_payload(piece, options)
        size = payload_size(payload)
        if size <= limit:
            yield piece, payload
        elif piece.num_rows > 1:
            half = piece.num_rows // 2
            todo += [piece.slice(half), piece.slice(0, half)]
        else:
            raise too_large(size)


def _slices(batch: pa.RecordBatch, limit: int) -> Iterator[pa.RecordBatch]:
    size = batch.nbytes
    if size <= limit or batch.num_rows <= 1:
        yield batch
        return
    rows = max(1, batch.num_rows * limit // size)
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)


def describe_size(message: DataMessage) -> str:
    """``'2048.0 MiB once decompressed'``: a message's size as a limit counts it."""
    mib = message.size / 2**20
    return f"{mib:.1f} MiB once decompressed" if message.compressed else f"{mib:.1f} MiB"


def batch_header(rows: int, seq: int, skipped: int = 0) -> tuple[bytes, bytes]:
    """A data message's ``aqds-batch-4b1f0a`` header; ``skipped``: on a resumed scan's first
    message, the rows the service left out at the start as asked (``skip_rows``)."""
    fields = {"rows": rows, "seq": seq}
    if skipped:
        fields["skipped"] = skipped
    return (H_BATCH, cbor2.dumps(fields))


def skipped_rows(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The rows a scan's service says it left out before this message (``skipped`` of its
    ``aqds-batch-4b1f0a`` header): 0 when the header or the field is absent, as from a
    service older than ``skip_rows``. A header that cannot be read is an error: whether
    rows were left out could not be told."""
    raw = find_header(headers, H_BATCH)
    if raw is None:
        return 0
    try:
        fields = cbor2.loads(raw)
    except (cbor2.CBORDecodeError, ValueError, TypeError, OverflowError) as exc:
        raise InvalidRequest(
            f"the service sent a data message whose batch header is not CBOR ({exc}); check "
            "that the URL is the dataset service you expect"
        ) from None
    skipped = fields.get("skipped", 0) if isinstance(fields, dict) else 0
    if isinstance(skipped, bool) or not isinstance(skipped, int) or skipped < 0:
        raise InvalidRequest(
            f"the service says it skipped {skipped!r:.40} rows of a scan, not a count; check "
            "that the URL is the dataset service you expect"
        )
    return skipped


def error_header(exc: DatasetError) -> tuple[bytes, bytes]:
    return (H_ERROR, cbor2.dumps(error_to_wire(exc)))


def find_header(headers: Iterable[tuple[bytes, bytes]], key: bytes) -> bytes | None:
    for k, v in headers:
        if k == key:
            return v
    return None
