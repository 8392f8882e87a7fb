"""Parquet row groups as scan data messages, decoded by the reader (issue 28).

A scan's rows usually leave the service as Arrow IPC record batches: the service decodes the
table's Parquet, then encodes Arrow. Decoding Parquet is most of a service's CPU per byte
(2.2-2.6 s per GB of Arrow on the bench table, the floor both our service and a Flight server
share), and Arrow is 2-3x the bytes of the same rows as stored Parquet. A reader that offers
the ``parquet`` format (channel header ``aqds-formats-4b1f0a``) may instead be sent a row
group's column chunks as they lie in the data file, untouched: the service reads bytes and
sends them; the reader decodes them with Arrow's Parquet reader. Fewer bytes on the wire, no
decode at the service, and the decode moves to where Spark's own Parquet reader would do it.

A Parquet data message carries the ``aqds-parquet-4b1f0a`` header, CBOR::

    {"row_group": i, "rows": n, "columns": [names], "size": file bytes,
     "footer": footer bytes, "ranges": [[offset, length], ...]}

and its payload is the file's footer (a metadata-only Parquet file: ``PAR1``, the Thrift
``FileMetaData``, its length, ``PAR1``) followed by the byte ranges of the file, in that
order. The ranges hold every column chunk of row group ``i`` for ``columns`` (their leaf
columns); the reader decodes exactly that row group's ``columns``, whose Arrow types are the
scan's. Only a reader that offered ``parquet`` is sent one, and the service decides per row
group: anything it would have to change (a filter, a cast, a partition or missing column, a
resumed scan's first rows, a row group over the reader's limit) goes as Arrow, as before.

What the reader checks before decoding: the header's fields and types; the ranges in order,
inside the file, and adding up with the footer to the payload's length (so the payload is
within the reader's message limit, which the transport enforced on arrival); the footer
parses, within Arrow's Thrift limits, and its row group ``i`` has ``rows`` rows; the columns
are the scan's, of the scan's types. Arrow's reader then reads only inside the ranges sent (a
read outside them is refused: :class:`RangeFile`), and each decoded batch must be within the
message limit. What this does not bound: a single decoded batch (``batch_rows`` rows) is
sized by the data, as a Parquet file read from a store is; a reader that will not decode a
service's Parquet asks for Arrow only (``decode=service``).
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import cbor2
import pyarrow as pa
import pyarrow.parquet as pq

from aqueduct_core.wire.frames import Gather

from .errors import InvalidRequest
from .headers import H_FORMATS, H_PARQUET

PARQUET = "parquet"
FORMATS = (PARQUET,)
"""The data formats a reader may offer besides Arrow IPC record batches."""

PAD = 128
"""Bytes sent past each column chunk's end (within the file): Arrow's reader reads up to 100
bytes beyond a chunk of files some old writers made (their chunk sizes left out the
dictionary page header), so the ranges sent cover that too."""


def offered_formats(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[str]:
    """The formats a scan's reader offered (its ``aqds-formats-4b1f0a`` channel header)."""
    for key, value in headers:
        if key == H_FORMATS:
            text = value.decode("ascii", "replace")
            return frozenset(f.strip().lower() for f in text.split(",")) & set(FORMATS)
    return frozenset()


def format_headers(decode: str) -> list[tuple[bytes, bytes]]:
    """The channel headers a scan's reader sends for its ``decode`` setting: ``auto`` offers
    Parquet, ``service`` offers nothing (Arrow only)."""
    return [(H_FORMATS, PARQUET.encode())] if decode == "auto" else []


def leaf_count(t: pa.DataType) -> int:
    """How many Parquet leaf columns (column chunks per row group) an Arrow column of type
    ``t`` is stored as."""
    if pa.types.is_struct(t):
        return sum(leaf_count(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return leaf_count(t.key_type) + leaf_count(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return leaf_count(t.value_type)
    return 1


def leaf_columns(arrow: pa.Schema, names: Sequence[str], stored: int) -> list[int] | None:
    """The Parquet leaf column indexes of the top-level columns ``names`` in a file whose
    Arrow schema is ``arrow`` and which stores ``stored`` leaf columns. None when the
    mapping cannot be told for sure (the leaves do not add up): such a file goes as Arrow."""
    spans: dict[str, range] = {}
    at = 0
    for f in arrow:
        n = leaf_count(f.type)
        spans[f.name] = range(at, at + n)
        at += n
    if at != stored or len(spans) != len(arrow):
        return None
    return sorted(i for name in names for i in spans[name])


def chunk_ranges(
    md: pq.FileMetaData, row_group: int, leaves: Sequence[int], size: int
) -> list[tuple[int, int]]:
    """The byte ranges (offset, length) of row group ``row_group``'s chunks of ``leaves``,
    each extended by :data:`PAD`, overlapping and adjacent ones merged, in file order."""
    rg = md.row_group(row_group)
    spans = []
    for j in leaves:
        c = rg.column(j)
        start = c.data_page_offset
        if c.has_dictionary_page and 0 < c.dictionary_page_offset < start:
            start = c.dictionary_page_offset
        spans.append((start, min(size, start + c.total_compressed_size + PAD)))
    spans.sort()
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e - s) for s, e in merged]


def declared_size(md: pq.FileMetaData, row_group: int, columns: Sequence[str]) -> int | None:
    """Bytes of ``columns`` in row group ``row_group`` before Parquet's compression, as the
    footer declares them (None: its leaf columns cannot be told). Both ends hold it to the
    reader's message limit: an honest row group decodes to about this much Arrow."""
    leaves = leaf_columns(md.schema.to_arrow_schema(), columns, md.num_columns)
    if leaves is None:
        return None
    rg = md.row_group(row_group)
    return int(sum(rg.column(j).total_uncompressed_size for j in leaves))


def footer_bytes(md: pq.FileMetaData) -> pa.Buffer:
    """A file's footer as a metadata-only Parquet file (what :func:`pq.read_metadata` reads)."""
    sink = pa.BufferOutputStream()
    md.write_metadata_file(sink)
    return sink.getvalue()


class RangeFile(io.RawIOBase):
    """A Parquet file of ``size`` bytes of which only ``ranges`` ((offset, buffer), in
    order, not overlapping) are here: reads inside one range return a view of it; any other
    read is refused, so Arrow's reader never sees bytes nobody sent."""

    def __init__(self, size: int, ranges: Sequence[tuple[int, Any]]) -> None:
        super().__init__()
        self._size = size
        self._ranges = list(ranges)
        self._starts = [o for o, _ in self._ranges]
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        base = (0, self._pos, self._size)[whence]
        self._pos = base + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> memoryview:
        i = bisect.bisect_right(self._starts, self._pos) - 1
        if n < 0:
            n = self._size - self._pos
        if i >= 0:
            start, buf = self._ranges[i]
            at = self._pos - start
            if at + n <= len(buf):
                self._pos += n
                return memoryview(buf)[at : at + n]
        raise OSError(
            f"Parquet's reader asked for bytes {self._pos}-{self._pos + n} of the data file, "
            "outside the ranges the service sent"
        )


@dataclass(frozen=True)
class ParquetPiece:
    """One row group of a data file, as the service sends it: the footer, the ranges."""

    row_group: int
    rows: int
    columns: tuple[str, ...]
    size: int
    metadata: pq.FileMetaData
    footer: pa.Buffer
    ranges: tuple[tuple[int, Any], ...]
    schema: pa.Schema
    """The Arrow schema of the decoded rows (the scan's)."""

    @property
    def nbytes(self) -> int:
        """The data message's length."""
        return len(self.footer) + sum(len(b) for _, b in self.ranges)

    @property
    def stored(self) -> int:
        """The row group's bytes of the columns sent before Parquet's compression, as its
        footer declares them (:func:`declared_size`)."""
        return declared_size(self.metadata, self.row_group, self.columns) or 0

    def header(self, codec: str | None = None) -> tuple[bytes, bytes]:
        """The message's ``aqds-parquet-4b1f0a`` header; ``codec``: its payload is that
        codec's compression of the footer and ranges (``length`` bytes once decompressed)."""
        fields: dict[str, Any] = {
            "row_group": self.row_group,
            "rows": self.rows,
            "columns": list(self.columns),
            "size": self.size,
            "footer": len(self.footer),
            "ranges": [[o, len(b)] for o, b in self.ranges],
        }
        if codec is not None:
            fields["codec"] = codec
            fields["length"] = self.nbytes
        return (H_PARQUET, cbor2.dumps(fields))

    def payload(self) -> Gather:
        return Gather([self.footer, *(b for _, b in self.ranges)])

    def packed(self, setting: str) -> tuple[Any, tuple[bytes, bytes]]:
        """The message's payload and header with ``setting``'s compression on the whole
        payload (``none``, ``lz4``, ``zstd:LEVEL``): one copy to join the parts, then the
        codec (the Arrow library's LZ4 frame or zstd, as for Arrow bodies)."""
        codec, _, level = setting.partition(":")
        if codec == "none":
            return self.payload(), self.header()
        joined = pa.py_buffer(bytes(self.payload()))
        packer = pa.Codec(codec, compression_level=int(level) if level else None)
        return packer.compress(joined), self.header(codec)

    def batches(self, batch_rows: int, use_threads: bool = False) -> Iterator[pa.RecordBatch]:
        """The rows, decoded here (the service does this for a piece it cannot send)."""
        yield from _decode(
            self.metadata,
            RangeFile(self.size, self.ranges),
            self.row_group,
            self.rows,
            self.columns,
            self.schema,
            batch_rows,
            None,
            use_threads,
        )


def _bad(what: str) -> InvalidRequest:
    return InvalidRequest(
        f"the service sent a Parquet data message whose {what}; check that the URL is the "
        "dataset service you expect, or read with decode=service (Arrow from the service)"
    )


@dataclass(frozen=True)
class ParquetMessage:
    """A received Parquet data message, checked (:func:`read_parquet_message`)."""

    metadata: pq.FileMetaData
    file: RangeFile
    row_group: int
    rows: int
    columns: tuple[str, ...]

    def decode(
        self, schema: pa.Schema, batch_rows: int, limit: int, use_threads: bool = False
    ) -> Iterator[pa.RecordBatch]:
        """The rows as batches of ``schema`` (the scan's), none over ``limit`` bytes, after
        checking that the row group declares no more than ``limit`` bytes decoded."""
        if list(self.columns) != schema.names:
            raise _bad(f"columns {list(self.columns)} are not the scan's {schema.names}")
        size = declared_size(self.metadata, self.row_group, self.columns)
        if size is None or size > limit:
            said = "leaf columns cannot be told" if size is None else f"{size} bytes"
            raise _bad(
                f"row group declares more than this client's limit of {limit / 2**20:g} MiB "
                f"decoded ({said}; Spark option maxBatchBytes)"
            )
        return _decode(
            self.metadata,
            self.file,
            self.row_group,
            self.rows,
            self.columns,
            schema,
            batch_rows,
            limit,
            use_threads,
        )


CODECS = ("lz4", "zstd")
"""Compressions a Parquet data message's payload may have (``codec`` in its header)."""

_HEADER_FIELDS = {
    "row_group": int,
    "rows": int,
    "columns": list,
    "size": int,
    "footer": int,
    "ranges": list,
}


def read_parquet_message(header: bytes, payload: Any, limit: int) -> ParquetMessage:
    """Check a Parquet data message's header against its payload and parse its footer;
    nothing is decoded yet. A compressed payload (``codec``) is decompressed into exactly
    the ``length`` it declares, which must be within ``limit`` (checked first)."""
    try:
        fields = cbor2.loads(header)
    except (cbor2.CBORDecodeError, ValueError, TypeError, OverflowError) as exc:
        raise _bad(f"header is not CBOR ({exc})") from None
    if not isinstance(fields, dict):
        raise _bad("header is not a map")
    for name, kind in _HEADER_FIELDS.items():
        value = fields.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _bad(f"header field {name!r} is {value!r:.40} (a {kind.__name__} is due)")
    if not all(isinstance(c, str) for c in fields["columns"]):
        raise _bad("column names are not all text")
    buf = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(payload)
    if "codec" in fields:
        codec, length = fields["codec"], fields.get("length")
        if codec not in CODECS:
            raise _bad(f"codec {codec!r:.20} is not one of {', '.join(CODECS)}")
        if not isinstance(length, int) or isinstance(length, bool) or not 0 < length <= limit:
            raise _bad(
                f"payload declares {length!r:.20} bytes decompressed, not from 1 to this "
                f"client's limit of {limit / 2**20:g} MiB (maxBatchBytes)"
            )
        try:
            buf = pa.Codec(codec).decompress(buf, decompressed_size=length)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise _bad(f"{codec} payload cannot be decompressed ({exc})") from None
        if len(buf) != length:
            raise _bad(f"payload decompresses to {len(buf)} bytes, not the {length} declared")
    size, footer = fields["size"], fields["footer"]
    if not 12 <= footer <= len(buf) or size < 0:
        raise _bad(f"footer of {footer} bytes does not fit a payload of {len(buf)}")
    ranges = []
    at, end = footer, -1
    for item in fields["ranges"]:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)
        ):
            raise _bad(f"range {item!r:.40} is not [offset, length]")
        offset, length = item
        if offset <= end or length <= 0 or offset + length > size:
            raise _bad(f"range [{offset}, {length}] overlaps, is out of order or leaves the file")
        if at + length > len(buf):
            raise _bad(f"ranges add up to more than the payload's {len(buf)} bytes")
        ranges.append((offset, buf.slice(at, length)))
        at, end = at + length, offset + length - 1
    if at != len(buf):
        raise _bad(f"ranges and footer add up to {at} bytes, not the payload's {len(buf)}")
    try:
        md = pq.read_metadata(pa.BufferReader(buf.slice(0, footer)))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _bad(f"footer cannot be read ({exc})") from None
    row_group, rows = fields["row_group"], fields["rows"]
    if not 0 <= row_group < md.num_row_groups:
        raise _bad(f"row group {row_group} is not in its footer's {md.num_row_groups}")
    if md.row_group(row_group).num_rows != rows:
        raise _bad(f"row count {rows} is not its row group's {md.row_group(row_group).num_rows}")
    return ParquetMessage(md, RangeFile(size, ranges), row_group, rows, tuple(fields["columns"]))


def _decode(
    md: pq.FileMetaData,
    file: RangeFile,
    row_group: int,
    rows: int,
    columns: Sequence[str],
    schema: pa.Schema,
    batch_rows: int,
    limit: int | None,
    use_threads: bool,
) -> Iterator[pa.RecordBatch]:
    got = 0
    try:
        pf = pq.ParquetFile(pa.PythonFile(file, mode="r"), metadata=md, pre_buffer=False)
        arrow = pf.schema_arrow
        for c in columns:
            if c not in arrow.names or not arrow.field(c).type.equals(schema.field(c).type):
                have = arrow.field(c).type if c in arrow.names else "nothing"
                raise _bad(f"column {c!r} is {have}, not the scan's {schema.field(c).type}")
        for batch in pf.iter_batches(
            batch_size=batch_rows,
            row_groups=[row_group],
            columns=list(columns),
            use_threads=use_threads,
        ):
            got += batch.num_rows
            if got > rows:
                raise _bad(f"row group holds more than the {rows} rows it declares")
            out = pa.RecordBatch.from_arrays([batch.column(c) for c in columns], schema=schema)
            if limit is not None and out.nbytes > limit and out.num_rows > 1:
                # values longer than the footer's sizes suggest (a dictionary of long text):
                # slices within the limit, as the service cuts the Arrow batches it sends
                step = max(1, out.num_rows * limit // out.nbytes)
                for start in range(0, out.num_rows, step):
                    yield out.slice(start, step)
                continue
            yield out
    except (pa.ArrowException, OSError) as exc:
        raise _bad(f"row group {row_group} cannot be decoded ({exc})") from None
    if got != rows:
        raise _bad(f"row group gave {got} rows, not the {rows} it declares")
