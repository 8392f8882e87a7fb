"""The service's worker threads: taken in turn by connections, and dropped with them.

Real threads and a real event loop; blocking calls are held on ``threading.Event``s, so the
order in which they start is what the pool decided, not what the scheduler happened to do.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from aqueduct_spark.cli import build_parser
from aqueduct_spark.service.admission import FairPool, Session
from aqueduct_spark.service.server import ServiceConfig


class Calls:
    """Blocking calls that record when they start and wait until released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = threading.Event()
        self._lock = threading.Lock()

    def call(self, name: str) -> str:
        with self._lock:
            self.started.append(name)
        assert self.release.wait(10)
        return name


async def settle(pool_calls: Calls, count: int) -> None:
    for _ in range(500):
        if len(pool_calls.started) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"only {pool_calls.started} started")


def test_a_connection_runs_at_most_a_quarter_of_the_threads_and_others_take_turns() -> None:
    async def scenario() -> None:
        pool = FairPool(threads=8)  # two at once per connection
        calls = Calls()
        flood = [asyncio.ensure_future(pool.run("a", calls.call, f"a{i}")) for i in range(20)]
        await settle(calls, 2)
        await asyncio.sleep(0.1)
        assert calls.started == ["a0", "a1"]  # six threads idle, yet "a" waits its turn
        other = [asyncio.ensure_future(pool.run(name, calls.call, name)) for name in "bc"]
        await settle(calls, 4)
        assert sorted(calls.started[2:]) == ["b", "c"]  # at once, not after the flood
        calls.release.set()
        assert await asyncio.gather(*flood, *other) == [f"a{i}" for i in range(20)] + ["b", "c"]
        pool.shutdown()

    asyncio.run(scenario())


def test_free_threads_go_round_robin_between_waiting_connections() -> None:
    async def scenario() -> None:
        pool = FairPool(threads=1)
        calls = Calls()
        first = asyncio.ensure_future(pool.run("a", calls.call, "a0"))
        await settle(calls, 1)
        waiting = [asyncio.ensure_future(pool.run("a", calls.call, f"a{i}")) for i in (1, 2, 3)]
        waiting += [asyncio.ensure_future(pool.run("b", calls.call, f"b{i}")) for i in (1, 2)]
        await asyncio.sleep(0.05)
        calls.release.set()
        await asyncio.gather(first, *waiting)
        assert calls.started == ["a0", "a1", "b1", "a2", "b2", "a3"]
        pool.shutdown()

    asyncio.run(scenario())


def test_calls_of_a_forgotten_connection_never_run() -> None:
    async def scenario() -> None:
        pool = FairPool(threads=1)
        calls = Calls()
        running = asyncio.ensure_future(pool.run("gone", calls.call, "running"))
        await settle(calls, 1)
        queued = [asyncio.ensure_future(pool.run("gone", calls.call, f"q{i}")) for i in range(5)]
        later = asyncio.ensure_future(pool.run("other", calls.call, "other"))
        await asyncio.sleep(0.05)
        for task in queued:
            task.cancel()
        pool.forget("gone")
        calls.release.set()
        assert await later == "other"
        assert await running == "running"
        await asyncio.gather(*queued, return_exceptions=True)
        assert calls.started == ["running", "other"]
        pool.shutdown()

    asyncio.run(scenario())


def test_a_session_cancels_every_request_it_started() -> None:
    async def scenario() -> None:
        session = Session(max_requests=3, max_scans=1)
        ended: list[str] = []

        async def request(name: str) -> None:
            try:
                await asyncio.sleep(60)
            finally:
                ended.append(name)

        for name in ("x", "y", "z"):
            await session.slots.acquire()
            session.start(request(name))
        assert session.slots.locked()  # a fourth would wait
        await asyncio.sleep(0)
        await asyncio.wait_for(session.cancel(), 5)
        assert sorted(ended) == ["x", "y", "z"]
        assert not session.slots.locked()
        await asyncio.wait_for(session.idle(), 1)

    asyncio.run(scenario())


def test_serve_limit_flags_default_to_the_service_config_and_refuse_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["serve"])
    defaults: Any = ServiceConfig(".")
    assert (args.max_requests, args.max_scans, args.request_window) == (
        defaults.max_requests,
        defaults.max_scans,
        defaults.request_window,
    )
    with pytest.raises(ValueError, match="request_window must be at least 1"):
        ServiceConfig(".", request_window=0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-scans", "0"])
    assert "expected a whole number of at least 1, got '0'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_requests must be at least 1"):
        ServiceConfig(".", max_requests=0)
