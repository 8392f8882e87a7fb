"""The process-wide budget for decoded write data (``service/write_buffers.py``), alone.

Through a real connection, with the service's memory measured: ``tests/security/
test_write_memory.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from aqueduct_core.api import channel, oneshot
from aqueduct_core.engine import EngineConfig
from aqueduct_core.testing.memory import memory_pair
from aqueduct_spark import protocol as P
from aqueduct_spark.service.server import DatasetService, ServiceConfig
from aqueduct_spark.service.write_buffers import WriteBudget

MIB = 1 << 20


def test_messages_beyond_the_budget_wait_in_turn_and_a_cancelled_one_leaves_no_trace() -> None:
    async def main() -> None:
        budget = WriteBudget(100)
        await budget.take(60)
        assert budget.crowded()  # more than half used: writes write out what they keep
        big = asyncio.ensure_future(budget.take(50))  # 110 > 100: waits
        small = asyncio.ensure_future(budget.take(10))  # would fit, but waits its turn
        gone = asyncio.ensure_future(budget.take(30))
        await asyncio.sleep(0)
        assert not big.done() and not small.done() and budget.waiting == 3
        assert budget.crowded()  # someone waits: writes must write out what they keep
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert budget.waiting == 2
        budget.settle(60, 20)  # a write wrote its batches out, keeping 20
        await asyncio.sleep(0)
        assert big.done() and small.done() and budget.used == 80
        budget.settle(50, 0)
        budget.settle(10, 0)
        budget.settle(20, 0)
        assert budget.used == 0 and not budget.crowded()

    asyncio.run(main())


def test_writes_keep_batches_only_while_at_most_half_is_used() -> None:
    budget = WriteBudget(100)
    budget.settle(0, 50)
    assert not budget.crowded()
    budget.settle(0, 1)
    assert budget.crowded()


def test_the_budget_must_hold_two_of_the_largest_messages() -> None:
    with pytest.raises(ValueError, match="at least twice max_batch_bytes"):
        ServiceConfig(".", max_batch_bytes=64 << 20, max_write_buffer_bytes=100 << 20)
    ServiceConfig(".", max_batch_bytes=50 << 20, max_write_buffer_bytes=100 << 20)


class Recorded(WriteBudget):
    """A budget that remembers the most it ever had in use."""

    most = 0

    def settle(self, held: int, now: int) -> int:
        got = super().settle(held, now)
        self.most = max(self.most, self.used)
        return got

    def _wake(self) -> None:
        super()._wake()
        self.most = max(self.most, self.used)


def test_open_writes_beyond_the_budget_write_out_and_wait_and_all_land(tmp_path: Path) -> None:
    """The real service code over the in-memory transport: eight writes, each one message of
    0.9 MiB and then silent, on a budget of 2 MiB. The service never has more than the
    budget in use, writes out all batches but one (at most half the budget is kept), and
    once the clients finish, every write lands whole."""
    writes, rows = 8, 30_000
    service = DatasetService(ServiceConfig(str(tmp_path), max_batch_bytes=MIB, threads=4))
    service.write_budget = budget = Recorded(2 * MIB)
    schema = pa.schema([(f"c{i}", pa.int64()) for i in range(4)])
    batch = pa.record_batch([pa.array(np.zeros(rows, np.int64))] * 4, schema=schema)
    payload = P.batch_to_payload(batch, P.ipc_options("none"))
    assert 0.8 * MIB < len(payload) < MIB

    async def main() -> list[Any]:
        engine = EngineConfig(require_flow_control=True)
        async with memory_pair(config=engine, codecs=service.codecs()) as pair:
            serving = asyncio.ensure_future(service.handle(pair.server, pair.entrypoint_receiver))
            send = pair.client.entrypoint.send
            reply, answer = oneshot()
            await send({"op": "begin", "dataset": "held", "mode": "append",
                        "schema": P.schema_to_bytes(schema), "reply": reply})  # fmt: skip
            txn = P.unwrap(await answer)["txn"]
            channels, answers = [], []
            for task in range(writes):
                tx, rx = channel(headers=[(P.H_SCHEMA, P.schema_to_bytes(schema))], codec="raw")
                reply, answer = oneshot()
                await send({"op": "write", "dataset": "held", "txn": txn, "task": f"t{task}",
                            "data": rx, "reply": reply})  # fmt: skip
                await tx.send(payload, headers=[P.batch_header(rows, 0)])
                channels.append(tx)
                answers.append(answer)
            for _ in range(1000):  # while every write is open
                written = len(list((tmp_path / "held").glob("part-*.parquet")))
                if written >= writes - 1:
                    break
                await asyncio.sleep(0.01)
            assert written >= writes - 1, f"{written} of {writes} open writes wrote out"
            for tx in channels:
                tx.finish()
            got = [P.unwrap(await a) for a in answers]
            pair.client.entrypoint.finish()
            await asyncio.wait_for(serving, 10)
            return got

    got = asyncio.run(asyncio.wait_for(main(), 60))
    service._pool.shutdown()
    assert budget.most <= budget.limit, f"{budget.most} bytes in use, budget {budget.limit}"
    assert budget.used == 0 and budget.waiting == 0
    assert [g["rows"] for g in got] == [rows] * writes
    staged = [f for g in got for f in g["staged"]]
    assert len(staged) == writes  # each wrote one file: none lost its batch


def test_serve_refuses_a_budget_under_two_of_the_largest_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aqueduct_spark import cli

    argv = ["serve", "--root", str(tmp_path), "--max-batch-bytes", str(600 * MIB)]
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert "--max-write-buffer-bytes 1073741824 is less than twice --max-batch-bytes" in error
    assert "raise --max-write-buffer-bytes or lower --max-batch-bytes" in error
