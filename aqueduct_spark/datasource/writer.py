"""Batch writes: each task stages its batches under one transaction begun on the driver; the
driver's commit publishes all of them in one Delta commit. Only the successful attempt of each
task is committed, so a retried or speculative task never duplicates rows. A task whose error
no retry can heal hands it to the commit, which aborts the write and raises it (see
:mod:`.task_errors`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from aqueduct_spark.client.urls import parse_endpoints
from aqueduct_spark.datasource.host_load import shared_avoidance
from aqueduct_spark.datasource.options import Options
from aqueduct_spark.datasource.schemas import writable_arrow
from aqueduct_spark.datasource.task_errors import deferred, first_error, surfaced


@dataclass
class StagedMessage(WriterCommitMessage):
    """What one task staged: handed to the driver's commit."""

    staged: dict[str, Any]
    partition: int
    attempt: int
    error: BaseException | None = None
    """An error the task met that no retry heals: the commit raises it."""


class AqueductWriter(DataSourceArrowWriter):
    """Stages each task's batches under one transaction; commit publishes them atomically."""

    @surfaced
    def __init__(self, opts: Options, schema: StructType, overwrite: bool) -> None:
        self.opts = opts
        self.mode = "overwrite" if overwrite else "append"
        # Begin on the driver: checks the DataFrame's schema against the dataset's now,
        # with a clear error, before any task runs.
        self.txn = opts.client().begin(
            opts.dataset,
            writable_arrow(schema),
            mode=self.mode,
            partition_by=opts.partition_by,
            overwrite_schema=opts.overwrite_schema,
            merge_schema=opts.merge_schema,
            replace_where=opts.replace_where,
        )

    @surfaced
    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        task = f"p{partition}-a{attempt}-{uuid.uuid4().hex[:8]}"
        try:
            # the partition's index: which endpoint this task prefers when they are even
            with shared_avoidance(parse_endpoints(self.opts.url)):
                staged = self.opts.client().write_task(
                    self.txn, iterator, task=task, endpoint=partition
                )
        except Exception as exc:
            if not deferred(exc):
                raise  # may heal: Spark tries the task again
            # The service removed what this task staged; the rest of its rows are not read.
            return StagedMessage({"staged": []}, partition, attempt, exc)
        return StagedMessage(staged, partition, attempt)

    @surfaced
    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        error = first_error(m.error for m in messages if isinstance(m, StagedMessage))
        if error is not None:
            self.abort(messages)
            raise error
        staged = [m.staged for m in messages if isinstance(m, StagedMessage)]
        client = self.opts.client()
        result = client.commit(
            self.txn,
            staged,
            overwrite_schema=self.opts.overwrite_schema,
            app_id=self.opts.txn_app_id,  # Delta's txnAppId/txnVersion: an idempotent write
            app_version=self.opts.txn_version,
            # Failed attempts of retried tasks staged files no commit references: the service
            # removes them once it has answered (one round trip, not two).
            finish=True,
        )
        if not result.get("finishing"):  # a service older than commit's finish
            client.abort(self.txn, [])

    @surfaced
    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        staged = [m.staged for m in messages if isinstance(m, StagedMessage)]
        self.opts.client().abort(self.txn, staged)
