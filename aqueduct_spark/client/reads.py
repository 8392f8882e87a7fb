"""Reading: plan a pinned version, scan its splits (resuming after a lost connection), or
read a whole dataset."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import cbor2
import pyarrow as pa

from aqueduct_core.api import channel
from aqueduct_core.errors import EndOfChannel
from aqueduct_spark import protocol as P
from aqueduct_spark.client.failures import Kind, classify
from aqueduct_spark.client.models import Plan, to_wire_filters
from aqueduct_spark.client.retry import Retrying, RetryPolicy
from aqueduct_spark.client.session import BULK, Session, log
from aqueduct_spark.protocol import parquet as PQ


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
        open_cost: int | None = None,
        min_tasks: int | None = None,
    ) -> Plan:
        """Pin a version and plan its scan: splits, and the tasks they are packed into (of
        about ``split_bytes``, each split counted ``open_cost`` larger; a small table spread
        over ``min_tasks``, the cores that will read it). None: the service's defaults."""
        r = await self.call(
            "plan",
            dataset=name,
            columns=list(columns) if columns is not None else None,
            filters=to_wire_filters(filter),
            version=version,
            timestamp=timestamp,
            split_bytes=split_bytes,
            open_cost=open_cost,
            min_tasks=min_tasks,
        )
        return Plan(
            r["dataset"],
            r["version"],
            P.schema_from_bytes(r["schema"]),
            r["splits"],
            r["rows"],
            r["bytes"],
            r.get("tasks"),
        )

    async def scan(
        self,
        split: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        schema: pa.Schema,
        columns: Sequence[str] | None = None,
        filter: Any = None,
        batch_rows: int | None = None,
    ) -> AsyncIterator[pa.RecordBatch]:
        """Stream one split's batches, or those of a list of splits (a plan's task) one
        after the other, cast by the service to ``schema``. Resumes after a lost connection
        from the first row not delivered, without repeating or skipping a row."""
        delivered = 0
        tries = Retrying(RetryPolicy.of(self.config))
        while True:
            held = self._held(BULK)
            try:
                async for batch in self._scan_once(
                    split, schema, columns, filter, batch_rows, delivered
                ):
                    delivered += batch.num_rows
                    yield batch
                return
            except BaseException as exc:
                # Refused for now (too many scans open on this connection: nothing was read,
                # the connection is fine) waits as the service asks, for up to ``timeout``;
                # a lost connection resumes on a new one, up to ``retries`` times in all.
                pause = self._pause(tries, exc, held, BULK)
                if pause is None:
                    raise
                if classify(exc) is Kind.TRANSIENT:
                    log.warning("scan interrupted (%s); resuming after row %d", exc, delivered)
                await asyncio.sleep(pause)

    async def _scan_once(
        self,
        split: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        schema: pa.Schema,
        columns: Sequence[str] | None,
        filter: Any,
        batch_rows: int | None,
        skip_rows: int,
    ) -> AsyncIterator[pa.RecordBatch]:
        """One scan request's batches, without its first ``skip_rows`` rows (a resumed
        scan's: those delivered already). The service leaves them out, and says so in its
        first data message (``skipped``); a service that predates the field sends them all,
        unconfirmed, and they are dropped here. Exact either way: a scan's rows come in the
        same order from every service process (``service.resume``)."""
        conn = await self._connection(BULK)  # the request carries the channel: same connection
        compression = P.Compression.parse(self.config.compression)
        headers = [
            (P.H_SCHEMA, P.schema_to_bytes(schema)),
            *P.request_headers(compression),
            *PQ.format_headers(self.config.decode),
        ]
        tx, rx = channel(headers=headers, codec="raw")
        first = split if isinstance(split, Mapping) else next(iter(split), {})
        await conn.entrypoint.send(
            {
                "op": "scan",
                "dataset": first.get("dataset"),  # what the service checks rights on
                **(
                    {"split": dict(split)}
                    if isinstance(split, Mapping)
                    else {"splits": [dict(s) for s in split]}
                ),
                "columns": list(columns) if columns is not None else None,
                "filters": to_wire_filters(filter),
                "batch_rows": batch_rows,
                "max_batch_bytes": self.config.max_batch_bytes,
                **({"skip_rows": skip_rows} if skip_rows else {}),
                "out": tx,
            }
        )
        skip, opening = skip_rows, True  # the first data message says what was skipped
        # row groups sent as stored, decoding on worker threads, oldest first: the next one
        # starts decoding while the one before is handed over (DECODE_AHEAD)
        decoding: deque[asyncio.Future[list[pa.RecordBatch]]] = deque()
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    delivery = await self._nudged(conn, rx.recv_message())
                except EndOfChannel:
                    delivery = None
                ready: list[pa.RecordBatch] = []
                if delivery is not None:
                    error = P.find_header(delivery.headers, P.H_ERROR)
                    if error is not None:
                        raise P.error_from_wire(cbor2.loads(error))
                    if opening:
                        opening = False
                        skip -= _confirmed(P.skipped_rows(delivery.headers), skip_rows)
                    stored = P.find_header(delivery.headers, P.H_PARQUET)
                    if stored is not None:
                        work = self._parquet_work(stored, delivery.value, schema, batch_rows)
                        decoding.append(loop.run_in_executor(None, work))
                    else:
                        ready.append(self._decode(delivery.value, schema))
                # in order: row groups sent before an Arrow batch, or before the end, first;
                # otherwise only the oldest once DECODE_AHEAD are decoding
                while decoding and (delivery is None or ready or len(decoding) >= DECODE_AHEAD):
                    for batch in await decoding.popleft():
                        kept, skip = _skipped(batch, skip)
                        if kept is not None:
                            yield kept
                for batch in ready:
                    kept, skip = _skipped(batch, skip)
                    if kept is not None:
                        yield kept
                if delivery is None:
                    return
        finally:
            for pending in decoding:
                pending.cancel()
            rx.close()

    def _parquet_work(
        self, header: bytes, payload: Any, schema: pa.Schema, batch_rows: int | None
    ) -> Callable[[], list[pa.RecordBatch]]:
        """A row group the service sent as stored (``protocol.parquet``), to check,
        decompress and decode on a worker thread (Arrow lets go of the GIL for all three)."""
        if self.config.decode != "auto":  # what offers Parquet (PQ.format_headers)
            raise P.InvalidRequest(
                "the service sent a row group as stored Parquet, which this client did not "
                "offer (decode=service); check that the URL is the dataset service you expect"
            )
        rows = batch_rows or PARQUET_BATCH_ROWS
        limit = self.config.max_batch_bytes

        def work() -> list[pa.RecordBatch]:
            message = PQ.read_parquet_message(header, payload, limit)
            return list(message.decode(schema, rows, limit))

        return work

    def _decode(self, payload: Any, schema: pa.Schema) -> pa.RecordBatch:
        """One data message of a scan, checked against this client's limit before anything
        is decompressed (a compressed message counts at the size it declares)."""
        message = P.read_data_message(payload)
        limit = self.config.max_batch_bytes
        if message.size > limit:
            raise P.InvalidRequest(
                f"the service sent a data message of {P.describe_size(message)}, over this "
                f"client's limit of {limit / 2**20:g} MiB for one data message (Spark option "
                "maxBatchBytes, ClientConfig.max_batch_bytes); raise it if the dataset holds "
                "rows this large, or check that the URL is the dataset service you expect"
            )
        return message.decode(schema)  # offsets checked: a service's lie is refused

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
        async for batch in self._scan_all(plan, columns, filter):
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
        batches = [batch async for batch in self._scan_all(plan, columns, filter)]
        return pa.Table.from_batches(batches, schema=plan.schema)

    async def _scan_all(
        self, plan: Plan, columns: Sequence[str] | None, filter: Any
    ) -> AsyncIterator[pa.RecordBatch]:
        for splits in plan.task_splits():
            task = splits[0] if len(splits) == 1 else splits
            async for batch in self.scan(task, schema=plan.schema, columns=columns, filter=filter):
                yield batch


PARQUET_BATCH_ROWS = 65536
"""Rows per batch decoded from stored Parquet when the scan leaves ``batch_rows`` to the
service (the service's own default)."""
DECODE_AHEAD = 2
"""Row groups sent as stored that a scan decodes at once (each on a worker thread, one
thread each): the next starts while the one before is handed over. A scan holds at most
this many row groups decoded."""


def _skipped(batch: pa.RecordBatch, skip: int) -> tuple[pa.RecordBatch | None, int]:
    """``batch`` without the first ``skip`` rows still to drop (what a service that predates
    ``skip_rows`` sent again), and what is left to drop."""
    if not skip:
        return batch, 0
    if batch.num_rows <= skip:
        return None, skip - batch.num_rows
    return batch.slice(skip), 0


def _confirmed(skipped: int, asked: int) -> int:
    """The rows a scan's service says it skipped, checked against those asked: never more
    (rows would be lost). Fewer is exact too: the rest are dropped here."""
    if skipped > asked:
        raise P.InvalidRequest(
            f"the service says it skipped {skipped} rows of a scan that asked it to skip "
            f"{asked}; rows would be lost: check that the URL is the dataset service you expect"
        )
    return skipped
