"""Writing: begin a transaction, stage data from any number of tasks, commit it once (or
abort it); and ``write``, which does all of that for one table."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any

import pyarrow as pa

from aqueduct_core.api import Connection, channel, oneshot
from aqueduct_core.errors import AqueductError, ChannelError
from aqueduct_spark import protocol as P
from aqueduct_spark.client import frames
from aqueduct_spark.client.config import JOIN_WAIT
from aqueduct_spark.client.models import Transaction
from aqueduct_spark.client.session import BULK, Session


class Writes(Session):
    """The write side of :class:`~aqueduct_spark.client.AsyncClient`."""

    async def begin(
        self,
        name: str,
        schema: pa.Schema,
        *,
        mode: str = "append",
        partition_by: Sequence[str] = (),
        overwrite_schema: bool = False,
        merge_schema: bool = False,
        replace_where: str | None = None,
    ) -> Transaction:
        extra: dict[str, Any] = {"merge_schema": True} if merge_schema else {}
        if replace_where is not None:
            extra["replace_where"] = replace_where
        r = await self.call(
            "begin",
            dataset=name,
            mode=mode,
            schema=P.schema_to_bytes(schema),
            partition_by=list(partition_by),
            overwrite_schema=overwrite_schema,
            **extra,
        )
        return Transaction(
            name,
            r["txn"],
            mode,
            P.schema_from_bytes(r["schema"]),
            tuple(r["partition_by"]),
            r["version"],
            merge_schema,
            replace_where,
            r.get("max_batch_bytes"),
            tuple(r["codecs"]) if isinstance(r.get("codecs"), list) else None,
        )

    async def write_task(
        self,
        txn: Transaction,
        batches: Iterable[pa.RecordBatch] | AsyncIterator[pa.RecordBatch],
        *,
        task: str | None = None,
    ) -> dict[str, Any]:
        """Stage ``batches`` under ``txn``; returns what was staged (pass it to commit).
        Nothing is visible until the commit. Not retried (the batches are consumed as they
        are sent), so it goes out on a connection proven alive: the ``ping`` that proves a
        quiet one runs while the first batch is made (a Spark task's first batch comes from
        the JVM), and nothing is sent before it answered."""
        # The bulk lane: the request carries the data channel.
        probe = asyncio.ensure_future(self._live_connection(BULK))
        source = _aiter(batches)
        try:
            first = await anext(source, None)
            conn = await probe
        except BaseException:
            probe.cancel()
            await source.aclose()
            raise
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
        codec = self._write_codec(conn, txn)
        limit = BatchLimit(self.config.max_batch_bytes, txn.max_batch_bytes)
        join = min(self.config.join_bytes, self.config.chunk_bytes, limit.bytes)
        batches_out = _joined(_chain(first, source), target, join, JOIN_WAIT)
        seq = 0
        try:
            async for batch in batches_out:
                setting = codec.setting()
                pieces = P.payloads_within(
                    batch,
                    P.write_options(setting),
                    limit.bytes,
                    limit.too_large,
                    self.config.chunk_bytes,
                )
                start = time.perf_counter()
                for piece, payload in pieces:
                    took = time.perf_counter() - start
                    await tx.send(payload, headers=[P.batch_header(piece.num_rows, seq)])
                    codec.sent(conn, setting, piece.nbytes, len(payload), took)
                    seq += 1
                    start = time.perf_counter()
        except ChannelError:
            await batches_out.aclose()  # no batch pulled ahead stays in flight
            _cancel(tx)
            # The service refused the data: its answer says why.
            raise_from_reply = await _answer_or_none(answer, self.config.timeout)
            if raise_from_reply is not None:
                P.unwrap(raise_from_reply)
            raise
        except BaseException:
            await batches_out.aclose()
            _cancel(tx)
            answer.close()
            raise
        tx.finish()
        result = await self._nudged(conn, answer)
        return dict(P.unwrap(result))

    def _write_codec(self, conn: Connection, txn: Transaction) -> WriteCodec:
        """How this write encodes its batches: the fixed setting, or ``auto`` among the
        codecs the service accepts, its state kept per connection (one path, one policy)."""
        setting = P.Compression.parse(self.config.compression)
        if not setting.auto:
            return WriteCodec(str(setting), None)
        codecs = P.accepted_codecs(txn.codecs)
        policy = self._write_policies.get(conn)
        if policy is None or tuple(policy.codecs) != codecs:
            policy = self._write_policies[conn] = P.AutoCompression(codecs)
        return WriteCodec("none", policy)

    async def commit(
        self,
        txn: Transaction,
        staged: Iterable[Mapping[str, Any]],
        *,
        app_id: str | None = None,
        app_version: int | None = None,
        overwrite_schema: bool = False,
        finish: bool = False,
    ) -> dict[str, Any]:
        """Publish every staged file of ``txn`` in one atomic commit. With ``app_id`` and
        ``app_version`` a repeated commit is a no-op (``committed`` is False). ``finish``:
        the service then removes the transaction's other staged files (of task attempts that
        failed), as ``abort(txn)`` would, after answering; the result says ``finishing``
        (a service older than that does not: call ``abort(txn)``)."""
        files = [f for task in staged for f in task["staged"]]
        fields: dict[str, Any] = dict(
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
        if txn.merge_schema:
            fields["merge_schema"] = True
        if txn.replace_where is not None:
            fields["replace_where"] = txn.replace_where
        if finish:
            fields["finish"] = txn.txn
        return dict(await self.call("commit", idempotent=app_id is not None, **fields))

    async def abort(self, txn: Transaction, staged: Iterable[Mapping[str, Any]] = ()) -> int:
        files = [f for task in staged for f in task["staged"]]
        r = await self.call("abort", dataset=txn.dataset, txn=txn.txn, staged=files)
        return int(r["removed"])

    async def write(
        self,
        name: str,
        data: Any,
        *,
        mode: str = "append",
        partition_by: Sequence[str] = (),
        app_id: str | None = None,
        app_version: int | None = None,
        merge_schema: bool = False,
        replace_where: str | None = None,
    ) -> dict[str, Any]:
        """Write a table in one transaction (staged, then committed). ``data`` is a Table, a
        RecordBatch, an iterable of batches, or a data frame (pandas, Polars: see frames).
        ``merge_schema`` adds the data's new columns to the dataset; ``replace_where`` (an
        SQL condition, mode overwrite) replaces only the rows it selects."""
        data = frames.to_arrow(data)
        if isinstance(data, pa.Table):
            schema, batches = data.schema, data.to_batches()
        elif isinstance(data, pa.RecordBatch):
            schema, batches = data.schema, [data]
        else:
            batches = list(data)
            if not batches:
                raise ValueError("no batches to write")
            schema = batches[0].schema

        async def begin(home: Writes) -> Transaction:
            return await home.begin(
                name,
                schema,
                mode=mode,
                partition_by=partition_by,
                merge_schema=merge_schema,
                replace_where=replace_where,
            )

        async def finish(home: Writes, txn: Transaction) -> dict[str, Any]:
            try:
                staged = await home.write_task(txn, batches)
            except BaseException:
                with contextlib.suppress(Exception):
                    await home.abort(txn)
                raise
            return await home.commit(txn, [staged], app_id=app_id, app_version=app_version)

        return await self._write_whole(begin, finish, sum(b.nbytes for b in batches))

    async def _write_whole(
        self,
        begin: Callable[[Writes], Awaitable[Transaction]],
        finish: Callable[[Writes, Transaction], Awaitable[dict[str, Any]]],
        size: int,
    ) -> dict[str, Any]:
        """A whole write (:meth:`write`: its begin, then its data and commit) of ``size``
        bytes, all at one service process: here. A client of several endpoints picks one
        per write (:meth:`.spreader.Spreader.write`)."""
        return await finish(self, await begin(self))

    async def append(self, name: str, data: Any, **kw: Any) -> dict[str, Any]:
        return await self.write(name, data, mode="append", **kw)

    async def overwrite(self, name: str, data: Any, **kw: Any) -> dict[str, Any]:
        return await self.write(name, data, mode="overwrite", **kw)


class WriteCodec:
    """The codec of each batch a write sends (fixed, or ``auto``'s choice)."""

    def __init__(self, fixed: str, policy: P.AutoCompression | None) -> None:
        self.fixed = fixed
        self.policy = policy

    def setting(self) -> str:
        return self.policy.setting() if self.policy is not None else self.fixed

    def sent(self, conn: Connection, setting: str, arrow: int, wire: int, took: float) -> None:
        """One message went out; ``took``: seconds to encode it (this thread's only work
        for it: the batches come ready)."""
        if self.policy is not None:
            now = time.monotonic()
            self.policy.sent(setting.partition(":")[0], arrow, wire, took, took, now)
            if self.policy.due(now):  # TCP_INFO once per interval, as a scan's sender
                self.policy.path(conn.path(), now)


def _cancel(tx: Any) -> None:
    """Cancel a data channel after a failure. On a connection that is gone already this
    fails too (ConnectionLost): the first failure is the one the caller must see."""
    with contextlib.suppress(AqueductError):
        tx.cancel()


async def _answer_or_none(answer: Any, timeout: float) -> Any:
    try:
        return await asyncio.wait_for(answer, timeout)
    except (TimeoutError, AqueductError):
        return None


async def _aiter(items: Any) -> AsyncGenerator[Any]:
    if hasattr(items, "__aiter__"):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


async def _chain(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``first`` (None: there was nothing), then ``rest``."""
    if first is None:
        return
    yield first
    async for item in rest:
        yield item


async def _joined(
    batches: AsyncIterator[pa.RecordBatch], schema: pa.Schema, size: int, wait: float
) -> AsyncGenerator[pa.RecordBatch]:
    """``batches`` conformed to ``schema``, consecutive ones smaller than ``size`` bytes
    joined (in order) into one of about ``size`` (``ClientConfig.join_bytes``); larger ones
    as they are. Nothing is held back longer than ``wait`` seconds for more to come: a slow
    source's batches still go out (and show as progress at the service) as they come. The
    next batch is pulled while the caller sends the last one.

    A message holds at most the bytes already sent (:func:`_join_goal`): the first batch goes
    as it comes, then messages double up to ``size``. What is still held when the source
    ends goes out after its last batch, ahead of the service's answer: a small write (a
    Spark task of a few batches) is not held back whole to its end, while a large one still
    moves in messages of ``size`` after its first few."""
    held: list[pa.RecordBatch] = []
    nbytes = 0
    sent = 0
    since = 0.0
    loop = asyncio.get_running_loop()
    pending: asyncio.Future[pa.RecordBatch] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(batches))
            if held and not pending.done():
                left = since + wait - loop.time()
                if left <= 0 or not (await asyncio.wait([pending], timeout=left))[0]:
                    yield _join(held, schema)  # the source is slow: send what came
                    held, nbytes = [], 0
                    continue
            try:
                item = await pending
            except StopAsyncIteration:
                break
            finally:
                if pending.done():
                    pending = None
            batch = _conform(item, schema)
            n = batch.get_total_buffer_size()
            if held and nbytes + n > _join_goal(size, sent):
                yield _join(held, schema)
                held, sent, nbytes = [], sent + nbytes, 0
            if not held:
                since = loop.time()
            held.append(batch)
            nbytes += n
            if nbytes >= _join_goal(size, sent):
                yield _join(held, schema)
                held, sent, nbytes = [], sent + nbytes, 0
        if held:
            yield _join(held, schema)
    finally:
        if pending is not None:
            pending.cancel()


def _join_goal(size: int, sent: int) -> int:
    """The bytes the next joined message is to reach: ``size``, but no more than the write
    sent so far (at least one byte: the first batch goes alone)."""
    return max(1, min(size, sent))


def _join(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    # combine_chunks: one copy per column, ~6x faster here than pa.concat_batches
    joined = pa.Table.from_batches(batches, schema=schema).combine_chunks().to_batches()
    return joined[0] if len(joined) == 1 else pa.RecordBatch.from_pylist([], schema=schema)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.equals(schema, check_metadata=False):
        return batch
    try:
        return batch.select(schema.names).cast(schema)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise P.SchemaMismatch(
            f"this data does not match the dataset's schema: {exc}. Dataset schema: {schema}"
        ) from exc


class BatchLimit:
    """The largest data message a write may send: this client's and the service's (as its
    begin answered), whichever is smaller; and how to say which one a row is over."""

    def __init__(self, client: int, service: int | None) -> None:
        self.client = client
        self.service = service if service is not None else P.MAX_BATCH_BYTES
        self.bytes = min(self.client, self.service)

    def too_large(self, size: int) -> P.InvalidRequest:
        mib = 2**20
        if size > self.client:
            over = (
                f"over this client's limit of {self.client / mib:g} MiB for one data message "
                "(Spark option maxBatchBytes, ClientConfig.max_batch_bytes)"
            )
        else:
            over = (
                f"over the service's limit of {self.service / mib:g} MiB for one data message "
                "(aqueduct serve --max-batch-bytes)"
            )
        return P.InvalidRequest(
            f"a row of this write is {size / mib:.1f} MiB once encoded (uncompressed), "
            f"{over}. A row is "
            "never split: raise the limit on both sides (the option maxBatchBytes and the "
            "service's --max-batch-bytes), or keep values this large outside the dataset "
            "(in object storage, say) and store where they are"
        )
