"""What an Arrow IPC record batch message will allocate when decoded, read before it is.

pyarrow decodes a message whole: for a compressed body it allocates every buffer at the size
the message declares and decompresses into it, so a few KiB of zstd zeros can declare (and
honestly hold) gigabytes. Nothing in pyarrow's Python API reads those sizes:
``pa.ipc.read_message`` parses the frame and verifies the metadata, but ``Message`` exposes
the metadata only as its raw Flatbuffer. This module reads the few fields that say what
decoding costs, from that Flatbuffer (Arrow's ``format/Message.fbs``), and the length each
compressed buffer starts with:

    table Message     { version: short; header: MessageHeader (a union: type, then value);
                        bodyLength: long; custom_metadata: [KeyValue] }
    table RecordBatch { length: long; nodes: [FieldNode]; buffers: [Buffer];
                        compression: BodyCompression; variadicBufferCounts: [long] }
    struct Buffer     { offset: long; length: long }          // 16 bytes, in the body

A compressed buffer is its uncompressed length (int64, little-endian; -1: the bytes follow
uncompressed) and then one LZ4 frame or zstd frame.

The Flatbuffer encoding, as much of it as is read here (all little-endian): the buffer starts
with a u32 offset to the root table. A table starts with an i32 that, subtracted from the
table's position, locates its vtable: u16 vtable size, u16 table size, then one u16 per field
id, the field's offset in the table (0: absent, the default). A table or vector field holds a
u32 offset, relative to the field's own position; a vector is a u32 count, then its elements.
A union of id ``n`` is its type (u8, id ``n``) and its value (id ``n + 1``). Every read is
bounds-checked, whatever pyarrow verified before (``tests/client/test_ipc_meta.py`` fuzzes
it with hypothesis).
"""

from __future__ import annotations

import bisect
import itertools
import struct
from dataclasses import dataclass
from typing import Any

from aqueduct_core.wire.frames import Gather

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_BUFFER = struct.Struct("<qq")

# Field ids (declaration order) of the tables read here.
_MESSAGE_HEADER = 2  # the union's value; its type (id 1) is MessageHeader.RecordBatch = 3
_BATCH_BUFFERS = 2
_BATCH_COMPRESSION = 3

UNCOMPRESSED = -1
"""The length prefix of a buffer a compressed message stores uncompressed."""


class _Malformed(ValueError):
    """The metadata of an IPC message is not what the format says (a field out of bounds, a
    compressed buffer without its length)."""


@dataclass(frozen=True, slots=True)
class Declared:
    """What decoding one record batch message allocates, as the message declares it."""

    compressed: bool
    """The body is compressed (LZ4_FRAME or ZSTD): decoding allocates ``decoded`` bytes.
    An uncompressed body is decoded in place (zero-copy), allocating nothing."""
    decoded: int
    """The buffers' sizes once decoded: each compressed one at the length it declares, each
    stored one at its own length; 0 for an uncompressed body."""
    codec: str = "none"
    """The body's codec: ``none``, ``lz4`` (LZ4_FRAME) or ``zstd``."""


_PLAIN = Declared(compressed=False, decoded=0)
_CODECS = {0: "lz4", 1: "zstd"}  # BodyCompression.codec (CompressionType; LZ4_FRAME default)


def _read(fmt: struct.Struct, data: bytes, pos: int) -> Any:
    if pos < 0:  # unpack_from would count from the end
        raise struct.error(f"negative position {pos}")
    return fmt.unpack_from(data, pos)[0]


def _field(data: bytes, table: int, field_id: int) -> int | None:
    """Position of field ``field_id`` of the table at ``table``, or None when it is absent."""
    vtable = table - _read(_I32, data, table)
    slot = 4 + 2 * field_id
    if slot + 2 > _read(_U16, data, vtable):
        return None  # a vtable written before the field existed: absent
    offset = _read(_U16, data, vtable + slot)
    return table + offset if offset else None


def _follow(data: bytes, pos: int) -> int:
    """Where the u32 offset at ``pos`` points."""
    return pos + int(_read(_U32, data, pos))


def declared(metadata: Any, body: Any) -> Declared:
    """What decoding the record batch message of ``metadata`` (its Flatbuffer: pyarrow's
    ``Message.metadata``) and ``body`` (``Message.body``, or the body's parts as a sender
    holds them: a :class:`~aqueduct_core.wire.frames.Gather`) allocates. Reads 8 bytes of
    the body per compressed buffer, none of an uncompressed body. Raises ValueError."""
    data = bytes(metadata)  # a few hundred bytes
    try:
        header = _field(data, _follow(data, 0), _MESSAGE_HEADER)
        if header is None:
            raise _Malformed("an IPC message without a header")
        batch = _follow(data, header)
        compression = _field(data, batch, _BATCH_COMPRESSION)
        if compression is None:
            return _PLAIN
        kind = _field(data, _follow(data, compression), 0)  # BodyCompression.codec
        codec = _CODECS.get(_read(_U8, data, kind) if kind is not None else 0, "unknown")
        buffers = _field(data, batch, _BATCH_BUFFERS)
        if buffers is None:
            return Declared(compressed=True, decoded=0, codec=codec)
        start = _follow(data, buffers)
        count = _read(_U32, data, start)
    except struct.error:
        raise _Malformed("a field of an IPC message's metadata lies outside it") from None
    entries = data[start + 4 : start + 4 + count * _BUFFER.size]
    if len(entries) != count * _BUFFER.size:
        raise _Malformed("the buffer list of an IPC message runs past its metadata")
    view = _BodyParts(body.parts) if isinstance(body, Gather) else memoryview(body).cast("B")
    decoded = _decoded_size(entries, view)
    return Declared(compressed=True, decoded=decoded, codec=codec)


class _BodyParts:
    """A body in parts, read 8 bytes at a time where a compressed buffer starts."""

    def __init__(self, parts: tuple[memoryview, ...]) -> None:
        self.parts = parts
        self.starts = list(itertools.accumulate((len(p) for p in parts), initial=0))

    def __len__(self) -> int:
        return self.starts[-1]

    def i64(self, offset: int) -> int:
        i = bisect.bisect_right(self.starts, offset) - 1
        at = offset - self.starts[i]
        piece = bytes(self.parts[i][at : at + _I64.size])
        while len(piece) < _I64.size and i + 1 < len(self.parts):  # a prefix across parts
            i += 1
            piece += bytes(self.parts[i][: _I64.size - len(piece)])
        return int(_I64.unpack(piece)[0])


def _decoded_size(entries: bytes, body: memoryview | _BodyParts) -> int:
    total = 0
    size = len(body)
    read = body.i64 if isinstance(body, _BodyParts) else lambda at: _I64.unpack_from(body, at)[0]
    for offset, length in _BUFFER.iter_unpack(entries):
        if length == 0:
            continue
        if offset < 0 or length < _I64.size or offset + length > size:
            raise _Malformed(
                f"a compressed buffer ({length} bytes at {offset}) is not within the "
                f"{size}-byte body, or too short to hold its length"
            )
        prefix = read(offset)
        if prefix == UNCOMPRESSED:
            total += length - _I64.size
        elif prefix < 0:
            raise _Malformed(f"a compressed buffer declares a negative length ({prefix})")
        else:
            total += prefix
    return total
