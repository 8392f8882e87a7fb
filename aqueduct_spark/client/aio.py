""":class:`AsyncClient`, the asyncio client: the requests about datasets, and the read,
write and push sides it inherits (``reads``, ``writes``, ``subscriptions``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from aqueduct_spark import protocol as P
from aqueduct_spark.client import frames
from aqueduct_spark.client.models import DatasetDescription
from aqueduct_spark.client.reads import Reads
from aqueduct_spark.client.subscriptions import Subscriptions
from aqueduct_spark.client.writes import Writes


class AsyncClient(Reads, Writes, Subscriptions):
    """An asyncio client for one dataset service (one connection, reopened as needed)."""

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
