""":class:`AsyncClient`, the asyncio client: the requests about datasets, and the read,
write and push sides it inherits (``reads``, ``writes``, ``subscriptions``). With several
endpoints in its URL, scans and writes are spread over them (:mod:`.spread`, :mod:`.spreader`)."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from aqueduct_spark import protocol as P
from aqueduct_spark.client import frames
from aqueduct_spark.client.config import ClientConfig
from aqueduct_spark.client.models import DatasetInfo, Transaction
from aqueduct_spark.client.reads import Reads
from aqueduct_spark.client.spread import Preference
from aqueduct_spark.client.spreader import Spreader
from aqueduct_spark.client.subscriptions import Subscriptions
from aqueduct_spark.client.writes import Writes


class AsyncClient(Reads, Writes, Subscriptions):
    """An asyncio client for one dataset service (one connection, reopened as needed; with
    several endpoints, scans and writes spread over them)."""

    def __init__(self, config: ClientConfig) -> None:
        super().__init__(config)
        self._spreader = Spreader(self, self._endpoints) if len(self._endpoints) > 1 else None

    def scan(
        self,
        split: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        schema: pa.Schema,
        endpoint: Preference = None,
        **kw: Any,
    ) -> AsyncIterator[pa.RecordBatch]:
        """:meth:`Reads.scan`; with several endpoints, on the one that can take it soonest
        (``endpoint``: the index preferred when they are even, as a planner assigned it, or
        indices in the order preferred, as :func:`~.spread.plan_orders` gives them)."""
        if self._spreader is None:
            return super().scan(split, schema=schema, **kw)
        return self._spreader.scan(split, schema=schema, prefer=endpoint, **kw)

    async def write_task(
        self,
        txn: Transaction,
        batches: Iterable[pa.RecordBatch] | AsyncIterator[pa.RecordBatch],
        *,
        task: str | None = None,
        endpoint: int | None = None,
    ) -> dict[str, Any]:
        """:meth:`Writes.write_task`; with several endpoints, on the one that can take it
        soonest (``endpoint``: the index preferred when they are even)."""
        if self._spreader is None:
            return await super().write_task(txn, batches, task=task)
        size = sum(b.nbytes for b in batches) if isinstance(batches, list) else None
        return await self._spreader.write_task(txn, batches, task=task, prefer=endpoint, size=size)

    async def _write_whole(
        self,
        begin: Callable[[Writes], Awaitable[Transaction]],
        finish: Callable[[Writes, Transaction], Awaitable[dict[str, Any]]],
        size: int,
    ) -> dict[str, Any]:
        """:meth:`Writes.write`'s begin, data and commit; with several endpoints, all three
        at the one that can take the write soonest (so each process commits the writes it
        received, and the commits of many writers spread with their data)."""
        if self._spreader is None:
            return await super()._write_whole(begin, finish, size)
        return await self._spreader.write(begin, finish, size)

    async def close(self) -> None:
        if self._spreader is not None:
            await self._spreader.close()
        await super().close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def to_pandas(self, name: str, **kw: Any) -> Any:
        """:meth:`read` as a pandas DataFrame (same arguments)."""
        return frames.to_pandas(await self.read(name, **kw))

    async def to_polars(self, name: str, **kw: Any) -> Any:
        """:meth:`read` as a Polars DataFrame (same arguments; needs ``pip install polars``)."""
        return frames.to_polars(await self.read(name, **kw))

    async def list(self) -> list[DatasetInfo]:
        result = await self.call("list")
        return [DatasetInfo.from_wire(d) for d in result["datasets"]]

    async def status(self) -> dict[str, Any]:
        """The service process's own counts: staged, uncommitted bytes, expired
        transactions and the limits on them (``status`` in docs/dataset-protocol.md)."""
        return dict(await self.call("status"))

    async def describe(
        self, name: str, *, version: int | None = None, timestamp: Any = None
    ) -> DatasetInfo:
        return DatasetInfo.from_wire(
            await self.call("describe", dataset=name, version=version, timestamp=timestamp)
        )

    async def create(
        self,
        name: str,
        schema: pa.Schema,
        *,
        partition_by: Sequence[str] = (),
        exist_ok: bool = False,
    ) -> DatasetInfo:
        return DatasetInfo.from_wire(
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

    async def changes(
        self,
        name: str,
        version: int,
        *,
        missing_ok: bool = False,
        change_feed: bool = False,
        to_version: int | None = None,
    ) -> dict[str, Any]:
        """The files ``version`` added (split dicts, in a stable order) and how many it
        removed (``removes``); with ``change_feed``, its change-feed splits. DataLoss if some
        are gone (vacuumed); with ``missing_ok`` their paths are in ``missing`` instead. With
        ``to_version``, the same for every version up to it, under ``versions`` (a service
        that predates ranges answers for ``version`` alone, without ``versions``)."""
        return dict(
            await self.call(
                "changes",
                dataset=name,
                version=version,
                missing_ok=missing_ok,
                change_feed=change_feed or None,
                to_version=to_version,
            )
        )

    async def feed(
        self,
        name: str,
        *,
        starting_version: int | None = None,
        ending_version: int | None = None,
        starting_timestamp: Any = None,
        ending_timestamp: Any = None,
        change_feed: bool = False,
    ) -> dict[str, Any]:
        """What each version of a range did (inclusive; by number or commit time): per
        version its ``files`` to scan (the rows it added; with ``change_feed``, its change
        feed) and how many files it ``removes``. See ``docs/dataset-protocol.md``."""
        result = dict(
            await self.call(
                "feed",
                dataset=name,
                starting_version=starting_version,
                ending_version=ending_version,
                starting_timestamp=starting_timestamp,
                ending_timestamp=ending_timestamp,
                change_feed=change_feed,
            )
        )
        result["schema"] = P.schema_from_bytes(result["schema"])
        return result

    # -- maintenance (writes, as to rights) ---------------------------------------------

    async def compact(self, name: str, *, target_bytes: int | None = None) -> dict[str, Any]:
        """Rewrite small files into larger ones (a version with ``dataChange=false``)."""
        return dict(
            await self.call("compact", idempotent=False, dataset=name, target_bytes=target_bytes)
        )

    async def vacuum(
        self, name: str, *, retention_hours: float | None = None, dry_run: bool = False
    ) -> builtins.list[str]:
        """Delete files removed over ``retention_hours`` ago (default 7 days); their paths."""
        result = await self.call(
            "vacuum",
            idempotent=False,
            dataset=name,
            retention_hours=retention_hours,
            dry_run=dry_run,
        )
        return list(result["removed"])

    async def restore(self, name: str, version: int) -> dict[str, Any]:
        """Make the data what it was at ``version``, as a new version."""
        return dict(await self.call("restore", idempotent=False, dataset=name, version=version))

    async def delete(self, name: str, predicate: str) -> dict[str, Any]:
        """Delete the rows where the SQL ``predicate`` holds, as a new version."""
        return dict(await self.call("delete", idempotent=False, dataset=name, predicate=predicate))
