"""Structured Streaming sink: ``writeStream.format("aqueduct")``, exactly once.

Each micro-batch is staged by its tasks and committed by the driver in one Delta commit
that records the Delta app transaction ``(app_id="spark-query-<query id>", version=<batch
id>)``. A batch replayed after a failure keeps its batch id, finds it already recorded and
commits nothing (its staged files are removed). The query id is the one Spark keeps in the
checkpoint (stable across restarts, unlike the run id); tasks read it, and the batch id, from
the local properties Spark's stream execution sets (``sql.streaming.queryId``,
``streaming.sql.batchId``) and carry them to the commit in their messages.

Spark builds the writer for every micro-batch on the planner (one transaction per batch:
it checks the schema before any task runs) and builds it again, fresh, for the commit, so
the commit uses only what the messages carry. Append mode appends (an empty batch commits
nothing); complete mode overwrites the dataset with each batch's result. A task whose error no
retry can heal hands it to the commit, which aborts the batch and raises it: the query stops
with that error first (see :mod:`.task_errors`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from aqueduct_spark.client.urls import parse_endpoints
from aqueduct_spark.datasource.host_load import shared_avoidance
from aqueduct_spark.datasource.options import OptionError, Options
from aqueduct_spark.datasource.schemas import writable_arrow
from aqueduct_spark.datasource.task_errors import deferred, first_error, surfaced

log = logging.getLogger("aqueduct.stream")

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def app_id(query_id: str) -> str:
    """The Delta app transaction id of a streaming query's commits."""
    return f"spark-query-{query_id}"


@dataclass
class StreamStaged(WriterCommitMessage):
    """What one task staged, and everything the (rebuilt) committing writer needs."""

    staged: dict[str, Any]
    txn: Any
    """The :class:`~aqueduct_spark.client.Transaction` the task staged under."""
    query_id: str | None
    batch_id: int | None
    attempt: int
    error: BaseException | None = None
    """An error the task met that no retry heals: the commit raises it."""


class AqueductStreamWriter(DataSourceStreamArrowWriter):
    """Writes one micro-batch. ``begin``: whether to begin the batch's transaction now, as
    the planner's writer (pickled to the tasks) must; the commit's writer needs none of its
    own, the messages carry the tasks' one (see ``AqueductDataSource.streamWriter``)."""

    @surfaced
    def __init__(
        self, opts: Options, schema: StructType, overwrite: bool, *, begin: bool = True
    ) -> None:
        self.opts = opts
        self.mode = "overwrite" if overwrite else "append"
        self.txn: Any = None
        batch_only = [
            n for n, v in (("replaceWhere", opts.replace_where), ("txnAppId", opts.txn_app_id)) if v
        ]
        if batch_only:
            raise OptionError(
                f"option {batch_only[0]!r} applies to batch writes only; a streaming write "
                "commits each micro-batch once by itself (its checkpoint is the idempotency key); "
                "drop the option from the streaming write"
            )
        if begin:
            whole = overwrite or opts.overwrite_schema
            self.txn = opts.client().begin(
                opts.dataset,
                writable_arrow(schema),
                mode=self.mode,
                partition_by=opts.partition_by,
                overwrite_schema=whole,
                merge_schema=opts.merge_schema and not whole,
            )

    @surfaced
    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamStaged:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query_id = batch_id = None
        attempt = 0
        task = uuid.uuid4().hex[:8]
        home = None  # the endpoint this task prefers when they are even: by partition
        if ctx is not None:
            home = ctx.partitionId()
            query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY) or None
            raw = ctx.getLocalProperty(BATCH_ID_PROPERTY)
            batch_id = int(raw) if raw else None
            attempt = ctx.attemptNumber()
            task = f"b{batch_id}-p{ctx.partitionId()}-a{attempt}-{task}"
        try:
            with shared_avoidance(parse_endpoints(self.opts.url)):
                staged = self.opts.client().write_task(self.txn, iterator, task=task, endpoint=home)
        except Exception as exc:
            if not deferred(exc):
                raise  # may heal: Spark tries the task again
            # The service removed what this task staged; the rest of its rows are not read.
            return StreamStaged({"staged": []}, self.txn, query_id, batch_id, attempt, exc)
        return StreamStaged(staged, self.txn, query_id, batch_id, attempt)

    @surfaced
    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, StreamStaged)]
        if not done:
            return
        error = first_error(m.error for m in done)
        if error is not None:
            self.abort(messages, batchId)
            raise error
        txn = done[0].txn
        query_ids = {m.query_id for m in done}
        if len(query_ids) != 1 or None in query_ids:
            # Not seen with Spark 4.3; without the key a replayed batch would be written twice.
            raise RuntimeError(
                f"aqueduct sink: cannot tell which streaming query wrote batch {batchId} "
                f"(task property {QUERY_ID_PROPERTY!r} gave {sorted(map(str, query_ids))}); "
                "refusing to commit without an idempotency key"
            )
        stray = {m.batch_id for m in done} - {batchId}
        if stray:
            log.warning("tasks of batch %d reported batch ids %s", batchId, sorted(map(str, stray)))
        (query_id,) = query_ids
        client = self.opts.client()
        rows = sum(int(m.staged.get("rows", 0)) for m in done)
        files = sum(len(m.staged.get("staged", ())) for m in done)
        committed = True
        if files or rows or self.mode == "overwrite":
            result = client.commit(
                txn,
                [m.staged for m in done],
                app_id=app_id(str(query_id)),
                app_version=int(batchId),
                overwrite_schema=self.mode == "overwrite" or self.opts.overwrite_schema,
            )
            committed = bool(result.get("committed"))
            if not committed:
                log.info(
                    "batch %d of query %s is already in %s: replay ignored",
                    batchId,
                    query_id,
                    self.opts.dataset,
                )
        # Remove staged files no commit references: those of a replayed batch, and of task
        # attempts that failed (retried tasks have attempt > 0).
        if not committed or any(m.attempt > 0 for m in done):
            for name in sorted({m.txn.txn for m in done}):
                client.abort(replace(txn, txn=name), [])

    @surfaced
    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, StreamStaged)]
        if not done:
            return  # nothing known; staged files of failed tasks go with cleanup_orphans
        client = self.opts.client()
        for name in sorted({m.txn.txn for m in done}):
            mine = [m.staged for m in done if m.txn.txn == name]
            client.abort(replace(done[0].txn, txn=name), mine)
