"""Spreading scans and writes over the endpoints of a URL (issue 30): the choice itself
(least outstanding bytes, the planner's preference on ties, a failed endpoint avoided for a
while and tried again), and a real service reached under two endpoints plus a closed port:
the work goes to both live endpoints, the dead one is avoided, a scan whose connection is
lost mid-way resumes on the other endpoint with every row exactly once
(``tests/client/test_client_urls.py``, beside its running service). Three service processes
with one SIGKILLed mid-read: ``tests/spark/test_scale_out.py`` (slow); link-shaped hosts:
``benchmarks/bench_scale.py``."""

from __future__ import annotations

import random
from typing import Any

from aqueduct_spark.client import Endpoint
from aqueduct_spark.client.spread import (
    AVOID,
    Spread,
    assign,
    plan_orders,
    split_bytes,
    spread_for,
)

THREE = [Endpoint("a", 1), Endpoint("b", 1), Endpoint("c", 1)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_least_outstanding_bytes_not_order() -> None:
    spread = Spread(THREE, rng=random.Random(1))
    big = spread.lease(0, 100)
    spread.lease(1, 10)
    assert spread.pick(5) == 2  # the idle one
    spread.lease(2, 50)
    assert spread.pick(5) == 1  # 10 + 5 under way beats 50 + 5 and 100 + 5
    big.end()
    assert spread.pick(5) == 0  # the first has finished its big piece: it is free now
    assert spread.outstanding() == [0, 10, 50] and spread.done() == [1, 0, 0]


def test_ties_go_to_the_preferred_endpoint_then_the_next() -> None:
    spread = Spread(THREE)
    assert [spread.pick(1, prefer=p) for p in range(5)] == [0, 1, 2, 0, 1]
    spread.lease(1, 1)
    assert spread.pick(1, prefer=1) == 2  # busier than its neighbours: the next after it


def test_without_a_preference_idle_processes_do_not_all_pick_the_first() -> None:
    picks = {Spread(THREE).pick(1) for _ in range(60)}
    assert picks == {0, 1, 2}


def test_a_failed_endpoint_is_avoided_for_a_while_then_tried_again() -> None:
    clock = Clock()
    spread = Spread(THREE, clock=clock)
    spread.failed(0)
    assert [spread.pick(1, prefer=0) for _ in range(3)] == [1, 1, 1]
    assert spread.avoided() == [True, False, False]
    clock.now += AVOID + 0.01
    assert spread.pick(1, prefer=0) == 0  # its pause is over: tried again
    spread.failed(0)  # failed again: the pause doubles
    clock.now += AVOID + 0.01
    assert spread.pick(1, prefer=0) == 1
    clock.now += AVOID
    assert spread.pick(1, prefer=0) == 0
    spread.succeeded(0)
    spread.failed(0)  # a success in between: back to the first pause
    clock.now += AVOID + 0.01
    assert spread.pick(1, prefer=0) == 0


def test_when_all_are_avoided_the_one_back_soonest_is_tried() -> None:
    clock = Clock()
    spread = Spread(THREE, clock=clock)
    for i in (2, 0, 1):
        spread.failed(i)
        clock.now += 0.1
    assert spread.pick(1) == 2
    assert spread.pick(1, exclude=[2]) == 0
    assert spread.pick(1, exclude=[0, 1, 2]) is None


def test_unknown_sizes_count_as_the_mean_of_finished_ones() -> None:
    spread = Spread(THREE, rng=random.Random(0))
    lease = spread.lease(0)
    lease.moved = 3000
    lease.end()
    assert spread.guess(None) == 3000
    spread.lease(1)
    assert spread.outstanding() == [0, 3000, 0]


def test_the_planner_spreads_tasks_by_bytes() -> None:
    assert assign([10] * 6, 3) == [0, 1, 2, 0, 1, 2]
    assert assign([90, 10, 10, 10, 60], 2) == [0, 1, 1, 1, 1]
    assert assign([5, 5], 1) == [0, 0]
    assert split_bytes({"bytes": 7}) == 7
    assert split_bytes([{"bytes": 7}, {"bytes": 3}]) == 10
    assert split_bytes([{"bytes": 7}, {}]) is None


def test_a_lost_hosts_tasks_move_to_every_survivor_not_to_the_next() -> None:
    """The bench_scale kill (12 tasks, 6 at a time, 3 hosts): the lost host's tasks under
    way (two at a time, consecutive in its list) each go to a different survivor. Each task's
    process decides alone (nothing under way there): only the planner's order spreads them.
    Before, both went to the host after the lost one: 4 tasks on one link, 2 on the other."""
    orders = plan_orders([10] * 12, 3)
    assert [o[0] for o in orders] == assign([10] * 12, 3)
    assert all(sorted(o) == [0, 1, 2] for o in orders)  # every endpoint, each once
    for lost in range(3):
        moved = [o[1] for o in orders if o[0] == lost]
        assert moved[0::2] == moved[0:1] * 2 and moved[1::2] == moved[1:2] * 2
        assert sorted(set(moved)) == sorted({0, 1, 2} - {lost})
        for order in orders:  # as each task's process picks, with its home avoided
            spread = Spread(THREE)
            spread.failed(order[0])
            assert spread.pick(10, prefer=order) == order[1]
    # by bytes, as the homes: what a lost host leaves differs by at most one task's bytes
    rng = random.Random(3)
    for n in (3, 4, 5):
        sizes = [rng.randrange(1, 100) for _ in range(40)]
        orders = plan_orders(sizes, n)
        for lost in range(n):
            moved = [0] * n
            for size, order in zip(sizes, orders, strict=True):
                if order[0] == lost:
                    moved[order[1]] += size
            del moved[lost]
            assert max(moved) - min(moved) <= max(sizes)
    assert plan_orders([5, 5], 1) == [(0,), (0,)]
    assert plan_orders([5, 5], 2) == [(0, 1), (1, 0)]


def test_one_spread_per_url_per_process() -> None:
    assert spread_for(THREE) is spread_for(list(THREE))
    assert spread_for(THREE[:2]) is not spread_for(THREE)


def test_a_whole_write_counts_at_its_endpoint_until_its_commit_is_answered() -> None:
    """A write (begin, data, commit at one endpoint) still committing keeps its endpoint
    busy, so the next goes to the other; a begin that fails moves the write (nothing was
    staged) and its endpoint is avoided."""
    import asyncio

    from aqueduct_core.errors import ConnectionLost
    from aqueduct_spark.client import ClientConfig
    from aqueduct_spark.client.spreader import Spreader

    class Owner:
        config = ClientConfig("quic://w1:1,quic://w2:1", retries=0)

    async def run() -> None:
        spreader = Spreader(Owner(), [Endpoint("w1", 1), Endpoint("w2", 1)])  # type: ignore[arg-type]
        spreader.client = lambda index: index  # type: ignore[assignment,method-assign,return-value]
        committing = asyncio.Event()
        answered = asyncio.Event()
        homes: list[int] = []

        async def begin(home: int) -> Any:
            homes.append(home)
            return home

        async def slow_commit(home: int, txn: Any) -> int:
            committing.set()
            await answered.wait()  # its commit not answered yet
            return home

        async def commit(home: int, txn: Any) -> int:
            return home

        first = asyncio.ensure_future(spreader.write(begin, slow_commit, 1000))
        await committing.wait()
        second = await spreader.write(begin, commit, 1000)
        answered.set()
        assert second != await first  # the endpoint still committing was left alone

        async def refused(home: int) -> Any:
            if home == 0:
                raise ConnectionLost("gone")
            return home

        with spreader.spread.lease(1, 10_000):  # so that the least busy, 0, is tried first
            assert await spreader.write(refused, commit, 1000) == 1
        assert spreader.spread.avoided() == [True, False]
        assert await spreader.write(refused, commit, 1000) == 1  # 0 left alone meanwhile

    asyncio.run(run())


def test_a_client_holding_only_its_control_connection_is_not_replaced() -> None:
    """A whole write holds its endpoint's control connection from its begin until its data
    opens the bulk lane: a second write choosing that endpoint meanwhile must reuse the
    client, not close it under the first (issue 30's intermittent socket leak)."""
    from types import SimpleNamespace

    from aqueduct_spark.client.session import BULK, CONTROL
    from aqueduct_spark.client.spreader import _went_away

    def client(reached: bool, had: set[str], open_lanes: set[str]) -> Any:
        return SimpleNamespace(
            _reached=reached,
            _had=had,
            _held=lambda lane=CONTROL: object() if lane in open_lanes else None,
        )

    assert not _went_away(client(False, set(), set()))  # new: nothing to lose
    assert not _went_away(client(True, {CONTROL}, {CONTROL}))  # a write between begin and data
    assert not _went_away(client(True, {CONTROL, BULK}, {CONTROL, BULK}))
    assert _went_away(client(True, {CONTROL, BULK}, {CONTROL}))  # its bulk connection died
    assert _went_away(client(True, {CONTROL}, set()))  # every connection it had died


class _Held:
    """A client of one endpoint as a :class:`Spreader` sees it: which lanes hold an open
    connection, and whether it was closed."""

    def __init__(self, config: Any, lanes: tuple[str, ...] = ()) -> None:
        self.config = config
        self._reached = bool(lanes)
        self.lanes = lanes
        self.closed = False

    def _held(self, lane: str = "bulk") -> object | None:
        return object() if lane in self.lanes else None

    async def close(self) -> None:
        self.closed = True


def test_a_late_failure_of_a_replaced_client_leaves_the_newer_one_alone() -> None:
    """A failure seen on an endpoint's older client (dropped already) must not close the newer
    one another piece of work made there since: that closed a connection under its owner
    ("connection lost: closed (close code 0)" on a begin)."""
    import asyncio
    from dataclasses import dataclass

    from aqueduct_spark.client.spreader import Spreader

    @dataclass(frozen=True)
    class Config:
        url: str = "quic://a:1"
        retries: int = 3

    async def main() -> None:
        spreader = Spreader(_Held(Config()), [Endpoint("a", 1)])  # type: ignore[arg-type]
        old = spreader.client(0)
        spreader._failed(0, old, ConnectionError("lost"), "a write")  # type: ignore[arg-type]
        fresh = spreader.client(0)
        assert fresh is not old
        spreader._failed(0, old, ConnectionError("lost"), "a write")  # type: ignore[arg-type]
        assert spreader.client(0) is fresh
        await asyncio.wait(list(spreader._closing))  # the background close of the old one
        assert old.closed and not fresh.closed  # type: ignore[attr-defined]
        await spreader.close()
        assert fresh.closed  # type: ignore[attr-defined]

    asyncio.run(main())
