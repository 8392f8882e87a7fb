"""Version ranges and the change feed in Spark: batch reads of the versions from
``startingVersion`` to ``endingVersion`` (or by timestamps), with ``readChangeFeed`` the rows
each version inserted and deleted, and the rule for versions that remove data, which batch
ranges and streams share (:func:`admit`).

A stream (or a range read) of appended rows cannot apply a version that removes data (an
overwrite, a delete, a restore): the rows it removes were already delivered. Delta's source
fails on such a version, and so does this one by default (:class:`DataChanged`), unless the
user chooses: ``skipChangeCommits`` skips such versions whole (their added rows too),
``ignoreDeletes`` skips versions that only remove files (no rows added), and
``readChangeFeed`` reads every change as rows with ``_change_type``. A compaction removes and
adds files with ``dataChange=false``: it changes no data, so it is never such a version.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from aqueduct_spark import protocol as P
from aqueduct_spark.datasource.options import Options
from aqueduct_spark.datasource.reader import SplitPartition, driver_cores
from aqueduct_spark.datasource.schemas import arrow_to_spark, spark_to_arrow
from aqueduct_spark.datasource.stream_offsets import DataChanged
from aqueduct_spark.datasource.task_errors import surfaced

__all__ = [
    "AqueductRangeReader",
    "DataChanged",
    "FilesPartition",
    "admit",
    "pack",
    "with_change_columns",
]


def with_change_columns(schema: StructType) -> StructType:
    """The schema of a change-feed read: the dataset's columns, then Delta's three."""
    out = StructType(list(schema.fields))
    for f in arrow_to_spark(pa.schema(P.CHANGE_FIELDS)).fields:
        out = out.add(f)
    return out


def admit(entry: dict[str, Any], opts: Options) -> list[dict[str, Any]]:
    """The files of one version (an entry of ``feed``, or a ``changes`` answer) a read takes,
    by the options' rule for versions that remove data (module docstring)."""
    files = list(entry.get("files") or [])
    removes = int(entry.get("removes") or 0)
    if opts.read_change_feed or not removes:
        return files
    if opts.skip_change_commits:
        return []
    adds = entry.get("adds", len(files))
    if opts.ignore_deletes and not adds:
        return []
    what = entry.get("operation") or "a commit"
    raise DataChanged(
        f"version {entry['version']} of dataset {opts.dataset!r} removes data ({what}, "
        f"{removes} files removed): a read of appended rows cannot apply that. Set "
        "skipChangeCommits=true to skip versions that remove or rewrite data (their new rows "
        "too), ignoreDeletes=true to skip versions that only delete, or readChangeFeed=true to "
        "read inserts and deletes as rows"
    )


class FilesPartition(SplitPartition):
    """Whole files (of a micro-batch or a version range; change-feed splits or added files)
    for one task: a batch read's partition without pushed filters."""

    def __init__(
        self, opts: Options, splits: list[dict[str, Any]], schema: bytes, columns: tuple[str, ...]
    ) -> None:
        super().__init__(opts, splits, schema, columns, None)


def pack(opts: Options, splits: list[dict[str, Any]], schema: pa.Schema) -> list[FilesPartition]:
    """Whole files packed into partitions of about ``splitSize`` bytes, in order, each file
    counted ``fileOpenCost`` bytes larger, a small batch spread over the driver's cores (as
    the service packs a batch plan's tasks: :func:`~aqueduct_spark.protocol.pack_tasks`)."""
    wire, columns = P.schema_to_bytes(schema), tuple(schema.names)
    sizes = [int(split["bytes"]) for split in splits]
    tasks = P.pack_tasks(sizes, opts.split_size, opts.file_open_cost, driver_cores())
    return [FilesPartition(opts, [splits[i] for i in task], wire, columns) for task in tasks]


class AqueductRangeReader(DataSourceReader):
    """A batch read of a version range: the rows its versions added or, with
    ``readChangeFeed``, their change feed (see docs/spark-options.md, "Change feed")."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.schema = spark_to_arrow(schema)

    @surfaced
    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        client = opts.client()
        start: int | None = None
        if opts.starting_timestamp is None and opts.starting_version == "latest":
            start = client.describe(opts.dataset).version
        elif opts.starting_timestamp is None and opts.starting_version != "earliest":
            start = int(opts.starting_version)
        found = client.feed(
            opts.dataset,
            starting_version=start,
            ending_version=opts.ending_version,
            starting_timestamp=opts.starting_timestamp,
            ending_timestamp=opts.ending_timestamp,
            change_feed=opts.read_change_feed,
        )
        splits = [s for entry in found["versions"] for s in admit(entry, opts)]
        return list(pack(opts, splits, self.schema))

    @surfaced
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilesPartition):
            return  # Spark reads an empty plan as one partition of None
        client = partition.opts.client()
        schema = P.schema_from_bytes(partition.schema)
        for split in partition.splits:
            yield from client.scan(
                split,
                schema=schema,
                columns=list(partition.columns),
                batch_rows=partition.opts.batch_rows,
            )
