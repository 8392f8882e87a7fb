"""Structured Streaming sink: ``writeStream.format("aqueduct")``, exactly once.

Each micro-batch is staged by its tasks and committed by the driver in one Delta commit
keyed by (query id, batch id): a batch replayed after a failure (same batch id) finds its
key already committed and changes nothing. Spark rebuilds the writer for every micro-batch
and again for the commit, so the commit messages carry everything the commit needs.
Append mode appends; complete mode overwrites the dataset with each batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from aqueduct_spark import options as O
from aqueduct_spark.datasource import _client, spark_to_arrow


@dataclass
class StreamStaged(WriterCommitMessage):
    staged: dict[str, Any]
    txn: str
    """The transaction the task staged under (the commit runs on a rebuilt writer)."""
    query_id: str | None
    batch_id: int | None


class AqueductStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: O.Options, schema: StructType, overwrite: bool) -> None:
        self.opts = opts
        self.mode = "overwrite" if overwrite else "append"
        self.txn = _client(opts).begin(
            opts.dataset,
            spark_to_arrow(schema),
            mode=self.mode,
            partition_by=opts.partition_by,
            overwrite_schema=overwrite,
        )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamStaged:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query_id = batch_id = None
        task = uuid.uuid4().hex[:8]
        if ctx is not None:
            query_id = ctx.getLocalProperty("sql.streaming.queryId")
            raw = ctx.getLocalProperty("streaming.sql.batchId")
            batch_id = int(raw) if raw is not None else None
            task = f"p{ctx.partitionId()}-a{ctx.attemptNumber()}-{task}"
        staged = _client(self.opts).write_task(self.txn, iterator, task=task)
        return StreamStaged(staged, self.txn.txn, query_id, batch_id)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, StreamStaged)]
        query_ids = {m.query_id for m in done if m.query_id}
        client = _client(self.opts)
        app_id = f"spark-query-{query_ids.pop()}" if len(query_ids) == 1 else None
        client.commit(
            self.txn,
            [m.staged for m in done],
            app_id=app_id,
            app_version=batchId if app_id else None,
            overwrite_schema=self.mode == "overwrite",
        )
        # Failed task attempts staged files no commit references: remove them.
        for txn in {m.txn for m in done}:
            client.abort(replace(self.txn, txn=txn), [])

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, StreamStaged)]
        client = _client(self.opts)
        for txn in {m.txn for m in done} or {self.txn.txn}:
            client.abort(replace(self.txn, txn=txn), [m.staged for m in done if m.txn == txn])
