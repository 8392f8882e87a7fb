"""Python client of the dataset service, usable without Spark (and used by it).

:class:`AsyncClient` is the asyncio client. :class:`Client` is the blocking facade: one
event-loop thread per process runs every connection (the anyio "blocking portal" shape),
so Spark's synchronous ``read()``/``write()`` and plain scripts share a connection pool.

Reads, plans and other idempotent requests are retried with exponential backoff when the
connection is lost; a scan resumes where it stopped (a scan of a pinned version is
deterministic, so the batches already delivered are skipped). Writes are not retried here:
the Spark job retries the task, and only committed staged files ever become visible.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import random
import threading
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, TypeVar

import cbor2
import pyarrow as pa

from aqueduct_core.api import Connection, channel, oneshot
from aqueduct_core.errors import AqueductError, ChannelError, ConnectionLost, EndOfChannel
from aqueduct_core.transport import ClientTLS, TransportConfig, connect
from aqueduct_spark import protocol as P

log = logging.getLogger("aqueduct.client")
T = TypeVar("T")

DEFAULT_PORT = 4433
CHUNK_BYTES = 8 * 1024 * 1024
"""Batches bigger than this are sent as several slices (Arrow slices are zero-copy)."""


def parse_url(url: str) -> list[tuple[str, int]]:
    """``quic://host:port`` (or ``aqueduct://``, or bare ``host:port``), several separated
    by commas: the endpoints to try, in order."""
    endpoints = []
    for part in url.split(","):
        part = part.strip()
        for prefix in ("quic://", "aqueduct://"):
            if part.startswith(prefix):
                part = part[len(prefix) :]
        part = part.rstrip("/")
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep:
            host, port = part, str(DEFAULT_PORT)
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"cannot read the service address {url!r}: use quic://host:port "
                f"(several separated by commas)"
            )
        endpoints.append((host, int(port)))
    if not endpoints:
        raise ValueError("no service address given: use quic://host:port")
    return endpoints


@dataclass(frozen=True)
class ClientConfig:
    """How to reach and talk to a dataset service."""

    url: str
    token: str | None = None
    tls: ClientTLS = field(default_factory=ClientTLS)
    transport: TransportConfig = field(default_factory=TransportConfig)
    retries: int = 3
    """Attempts after the first for idempotent requests when the connection is lost."""
    retry_backoff: float = 0.2
    """First backoff in seconds (doubles each attempt, with jitter)."""
    timeout: float = 60.0
    """Seconds to wait for a reply to a request (not for a whole scan or write)."""
    compression: str = "none"
    """IPC body compression for data channels: none (best on loopback), lz4, zstd."""
    chunk_bytes: int = CHUNK_BYTES

    def __post_init__(self) -> None:
        if isinstance(self.transport, str):
            # transport="tcp" (or quic, auto): the choice alone, other settings default.
            object.__setattr__(self, "transport", TransportConfig(transport=self.transport))  # type: ignore[unreachable]


@dataclass(frozen=True)
class DatasetDescription:
    name: str
    version: int
    schema: pa.Schema
    partition_by: tuple[str, ...]
    rows: int
    bytes: int
    files: int
    created: Any = None
    updated: Any = None

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> DatasetDescription:
        return cls(
            d["name"],
            d["version"],
            P.schema_from_bytes(d["schema"]),
            tuple(d.get("partition_by") or ()),
            d["rows"],
            d["bytes"],
            d.get("files", 0),
            d.get("created"),
            d.get("updated"),
        )


@dataclass(frozen=True)
class Plan:
    """Splits of one pinned version; each split is scanned independently."""

    dataset: str
    version: int
    schema: pa.Schema
    splits: list[dict[str, Any]]
    rows: int
    bytes: int


@dataclass(frozen=True)
class Transaction:
    """A write in progress: tasks stage data under ``txn``; one commit publishes it."""

    dataset: str
    txn: str
    mode: str
    schema: pa.Schema
    partition_by: tuple[str, ...]
    base_version: int | None


def to_wire_filters(filters: Any) -> list[Any] | None:
    """Accept pyarrow-style ``[(column, op, value), ...]`` (AND) or the wire form."""
    if filters is None:
        return None
    out: list[Any] = []
    for f in filters:
        if isinstance(f, tuple) and len(f) in (2, 3) and isinstance(f[0], str):
            column, op = f[0], f[1]
            path = column.split(".") if isinstance(column, str) else list(column)
            if op in P.UNARY_OPS:
                out.append([op, path])
            else:
                value = list(f[2]) if op in ("in", "not in") and len(f) == 3 else f[2]
                if op == "not in":
                    out.append([P.NOT, ["in", path, value]])
                else:
                    out.append([{"=": "=="}.get(op, op), path, value])
        else:
            out.append(f)
    return out


def _is_connection_failure(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionLost | ConnectionError | OSError | asyncio.TimeoutError)


def _retry_after(exc: BaseException) -> float | None:
    """Seconds to wait when the service refused a request for now (``UNAVAILABLE`` with a
    ``retry_after`` detail: a per-connection limit was reached); None for other errors."""
    if isinstance(exc, P.Unavailable):
        after = exc.details.get("retry_after")
        if isinstance(after, int | float) and not isinstance(after, bool) and after >= 0:
            return float(after)
    return None


class AsyncClient:
    """An asyncio client for one dataset service (one connection, reopened as needed)."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._endpoints = parse_url(config.url)
        self._conn: Connection | None = None
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Future[None]] = set()

    async def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and not conn.is_closed:
            return conn
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed:
                return self._conn
            headers: list[tuple[bytes, bytes]] = [(P.H_VERSION, str(P.PROTOCOL_VERSION).encode())]
            if self.config.token:
                headers.append((P.H_TOKEN, self.config.token.encode()))
            errors = []
            for host, port in self._endpoints:
                try:
                    self._conn = await connect(
                        host,
                        port,
                        headers=headers,
                        tls=self.config.tls,
                        config=self.config.transport,
                    )
                    return self._conn
                except (ConnectionLost, OSError) as exc:
                    errors.append(str(exc))
            raise ConnectionLost("cannot reach the dataset service: " + "; ".join(errors)) from None

    async def close(self) -> None:
        if self._conn is not None and not self._conn.is_closed:
            self._conn.entrypoint.finish()
            await self._conn.close()
        self._conn = None

    @property
    def transport(self) -> str | None:
        """What carries the current connection (``quic`` or ``tcp``); None before one."""
        conn = self._conn
        return conn.transport if conn is not None else None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- requests ---------------------------------------------------------------------

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        delay = self.config.retry_backoff
        for n in range(self.config.retries + 1):
            try:
                return await attempt()
            except BaseException as exc:
                if not _is_connection_failure(exc) or n == self.config.retries:
                    raise
                log.warning("connection to the dataset service lost (%s); retrying", exc)
                self._conn = None
                await asyncio.sleep(delay * (1 + random.random()))
                delay *= 2
        raise AssertionError("unreachable")

    async def _call_once(self, op: str, fields: dict[str, Any]) -> Any:
        conn = await self._connection()
        reply, answer = oneshot()
        await conn.entrypoint.send({"op": op, **fields, "reply": reply})
        try:
            result = await asyncio.wait_for(answer, self.config.timeout)
        except TimeoutError:
            answer.close()
            raise P.Unavailable(f"no answer to {op!r} within {self.config.timeout} s") from None
        return P.unwrap(result)

    async def call(self, op: str, *, idempotent: bool = True, **fields: Any) -> Any:
        """Send one request and return its result (raises the service's error)."""
        if idempotent:
            return await self._retrying(lambda: self._call_once(op, fields))
        return await self._call_once(op, fields)

    async def list(self) -> list[DatasetDescription]:
        result = await self.call("list")
        return [DatasetDescription.from_wire(d) for d in result["datasets"]]

    async def describe(
        self, name: str, *, version: int | None = None, timestamp: Any = None
    ) -> DatasetDescription:
        return DatasetDescription.from_wire(
            await self.call("describe", dataset=name, version=version, timestamp=timestamp)
        )

    async def create(
        self,
        name: str,
        schema: pa.Schema,
        *,
        partition_by: Sequence[str] = (),
        exist_ok: bool = False,
    ) -> DatasetDescription:
        return DatasetDescription.from_wire(
            await self.call(
                "create",
                idempotent=False,
                dataset=name,
                schema=P.schema_to_bytes(schema),
                partition_by=list(partition_by),
                exist_ok=exist_ok,
            )
        )

    async def drop(self, name: str, *, if_exists: bool = False) -> bool:
        result = await self.call("drop", idempotent=False, dataset=name, if_exists=if_exists)
        return bool(result["dropped"])

    async def offsets(self, name: str, *, since_version: int | None = None) -> dict[str, Any]:
        return dict(await self.call("offsets", dataset=name, since_version=since_version))

    async def changes(self, name: str, version: int, *, missing_ok: bool = False) -> dict[str, Any]:
        """The files ``version`` added (split dicts, in a stable order). DataLoss if some are
        gone (vacuumed); with ``missing_ok`` their paths are in ``missing`` instead."""
        return dict(
            await self.call("changes", dataset=name, version=version, missing_ok=missing_ok)
        )

    async def subscribe(
        self,
        name: str,
        on_version: Callable[[int], None],
        on_state: Callable[[bool], None] = lambda alive: None,
    ) -> None:
        """Call ``on_version(v)`` with each newer version the service pushes, until
        cancelled; reconnects with backoff. ``on_state`` says whether pushes are flowing.

        The service re-sends the latest version as a heartbeat when nothing happened for a
        while (it says how often in each note): a subscription that hears nothing for three
        heartbeats is treated as dead (the service went away without a word, e.g. killed or
        restarted) and reconnects over a new connection."""
        delay = self.config.retry_backoff
        while True:
            alive = False
            try:
                conn = await self._connection()
                tx, rx = channel()
                await conn.entrypoint.send({"op": "subscribe", "dataset": name, "out": tx})
                silence: float | None = None  # until the first note says the heartbeat
                try:
                    while True:
                        try:
                            delivery = await asyncio.wait_for(rx.recv_message(), silence)
                        except TimeoutError:
                            # The connection is dead (the service cannot say so: a restarted
                            # one does not know it). Close it, so requests waiting on it fail
                            # and retry now on a new one instead of at the idle timeout.
                            log.info("subscription to %s went silent; reconnecting", name)
                            if self._conn is conn:
                                self._conn = None
                            closing = asyncio.ensure_future(_close_quietly(conn))
                            self._closing.add(closing)
                            closing.add_done_callback(self._closing.discard)
                            break
                        except EndOfChannel:
                            break
                        error = P.find_header(delivery.headers, P.H_ERROR)
                        if error is not None:
                            raise P.error_from_wire(cbor2.loads(error))
                        note = delivery.value
                        if isinstance(note, Mapping) and isinstance(note.get("version"), int):
                            beat = note.get("heartbeat")
                            if isinstance(beat, int | float) and beat > 0:
                                silence = 3 * float(beat)
                            if not alive:
                                alive = True
                                on_state(True)
                            on_version(note["version"])
                            delay = self.config.retry_backoff
                finally:
                    rx.close()
            except asyncio.CancelledError:
                on_state(False)
                raise
            except Exception as exc:  # anything else: report, back off, subscribe again
                log.info("subscription to %s interrupted (%s); retrying", name, exc)
                if _is_connection_failure(exc):
                    self._conn = None
            if alive:
                on_state(False)
            await asyncio.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 10.0)

    # -- reading ----------------------------------------------------------------------

    async def plan(
        self,
        name: str,
        *,
        columns: Sequence[str] | None = None,
        filter: Any = None,
        version: int | None = None,
        timestamp: Any = None,
        split_bytes: int | None = None,
    ) -> Plan:
        r = await self.call(
            "plan",
            dataset=name,
            columns=list(columns) if columns is not None else None,
            filters=to_wire_filters(filter),
            version=version,
            timestamp=timestamp,
            split_bytes=split_bytes,
        )
        return Plan(
            r["dataset"],
            r["version"],
            P.schema_from_bytes(r["schema"]),
            r["splits"],
            r["rows"],
            r["bytes"],
        )

    async def scan(
        self,
        split: Mapping[str, Any],
        *,
        schema: pa.Schema,
        columns: Sequence[str] | None = None,
        filter: Any = None,
        batch_rows: int | None = None,
    ) -> AsyncIterator[pa.RecordBatch]:
        """Stream one split's batches, cast by the service to ``schema``. Resumes after a
        lost connection without repeating or skipping a batch."""
        delivered = 0
        delay = self.config.retry_backoff
        failures = 0
        refused_until = None
        while True:
            try:
                async for batch in self._scan_once(
                    split, schema, columns, filter, batch_rows, delivered
                ):
                    delivered += 1
                    yield batch
                return
            except BaseException as exc:
                after = _retry_after(exc)
                if after is not None:
                    # Refused for now: too many scans open on this connection. Nothing was
                    # read, and the connection is fine; wait a turn, for up to ``timeout``.
                    now = asyncio.get_running_loop().time()
                    refused_until = refused_until or now + self.config.timeout
                    if now + after > refused_until:
                        raise
                    await asyncio.sleep(after * (1 + random.random()))
                    continue
                if not _is_connection_failure(exc) or failures >= self.config.retries:
                    raise
                failures += 1
                log.warning("scan interrupted (%s); resuming after batch %d", exc, delivered)
                self._conn = None
                await asyncio.sleep(delay * (1 + random.random()))
                delay *= 2

    async def _scan_once(
        self,
        split: Mapping[str, Any],
        schema: pa.Schema,
        columns: Sequence[str] | None,
        filter: Any,
        batch_rows: int | None,
        skip: int,
    ) -> AsyncIterator[pa.RecordBatch]:
        conn = await self._connection()
        headers = [
            (P.H_SCHEMA, P.schema_to_bytes(schema)),
            (P.H_COMPRESSION, self.config.compression.encode()),
        ]
        tx, rx = channel(headers=headers, codec="raw")
        await conn.entrypoint.send(
            {
                "op": "scan",
                "split": dict(split),
                "columns": list(columns) if columns is not None else None,
                "filters": to_wire_filters(filter),
                "batch_rows": batch_rows,
                "out": tx,
            }
        )
        seq = 0
        try:
            while True:
                try:
                    delivery = await rx.recv_message()
                except EndOfChannel:
                    return
                error = P.find_header(delivery.headers, P.H_ERROR)
                if error is not None:
                    raise P.error_from_wire(cbor2.loads(error))
                if seq >= skip:
                    yield P.batch_from_payload(delivery.value, schema)
                seq += 1
        finally:
            rx.close()

    async def read_batches(
        self,
        name: str,
        *,
        columns: Sequence[str] | None = None,
        filter: Any = None,
        version: int | None = None,
        timestamp: Any = None,
    ) -> AsyncIterator[pa.RecordBatch]:
        plan = await self.plan(
            name, columns=columns, filter=filter, version=version, timestamp=timestamp
        )
        for split in plan.splits:
            async for batch in self.scan(split, schema=plan.schema, columns=columns, filter=filter):
                yield batch

    async def read(
        self,
        name: str,
        *,
        columns: Sequence[str] | None = None,
        filter: Any = None,
        version: int | None = None,
        timestamp: Any = None,
    ) -> pa.Table:
        """The dataset (at a version or timestamp) as a Table, optionally projected and
        filtered on the service."""
        plan = await self.plan(
            name, columns=columns, filter=filter, version=version, timestamp=timestamp
        )
        batches = []
        for split in plan.splits:
            async for batch in self.scan(split, schema=plan.schema, columns=columns, filter=filter):
                batches.append(batch)
        return pa.Table.from_batches(batches, schema=plan.schema)

    # -- writing ----------------------------------------------------------------------

    async def begin(
        self,
        name: str,
        schema: pa.Schema,
        *,
        mode: str = "append",
        partition_by: Sequence[str] = (),
        overwrite_schema: bool = False,
    ) -> Transaction:
        r = await self.call(
            "begin",
            dataset=name,
            mode=mode,
            schema=P.schema_to_bytes(schema),
            partition_by=list(partition_by),
            overwrite_schema=overwrite_schema,
        )
        return Transaction(
            name,
            r["txn"],
            mode,
            P.schema_from_bytes(r["schema"]),
            tuple(r["partition_by"]),
            r["version"],
        )

    async def write_task(
        self,
        txn: Transaction,
        batches: Iterable[pa.RecordBatch] | AsyncIterator[pa.RecordBatch],
        *,
        task: str | None = None,
    ) -> dict[str, Any]:
        """Stage ``batches`` under ``txn``; returns what was staged (pass it to commit).
        Nothing is visible until the commit."""
        conn = await self._connection()
        target = txn.schema
        tx, rx = channel(headers=[(P.H_SCHEMA, P.schema_to_bytes(target))], codec="raw")
        reply, answer = oneshot()
        await conn.entrypoint.send(
            {
                "op": "write",
                "dataset": txn.dataset,
                "txn": txn.txn,
                "task": task or uuid.uuid4().hex[:12],
                "partition_by": list(txn.partition_by),
                "data": rx,
                "reply": reply,
            }
        )
        options = P.ipc_options(self.config.compression)
        seq = 0
        try:
            async for batch in _aiter(batches):
                batch = _conform(batch, target)
                for piece in _slices(batch, self.config.chunk_bytes):
                    await tx.send(
                        P.batch_to_payload(piece, options),
                        headers=[P.batch_header(piece.num_rows, seq)],
                    )
                    seq += 1
        except ChannelError:
            tx.cancel()
            # The service refused the data: its answer says why.
            raise_from_reply = await _answer_or_none(answer, self.config.timeout)
            if raise_from_reply is not None:
                P.unwrap(raise_from_reply)
            raise
        except BaseException:
            tx.cancel()
            answer.close()
            raise
        tx.finish()
        result = await asyncio.wait_for(answer, None)
        return dict(P.unwrap(result))

    async def commit(
        self,
        txn: Transaction,
        staged: Iterable[Mapping[str, Any]],
        *,
        app_id: str | None = None,
        app_version: int | None = None,
        overwrite_schema: bool = False,
    ) -> dict[str, Any]:
        """Publish every staged file of ``txn`` in one atomic commit. With ``app_id`` and
        ``app_version`` a repeated commit is a no-op (``committed`` is False)."""
        files = [f for task in staged for f in task["staged"]]
        fields = dict(
            dataset=txn.dataset,
            mode=txn.mode,
            schema=P.schema_to_bytes(txn.schema),
            partition_by=list(txn.partition_by),
            staged=files,
            app_id=app_id,
            app_version=app_version,
            overwrite_schema=overwrite_schema,
            # WriteSerializable: an overwrite replaces the version it began at, so appends
            # committed meanwhile are kept (-1: the dataset did not exist then)
            replaces=None
            if txn.mode != "overwrite"
            else (-1 if txn.base_version is None else txn.base_version),
        )
        return dict(await self.call("commit", idempotent=app_id is not None, **fields))

    async def abort(self, txn: Transaction, staged: Iterable[Mapping[str, Any]] = ()) -> int:
        files = [f for task in staged for f in task["staged"]]
        r = await self.call("abort", dataset=txn.dataset, txn=txn.txn, staged=files)
        return int(r["removed"])

    async def write(
        self,
        name: str,
        data: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch],
        *,
        mode: str = "append",
        partition_by: Sequence[str] = (),
        app_id: str | None = None,
        app_version: int | None = None,
    ) -> dict[str, Any]:
        """Write a table in one transaction (staged, then committed)."""
        if isinstance(data, pa.Table):
            schema, batches = data.schema, data.to_batches()
        elif isinstance(data, pa.RecordBatch):
            schema, batches = data.schema, [data]
        else:
            batches = list(data)
            if not batches:
                raise ValueError("no batches to write")
            schema = batches[0].schema
        txn = await self.begin(name, schema, mode=mode, partition_by=partition_by)
        try:
            staged = await self.write_task(txn, batches)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.abort(txn)
            raise
        return await self.commit(txn, [staged], app_id=app_id, app_version=app_version)

    async def append(self, name: str, data: Any, **kw: Any) -> dict[str, Any]:
        return await self.write(name, data, mode="append", **kw)

    async def overwrite(self, name: str, data: Any, **kw: Any) -> dict[str, Any]:
        return await self.write(name, data, mode="overwrite", **kw)


async def _close_quietly(conn: Connection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 5.0)


async def _answer_or_none(answer: Any, timeout: float) -> Any:
    try:
        return await asyncio.wait_for(answer, timeout)
    except (TimeoutError, AqueductError):
        return None


async def _aiter(items: Any) -> AsyncIterator[Any]:
    if hasattr(items, "__aiter__"):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.equals(schema, check_metadata=False):
        return batch
    try:
        return batch.select(schema.names).cast(schema)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise P.SchemaMismatch(
            f"this data does not match the dataset's schema: {exc}. Dataset schema: {schema}"
        ) from exc


def _slices(batch: pa.RecordBatch, limit: int) -> Iterator[pa.RecordBatch]:
    size = batch.nbytes
    if size <= limit or batch.num_rows <= 1:
        yield batch
        return
    rows = max(1, batch.num_rows * limit // size)
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)


# -- the blocking facade ----------------------------------------------------------------


class _Portal:
    """One event-loop thread per process; blocking callers submit coroutines to it."""

    _instance: _Portal | None = None
    _guard = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = _new_loop()
        self.thread = threading.Thread(target=self._run, name="aqueduct-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    @classmethod
    def get(cls) -> _Portal:
        with cls._guard:
            inst = cls._instance
            if inst is None or inst.pid != os.getpid():  # a fork has no loop thread
                inst = cls._instance = cls()
            return inst

    def run(self, coro: Awaitable[T]) -> T:
        if threading.current_thread() is self.thread:
            raise RuntimeError("blocking Client calls cannot run on the client's own loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        try:
            while True:
                try:
                    yield self.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            with contextlib.suppress(Exception):
                self.run(agen.aclose())  # type: ignore[attr-defined]


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()  # type: ignore[no-any-return]
    except ImportError:
        return asyncio.new_event_loop()


_pool: dict[ClientConfig, AsyncClient] = {}
_pool_pid = os.getpid()


def _pooled(config: ClientConfig) -> AsyncClient:
    global _pool_pid
    if _pool_pid != os.getpid():
        _pool.clear()
        _pool_pid = os.getpid()
    client = _pool.get(config)
    if client is None:
        client = _pool[config] = AsyncClient(config)
    return client


@atexit.register
def _close_pool() -> None:
    if _Portal._instance is None or _Portal._instance.pid != os.getpid():
        return
    portal = _Portal._instance
    for client in list(_pool.values()):
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(client.close(), portal.loop).result(5)
    _pool.clear()
    # Stop the loop thread before the interpreter tears modules down under it (a daemon thread
    # still running native code at exit can crash the process).
    portal.loop.call_soon_threadsafe(portal.loop.stop)
    portal.thread.join(5)


class Client:
    """Blocking client: the same methods as :class:`AsyncClient`, without ``await``.

    Clients with equal settings in one process share one pooled connection.
    """

    def __init__(
        self, url: str | None = None, *, config: ClientConfig | None = None, **options: Any
    ) -> None:
        if config is None:
            if url is None:
                raise ValueError("give the service url (quic://host:port) or a ClientConfig")
            config = ClientConfig(url, **options)
        self.config = config
        self._portal = _Portal.get()
        self._client = _pooled(config)

    def _run(self, coro: Awaitable[T]) -> T:
        return self._portal.run(coro)

    def list(self) -> list[DatasetDescription]:
        return self._run(self._client.list())

    def describe(self, name: str, **kw: Any) -> DatasetDescription:
        return self._run(self._client.describe(name, **kw))

    def create(self, name: str, schema: pa.Schema, **kw: Any) -> DatasetDescription:
        return self._run(self._client.create(name, schema, **kw))

    def drop(self, name: str, **kw: Any) -> bool:
        return self._run(self._client.drop(name, **kw))

    def offsets(self, name: str, **kw: Any) -> dict[str, Any]:
        return self._run(self._client.offsets(name, **kw))

    def changes(self, name: str, version: int, **kw: Any) -> dict[str, Any]:
        return self._run(self._client.changes(name, version, **kw))

    def subscribe(
        self, name: str, on_version: Callable[[int], None], on_state: Callable[[bool], None]
    ) -> Any:
        """Start a background subscription (see AsyncClient.subscribe); returns a future
        whose ``cancel()`` stops it. The callbacks run on the client's loop thread."""
        return asyncio.run_coroutine_threadsafe(
            self._client.subscribe(name, on_version, on_state), self._portal.loop
        )

    def plan(self, name: str, **kw: Any) -> Plan:
        return self._run(self._client.plan(name, **kw))

    def scan(self, split: Mapping[str, Any], **kw: Any) -> Iterator[pa.RecordBatch]:
        return self._portal.iterate(self._client.scan(split, **kw))

    def read_batches(self, name: str, **kw: Any) -> Iterator[pa.RecordBatch]:
        return self._portal.iterate(self._client.read_batches(name, **kw))

    def read(self, name: str, **kw: Any) -> pa.Table:
        return self._run(self._client.read(name, **kw))

    def begin(self, name: str, schema: pa.Schema, **kw: Any) -> Transaction:
        return self._run(self._client.begin(name, schema, **kw))

    def write_task(
        self, txn: Transaction, batches: Iterable[pa.RecordBatch], **kw: Any
    ) -> dict[str, Any]:
        return self._run(self._client.write_task(txn, _ThreadedBatches(batches), **kw))

    def commit(
        self, txn: Transaction, staged: Iterable[Mapping[str, Any]], **kw: Any
    ) -> dict[str, Any]:
        return self._run(self._client.commit(txn, list(staged), **kw))

    def abort(self, txn: Transaction, staged: Iterable[Mapping[str, Any]] = ()) -> int:
        return self._run(self._client.abort(txn, list(staged)))

    def write(self, name: str, data: Any, **kw: Any) -> dict[str, Any]:
        return self._run(self._client.write(name, data, **kw))

    def append(self, name: str, data: Any, **kw: Any) -> dict[str, Any]:
        return self._run(self._client.append(name, data, **kw))

    def overwrite(self, name: str, data: Any, **kw: Any) -> dict[str, Any]:
        return self._run(self._client.overwrite(name, data, **kw))

    @property
    def transport(self) -> str | None:
        """What carries the pooled connection (``quic`` or ``tcp``); None before one."""
        return self._client.transport

    def close(self) -> None:
        """Close this client's pooled connection (others with the same settings share it)."""
        client = _pool.pop(self.config, None)
        if client is not None:
            self._run(client.close())


class _ThreadedBatches:
    """Pull batches from a (possibly slow, blocking) iterator of the caller's thread without
    blocking the loop: each ``next`` runs in a worker thread."""

    def __init__(self, batches: Iterable[pa.RecordBatch]) -> None:
        self._it = iter(batches)

    def __aiter__(self) -> _ThreadedBatches:
        return self

    async def __anext__(self) -> pa.RecordBatch:
        item = await asyncio.to_thread(next, self._it, None)
        if item is None:
            raise StopAsyncIteration
        return item
