"""Doing the bulk work of a client whose URL names several endpoints, where
:class:`~.spread.Spread` chooses: a client per endpoint, each scan and write on the endpoint
chosen for it, and what happens when that endpoint fails.

A service that dies is noticed at once over TLS/TCP (the bulk lane's transport by default:
its kernel ends the connection). QUIC ignores ICMP errors after the handshake (a forged one
could end a connection), so over QUIC, and for a host that hangs, a scan waiting on a
connection that has answered nothing for :data:`STALL` seconds (no data, no reply to the
pings sent while it is silent) moves on; a write waits for the transport's verdict. Sooner,
after :data:`PING_AFTER` s of such silence, when the host answered the pings with an ICMP
unreachable (``Connection.unreachable_at``: the service process died, its host is up): the
error alone proves nothing (anyone on the path can forge one, and the connection stays
open), but with the silence it is the host's word; a forged one costs a resumed scan.

A scan that loses its endpoint resumes on another from the first row it has not delivered (a
pinned version's split reads the same rows in the same order on every process): the service
leaves out the rows before it, unread where it can and never sent (``skip_rows``: a service
that predates it sends them, and they are dropped here); a write is
redirected only if its endpoint fails before any of its data went out (the data is consumed
as it is sent; after that the failure is the caller's, as with one endpoint: Spark retries
the task, and staged files of a failed attempt are never committed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pyarrow as pa

from aqueduct_core.errors import ConnectionLost
from aqueduct_spark.client.failures import Kind, classify
from aqueduct_spark.client.retry import Retrying, RetryPolicy
from aqueduct_spark.client.session import BULK, CONTROL
from aqueduct_spark.client.spread import Lease, Preference, split_bytes, spread_for
from aqueduct_spark.client.urls import Endpoint

if TYPE_CHECKING:
    import weakref

    from aqueduct_core.api import Connection
    from aqueduct_spark.client.config import ClientConfig
    from aqueduct_spark.client.models import Transaction


class BulkClient(Protocol):
    """What a spreader uses of :class:`~aqueduct_spark.client.AsyncClient` (which imports
    this module): its session's connection state and its bulk requests."""

    config: ClientConfig
    _reached: bool
    _had: set[str]
    _heard: weakref.WeakKeyDictionary[Connection, float]

    def __init__(self, config: ClientConfig) -> None: ...
    def _held(self, lane: str = ...) -> Connection | None: ...
    def _nudge(self, conn: Connection) -> None: ...
    async def _live_connection(self, lane: str = ...) -> Connection: ...
    def _scan_once(
        self,
        split: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        schema: pa.Schema,
        columns: Sequence[str] | None,
        filter: Any,
        batch_rows: int | None,
        skip_rows: int,
    ) -> AsyncIterator[pa.RecordBatch]: ...
    async def write_task(
        self,
        txn: Transaction,
        batches: Iterable[pa.RecordBatch] | AsyncIterator[pa.RecordBatch],
        *,
        task: str | None = None,
    ) -> dict[str, Any]: ...
    async def close(self) -> None: ...


log = logging.getLogger("aqueduct.client")
T = TypeVar("T")
STALL = 3.0
"""Seconds a connection may stay silent (no data, no answer to pings) while a scan waits on
it before the scan moves to another endpoint (a mistake costs a resumed scan). Writes are
not watched so: one fails once its data went out, and a service busy staging a large write
on a loaded machine can be silent longer than this."""
PING_AFTER = 0.5
"""Seconds of silence after which the waiting work pings the connection."""
_FAILOVER = (Kind.TRANSIENT, Kind.UNREACHABLE)
"""Failures that say the endpoint, not the request, is the problem."""


def _went_away(client: BulkClient) -> bool:
    """Whether ``client``'s bulk connection went away, or every connection it had did."""
    if client._held(BULK) is not None or not client._reached:
        return False
    return BULK in client._had or client._held(CONTROL) is None


class Spreader:
    """The bulk work of one :class:`~aqueduct_spark.client.AsyncClient` whose URL names
    several endpoints: a client of each endpoint (made when first needed, dropped when its
    endpoint fails), chosen per piece of work by the process's :class:`Spread`."""

    def __init__(self, owner: BulkClient, endpoints: Sequence[Endpoint]) -> None:
        self.owner = owner
        self.spread = spread_for(endpoints)
        self._clients: dict[int, BulkClient] = {}
        self._closing: set[asyncio.Future[None]] = set()

    def client(self, index: int) -> BulkClient:
        """The client of endpoint ``index``. It makes one connection attempt round (the
        spread does the retrying, elsewhere); one whose connection went away is replaced,
        so that a dead endpoint fails at once instead of being waited for. A client that holds
        only its control connection (a whole write between its begin and its data) has lost
        nothing: replacing it would close it under that write."""
        found = self._clients.get(index)
        if found is not None and _went_away(found):
            self.drop(index, found)
            found = None
        if found is None:
            config = replace(self.owner.config, url=str(self.spread.endpoints[index]), retries=0)
            found = self._clients[index] = type(self.owner)(config)
        return found

    def drop(self, index: int, found: BulkClient) -> None:
        """Forget endpoint ``index``'s client ``found`` and close it in the background; a
        newer client made there meanwhile (another piece of work's) is left alone."""
        if self._clients.get(index) is found:
            del self._clients[index]
            closing = asyncio.ensure_future(_close_quietly(found))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def _failed(self, index: int, client: BulkClient, exc: BaseException, what: str) -> None:
        self.spread.failed(index)
        self.drop(index, client)
        log.warning(
            "%s at %s failed (%s); avoiding it for a while",
            what,
            self.spread.endpoints[index],
            exc,
        )

    async def _watched(self, client: BulkClient, step: Awaitable[T]) -> T:
        """Await ``step`` (a scan's next batch on ``client``'s bulk connection), pinging the
        connection while it is silent; ConnectionLost once it has answered nothing for
        :data:`STALL` s."""
        stall = STALL
        task = asyncio.ensure_future(step)
        since = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=PING_AFTER / 2)
                if done:
                    return task.result()
                conn = client._held(BULK)
                if conn is None:
                    continue  # still connecting: that has its own timeout
                heard = client._heard.get(conn)  # time.monotonic(), as Session keeps it
                last = since if heard is None else max(since, heard)
                silent = time.monotonic() - last
                if silent >= stall:
                    raise ConnectionLost(f"no answer for {stall:g} s")
                told = conn.unreachable_at
                if silent >= PING_AFTER and told is not None and told >= last:
                    raise ConnectionLost(
                        f"no answer for {silent:.1f} s, and its host says nothing listens "
                        "there any more (ICMP unreachable)"
                    )
                if silent >= PING_AFTER:
                    client._nudge(conn)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def scan(
        self,
        split: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        schema: pa.Schema,
        columns: Sequence[str] | None = None,
        filter: Any = None,
        batch_rows: int | None = None,
        prefer: Preference = None,
    ) -> AsyncIterator[pa.RecordBatch]:
        """:meth:`Reads.scan` on the endpoint that can take it, resumed on another from
        the first row not delivered if that endpoint fails."""
        size = split_bytes(split)
        rows = 0
        attempts = _Attempts(self, size, prefer)
        while True:
            index = await attempts.next()
            client = self.client(index)
            # from the first row not delivered: the service leaves out those before it
            scan = client._scan_once(split, schema, columns, filter, batch_rows, rows)
            try:
                with self.spread.lease(index, size):
                    while True:
                        try:
                            batch = await self._watched(client, scan.__anext__())
                        except StopAsyncIteration:
                            break
                        rows += batch.num_rows
                        yield batch
                self.spread.succeeded(index)
                return
            except Exception as exc:
                kind = classify(exc)
                if kind not in _FAILOVER and not (kind is Kind.WAIT and attempts.others()):
                    raise
                if kind in _FAILOVER:
                    self._failed(index, client, exc, f"a scan (resuming after row {rows})")
                attempts.missed(index, exc)
            finally:
                closing = getattr(scan, "aclose", None)  # an async generator's
                if closing is not None:
                    with contextlib.suppress(BaseException):
                        await closing()

    async def write_task(
        self,
        txn: Transaction,
        batches: Iterable[pa.RecordBatch] | AsyncIterator[pa.RecordBatch],
        *,
        task: str | None = None,
        prefer: int | None = None,
        size: int | None = None,
    ) -> dict[str, Any]:
        """:meth:`Writes.write_task` on the endpoint that can take it; on another if that
        one fails before any data went out."""
        counted = _Counted()

        async def send(client: BulkClient, _: object, lease: Lease) -> dict[str, Any]:
            try:
                return await client.write_task(txn, _counting(batches, counted), task=task)
            finally:
                if size is None:
                    lease.moved = counted.bytes

        return await self._placed(size, prefer, lambda c: c._live_connection(BULK), send, "a write")

    async def write(
        self,
        begin: Callable[[Any], Awaitable[Transaction]],
        finish: Callable[[Any, Transaction], Awaitable[T]],
        size: int,
    ) -> T:
        """A whole write (``begin``, then ``finish``: its data and commit) at the endpoint
        that can take it, counted there until its commit is answered: a process slow to
        commit keeps its writes longer, so it gets fewer. On another endpoint if ``begin``
        fails there (nothing is staged yet); a failure after that is the caller's."""

        async def then(client: BulkClient, txn: Transaction, _: Lease) -> T:
            return await finish(client, txn)

        return await self._placed(size, None, begin, then, "a write's begin")

    async def _placed(
        self,
        size: int | None,
        prefer: int | None,
        first: Callable[[Any], Awaitable[Any]],
        then: Callable[[Any, Any, Lease], Awaitable[T]],
        what: str,
    ) -> T:
        """``first`` at the endpoint that can take the write (nothing sent yet: on another
        if it fails there), then ``then`` at the same one; counted there from the choice on
        (writes chosen meanwhile see this one under way) until ``then`` ends. A failure in
        ``then`` is the caller's."""
        attempts = _Attempts(self, size, prefer)
        while True:
            index = await attempts.next()
            client = self.client(index)
            with self.spread.lease(index, size) as lease:
                try:
                    got = await first(client)
                except Exception as exc:
                    if classify(exc) not in _FAILOVER:
                        raise
                    self._failed(index, client, exc, what)
                    attempts.missed(index, exc)
                    continue
                try:
                    result = await then(client, got, lease)
                except Exception as exc:
                    if classify(exc) in _FAILOVER:
                        self._failed(index, client, exc, "a write")
                    raise
            self.spread.succeeded(index)
            return result

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for found in clients:
            await found.close()
        if self._closing:
            await asyncio.wait(list(self._closing))


class _Attempts:
    """The endpoints one piece of work tried: the next to try, and a pause (under the
    client's ``retries``) once every endpoint failed it."""

    def __init__(self, spreader: Spreader, size: int | None, prefer: Preference) -> None:
        self.spread = spreader.spread
        self.size, self.prefer = size, prefer
        self.tried: set[int] = set()
        self.tries = Retrying(RetryPolicy.of(spreader.owner.config))
        self.last: BaseException | None = None

    async def next(self) -> int:
        while True:
            index = self.spread.pick(self.size, self.prefer, self.tried)
            if index is not None:
                return index
            assert self.last is not None
            pause = self.tries.delay(self.last)
            if pause is None:
                raise self.last
            await asyncio.sleep(pause)
            self.tried.clear()

    def missed(self, index: int, exc: BaseException) -> None:
        self.tried.add(index)
        self.last = exc

    def others(self) -> bool:
        """Whether an endpoint not tried yet remains."""
        return len(self.tried) + 1 < len(self.spread)


class _Counted:
    """The bytes of a write's batches, counted as they are sent (:func:`_counting`)."""

    bytes = 0


async def _counting(
    batches: Iterable[pa.RecordBatch] | AsyncIterator[pa.RecordBatch], counted: _Counted
) -> AsyncIterator[pa.RecordBatch]:
    if isinstance(batches, AsyncIterator):
        async for batch in batches:
            counted.bytes += batch.nbytes
            yield batch
    else:
        for batch in batches:
            counted.bytes += batch.nbytes
            yield batch


async def _close_quietly(client: BulkClient) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.close(), 5.0)
