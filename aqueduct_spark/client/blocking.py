"""The blocking facade: :class:`Client`, one event-loop thread per process that runs every
connection (the anyio "blocking portal" shape), and the pool of connections it shares."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import pyarrow as pa

from aqueduct_spark.client.aio import AsyncClient
from aqueduct_spark.client.config import ClientConfig
from aqueduct_spark.client.models import DatasetDescription, Plan, Transaction

T = TypeVar("T")


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

        return uvloop.new_event_loop()
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
