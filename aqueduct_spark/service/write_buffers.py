"""The service's memory for the data of writes: one budget for the whole process.

A write's data messages are decoded (decompressed) into Arrow batches, and a write keeps its
batches in memory until they make a Parquet row group (``StageWriter``, 32 MiB). Each write
is bounded (``--max-batch-bytes`` per message, two row groups of buffer), but the writes
together were not: 16 open writes each sending one message that declared 30 MiB held 480 MiB,
and a client may open as many writes as it may send requests.

:class:`WriteBudget` (``--max-write-buffer-bytes``) counts, for the whole process, the
messages being decoded and staged (at the size they declare) and the batches writes keep.
A message that does not fit waits, in turn, before it is decoded, and its write reads nothing
more meanwhile: the data channel's flow-control credit is withheld, so the client's library
waits to send. That is back pressure, not refusal, because a write beyond the budget is not
an error: many honest writers at once (a Spark job's tasks) should each slow down, not fail.
A refusal would also fail whole Spark jobs for a transient crowd.

No write holds memory others are waiting for: a write keeps its batches only while the
budget is at most half used and nobody waits; otherwise it writes them out at once, as a
smaller row group. So what writes keep is at most half the budget, every message of up to
half the budget is admitted once the messages being decoded are done, and a write whose
client went silent holds back nobody. A budget must therefore be at least twice
``--max-batch-bytes``.

Besides this budget, each write channel may hold its flow window of received, undecoded
bytes (``EngineConfig.flow_window``): that is credit the engine granted, per channel.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import cbor2
import pyarrow as pa
from prometheus_client import CollectorRegistry, Counter, Gauge

from aqueduct_core.api import Receiver
from aqueduct_core.errors import EndOfChannel
from aqueduct_spark import protocol as P
from aqueduct_spark.service.batch_limits import check_message
from aqueduct_spark.service.observability import note
from aqueduct_spark.service.transactions import StagedWrite

T = TypeVar("T")
MIB = 2**20
WRITE_BUFFER_BYTES = 1024 * MIB
"""``serve --max-write-buffer-bytes``'s default: 16 writes keeping full row groups (32 MiB
each) at once, the rest writing smaller ones."""


class WriteBudget:
    """Bytes of decoded write data in this process, and the writes waiting for room.

    Event-loop side only (not thread-safe): every change is made by the coroutine of a
    write, between its calls on worker threads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waits: Counter | None = None
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def take(self, n: int) -> None:
        """Room for ``n`` bytes, first come, first served."""
        if not self._waiting and self.used + n <= self.limit:
            self.used += n
            return
        entry = (n, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        if self._waits is not None:
            self._waits.inc()
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():
                self.used -= n  # given room as it was cancelled: give it back
            else:
                self._waiting.remove(entry)
            self._wake()
            raise

    def settle(self, held: int, now: int) -> int:
        """A write held ``held`` bytes and now holds ``now``: returns ``now``."""
        self.used += now - held
        self._wake()
        return now

    def crowded(self) -> bool:
        """Whether a write must write out what it keeps (more than half used, or anyone
        waiting)."""
        return bool(self._waiting) or self.used > self.limit // 2

    def _wake(self) -> None:
        while self._waiting and self.used + self._waiting[0][0] <= self.limit:
            n, turn = self._waiting.popleft()
            if not turn.done():
                self.used += n
                turn.set_result(None)

    def observe(self, reg: CollectorRegistry) -> None:
        """Show the budget in the service's metrics (``/metrics``)."""
        Gauge(
            "aqueduct_write_buffer_bytes",
            "Bytes of write data this process holds decoded: messages being staged and "
            "batches kept for a row group (--max-write-buffer-bytes bounds it).",
            registry=reg,
        ).set_function(lambda: self.used)
        Gauge(
            "aqueduct_write_buffer_waiting",
            "Data messages of writes waiting for room in --max-write-buffer-bytes.",
            registry=reg,
        ).set_function(lambda: len(self._waiting))
        self._waits = Counter(
            "aqueduct_write_buffer_waits",
            "Data messages of writes that waited for room in --max-write-buffer-bytes.",
            registry=reg,
        )


async def _done(call: Awaitable[T]) -> T:
    """Await ``call`` (work on a worker thread); if cancelled meanwhile, still wait for it
    to end before raising, so that nothing else touches the write while a thread does and
    the budget counts what the write really holds."""
    job = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await job
        raise


def _stage(write: StagedWrite, message: P.DataMessage, schema: pa.Schema) -> tuple[int, int]:
    """Decode one data message and stage it (on a worker thread): its rows and Arrow bytes."""
    batch = message.decode(schema, check="full")
    write.write(batch)
    return int(batch.num_rows), int(batch.nbytes)


async def stage_messages(
    data: Receiver[Any],
    write: StagedWrite,
    schema: pa.Schema,
    limit: int,
    budget: WriteBudget,
    run: Callable[..., Awaitable[Any]],
) -> tuple[int, list[P.StagedFile]]:
    """Stage every data message of a write channel, within ``budget``; returns the rows and
    the staged files. ``run(fn, *args)`` runs ``fn`` on a worker thread, in the connection's
    turn. On any failure (a refused message, the connection closed) what was staged is
    removed."""
    rows = held = 0
    try:
        while True:
            try:
                delivery = await data.recv_message()
            except EndOfChannel:
                break
            error = P.find_header(delivery.headers, P.H_ERROR)
            if error is not None:
                raise P.error_from_wire(cbor2.loads(error))
            message = check_message(delivery.value, limit)  # parsed: nothing decoded yet
            await budget.take(message.size)
            held += message.size
            try:
                added, arrow = await _done(run(_stage, write, message, schema))
            finally:
                held = budget.settle(held, write.buffered)
            rows += added
            note(
                rows=added,
                nbytes=len(delivery.value),
                direction="in",
                arrow=arrow,
                codec=message.codec,
            )
            if held and budget.crowded():
                try:
                    await _done(run(write.flush))
                finally:
                    held = budget.settle(held, write.buffered)
        staged: list[P.StagedFile] = await _done(run(write.close))
    except BaseException:
        # Not through the pool: a cancelled request (its connection closed) must still
        # remove what it staged, and must not wait for its turn to do so.
        await asyncio.shield(asyncio.to_thread(write.abort))
        raise
    finally:
        budget.settle(held, 0)
    return rows, staged
