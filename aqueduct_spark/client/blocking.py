"""The blocking facade: :class:`Client`, whose calls run on the process's event-loop thread
(the anyio "blocking portal" shape) over the connection pool of :mod:`.pool`."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from aqueduct_spark.client import frames
from aqueduct_spark.client.config import ClientConfig
from aqueduct_spark.client.models import DatasetInfo, Plan, Transaction
from aqueduct_spark.client.pool import Portal, pooled, unpool

T = TypeVar("T")


class Client:
    """Blocking client: the same methods as :class:`AsyncClient`, without ``await``.

    Clients with equal settings in one process share one pooled connection.
    """

    def __init__(
        self, url: str | None = None, *, config: ClientConfig | None = None, **options: Any
    ) -> None:
        if config is None:
            config = ClientConfig.from_environment(url, **options)
        self.config = config
        self._portal = Portal.get()
        self._client = pooled(config)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Awaitable[T]) -> T:
        return self._portal.run(coro)

    def list(self) -> list[DatasetInfo]:
        return self._run(self._client.list())

    def status(self) -> dict[str, Any]:
        return self._run(self._client.status())

    def describe(self, name: str, **kw: Any) -> DatasetInfo:
        return self._run(self._client.describe(name, **kw))

    def create(self, name: str, schema: pa.Schema, **kw: Any) -> DatasetInfo:
        return self._run(self._client.create(name, schema, **kw))

    def drop(self, name: str, **kw: Any) -> bool:
        return self._run(self._client.drop(name, **kw))

    def offsets(self, name: str, **kw: Any) -> dict[str, Any]:
        return self._run(self._client.offsets(name, **kw))

    def changes(self, name: str, version: int, **kw: Any) -> dict[str, Any]:
        return self._run(self._client.changes(name, version, **kw))

    def feed(self, name: str, **kw: Any) -> dict[str, Any]:
        return self._run(self._client.feed(name, **kw))

    def compact(self, name: str, **kw: Any) -> dict[str, Any]:
        return self._run(self._client.compact(name, **kw))

    def vacuum(self, name: str, **kw: Any) -> builtins.list[str]:
        return self._run(self._client.vacuum(name, **kw))

    def restore(self, name: str, version: int) -> dict[str, Any]:
        return self._run(self._client.restore(name, version))

    def delete(self, name: str, predicate: str) -> dict[str, Any]:
        return self._run(self._client.delete(name, predicate))

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

    def scan(
        self, split: Mapping[str, Any] | Sequence[Mapping[str, Any]], **kw: Any
    ) -> Iterator[pa.RecordBatch]:
        return self._portal.iterate(self._client.scan(split, **kw))

    def read_batches(self, name: str, **kw: Any) -> Iterator[pa.RecordBatch]:
        return self._portal.iterate(self._client.read_batches(name, **kw))

    def read(self, name: str, **kw: Any) -> pa.Table:
        return self._run(self._client.read(name, **kw))

    def to_pandas(self, name: str, **kw: Any) -> Any:
        """:meth:`read` as a pandas DataFrame (same arguments)."""
        return frames.to_pandas(self.read(name, **kw))

    def to_polars(self, name: str, **kw: Any) -> Any:
        """:meth:`read` as a Polars DataFrame (same arguments; needs ``pip install polars``)."""
        return frames.to_polars(self.read(name, **kw))

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
        """What carries the control lane's pooled connection (``quic`` or ``tcp``), else the
        bulk lane's; None before one."""
        return self._client.transport

    @property
    def transports(self) -> dict[str, str]:
        """What carries each lane with an open connection (``{"control": "quic", "bulk":
        "tcp"}``; see ``docs/python-client.md``, "QUIC or TCP")."""
        return self._client.transports

    def close(self) -> None:
        """Close this client's pooled connection (others with the same settings share it)."""
        client = unpool(self.config)
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
