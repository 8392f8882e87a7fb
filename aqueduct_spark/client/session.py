"""The connections to a dataset service, each opened on first use and reopened after it is
lost, and the request/reply exchange over them (with retries for idempotent requests).

**Two lanes.** Requests travel in one of two lanes: :data:`BULK`, the requests that carry a
data channel (``scan`` and ``write``: their channel is attached to the request, so the request
goes on the connection that is to carry the data), and :data:`CONTROL`, everything else (list,
describe, plan, begin, commit, subscribe, ...). With ``transport="auto"`` (the default) each
lane prefers its own transport: bulk TLS/TCP, where kernel TCP moves data at a fraction of
user-space QUIC's CPU per byte (2x the rate at MTU 1500), control QUIC (0-RTT on reconnects,
no head-of-line blocking, datagrams). A lane uses a connection the other lane opened when it is
of the transport it prefers, or when its own transport could not be had (UDP blocked: both
lanes share one TCP connection, as a client with one transport does); so a process holds at
most two connections to a service, and only when it uses both lanes. ``transport="quic"`` or
``"tcp"`` (or a ``tcp://`` address) means one transport, one connection, for everything.

A pooled connection can be dead without knowing it: the service restarted while it was quiet
(a restarted service answers the next packet with a stateless reset, or TCP with a reset,
but only once the client sends one). A request that can be repeated finds out and is retried
on a new connection. One that cannot (a ``write``, whose data is streamed from the caller and
is gone once sent; a ``commit`` without an application transaction) must not be the one to
find out: before it, a connection quiet for :data:`PROBE_AFTER` is proven with a ``ping``
round trip, which is retried like any idempotent request. While the service is away (it is
restarting: nothing listens on its port for a while), a session that reached it before waits
for it for up to the request ``timeout``, so a running query outlives a restart.

A request already sent when the service died is answered by nobody. QUIC retransmits it with
exponential backoff, so the restarted service may see the next copy (and answer with a
reset) seconds after it is up; a scan waiting for data sends nothing at all and would wait
out the idle timeout. So whatever waits on the service sends a ``ping`` on its connection
every :data:`NUDGE` seconds that the connection stays silent: a packet that a restarted
service resets at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from aqueduct_core.api import Connection, oneshot
from aqueduct_core.errors import AqueductError, ConnectionLost, WouldBlock
from aqueduct_core.transport import dial
from aqueduct_core.transport.dial import REMEMBER, resolve_transport
from aqueduct_spark import protocol as P
from aqueduct_spark.client.config import ClientConfig
from aqueduct_spark.client.connecting import open_connection
from aqueduct_spark.client.failures import Kind, ServiceUnreachable, classify
from aqueduct_spark.client.retry import Retrying, RetryPolicy
from aqueduct_spark.client.urls import parse_endpoints

log = logging.getLogger("aqueduct.client")
T = TypeVar("T")

PROBE_AFTER = 1.0
"""Seconds without an answer on a connection after which a request that cannot be repeated
first proves it alive with a ``ping`` (one round trip)."""
REOPEN = 0.25
"""Seconds between attempts to reach a service that went away (see :meth:`Session._reopen`):
each attempt at a port nobody listens on costs a round trip."""
NUDGE = 0.5
"""Seconds a connection may stay silent while something waits on it before a ``ping`` goes
out on it (see the module's docstring)."""
CONTROL = "control"
"""The lane of requests that carry no data channel (see the module's docstring)."""
BULK = "bulk"
"""The lane of ``scan`` and ``write``, whose data channel travels with the request."""
PREFERRED = {CONTROL: "quic", BULK: "tcp"}
"""The transport each lane prefers when the transport is ``auto``."""


class Session:
    """An asyncio client's connections to one dataset service, and its requests."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._endpoints = parse_endpoints(config.url)
        fixed = {e.transport for e in self._endpoints}
        choice = resolve_transport(None, config.transport)
        self._fixed: str | None = None if choice == "auto" else choice
        """One transport for every lane (``quic``/``tcp``, or only ``tcp://`` addresses)."""
        if fixed == {"tcp"}:
            self._fixed = "tcp"
        self._conns: dict[str, Connection] = {}
        """Each lane's connection (two lanes may hold the same one)."""
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Future[None]] = set()
        self._retired: set[Connection] = set()
        """Connections no lane uses any more that were still open (see :meth:`_forget`)."""
        self._closes = 0
        """How many times :meth:`close` ran: a connection that finishes opening after a close
        that began while it was being opened is closed, not kept (nobody would close it)."""
        self._reached = False
        """Whether a connection to the service was ever opened (see :meth:`_reopen`)."""
        self._had: set[str] = set()
        """The lanes that ever held a connection (one gone from such a lane went away)."""
        self._missed: dict[str, float] = {}
        """A transport a lane asked for and did not get, and when (monotonic)."""
        self._heard: weakref.WeakKeyDictionary[Connection, float] = weakref.WeakKeyDictionary()
        """When each connection last answered (monotonic)."""
        self._pinged: weakref.WeakKeyDictionary[Connection, float] = weakref.WeakKeyDictionary()
        """When each connection was last pinged by :meth:`_nudge` (monotonic)."""
        self._pings: set[asyncio.Future[None]] = set()
        self._write_policies: weakref.WeakKeyDictionary[Connection, Any] = (
            weakref.WeakKeyDictionary()
        )
        """Each connection's ``auto`` compression of writes (one path, one policy)."""

    def _wants(self, lane: str) -> str:
        """The transport ``lane`` asks for."""
        return self._fixed or PREFERRED[lane]

    def _open(self, lane: str) -> Connection | None:
        """``lane``'s open connection, if it has one."""
        conn = self._conns.get(lane)
        return conn if conn is not None and not conn.is_closed else None

    def _shared(self, lane: str) -> Connection | None:
        """An open connection of another lane that ``lane`` may use: one of the transport it
        wants, or any when that transport could not be had lately."""
        want = self._wants(lane)
        unavailable = self._unavailable(want)
        for other in self._conns:
            conn = self._open(other)
            if conn is not None and (conn.transport == want or unavailable):
                return conn
        return None

    def _unavailable(self, transport: str) -> bool:
        """Whether ``transport`` could not be had lately: a lane of this session asked for it
        and got the other, or a race that preferred it lost to every address (``dial``)."""
        missed = self._missed.get(transport)
        if missed is not None and time.monotonic() - missed <= REMEMBER:
            return True
        return all(dial.lost(e.host, e.port, transport) for e in self._endpoints)

    async def _connection(self, lane: str = CONTROL) -> Connection:
        conn = self._open(lane)
        if conn is not None:
            return conn
        async with self._lock:
            conn = self._open(lane) or self._shared(lane)
            if conn is not None:
                self._conns[lane] = conn
                self._had.add(lane)
                return conn
            headers: list[tuple[bytes, bytes]] = [(P.H_VERSION, str(P.PROTOCOL_VERSION).encode())]
            if self.config.token:
                headers.append((P.H_TOKEN, self.config.token.encode()))
            want = self._wants(lane)
            prefer = PREFERRED[lane]  # what auto races first; a fixed transport ignores it
            closes = self._closes
            if not self._reached:
                conn = await open_connection(self.config, self._endpoints, headers, prefer)
            else:
                conn = await self._reopen(headers, prefer)
            if self._closes != closes:
                await conn.close()
                raise ConnectionLost("the client was closed while it connected")
            self._reached = True
            if conn.transport == want:
                self._missed.pop(want, None)
            else:
                self._missed[want] = time.monotonic()
                # The other transport won: a lane that holds one of those already carries this
                # lane too (one connection per transport, as the service's limits count them).
                for other in list(self._conns):
                    held = self._open(other)
                    if held is not None and held.transport == conn.transport:
                        self._drop_connection(conn)
                        conn = held
                        break
            self._conns[lane] = conn
            self._had.add(lane)
            self._answered(conn)  # its handshake just proved it
            return conn

    async def _reopen(self, headers: list[tuple[bytes, bytes]], prefer: str) -> Connection:
        """A new connection to a service this session reached before: it went away, most
        likely to restart, so it is waited for up to the request ``timeout`` (a service
        never reached fails within ``connect_timeout``), tried every :data:`REOPEN` s so
        that it is found as soon as it is back."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout
        once = replace(self.config, retries=0)  # one round; the pauses are ours
        while True:
            try:
                return await open_connection(once, self._endpoints, headers, prefer)
            except ServiceUnreachable:
                if loop.time() + REOPEN >= deadline:
                    raise
                log.info("the dataset service at %s is away; waiting for it", self.config.url)
                await asyncio.sleep(REOPEN)

    def _drop_connection(self, conn: Connection) -> None:
        """Forget ``conn`` and close it in the background: requests waiting on it fail now
        (and retry on a new one) instead of at its idle timeout."""
        self._forget(conn)
        closing = asyncio.ensure_future(_close_quietly(conn))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    def _forget(self, conn: Connection | None) -> None:
        """No lane uses ``conn`` any more. One still open is kept for :meth:`close`: requests
        under way on it finish there, and its socket is closed with the session's."""
        for lane in [lane for lane, c in self._conns.items() if c is conn]:
            del self._conns[lane]
        self._retired = {c for c in self._retired if not c.is_closed}
        if conn is not None and not conn.is_closed and conn not in self._conns.values():
            self._retired.add(conn)

    async def close(self) -> None:
        """Finish the entrypoint channels and close the connections (code 0); return once every
        socket this session had is closed, so a loop that ends next leaks none: a connection
        that ended already (its idle timeout, the service's CLOSE) may still be closing its
        socket (TLS closes with a round trip), and so may those dropped in the background."""
        self._closes += 1
        conns = list({id(c): c for c in [*self._conns.values(), *self._retired]}.values())
        self._conns.clear()
        self._retired.clear()
        for conn in conns:
            if not conn.is_closed:
                # The entrypoint may be gone already (ended by its garbage-collection backstop,
                # as at interpreter exit): the connection is closed all the same.
                with contextlib.suppress(AqueductError):
                    conn.entrypoint.finish()
            await conn.close()
        if self._closing:
            await asyncio.wait(list(self._closing))  # each bounded by _close_quietly

    @property
    def transport(self) -> str | None:
        """What carries the control lane's connection (else the bulk lane's): ``quic`` or
        ``tcp``; None before one."""
        conn = self._open(CONTROL) or self._open(BULK)
        return conn.transport if conn is not None else None

    @property
    def transports(self) -> dict[str, str]:
        """What carries each lane that has an open connection: ``{"control": "quic", "bulk":
        "tcp"}`` for a client that listed and scanned with the default ``auto``."""
        return {lane: c.transport for lane in (CONTROL, BULK) if (c := self._open(lane))}

    # -- requests ---------------------------------------------------------------------

    async def _retrying(self, attempt: Callable[[], Awaitable[T]], lane: str = CONTROL) -> T:
        tries = Retrying(RetryPolicy.of(self.config))
        while True:
            held = self._held(lane)
            try:
                return await attempt()
            except BaseException as exc:
                pause = self._pause(tries, exc, held, lane)
                if pause is None:
                    raise
                log.warning("request to the dataset service failed (%s); retrying", exc)
                await asyncio.sleep(pause)

    def _held(self, lane: str = CONTROL) -> Connection | None:
        """The open connection an attempt in ``lane`` is about to use, if there is one."""
        return self._open(lane)

    def _pause(
        self, tries: Retrying, exc: BaseException, held: Connection | None, lane: str = CONTROL
    ) -> float | None:
        """Seconds to wait before the next attempt after ``exc`` (None: give up), and the
        connection forgotten if it failed. A connection that was open before the operation
        and is found dead is replaced at once: the service that reset it is up again (a
        restarted one). Only a new connection that fails backs off."""
        pause = tries.delay(exc)
        if pause is None:
            return None
        self._forget_failed(exc, lane)
        if held is not None and tries.failures == 1 and classify(exc) is Kind.TRANSIENT:
            return 0.0
        return pause

    def _forget_failed(self, exc: BaseException, lane: str = CONTROL) -> None:
        """After a connection failure, the next attempt in ``lane`` opens a new connection
        (and so does the other lane, if it shared that one)."""
        if classify(exc) is Kind.TRANSIENT:
            self._forget(self._conns.get(lane))

    def _answered(self, conn: Connection) -> None:
        """``conn`` just answered: it is alive."""
        self._heard[conn] = time.monotonic()

    async def _live_connection(self, lane: str = CONTROL) -> Connection:
        """``lane``'s connection, proven alive by a ``ping`` round trip if it has not answered
        for :data:`PROBE_AFTER` (see the module's docstring): for requests that cannot be
        repeated."""
        conn = await self._connection(lane)
        heard = self._heard.get(conn)
        if heard is not None and time.monotonic() - heard < PROBE_AFTER:
            return conn
        # A service older than ping answers InvalidRequest: that proves the connection too.
        with contextlib.suppress(P.InvalidRequest):
            await self.call("ping", lane=lane)
        return await self._connection(lane)

    async def _nudged(
        self, conn: Connection, waiting: Awaitable[T], timeout: float | None = None
    ) -> T:
        """Await ``waiting`` (something ``conn`` is to deliver), pinging ``conn`` whenever
        it stays silent for :data:`NUDGE` s; TimeoutError after ``timeout`` s."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        task = asyncio.ensure_future(waiting)
        try:
            while True:
                wait = NUDGE if deadline is None else max(0.0, min(NUDGE, deadline - loop.time()))
                done, _ = await asyncio.wait({task}, timeout=wait)
                if done:
                    result = task.result()
                    self._answered(conn)
                    return result
                if deadline is not None and loop.time() >= deadline:
                    raise TimeoutError
                self._nudge(conn)
        finally:
            task.cancel()

    def _nudge(self, conn: Connection) -> None:
        """Ping ``conn`` in the background, unless it answered or was pinged within
        :data:`NUDGE` s. Each ping is a new packet: on a dead connection an earlier one may
        wait for QUIC's next retransmission, seconds away."""
        now = time.monotonic()
        for last in (self._heard.get(conn), self._pinged.get(conn)):
            if last is not None and now - last < NUDGE:
                return
        if conn.is_closed:
            return
        self._pinged[conn] = now
        ping = asyncio.ensure_future(self._ping(conn))
        self._pings.add(ping)
        ping.add_done_callback(self._pings.discard)

    async def _ping(self, conn: Connection) -> None:
        with contextlib.suppress(Exception):
            reply, answer = oneshot()
            await conn.entrypoint.send({"op": "ping", "reply": reply})
            try:
                await asyncio.wait_for(answer, 10 * NUDGE)
            except TimeoutError:
                answer.close()  # later pings have gone out meanwhile
                return
            self._answered(conn)

    async def _call_once(self, op: str, fields: dict[str, Any], lane: str = CONTROL) -> Any:
        conn = await self._connection(lane)
        reply, answer = oneshot()
        timeout = self.config.timeout
        request = {"op": op, **fields, "reply": reply}
        started = time.monotonic()
        try:
            conn.entrypoint.send_nowait(request)
        except WouldBlock:
            # The service lets a connection send only so many requests ahead of those it
            # serves (--request-window): the wait for room counts in the timeout too.
            try:
                await asyncio.wait_for(conn.entrypoint.send(request), timeout)
            except TimeoutError:
                raise P.Unavailable(
                    f"{op!r} could not be sent within {timeout} s: the service is still busy "
                    "with this connection's earlier requests"
                ) from None
        try:
            left = max(0.0, timeout - (time.monotonic() - started))
            result = await self._nudged(conn, answer, left)
        except TimeoutError:
            answer.close()
            raise P.Unavailable(f"no answer to {op!r} within {timeout} s") from None
        return P.unwrap(result)

    async def call(
        self, op: str, *, idempotent: bool = True, lane: str = CONTROL, **fields: Any
    ) -> Any:
        """Send one request in ``lane`` and return its result (raises the service's error). A
        request that is not ``idempotent`` is sent once, on a connection proven alive."""
        if idempotent:
            return await self._retrying(lambda: self._call_once(op, fields, lane), lane)
        await self._live_connection(lane)
        return await self._call_once(op, fields, lane)


async def _close_quietly(conn: Connection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 5.0)
