"""Writes together hold no more decoded data than ``--max-write-buffer-bytes``.

Each write was bounded (``--max-batch-bytes`` per message, two row groups of buffer), the
writes together were not: 16 open writes, each sending one zstd message of a few KiB that
declares 30 MiB and then nothing, made the service hold 480 MiB (each write kept its batch
for a row group that never filled). Now a message waits for room in the process's budget
before it is decoded, and a write keeps batches only while the budget is at most half used,
writing them out (a smaller row group) otherwise.

In ``make slow`` (a service of its own and 240 MiB of zstd to decode: about 10 s); the fast
suite covers the budget with the real service code over the in-memory transport
(``tests/service/test_write_buffers.py``, 0.2 s).
"""

from __future__ import annotations

import asyncio
import mmap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import MIB, TOKEN, ServerMemory
from test_compression_bomb import client_of

from aqueduct_spark import protocol as P
from aqueduct_spark.testing import ServiceProcess, start_service

pytestmark = pytest.mark.slow

BUDGET = 32 * MIB
BATCH = 16 * MIB
WRITES = 16
DECLARED = 15 * MIB
"""What each write's one message declares (a few KiB of zstd zeros): 240 MiB in all."""
SCHEMA = pa.schema([(f"c{i}", pa.int64()) for i in range(4)])
"""Four columns: 15 MiB is 491,520 rows, under the million rows that make a row group on
their own (a write keeps a batch of fewer rows and bytes than a row group)."""
MARGIN = 64 * MIB
"""What the service's peak RSS may grow beyond the budget: the decoding and Parquet
encoding of the messages in hand, and the allocator's slack."""


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    root = tmp_path_factory.mktemp("budget-root")
    args = ["--max-write-buffer-bytes", str(BUDGET), "--max-batch-bytes", str(BATCH)]
    svc = start_service(root, token=TOKEN, args=args)
    try:
        yield svc
    finally:
        svc.stop()


def zeros(nbytes: int) -> pa.RecordBatch:
    """``nbytes`` of int64 zeros in SCHEMA's columns, occupying no memory until written to
    (an anonymous mapping never touched)."""
    rows = nbytes // (8 * len(SCHEMA))
    mapping = mmap.mmap(-1, rows * 8, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    column = pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(mapping)])
    return pa.record_batch([column] * len(SCHEMA), schema=SCHEMA)


def bomb(nbytes: int) -> bytes:
    """One data message of a few KiB of zstd that declares ``nbytes``."""
    return bytes(P.batch_to_payload(zeros(nbytes), P.ipc_options("zstd")))


def staged_files(root: Path) -> int:
    return sum(1 for _ in root.rglob("part-*.parquet"))


@pytest.mark.parametrize("transport", ["quic", "tcp"])
def test_open_writes_together_hold_no_more_than_the_budget(
    budgeted: ServiceProcess, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 writes of one transaction, each one message declaring 15 MiB and then silent:
    the service writes out what it cannot keep (a staged file per write but one: at most
    half the budget is kept), its peak RSS grows by less than the budget and a margin,
    and once the clients go on every write lands whole: they waited, none was refused."""
    payload = bomb(DECLARED)
    assert len(payload) < MIB
    memory = ServerMemory(budgeted.proc.pid)
    table = Path(str(budgeted.root)) / f"held_{transport}"
    go_on = asyncio.Event()

    def unchecked(batch: pa.RecordBatch, *_: Any) -> Iterator[tuple[pa.RecordBatch, Any]]:
        yield batch, payload  # the client's own split and size check bypassed

    async def one_message() -> AsyncIterator[pa.RecordBatch]:
        yield zeros(8 * len(SCHEMA))  # one row: the client sends the bomb instead
        await go_on.wait()  # the write stays open, its batch in the service

    async def attack() -> tuple[list[dict[str, Any]], int]:
        client = client_of(budgeted, transport, compression="zstd")
        try:
            txn = await client.begin(table.name, SCHEMA)
            monkeypatch.setattr(P, "payloads_within", unchecked)
            # One such write first, alone: what the service allocates once (Parquet
            # writing, its allocator's pools) is not what the writes together hold.
            go_on.set()
            await client.write_task(txn, one_message())
            go_on.clear()
            memory.reset_peak()
            before = memory.rss
            writes = [
                asyncio.ensure_future(client.write_task(txn, one_message())) for _ in range(WRITES)
            ]
            deadline = time.monotonic() + 60
            while staged_files(table) < WRITES:  # the first write's, and all but one
                assert time.monotonic() < deadline, (
                    f"{staged_files(table) - 1} of {WRITES} open writes wrote their batch "
                    "out; the others keep theirs in memory"
                )
                await asyncio.sleep(0.05)
            go_on.set()
            staged = await asyncio.gather(*writes)
            grew = memory.peak - before
            monkeypatch.undo()
            await client.abort(txn)
            return staged, grew
        finally:
            await client.close()

    staged, grew = asyncio.run(asyncio.wait_for(attack(), 120))
    print(f"\n[{transport}] {WRITES} x {DECLARED // MIB} MiB declared: peak RSS growth "
          f"{grew / MIB:.1f} MiB (budget {BUDGET // MIB} MiB)")  # fmt: skip
    assert [s["rows"] for s in staged] == [DECLARED // 32] * WRITES
    assert grew < BUDGET + MARGIN, (
        f"the service's peak RSS grew by {grew / MIB:.0f} MiB; {WRITES} writes of "
        f"{DECLARED // MIB} MiB may hold {BUDGET // MIB} MiB (--max-write-buffer-bytes)"
    )
