"""Batch reads: the driver plans one partition per task of one pinned dataset version (the
service packs small files into tasks of about ``splitSize``, each file counted with
``fileOpenCost`` more, a small table spread evenly over the driver's cores, and splits large
files by row groups); each executor reads its task's splits with one scan, as Arrow batches
already cast to Spark's schema by the service.

Two readers, because Spark 4.3 refuses a reader that overrides ``pushFilters`` unless
``spark.sql.python.filterPushdown.enabled`` is true: :class:`AqueductReader` pushes nothing,
and :class:`AqueductPushdownReader` is the one the option ``pushDownPredicate=true`` asks for.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)
from pyspark.sql.types import StructType

from aqueduct_core.host import usable_cores
from aqueduct_spark import protocol as P
from aqueduct_spark.client.spread import plan_orders, split_bytes, spread_for
from aqueduct_spark.client.urls import parse_endpoints
from aqueduct_spark.datasource.host_load import host_load
from aqueduct_spark.datasource.options import Options
from aqueduct_spark.datasource.schemas import check_user_schema, spark_to_arrow
from aqueduct_spark.datasource.task_errors import surfaced


class SplitPartition(InputPartition):
    """The splits of one task of a pinned version: everything an executor needs to read
    them (the driver's reader state is not visible on executors)."""

    def __init__(
        self,
        opts: Options,
        splits: list[dict[str, Any]],
        schema: bytes,
        columns: tuple[str, ...],
        filters: tuple[Any, ...] | None,
        endpoint: int | None = None,
        endpoints: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__([s.get("path") for s in splits])
        self.opts = opts
        self.splits = splits
        self.schema = schema
        """Arrow schema (IPC) the batches must have for Spark."""
        self.columns = columns
        self.filters = filters
        self.endpoint = endpoint
        """The endpoint of the URL the driver assigned (spreading the tasks' bytes over
        them); the executor takes another if that one is busier or failing."""
        self.endpoints = endpoints
        """Every endpoint in the order this task prefers them (``endpoint`` first, then the
        one it moves to if that fails: :func:`~aqueduct_spark.client.spread.plan_orders`)."""


class AqueductReader(DataSourceReader):
    """Plans on the driver (one partition per task), reads on executors."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.spark_schema = schema
        self.filters: list[Any] = []

    @surfaced
    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        target = spark_to_arrow(self.spark_schema)
        plan = opts.client().plan(
            opts.dataset,
            columns=list(target.names),
            filter=self.filters or None,
            version=opts.version_as_of,
            timestamp=opts.timestamp_as_of,
            split_bytes=opts.split_size,
            open_cost=opts.file_open_cost,
            min_tasks=driver_cores(),
        )
        check_user_schema(target, plan.schema, opts.dataset)
        schema = P.schema_to_bytes(target)
        filters = tuple(self.filters) if self.filters else None
        tasks = plan.task_splits()
        orders = plan_orders([split_bytes(t) or 0 for t in tasks], len(parse_endpoints(opts.url)))
        return [
            SplitPartition(opts, splits, schema, tuple(target.names), filters, order[0], order)
            for splits, order in zip(tasks, orders, strict=True)
        ]

    @surfaced
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SplitPartition):
            return  # Spark reads an empty plan as one partition of None
        schema = P.schema_from_bytes(partition.schema)
        client = partition.opts.client()
        splits = partition.splits
        planned = partition.endpoints or (
            (partition.endpoint,) if partition.endpoint is not None else ()
        )
        endpoints = parse_endpoints(partition.opts.url)
        batches = functools.partial(
            client.scan,
            splits[0] if len(splits) == 1 else splits,
            schema=schema,
            columns=list(partition.columns),
            filter=list(partition.filters) if partition.filters else None,
            batch_rows=partition.opts.batch_rows,
        )
        if len(endpoints) == 1:
            yield from batches(endpoint=planned or None)
            return
        # the least loaded from this host, endpoints its workers avoid last (:mod:`.host_load`)
        load = host_load(" ".join(map(str, endpoints)), len(endpoints))
        spread = spread_for(endpoints)
        load.note_avoided(spread.avoided())
        with load.claim(split_bytes(splits) or 0, planned) as order:
            for batch in batches(endpoint=order):
                load.note_avoided(spread.avoided())  # a host lost mid-read: tell the others
                yield batch


def driver_cores() -> int:
    """The cores of the machine that plans the read: the parallelism a small table is spread
    over, as Spark's ``minPartitionNum`` defaults to its default parallelism (which a Python
    data source cannot see; under ``local[*]`` they are the same)."""
    return usable_cores()


class AqueductPushdownReader(AqueductReader):
    """The reader of ``pushDownPredicate=true``: it gives Spark's pushable filters to the
    service, which evaluates them; Spark lists them as ``PushedFilters`` and filters no more.

    It needs ``spark.sql.python.filterPushdown.enabled=true``: with the setting off, Spark
    refuses any reader that overrides ``pushFilters`` (``DATA_SOURCE_PUSHDOWN_DISABLED``,
    naming the setting). Pushdown is off by default because Spark 4.3 stores the read plan
    made by a pushdown on the relation that ``load()`` created and reuses it for every later
    scan of that relation that has no pushable filter: after ``df.filter("id > 5").count()``,
    ``df.count()`` would read only the filtered rows. See "Filter pushdown" in
    ``docs/spark-options.md``.
    """

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        names = set(self.spark_schema.fieldNames())
        for f in filters:
            wire = spark_filter_to_wire(f, names)
            if wire is None:
                yield f  # not pushed: Spark keeps filtering it
            else:
                self.filters.append(wire)


def spark_filter_to_wire(f: Filter, names: set[str]) -> list[Any] | None:
    """The dataset-protocol predicate for a Spark filter, or None if it cannot be pushed."""
    ops: list[tuple[type, str]] = [
        (EqualTo, "=="),
        (EqualNullSafe, "<=>"),
        (GreaterThan, ">"),
        (GreaterThanOrEqual, ">="),
        (LessThan, "<"),
        (LessThanOrEqual, "<="),
        (In, "in"),
        (StringStartsWith, "starts_with"),
        (StringEndsWith, "ends_with"),
        (StringContains, "contains"),
    ]
    if isinstance(f, Not):
        inner = spark_filter_to_wire(f.child, names)
        return None if inner is None else [P.NOT, inner]
    attribute = getattr(f, "attribute", None)
    if not attribute or attribute[0] not in names:
        return None
    path = list(attribute)
    if isinstance(f, IsNull):
        return ["is_null", path]
    if isinstance(f, IsNotNull):
        return ["is_not_null", path]
    for cls, op in ops:
        if isinstance(f, cls):
            value = f.value  # type: ignore[attr-defined]
            if op == "in":
                value = list(value)
            return [op, path, value]
    return None
