"""Reading: plan a pinned version, scan its splits (resuming after a lost connection), or
read a whole dataset."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import cbor2
import pyarrow as pa

from aqueduct_core.api import channel
from aqueduct_core.errors import EndOfChannel
from aqueduct_spark import protocol as P
from aqueduct_spark.client.models import Plan, to_wire_filters
from aqueduct_spark.client.session import Session, _is_connection_failure, _retry_after, log


class Reads(Session):
    """The read side of :class:`~aqueduct_spark.client.AsyncClient`."""

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
