"""A write joins small batches into data messages of about ``join_bytes`` (Spark hands a
writer 10,000 rows at a time, and each message costs both ends a fixed amount of work), in
order, and never holds a slow source's batches back for long."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pyarrow as pa
import pytest

from aqueduct_spark import protocol as P
from aqueduct_spark.client.writes import _joined

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])


def batch(start: int, rows: int) -> pa.RecordBatch:
    ids = list(range(start, start + rows))
    return pa.record_batch([pa.array(ids), pa.array([f"r{i:05d}" for i in ids])], schema=SCHEMA)


async def source(
    batches: list[pa.RecordBatch], pause: float = 0.0
) -> AsyncIterator[pa.RecordBatch]:
    for b in batches:
        if pause:
            await asyncio.sleep(pause)
        yield b


def joined(
    batches: list[pa.RecordBatch], size: int, wait: float = 10.0, pause: float = 0.0
) -> list[pa.RecordBatch]:
    async def run() -> list[pa.RecordBatch]:
        return [b async for b in _joined(source(batches, pause), SCHEMA, size, wait)]

    return asyncio.run(run())


def ids(batches: list[pa.RecordBatch]) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


def test_small_batches_become_messages_of_about_the_join_size_in_order() -> None:
    """The first batch goes alone, then each message holds what was sent before it, up to
    the join size: a small write is not held back whole to its end (issue 28: at 100k rows
    the upload of a Spark task's three batches sat after its last one)."""
    small = [batch(i * 100, 100) for i in range(40)]  # ~2.3 KB each
    size = 10 * small[0].get_total_buffer_size()
    out = joined(small, size)
    assert [b.num_rows // 100 for b in out] == [1, 1, 2, 4, 8, 10, 10, 4]
    assert ids(out) == list(range(4000))
    assert all(b.schema == SCHEMA for b in out)


def test_a_write_of_a_few_batches_holds_little_back_to_its_end() -> None:
    """A Spark task's 25,000 rows (10,000, 10,000, 5,000): before, all three were joined and
    went after the last; now only the last is left when the source ends."""
    rows = [10_000, 10_000, 5_000]
    few = [batch(sum(rows[:i]), n) for i, n in enumerate(rows)]
    out = joined(few, 4 << 20)
    assert [b.num_rows for b in out] == rows
    assert out[0] is few[0]  # as it came: no copy


def test_a_large_batch_goes_as_it_is_and_keeps_its_place() -> None:
    big = batch(300, 5000)
    small = [batch(0, 100), batch(100, 100), batch(200, 100)]
    out = joined([*small, big, batch(5300, 100)], 20_000)
    assert [b.num_rows for b in out] == [100, 100, 100, 5000, 100]
    assert out[3] is big  # no copy of a batch already large enough
    assert ids(out) == list(range(5400))


def test_joining_off_sends_every_batch_as_it_comes() -> None:
    out = joined([batch(i * 10, 10) for i in range(5)], 0)
    assert [b.num_rows for b in out] == [10] * 5


def test_a_slow_source_is_not_held_back_past_the_wait() -> None:
    """Batches 0.1 s apart with a wait of 0.03 s: each goes out on its own, soon after it came
    (the service shows the write's progress as it runs)."""
    started = time.monotonic()
    out = joined([batch(i * 10, 10) for i in range(4)], 1 << 20, wait=0.03, pause=0.1)
    assert [b.num_rows for b in out] == [10, 10, 10, 10]
    assert time.monotonic() - started < 2


def test_batches_are_conformed_and_a_mismatch_names_the_schema() -> None:
    narrow = pa.record_batch(
        [pa.array([1, 2], pa.int32()), pa.array(["a", "b"])], names=["id", "s"]
    )
    out = joined([narrow, batch(3, 1), batch(4, 1)], 1 << 20)
    assert all(b.schema == SCHEMA for b in out) and ids(out) == [1, 2, 3, 4]
    with pytest.raises(P.SchemaMismatch, match="does not match the dataset's schema"):
        joined([pa.record_batch([pa.array(["x"])], names=["other"])], 1 << 20)
