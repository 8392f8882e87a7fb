"""Spreading work over the endpoints of a URL that names several service processes.

A URL such as ``quic://svc1:4433,quic://svc2:4433,quic://svc3:4433`` names processes that
serve one root. Requests about datasets (plan, begin, commit, describe...) go to the first
that answers, in order (:mod:`.connecting`). The bulk of the bytes does not: each scan (a
read task's splits) and each ``write_task`` (a writer's data) goes to the endpoint that can
take it soonest, as this process sees it (:class:`Spread`), and so does a whole ``write``
(its begin, data and commit: :meth:`Spreader.write`), so that each process commits the
writes it received:

- **least outstanding bytes**: each endpoint counts the bytes of the work this process has
  under way there (a scan's planned bytes; a write's size when known, else the mean of the
  writes that finished; a whole write's until its commit is answered), and the next piece
  goes where that sum, with the new piece, is smallest. A host that moves bytes slower, or
  commits slower, keeps its work longer, so it gets less;
- **ties** (nothing under way, as in a Spark task's process at the start of each task) go to
  the endpoint the caller prefers (the planner's choice: the Spark reader assigns each task
  on the driver by the same rule, over the tasks' bytes), else to one picked at random, so
  processes that start together do not all pick the first. The planner also gives each
  task the endpoint it moves to if its own fails (:func:`plan_orders`): the tasks of one
  host go to all the others, spread by bytes, so a host lost mid-read leaves its work to
  every survivor, not all to the next one in the list (each task's process decides alone);
- **an endpoint that fails** (its connection lost, nothing answering) is avoided for
  :data:`AVOID` seconds, doubling with each failure in a row up to :data:`AVOID_MAX`, then
  tried again; one success clears it. When every endpoint is being avoided, the one whose
  pause ends first is tried.

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
pinned version's split reads the same rows in the same order on every process); a write is
redirected only if its endpoint fails before any of its data went out (the data is consumed
as it is sent; after that the failure is the caller's, as with one endpoint: Spark retries
the task, and staged files of a failed attempt are never committed).

The state is per process and per URL (:func:`spread_for`): every client of one URL shares
what it learned of the endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pyarrow as pa

from aqueduct_core.errors import ConnectionLost
from aqueduct_spark.client.failures import Kind, classify
from aqueduct_spark.client.retry import Retrying, RetryPolicy
from aqueduct_spark.client.session import BULK, CONTROL
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
        skip: int,
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
Preference = int | Sequence[int] | None
"""An endpoint a piece of work prefers when the endpoints are even (its index), or several
in the order preferred (:func:`plan_orders`)."""

AVOID = 1.0
"""Seconds an endpoint that just failed is avoided (doubled per failure in a row)."""
AVOID_MAX = 30.0
"""The longest an endpoint is avoided before it is tried again."""
STALL = 3.0
"""Seconds a connection may stay silent (no data, no answer to pings) while a scan waits on
it before the scan moves to another endpoint (a mistake costs a resumed scan). Writes are
not watched so: one fails once its data went out, and a service busy staging a large write
on a loaded machine can be silent longer than this."""
PING_AFTER = 0.5
"""Seconds of silence after which the waiting work pings the connection."""
UNKNOWN_SIZE = 1 << 20
"""Bytes counted for a piece of work of unknown size before any finished."""
_FAILOVER = (Kind.TRANSIENT, Kind.UNREACHABLE)
"""Failures that say the endpoint, not the request, is the problem."""


@dataclass
class _State:
    outstanding: int = 0
    leases: int = 0
    done: int = 0
    failures: int = 0
    avoid_until: float = 0.0


class Lease:
    """One piece of work under way at an endpoint: counted there until :meth:`end`."""

    def __init__(self, spread: Spread, index: int, size: int) -> None:
        self.spread, self.index, self.size = spread, index, size
        self.moved: int | None = None
        """Bytes the work moved, when known at the end (a write's): teaches the mean."""
        self._open = True

    def end(self) -> None:
        if self._open:
            self._open = False
            self.spread._ended(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


class Spread:
    """Which of ``endpoints`` gets the next piece of work (see the module's docstring).
    Not thread-safe: used from one event loop (the client's)."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.endpoints = list(endpoints)
        self._state = [_State() for _ in self.endpoints]
        self._clock = clock
        self._rng = rng or random.Random()
        self._sizes = (0, 0)  # finished work of unknown size: count, bytes

    def __len__(self) -> int:
        return len(self.endpoints)

    def outstanding(self) -> list[int]:
        """Bytes under way at each endpoint."""
        return [s.outstanding for s in self._state]

    def done(self) -> list[int]:
        """Pieces of work each endpoint finished (failed ones included)."""
        return [s.done for s in self._state]

    def avoided(self) -> list[bool]:
        """Whether each endpoint is being avoided now."""
        now = self._clock()
        return [s.avoid_until > now for s in self._state]

    def guess(self, size: int | None) -> int:
        """``size``, or for work of unknown size the mean of such work that finished."""
        if size is not None:
            return max(0, size)
        count, total = self._sizes
        return total // count if count else UNKNOWN_SIZE

    def pick(
        self,
        size: int | None = None,
        prefer: Preference = None,
        exclude: Iterable[int] = (),
    ) -> int | None:
        """The endpoint (its index) for a piece of ``size`` bytes: the usable one with the
        least outstanding bytes after it; ties to ``prefer`` (an index, or indices in the
        order preferred), then the next ones after it (a random start without one). None
        when every endpoint is excluded."""
        n = len(self.endpoints)
        skip = set(exclude)
        left = [i for i in range(n) if i not in skip]
        if not left:
            return None
        now = self._clock()
        usable = [i for i in left if self._state[i].avoid_until <= now]
        if not usable:  # all are being avoided: try the one whose pause ends first
            return min(left, key=lambda i: self._state[i].avoid_until)
        order = [prefer] if isinstance(prefer, int) else list(prefer or ())
        start = order[0] % n if order else self._rng.randrange(n)
        rank = {i % n: r for r, i in reversed(list(enumerate(order)))}
        add = self.guess(size)
        return min(
            usable,
            key=lambda i: (
                self._state[i].outstanding + add,
                self._state[i].leases,
                rank.get(i, len(order)),
                (i - start) % n,
            ),
        )

    def lease(self, index: int, size: int | None = None) -> Lease:
        """Count a piece of work at endpoint ``index`` until the lease ends."""
        lease = Lease(self, index, self.guess(size))
        if size is None:
            lease.moved = 0
        state = self._state[index]
        state.outstanding += lease.size
        state.leases += 1
        return lease

    def _ended(self, lease: Lease) -> None:
        state = self._state[lease.index]
        state.outstanding -= lease.size
        state.leases -= 1
        state.done += 1
        if lease.moved:
            count, total = self._sizes
            self._sizes = (count + 1, total + lease.moved)

    def failed(self, index: int) -> None:
        """Endpoint ``index`` failed: avoid it for a while (longer after each failure)."""
        state = self._state[index]
        state.failures += 1
        pause = min(AVOID * 2.0 ** (state.failures - 1), AVOID_MAX)
        state.avoid_until = self._clock() + pause

    def succeeded(self, index: int) -> None:
        """Endpoint ``index`` did its work: it is no longer avoided."""
        state = self._state[index]
        state.failures = 0
        state.avoid_until = 0.0


def assign(sizes: Sequence[int], endpoints: int) -> list[int]:
    """The endpoint for each piece of work of ``sizes`` bytes, all under way together: each
    in turn to the least loaded (the planner's use of :class:`Spread`, on the driver)."""
    plan = Spread([Endpoint("", 0)] * endpoints, rng=random.Random(0))
    chosen: list[int] = []
    for size in sizes:
        index = plan.pick(size, prefer=len(chosen))
        assert index is not None
        plan.lease(index, size)
        chosen.append(index)
    return chosen


def plan_orders(sizes: Sequence[int], endpoints: int) -> list[tuple[int, ...]]:
    """Each task's endpoints in the order it prefers them (the planner's, on the driver):
    first its home (:func:`assign`), then the endpoint it moves to if its home fails. The
    tasks of one home are spread over the others by bytes, like the homes themselves: a host
    lost mid-read hands its tasks (those cut, those not begun) to all the survivors, not to
    one. Every process of a read works alone, so this rule is what keeps them apart."""
    homes = assign(sizes, endpoints)
    fallback = [0] * len(sizes)
    for home in range(endpoints):
        mine = [t for t, h in enumerate(homes) if h == home]
        others = [(home + 1 + j) % endpoints for j in range(endpoints - 1)]
        if not others:
            continue
        for t, j in zip(mine, assign([sizes[t] for t in mine], len(others)), strict=True):
            fallback[t] = others[j]
    orders = []
    for t, home in enumerate(homes):
        rest = [(home + j) % endpoints for j in range(1, endpoints)]
        rest = [i for i in rest if i != fallback[t]]
        orders.append((home, fallback[t], *rest) if endpoints > 1 else (home,))
    return orders


_spreads: dict[tuple[Endpoint, ...], Spread] = {}
_spreads_pid = os.getpid()


def spread_for(endpoints: Sequence[Endpoint]) -> Spread:
    """This process's :class:`Spread` of ``endpoints`` (shared by its clients of that URL)."""
    global _spreads_pid
    if _spreads_pid != os.getpid():  # a forked child learns for itself
        _spreads.clear()
        _spreads_pid = os.getpid()
    key = tuple(endpoints)
    found = _spreads.get(key)
    if found is None:
        found = _spreads[key] = Spread(key)
    return found


def split_bytes(split: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> int | None:
    """The planned bytes of a split or of a task's splits (None if the plan gave none)."""
    splits = [split] if isinstance(split, Mapping) else list(split)
    sizes = [s.get("bytes") for s in splits]
    if not sizes or any(not isinstance(b, int) for b in sizes):
        return None
    return sum(b for b in sizes if isinstance(b, int))


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
            skip = rows
            client = self.client(index)
            scan = client._scan_once(split, schema, columns, filter, batch_rows, 0)
            try:
                with self.spread.lease(index, size):
                    while True:
                        try:
                            batch = await self._watched(client, scan.__anext__())
                        except StopAsyncIteration:
                            break
                        if skip:
                            if batch.num_rows <= skip:
                                skip -= batch.num_rows
                                continue
                            batch, skip = batch.slice(skip), 0
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
