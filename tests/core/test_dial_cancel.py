"""The QUIC/TCP race of ``connect`` cancelled while it cleans up after itself: a timeout
around ``connect`` or a task group that closes can cancel the caller a second time while
the first cancel's clean-up runs. Every connection an attempt completed is closed all the
same (else its socket, and a connection slot at the service, stay until the idle timeout),
and so is a winner that nobody will get now. Real QUIC and TLS/TCP connections to a real
local server; the attempts are only watched, to cancel the caller at the instant that
matters."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from aqueduct_core import Connection, TransportConfig, serve
from aqueduct_core.transport import Server, dial
from aqueduct_core.transport.mux_wire import TcpSettings

pytestmark = pytest.mark.quic


async def echo(conn: Connection, rx: Any) -> None:
    async for _ in rx:
        pass


async def elsewhere(host: str, port: int) -> bool:
    """``dial._same_host`` as if the service were on another machine: both attempts race."""
    return False


class Attempts:
    """The connections the race's attempts (real ones) completed, in order; ``completed``
    is set, and ``then`` called, in the instant an attempt completes (before the race can
    see it)."""

    def __init__(self) -> None:
        self.made: list[Connection] = []
        self.completed = asyncio.Event()
        self.then: Callable[[], object] = lambda: None


def watch_attempts(monkeypatch: pytest.MonkeyPatch) -> Attempts:
    seen = Attempts()
    for name in ("_quic", "_tcp"):
        real = getattr(dial, name)

        async def attempt(*args: Any, real: Any = real) -> Connection:
            conn: Connection = await real(*args)
            seen.made.append(conn)
            seen.completed.set()
            seen.then()
            return conn

        monkeypatch.setattr(dial, name, attempt)
    return seen


async def cancel_until_done(caller: asyncio.Future[Any]) -> None:
    """Cancel ``caller`` on every turn of the loop until it ends: its clean-up is
    interrupted wherever it awaits."""
    while not caller.done():
        caller.cancel()
        await asyncio.sleep(0)


async def all_closed(made: list[Connection], server: Server) -> None:
    """Every connection the attempts made is closed, at both ends (a backstop of 5 s: the
    idle timeout, 30 s, would close a leaked one only much later)."""
    assert made
    for conn in made:
        await asyncio.wait_for(conn.wait_closed(), 5)
    for _ in range(100):
        if all(c.is_closed for c in server.connections):
            break
        await asyncio.sleep(0.05)
    assert [c.transport for c in server.connections if not c.is_closed] == []


def against_a_server(body: Callable[[Server], Awaitable[None]]) -> None:
    """Run ``body`` against a real local server, with nothing remembered of earlier races."""

    async def main() -> None:
        dial.forget()
        server = await serve(echo)
        try:
            await body(server)
        finally:
            await server.close()
            dial.forget()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_completed_attempt_is_closed_when_the_caller_is_cancelled_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller is cancelled in the instant its attempt completes, before the race has
    seen it win, and again on every turn while the race cleans up: the completed
    connection is closed, and the caller ends cancelled."""
    monkeypatch.delenv("AQUEDUCT_TRANSPORT", raising=False)
    attempts = watch_attempts(monkeypatch)

    async def body(server: Server) -> None:
        caller = asyncio.ensure_future(
            dial.connect("127.0.0.1", server.port, tls=server.client_tls())
        )
        attempts.then = caller.cancel  # the first cancel, as the attempt completes
        await attempts.completed.wait()
        await cancel_until_done(caller)
        assert caller.cancelled()
        await all_closed(attempts.made, server)

    against_a_server(body)


def test_a_chosen_winner_is_closed_when_the_caller_is_cancelled_while_the_race_cleans_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both attempts race (no delay); once a winner is chosen, the caller is cancelled on
    every turn while the loser is being cancelled or closed: nobody gets the winner, so it
    is closed too, and so is the loser."""
    monkeypatch.delenv("AQUEDUCT_TRANSPORT", raising=False)
    monkeypatch.setattr(dial, "_same_host", elsewhere)
    config = TransportConfig(tcp=TcpSettings(race_delay=0.0))
    attempts = watch_attempts(monkeypatch)

    async def body(server: Server) -> None:
        caller = asyncio.ensure_future(
            dial.connect("127.0.0.1", server.port, tls=server.client_tls(), config=config)
        )
        await attempts.completed.wait()
        while dial.remembered("127.0.0.1", server.port) is None:  # the race chose it
            assert not caller.done()
            await asyncio.sleep(0)
        await cancel_until_done(caller)
        assert caller.cancelled()
        await all_closed(attempts.made, server)

    against_a_server(body)
