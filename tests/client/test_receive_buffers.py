"""The receive path without fresh buffers (issue 28, item 2): a data message lands in a pooled
buffer that goes back to the pool only when the last Arrow object viewing it is gone, and a
blocking iteration hands each batch over once (the next one received meanwhile)."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator

import pyarrow as pa
import pytest

from aqueduct_core.api.codec import CODEC_HEADER
from aqueduct_spark import protocol as P
from aqueduct_spark.client.pool import Portal
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


async def numbers(n: int, log: list[str], fail: bool = False) -> AsyncIterator[int]:
    try:
        for i in range(n):
            await asyncio.sleep(0)
            log.append(f"made {i}")
            yield i
        if fail:
            raise ValueError("broken after the items")
    finally:
        log.append(f"closed on {threading.current_thread().name}")


def test_iterate_hands_items_over_in_order_one_ahead() -> None:
    portal = Portal.get()
    log: list[str] = []
    got = []
    for item in portal.iterate(numbers(5, log)):
        got.append(item)
        if item == 2:  # the caller works on 2 while 3 is made, not 4
            assert "made 3" in log or len(log) == 3
            assert "made 4" not in log
    assert got == [0, 1, 2, 3, 4]
    assert log[-1] == "closed on aqueduct-loop"


def test_iterate_raises_the_generators_error_after_its_items() -> None:
    got = []
    with pytest.raises(ValueError, match="broken after"):
        for item in Portal.get().iterate(numbers(3, [], fail=True)):
            got.append(item)
    assert got == [0, 1, 2]


def test_a_caller_that_stops_early_closes_the_generator_before_going_on() -> None:
    log: list[str] = []
    items = Portal.get().iterate(numbers(1000, log))
    assert next(items) == 0
    items.close()
    assert log[-1] == "closed on aqueduct-loop"
    assert len(log) <= 4  # it stopped: nothing ran ahead beyond one item


def test_a_generator_cancelled_from_within_ends_the_callers_wait() -> None:
    """Work the generator awaits is cancelled (a closing connection, the pool's exit): the
    caller waiting for the next item gets the cancellation instead of waiting for ever."""

    async def cancelled() -> AsyncIterator[int]:
        yield 1
        raise asyncio.CancelledError

    outcome: list[object] = []

    def consume() -> None:
        try:
            outcome.extend(Portal.get().iterate(cancelled()))
        except BaseException as exc:
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the caller still waits for an item that never comes"
    assert outcome == [1, "CancelledError"]
