"""Row groups that go as stored: which ones, and reading their bytes (issue 28).

A scan's reader that offered Parquet (``protocol.parquet``) is sent each row group that needs
nothing done to it as it lies in the data file: the footer, and the byte ranges of the column
chunks of the scan's columns (memory-mapped for a local file, one ranged read each on a
store). No Parquet decode here, and fewer bytes on the wire than the Arrow they decode to.
Anything else goes through :class:`.SplitReader` as before, in order with the pieces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from aqueduct_spark.protocol import DataLoss, Split
from aqueduct_spark.protocol import parquet as PQ

from .resume import Skip
from .scan import Item, SplitReader

PASS_FROM = 1 << 20
"""A row group whose chunks of the scan's columns hold at least this many bytes as stored
goes as stored to a reader that offered Parquet (:func:`read_or_pass`); a smaller
one is decoded here and merged with its neighbours into Arrow batches: a message, a footer
and a decoder set-up per 100-row file would cost the reader more than decoding it here."""


def read_or_pass(
    reader: SplitReader, split: Split, skip: Skip | None = None, passing: bool = False
) -> Iterator[Item]:
    """``reader.read(split, skip)``, except that with ``passing`` (the reader offered
    Parquet) a row group that needs nothing done to it goes as it is stored
    (:class:`.ParquetPiece`): no filter, no cast, no column to fill or drop, no rows of it to
    skip, the file's types the table's, and at least :data:`PASS_FROM` bytes. Everything
    else is decoded here, as before: the rows and their order are the same either way
    (``service.resume``)."""
    if (
        not passing
        or split.bytes < PASS_FROM
        or reader.filter is not None
        or reader.cast
        or len(reader.needed) != len(reader.columns)
        or (skip is not None and skip.rows)
    ):
        yield from reader.read(split, skip)
        return
    try:
        with reader._open(split.path) as f:
            pf = pq.ParquetFile(f, pre_buffer=False)
            md = pf.metadata
            stored = reader._stored(pf)
            arrow = pf.schema_arrow
            leaves = None
            if stored == reader.needed and pa.schema([arrow.field(c) for c in stored]).equals(
                reader.needed_schema
            ):
                leaves = PQ.leaf_columns(arrow, stored, md.num_columns)
            groups = (
                list(range(md.num_row_groups))
                if split.row_groups is None
                else list(split.row_groups)
            )
            if leaves is not None and all(0 <= g < md.num_row_groups for g in groups):
                size = f.size()
                footer = None
                for g in groups:
                    ranges = PQ.chunk_ranges(md, g, leaves, size)
                    if sum(n for _, n in ranges) < PASS_FROM:
                        yield from reader.read(dataclasses.replace(split, row_groups=(g,)))
                        continue
                    if footer is None:
                        footer = PQ.footer_bytes(md)
                    yield PQ.ParquetPiece(
                        row_group=g,
                        rows=md.row_group(g).num_rows,
                        columns=tuple(stored),
                        size=size,
                        metadata=md,
                        footer=footer,
                        ranges=tuple((o, f.read_at(n, o)) for o, n in ranges),
                        schema=reader.needed_schema,
                    )
                return
    except FileNotFoundError as exc:
        raise DataLoss(
            f"data file {split.path!r} of dataset {split.dataset!r} version {split.version} "
            "disappeared while it was read (vacuumed or deleted); re-plan the scan"
        ) from exc
    yield from reader.read(split, skip)
