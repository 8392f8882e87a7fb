"""The :class:`AqueductDataSource` Spark instantiates for ``format("aqueduct")``, and
:func:`register`, which makes that format known to a session."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from aqueduct_spark.datasource.options import parse
from aqueduct_spark.datasource.task_errors import surfaced

if TYPE_CHECKING:
    from aqueduct_spark.datasource.stream_reader import AqueductStreamReader
    from aqueduct_spark.datasource.stream_writer import AqueductStreamWriter
    from aqueduct_spark.datasource.writer import AqueductWriter

# Each hook imports what it uses: Spark builds this class in a fresh Python worker for each
# read or write, and the options are checked there (a missing cafile, a typo) before
# pyarrow, the client and the QUIC stack are loaded.


def register(spark: Any) -> None:
    """Make ``format("aqueduct")`` available in this Spark session."""
    spark.dataSource.register(AqueductDataSource)


class AqueductDataSource(DataSource):
    """Read and write datasets of an Aqueduct dataset service. Options: see
    ``docs/spark-options.md`` (url and the dataset name are required)."""

    @classmethod
    def name(cls) -> str:
        return "aqueduct"

    @surfaced
    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.opts = parse(dict(options))
        self.unpickled = False
        """Whether this instance came to this process pickled (see :meth:`streamWriter`)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.unpickled = True

    @surfaced
    def schema(self) -> StructType:
        import pyarrow as pa

        from aqueduct_spark import protocol as P
        from aqueduct_spark.datasource.changes import with_change_columns
        from aqueduct_spark.datasource.schemas import arrow_to_spark

        opts = self.opts
        info = opts.client().describe(
            opts.dataset, version=opts.version_as_of, timestamp=opts.timestamp_as_of
        )
        schema = info.schema
        if opts.columns is not None:
            missing = [c for c in opts.columns if c not in schema.names]
            if missing:
                raise P.InvalidRequest(
                    f"option columns names {missing}, not in dataset {opts.dataset!r} "
                    f"(columns: {schema.names}); name only columns the dataset has"
                )
            schema = pa.schema([schema.field(c) for c in opts.columns])
        if opts.read_change_feed:
            return with_change_columns(arrow_to_spark(schema))
        return arrow_to_spark(schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        # The option decides, not the planner worker asking: Spark refuses a reader that
        # overrides pushFilters while spark.sql.python.filterPushdown.enabled is false, so
        # only pushDownPredicate=true gets one (and needs that setting, as documented).
        from aqueduct_spark.datasource.changes import AqueductRangeReader
        from aqueduct_spark.datasource.reader import AqueductPushdownReader, AqueductReader

        if self.opts.version_range:
            return AqueductRangeReader(self.opts, schema)
        if self.opts.push_down_predicate:
            return AqueductPushdownReader(self.opts, schema)
        return AqueductReader(self.opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> AqueductWriter:
        from aqueduct_spark.datasource.writer import AqueductWriter

        return AqueductWriter(self.opts, schema, overwrite)

    def streamReader(self, schema: StructType) -> AqueductStreamReader:
        from aqueduct_spark.datasource.stream_reader import AqueductStreamReader

        return AqueductStreamReader(self.opts, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> AqueductStreamWriter:
        """Spark calls this in two places per micro-batch. Its write planner builds this source
        afresh from its class and options (``unpickled`` is false) and pickles the writer to
        the tasks: that writer begins the batch's transaction, which the tasks stage under.
        The commit runner gets this source pickled (``unpickled`` is true) and builds a writer
        only to commit or abort what the tasks' messages carry: it begins nothing."""
        from aqueduct_spark.datasource.stream_writer import AqueductStreamWriter

        return AqueductStreamWriter(self.opts, schema, overwrite, begin=not self.unpickled)
