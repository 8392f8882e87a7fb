"""The receive path without fresh buffers (issue 28, item 2): a data message lands in a pooled
buffer that goes back to the pool only when the last Arrow object viewing it is gone."""

from __future__ import annotations

import gc

import pyarrow as pa
import pytest

from aqueduct_core.api.codec import CODEC_HEADER
from aqueduct_spark import protocol as P
from aqueduct_spark.protocol.buffers import BufferPool, size_class

MIB = 1 << 20


def received(pool: BufferPool, batch: pa.RecordBatch) -> pa.Buffer:
    """``batch`` as a data message gathered into a buffer of ``pool`` (as the engine does)."""
    message = bytes(P.batch_to_payload(batch, P.ipc_options("none")))
    view, payload = pool.buffer(len(message))
    view[:] = message
    return payload


def test_a_buffer_is_reused_only_once_nothing_views_it() -> None:
    pool = BufferPool()
    batch = pa.RecordBatch.from_pydict({"x": pa.array(range(100_000))})
    kept = P.read_data_message(received(pool, batch)).decode(batch.schema)
    assert kept.equals(batch) and pool.made == 1
    column = kept.column(0).slice(10, 5)  # a slice of a column keeps the buffer too
    del kept
    gc.collect()
    second = received(pool, batch)  # the first is still viewed: a fresh one
    assert pool.made == 2 and pool.reused == 0
    assert column.to_pylist() == [10, 11, 12, 13, 14]
    del column, second
    gc.collect()
    assert pool.in_use == 0 and pool.idle_bytes == 2 * size_class(
        len(bytes(P.batch_to_payload(batch, P.ipc_options("none"))))
    )
    again = P.read_data_message(received(pool, batch)).decode(batch.schema)
    assert pool.reused == 1 and again.equals(batch)


def test_idle_buffers_are_bounded() -> None:
    pool = BufferPool(max_idle=3 * MIB)
    held = [pool.buffer(MIB)[1] for _ in range(5)]
    del held
    gc.collect()
    assert pool.idle_bytes <= 3 * MIB and pool.in_use == 0


@pytest.mark.parametrize("n", [1, 4095, 4096, 65_536, 1_000_003, 8 * MIB, 8 * MIB + 1])
def test_a_size_class_holds_the_message_with_little_to_spare(n: int) -> None:
    size = size_class(n)
    assert n <= size <= 1.2 * n + 4096 and size % 4096 == 0


def test_only_raw_channels_get_pooled_buffers() -> None:
    pool = BufferPool()
    assert pool.for_channel(MIB, ((CODEC_HEADER, b"cbor"),)) is None
    view, payload = pool.for_channel(MIB, ((b"x", b"y"), (CODEC_HEADER, b"raw")))
    assert len(view) == len(payload) == MIB
