"""A resumed scan: ``skip_rows``, the rows at the start of a scan's output that its reader
already has (a scan cut off on this process or another), left out here before anything is
encoded or sent (dataset protocol §5, ``scan``). On a link that is the limit, each row sent
again costs the link's time; a task cut half-way used to cost half a split again.

**Why the rows skipped are the rows the reader has.** A scan's output is the same rows in
the same order on every process, every time, whatever batches carry them:

- a split names one data file of a pinned version (Delta data files are never rewritten in
  place), and which of its row groups, in order; Parquet's batch reader yields a file's rows
  in storage order, row group after row group as listed, also when it decodes columns on
  several threads (the threads share out columns, not rows);
- a filter drops rows and never reorders them (``RecordBatch.filter``); a projection, a cast
  and the filling of partition or missing columns keep the rows as they are;
- a task's splits are read in the order the request lists them, and merging their small
  batches (``scan.coalesce``) concatenates in that order; change splits likewise;
- what differs between processes or runs is only where batches end: ``batch_rows`` (the
  service's default when the reader leaves it out), the reader's ``max_batch_bytes`` (a batch
  too large is cut in slices, in order) and the codec chosen per batch. So a resume counts
  rows, never batches.

**Where rows are skipped.** At the source of each split, before small batches are merged
(a merge would hold rows not yet counted): the batch that straddles the boundary is sliced
(:meth:`Skip.cut`). Without a filter, whole row groups inside the skipped range are passed
over from the file's footer, never decoded (:meth:`Skip.pass_over`): the footer's row count
is exactly the rows a row group yields here (no filter, and this reader applies no deletion
vectors; one that does must count them before passing a group over). With a filter each
row must be decoded to know whether it is output, so only encoding and sending are saved.

**What it costs.** A counter, whatever the number asked: a value beyond the scan's rows
costs at most reading the scan once (less without a filter: footers only), and sends
nothing. The first data message says how many rows were skipped (``skipped`` in its
``aqds-batch-4b1f0a`` header), so a reader knows this service honoured the field; a service
older than it sends every row, unconfirmed, and the reader skips them itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from aqueduct_spark import protocol as P

MAX_SKIP_ROWS = 2**63 - 1
"""The most rows a scan may ask to skip: more than any table holds (Arrow counts rows in
64 bits), so a larger number is a mistake, said so at once."""


def skip_rows(req: dict[str, Any]) -> int:
    """The ``skip_rows`` field of a scan request (0 when absent or null), checked."""
    value = req.get("skip_rows")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise P.InvalidRequest(
            f"field 'skip_rows' of 'scan' must be a whole number of rows, got {value!r:.40}; "
            "send the rows the reader already has (0 or null for none)"
        )
    if not 0 <= value <= MAX_SKIP_ROWS:
        shown = value if abs(value) < 10**30 else f"a {value.bit_length()}-bit number"
        raise P.InvalidRequest(
            f"field 'skip_rows' of 'scan' must be from 0 to {MAX_SKIP_ROWS}, got {shown}; "
            "send the rows the reader already has (0 or null for none)"
        )
    return value


class Skip:
    """The rows of one scan still to leave out at its start, counted down as they are
    passed over (shared by the scan's splits, which are read in turn)."""

    def __init__(self, rows: int) -> None:
        self.asked = rows
        self.rows = rows

    def confirm(self, seq: int) -> int:
        """What data message ``seq`` says was skipped: the rows asked, on the first."""
        return 0 if seq else self.asked

    def pass_over(self, md: pq.FileMetaData, row_groups: list[int] | None) -> list[int]:
        """Of ``row_groups`` (None: all the file's), those left once the leading ones that lie
        wholly inside the rows to skip are passed over (counted from the footer, not read).
        Call only for a scan without a filter. A row group the file lacks stops the passing:
        reading it fails as it would have."""
        groups = list(range(md.num_row_groups)) if row_groups is None else list(row_groups)
        passed = 0
        for group in groups:
            if not 0 <= group < md.num_row_groups:
                break
            rows = md.row_group(group).num_rows
            if rows > self.rows:
                break
            self.rows -= rows
            passed += 1
        return groups[passed:]

    def cut(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """``batch`` without the rows still to skip (None: all of it is skipped)."""
        if self.rows == 0:
            return batch
        if batch.num_rows <= self.rows:
            self.rows -= batch.num_rows
            return None
        batch, self.rows = batch.slice(self.rows), 0
        return batch

    def drop(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches`` without the rows still to skip."""
        for batch in batches:
            kept = self.cut(batch)
            if kept is not None:
                yield kept
