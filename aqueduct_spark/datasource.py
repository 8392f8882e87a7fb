"""The ``aqueduct`` Spark data source (PySpark 4.3 Python Data Source API).

Reads::

    spark.read.format("aqueduct").option("url", "quic://host:4433").load("trips")

Writes (mode append or overwrite; Spark rejects its default mode for Python sources)::

    df.write.format("aqueduct").option("url", url).mode("append").save("trips")

Every option, with its default, is in :data:`aqueduct_spark.options.OPTIONS` and
``docs/spark-options.md``. Register once per session with :func:`register` (or install the
package: ``pyspark_aqueduct`` registers it automatically).

What runs where (see ``shared/design/spark-datasource-api.md``): options are parsed and the
service contacted for the schema and the plan on the driver; each partition is one split of
one pinned dataset version, and carries everything its executor needs. Executors open (or
reuse) a pooled QUIC connection and receive Arrow batches already cast to Spark's schema by
the service. A write stages each task's data under a transaction; the driver's commit
publishes all of it in one Delta commit, and only the successful attempt of each task is
committed, so a retried or speculative task never duplicates rows.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
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
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from aqueduct_spark import options as O
from aqueduct_spark import protocol as P


def register(spark: Any) -> None:
    """Make ``format("aqueduct")`` available in this Spark session."""
    spark.dataSource.register(AqueductDataSource)


def _client(opts: O.Options) -> Any:
    from aqueduct_spark.client import Client

    return Client(config=opts.client_config())


def spark_to_arrow(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects from ``read()`` (pitfall 4 of the API brief)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def writable_arrow(schema: StructType) -> pa.Schema:
    """The Arrow schema of a DataFrame to write; SchemaMismatch naming the column for a type
    that has no Delta Lake equivalent (pyspark's own error would name neither)."""
    from pyspark.sql import types as T

    hints = {
        "DayTimeIntervalType": "e.g. a long of microseconds, or a string",
        "YearMonthIntervalType": "e.g. an int of months, or a string",
        "CalendarIntervalType": "e.g. a string",
        "NullType": "an all-null column still needs one: e.g. lit(None).cast('string')",
        "TimeType": "e.g. a string, or a long of microseconds since midnight",
        "VariantType": "e.g. to_json(column), a string",
    }

    def check(t: Any, where: str) -> Any:
        if isinstance(t, T.CharType | T.VarcharType):
            return T.StringType()  # stored as strings (pyspark has no Arrow type for them)
        hint = hints.get(type(t).__name__)
        if hint is not None:
            raise P.SchemaMismatch(
                f"column {where!r} has Spark type {t.simpleString()}, which Delta Lake cannot "
                f"store; cast it to a supported type ({hint})"
            )
        if isinstance(t, T.StructType):
            return T.StructType(
                [
                    T.StructField(f.name, check(f.dataType, f"{where}.{f.name}"), f.nullable)
                    for f in t.fields
                ]
            )
        if isinstance(t, T.ArrayType):
            return T.ArrayType(check(t.elementType, f"{where}[]"), t.containsNull)
        if isinstance(t, T.MapType):
            return T.MapType(
                check(t.keyType, f"{where}.key"),
                check(t.valueType, f"{where}.value"),
                t.valueContainsNull,
            )
        return t

    fields = [
        T.StructField(f.name, check(f.dataType, f.name), f.nullable, f.metadata)
        for f in schema.fields
    ]
    return spark_to_arrow(T.StructType(fields))


def arrow_to_spark(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    try:
        return from_arrow_schema(schema)
    except (TypeError, Exception) as exc:
        raise P.SchemaMismatch(
            f"the dataset has a column type Spark cannot represent: {exc}"
        ) from exc


class AqueductDataSource(DataSource):
    """Read and write datasets of an Aqueduct dataset service. Options: see
    ``docs/spark-options.md`` (url and the dataset name are required)."""

    @classmethod
    def name(cls) -> str:
        return "aqueduct"

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.opts = O.parse(dict(options))

    def schema(self) -> StructType:
        opts = self.opts
        info = _client(opts).describe(
            opts.dataset, version=opts.version_as_of, timestamp=opts.timestamp_as_of
        )
        schema = info.schema
        if opts.columns is not None:
            missing = [c for c in opts.columns if c not in schema.names]
            if missing:
                raise P.InvalidRequest(
                    f"option columns names {missing}, not in dataset {opts.dataset!r} "
                    f"(columns: {schema.names})"
                )
            schema = pa.schema([schema.field(c) for c in opts.columns])
        return arrow_to_spark(schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        # Spark refuses a reader that overrides pushFilters unless
        # spark.sql.python.filterPushdown.enabled is true, and only its pushdown planner
        # worker calls it: give that worker the pushdown reader, everyone else the plain one.
        cls = AqueductPushdownReader if _in_pushdown_worker() else AqueductReader
        return cls(self.opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> AqueductWriter:
        return AqueductWriter(self.opts, schema, overwrite)

    def streamReader(self, schema: StructType) -> Any:
        from aqueduct_spark.stream_reader import AqueductStreamReader

        return AqueductStreamReader(self.opts, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from aqueduct_spark.stream_writer import AqueductStreamWriter

        return AqueductStreamWriter(self.opts, schema, overwrite)


def _in_pushdown_worker() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class SplitPartition(InputPartition):
    """One split of a pinned version: everything an executor needs to read it (the
    driver's reader state is not visible on executors)."""

    def __init__(
        self,
        opts: O.Options,
        split: dict[str, Any],
        schema: bytes,
        columns: tuple[str, ...],
        filters: tuple[Any, ...] | None,
    ) -> None:
        super().__init__(split.get("path"))
        self.opts = opts
        self.split = split
        self.schema = schema
        """Arrow schema (IPC) the batches must have for Spark."""
        self.columns = columns
        self.filters = filters


class AqueductReader(DataSourceReader):
    """Plans on the driver (one partition per split), reads on executors."""

    def __init__(self, opts: O.Options, schema: StructType) -> None:
        self.opts = opts
        self.spark_schema = schema
        self.filters: list[Any] = []

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        target = spark_to_arrow(self.spark_schema)
        plan = _client(opts).plan(
            opts.dataset,
            columns=list(target.names),
            filter=self.filters or None,
            version=opts.version_as_of,
            timestamp=opts.timestamp_as_of,
            split_bytes=opts.split_size,
        )
        _check_user_schema(target, plan.schema, opts.dataset)
        schema = P.schema_to_bytes(target)
        filters = tuple(self.filters) if self.filters else None
        return [
            SplitPartition(opts, split, schema, tuple(target.names), filters)
            for split in plan.splits
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SplitPartition):
            return  # Spark reads an empty plan as one partition of None
        schema = P.schema_from_bytes(partition.schema)
        client = _client(partition.opts)
        yield from client.scan(
            partition.split,
            schema=schema,
            columns=list(partition.columns),
            filter=list(partition.filters) if partition.filters else None,
            batch_rows=partition.opts.batch_rows,
        )


class AqueductPushdownReader(AqueductReader):
    """The reader Spark's pushdown planner gets (``spark.sql.python.filterPushdown.enabled``).

    It pushes filters to the service only with the option ``pushDownPredicate=true``. Spark
    4.3 stores the read plan made by a pushdown on the relation that ``load()`` created and
    reuses it for every later scan of that relation that has no pushable filter: after
    ``df.filter("id > 5").count()``, ``df.count()`` would read only the filtered rows. Declining
    the filters keeps every plan filter-free, so each query is right and Spark filters after
    the scan. See "Filter pushdown" in ``docs/spark-options.md``.
    """

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        if not self.opts.push_down_predicate:
            yield from filters
            return
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


def _check_user_schema(wanted: pa.Schema, have: pa.Schema, dataset: str) -> None:
    """A user-given schema must name existing columns with castable types."""
    problems = []
    for field in wanted:
        if field.name not in have.names:
            problems.append(f"{field.name}: not in the dataset")
            continue
        source = have.field(field.name).type
        if source != field.type and not _castable(source, field.type):
            problems.append(f"{field.name}: dataset has {source}, schema asks for {field.type}")
    if problems:
        raise P.SchemaMismatch(
            f"the schema given for dataset {dataset!r} does not fit it: "
            + "; ".join(problems)
            + ". Drop .schema(...) to use the dataset's own schema."
        )


def _castable(source: pa.DataType, target: pa.DataType) -> bool:
    try:
        pa.array([], type=source).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


# -- writing ----------------------------------------------------------------------------


@dataclass
class StagedMessage(WriterCommitMessage):
    """What one task staged: handed to the driver's commit."""

    staged: dict[str, Any]
    partition: int
    attempt: int


class AqueductWriter(DataSourceArrowWriter):
    """Stages each task's batches under one transaction; commit publishes them atomically."""

    def __init__(self, opts: O.Options, schema: StructType, overwrite: bool) -> None:
        self.opts = opts
        self.mode = "overwrite" if overwrite else "append"
        # Begin on the driver: checks the DataFrame's schema against the dataset's now,
        # with a clear error, before any task runs.
        self.txn = _client(opts).begin(
            opts.dataset,
            writable_arrow(schema),
            mode=self.mode,
            partition_by=opts.partition_by,
            overwrite_schema=opts.overwrite_schema,
        )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        task = f"p{partition}-a{attempt}-{uuid.uuid4().hex[:8]}"
        staged = _client(self.opts).write_task(self.txn, iterator, task=task)
        return StagedMessage(staged, partition, attempt)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        staged = [m.staged for m in messages if isinstance(m, StagedMessage)]
        client = _client(self.opts)
        client.commit(self.txn, staged, overwrite_schema=self.opts.overwrite_schema)
        # Failed attempts of retried tasks staged files no commit references: remove them.
        client.abort(self.txn, [])

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        staged = [m.staged for m in messages if isinstance(m, StagedMessage)]
        _client(self.opts).abort(self.txn, staged)
