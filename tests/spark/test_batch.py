"""The Spark batch connector in Spark local mode against a real service process."""

from __future__ import annotations

import datetime as dt
import decimal
import re
import socket
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from aqueduct_spark.datasource.reader import driver_cores
from aqueduct_spark.testing import ServiceProcess

pytestmark = pytest.mark.spark


def read(spark: Any, service: ServiceProcess, name: str, **options: str) -> DataFrame:
    return spark.read.format("aqueduct").options(**service.options, **options).load(name)


def write(
    df: DataFrame, service: ServiceProcess, name: str, mode: str = "append", **options: str
) -> None:
    df.write.format("aqueduct").options(**service.options, **options).mode(mode).save(name)


def numbers(spark: Any, n: int, partitions: int = 2) -> DataFrame:
    return spark.range(0, n, numPartitions=partitions).selectExpr(
        "id", "cast(id as double) * 0.5 as x", "concat('row-', cast(id as string)) as s"
    )


def test_write_then_read_back(spark: Any, service: ServiceProcess) -> None:
    df = numbers(spark, 10_000)
    write(df, service, "basic", mode="overwrite")
    assert_df_equality(read(spark, service, "basic"), df, ignore_row_order=True)


def test_append_and_overwrite(spark: Any, service: ServiceProcess) -> None:
    write(numbers(spark, 100), service, "modes", mode="overwrite")
    write(numbers(spark, 100).selectExpr("id + 100 as id", "x", "s"), service, "modes")
    assert read(spark, service, "modes").count() == 200
    write(numbers(spark, 7), service, "modes", mode="overwrite")
    assert_df_equality(read(spark, service, "modes"), numbers(spark, 7), ignore_row_order=True)


def test_time_travel(spark: Any, service: ServiceProcess) -> None:
    write(numbers(spark, 10), service, "travel", mode="overwrite")
    v0 = service.client().describe("travel").version
    write(numbers(spark, 5), service, "travel")
    assert read(spark, service, "travel").count() == 15
    assert read(spark, service, "travel", versionAsOf=str(v0)).count() == 10


FILTERS = [
    "id = 7",
    "id <=> 7",
    "id != 7",
    "id > 90",
    "id >= 90",
    "id < 5",
    "id <= 5",
    "id in (3, 50, 1000)",
    "id not in (3, 50)",
    "s is null",
    "s is not null",
    "s like 'row-9%'",
    "s like '%-42'",
    "s like '%-7%'",
    "not (id >= 10)",
    "id >= 10 and id <= 12",
    "x >= 45.0",
]


def pushed_filters(df: DataFrame) -> str:
    """What Spark's formatted plan lists as accepted by the source ("" for none)."""
    utils = df.sparkSession._jvm.org.apache.spark.sql.api.python.PythonSQLUtils
    plan = utils.explainString(df._jdf.queryExecution(), "formatted")
    lines = [line for line in plan.splitlines() if line.startswith("PushedFilters: ")]
    line = lines[0] if lines else "PushedFilters: []"  # Spark omits the line when empty
    return line.removeprefix("PushedFilters: ").strip("[]")


def pushed_per_scan(df: DataFrame) -> list[str]:
    """The filters Spark's formatted plan lists as accepted by each scan that accepted any
    (Spark omits the line of a scan that accepted none: count them against the scans)."""
    utils = df.sparkSession._jvm.org.apache.spark.sql.api.python.PythonSQLUtils
    plan = utils.explainString(df._jdf.queryExecution(), "formatted")
    return [m.group(1) for m in re.finditer(r"^PushedFilters: \[(.*)\]$", plan, re.M)]


@pytest.fixture
def filter_pushdown(spark: Any) -> Any:
    """Spark's Python filter pushdown turned on for one test."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    yield
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def filtered_dataset(spark: Any, service: ServiceProcess) -> DataFrame:
    data = numbers(spark, 100).withColumn(
        "s", F.when(F.col("id") % 10 == 3, None).otherwise(F.col("s"))
    )
    write(data, service, "filtered", mode="overwrite")
    return data


def rows_per_condition(
    frame: Any, conditions: list[str]
) -> tuple[Any, dict[int, list[tuple[Any, ...]]]]:
    """The rows of ``frame(condition)`` for each condition, all in one Spark job (a union
    tagged by condition: a job and a collect per condition cost ~1 s each), and the union's
    schema."""
    from functools import reduce

    parts = [frame(c).withColumn("_case", F.lit(i)) for i, c in enumerate(conditions)]
    union = reduce(DataFrame.unionByName, parts)
    out: dict[int, list[tuple[Any, ...]]] = {i: [] for i in range(len(conditions))}
    for row in union.collect():
        out[row["_case"]].append(tuple(row)[:-1])
    return union, {i: sorted(rows, key=repr) for i, rows in out.items()}


def assert_same_rows_per_condition(got: Any, expected: Any, conditions: list[str]) -> Any:
    """Each condition's rows through the data source are Spark's own on ``expected``."""
    got_union, got_rows = rows_per_condition(got, conditions)
    want_union, want_rows = rows_per_condition(expected, conditions)
    assert got_union.schema == want_union.schema
    for i, condition in enumerate(conditions):
        assert got_rows[i] == want_rows[i], condition
    return got_union


def test_filters_without_pushdown(spark: Any, service: ServiceProcess) -> None:
    data = filtered_dataset(spark, service)
    got = assert_same_rows_per_condition(
        lambda c: read(spark, service, "filtered").filter(c), data.filter, FILTERS
    )
    assert pushed_filters(got) == ""


def test_pushdown_option_without_the_spark_setting_names_the_setting(
    spark: Any, service: ServiceProcess
) -> None:
    """pushDownPredicate=true needs spark.sql.python.filterPushdown.enabled: with it off,
    Spark refuses the read and says which setting to turn on (not a silent full scan)."""
    filtered_dataset(spark, service)
    with pytest.raises(Exception, match=r"DATA_SOURCE_PUSHDOWN_DISABLED") as e:
        read(spark, service, "filtered", pushDownPredicate="true").filter("id > 5").count()
    assert "spark.sql.python.filterPushdown.enabled" in str(e.value)


def test_every_pushed_filter_gives_the_rows_spark_would(
    spark: Any, service: ServiceProcess, filter_pushdown: None
) -> None:
    data = filtered_dataset(spark, service)
    got = assert_same_rows_per_condition(
        lambda c: read(spark, service, "filtered", pushDownPredicate="true").filter(c),
        data.filter,
        FILTERS,
    )
    # The service, not Spark, evaluated each: Spark lists it as accepted by its scan.
    pushed = pushed_per_scan(got)
    assert len(pushed) == len(FILTERS) and all(pushed), pushed


TYPED = StructType(
    [
        StructField("id", LongType()),
        StructField("ts", TimestampType()),
        StructField("ntz", TimestampNTZType()),
        StructField("day", DateType()),
        StructField("price", DecimalType(10, 2)),
        StructField("zip", StringType()),
    ]
)


def test_pushed_filters_on_typed_columns_give_the_rows_spark_would(
    spark: Any, service: ServiceProcess, filter_pushdown: None
) -> None:
    """Spark pushes each value in its column's type: a TIMESTAMP_NTZ's naive datetime (which
    CBOR cannot carry: it failed with "naive datetime encountered"), an instant, a date, a
    Decimal; the service binds them by the same rules as every condition (issue 27)."""
    rows = [
        (
            i,
            dt.datetime(2026, 1, i, 12, tzinfo=dt.UTC),
            dt.datetime(2026, 1, i, 12),
            dt.date(2026, 1, i),
            decimal.Decimal(f"{i}.25"),
            f"0{i}50",
        )
        for i in (1, 2, 3, 4)
    ]
    data = spark.createDataFrame(rows, TYPED)
    write(data, service, "typed_pushed", mode="overwrite")
    conditions = [
        "ntz >= '2026-01-02 12:00:00' AND day < '2026-01-04'",
        # the session's zone is UTC
        "ts < '2026-01-03 13:00:00' AND price > 1.3 AND zip IN ('0150', '0250')",
    ]
    # a DataFrame per query: Spark 4.3 reuses a pushed plan on its relation (see below)
    got = assert_same_rows_per_condition(
        lambda c: read(spark, service, "typed_pushed", pushDownPredicate="true").filter(c),
        data.filter,
        conditions,
    )
    pushed = pushed_per_scan(got)
    assert len(pushed) == len(conditions) and all(pushed), pushed


def test_pushdown_is_declined_by_default_so_a_reused_dataframe_stays_right(
    spark: Any, service: ServiceProcess, filter_pushdown: None
) -> None:
    write(numbers(spark, 1000), service, "reused", mode="overwrite")
    df = read(spark, service, "reused")
    assert pushed_filters(df.filter("id >= 990")) == ""
    assert df.filter("id >= 990").count() == 10
    assert df.count() == 1000
    assert df.filter("id % 2 = 0").count() == 500
    df.createOrReplaceTempView("reused_view")
    assert spark.sql("SELECT count(*) FROM reused_view WHERE id < 3").first()[0] == 3
    assert spark.sql("SELECT count(*) FROM reused_view").first()[0] == 1000


def test_spark_43_still_reuses_pushed_read_plans(
    spark: Any, service: ServiceProcess, filter_pushdown: None
) -> None:
    """Canary for the Spark defect that keeps ``pushDownPredicate`` off by default.

    When this fails, the installed Spark scopes a pushdown's read plan to its own scan: make
    ``pushDownPredicate`` default to true and drop the warning in docs/spark-options.md.
    """
    write(numbers(spark, 1000), service, "reused_pushed", mode="overwrite")
    df = read(spark, service, "reused_pushed", pushDownPredicate="true")
    assert df.filter("id >= 990").count() == 10
    assert df.count() == 10, "Spark no longer reuses the pushed plan: see the docstring"


def test_sql_catalog_table(spark: Any, service: ServiceProcess) -> None:
    write(numbers(spark, 50), service, "sqltable", mode="overwrite")
    options = ", ".join(f"{k} '{v}'" for k, v in service.options.items())
    with_clause = ", ".join(f"'{k}' = '{v}'" for k, v in service.options.items())
    with_clause += ", 'path' = 'sqltable'"
    spark.sql("DROP TABLE IF EXISTS aq_trips")
    # Creating a table hands its properties (provider, owner, location, TBLPROPERTIES) to
    # the source among its options: they must not be taken for misspelt options.
    spark.sql(
        f"CREATE TABLE aq_trips USING aqueduct OPTIONS ({options}) LOCATION 'sqltable' "
        "TBLPROPERTIES ('team' = 'mobility')"
    )
    try:
        # Spark 4.3 does not pass a table's OPTIONS on to a Python source when it is queried:
        # the user gets an error that says so and how to go on.
        with pytest.raises(Exception, match=r"Spark 4\.3 does not pass a table's OPTIONS"):
            spark.sql("SELECT count(*) FROM aq_trips").collect()
        # ... and each of the ways it names works.
        query = f"SELECT count(*) FROM aq_trips WITH ({with_clause})"
        assert spark.sql(query).first()[0] == 50
        spark.sql(
            f"INSERT INTO aq_trips WITH ({with_clause}) "
            f"SELECT id + 50, x, s FROM aq_trips WITH ({with_clause})"
        )
        reread = spark.read.options(**service.options).option("path", "sqltable")
        assert reread.table("aq_trips").selectExpr("count(*)", "sum(id)").first() == (100, 4950)
        numbers(spark, 10).writeTo("aq_trips").options(**service.options, path="sqltable").append()
        assert service.client().describe("sqltable").rows == 110
    finally:
        spark.sql("DROP TABLE IF EXISTS aq_trips")


def test_sql_temporary_view(spark: Any, service: ServiceProcess) -> None:
    write(numbers(spark, 50), service, "sqlview", mode="overwrite")
    options = ", ".join(f"{k} '{v}'" for k, v in service.options.items())
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW aq_view USING aqueduct OPTIONS ({options}, path 'sqlview')"
    )
    try:
        assert spark.sql("SELECT count(*), sum(id) FROM aq_view").first() == (50, 1225)
        spark.sql("INSERT INTO aq_view SELECT id + 50, x, s FROM aq_view")
        assert service.client().describe("sqlview").rows == 100
        spark.sql("INSERT OVERWRITE aq_view SELECT * FROM aq_view WHERE id < 10")
        assert service.client().describe("sqlview").rows == 10
    finally:
        spark.sql("DROP VIEW IF EXISTS aq_view")
    bad = f"{options}, path 'sqlview', urll 'x'"
    with pytest.raises(Exception, match=r"unknown option 'urll'.*Did you mean url"):
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW aq_bad USING aqueduct OPTIONS ({bad})")


def test_a_dataframe_keeps_reading_the_version_of_its_first_action(
    spark: Any, service: ServiceProcess
) -> None:
    # Documented: a DataFrame is a snapshot; load again to see newer commits.
    write(numbers(spark, 20), service, "pinned", mode="overwrite")
    df = read(spark, service, "pinned")
    assert df.count() == 20
    write(numbers(spark, 5), service, "pinned")
    assert df.count() == 20
    assert read(spark, service, "pinned").count() == 25


TYPES = StructType(
    [
        StructField("id", IntegerType()),
        StructField("b", ByteType()),
        StructField("sh", ShortType()),
        StructField("i", IntegerType()),
        StructField("l", LongType()),
        StructField("f", FloatType()),
        StructField("d", DoubleType()),
        StructField("dec", DecimalType(38, 10)),
        StructField("s", StringType()),
        StructField("bin", BinaryType()),
        StructField("bool", BooleanType()),
        StructField("date", DateType()),
        StructField("ts", TimestampType()),
        StructField("ntz", TimestampNTZType()),
        StructField("arr", ArrayType(LongType())),
        StructField("m", MapType(StringType(), LongType())),
        StructField(
            "st", StructType([StructField("a", IntegerType()), StructField("b", StringType())])
        ),
        StructField(
            "nested",
            ArrayType(
                StructType(
                    [StructField("k", StringType()), StructField("v", ArrayType(DoubleType()))]
                )
            ),
        ),
    ]
)


def type_rows() -> list[tuple[Any, ...]]:
    ts = dt.datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=dt.UTC)
    full = (
        1,
        -128,
        -32768,
        -(2**31),
        -(2**63),
        1.5,
        -2.25,
        decimal.Decimal("1234567890123456789012345678.0123456789"),
        "héllo wörld ✓",
        b"\x00\xffbytes",
        True,
        dt.date(1970, 1, 1),
        ts,
        dt.datetime(2026, 3, 4, 5, 6, 7),
        [1, 2, None],
        {"a": 1, "b": None},
        (7, "x"),
        [("k1", [1.0, None]), None],
    )
    edges = (
        2,
        127,
        32767,
        2**31 - 1,
        2**63 - 1,
        float("inf"),
        float("nan"),
        decimal.Decimal("-0.0000000001"),
        "",
        b"",
        False,
        dt.date(2262, 4, 11),
        ts,
        dt.datetime(1900, 1, 1),
        [],
        {},
        (None, None),
        [],
    )
    nulls: tuple[Any, ...] = (3, *([None] * 17))
    return [full, edges, nulls]


def test_every_spark_type_round_trips(spark: Any, service: ServiceProcess) -> None:
    df = spark.createDataFrame(type_rows(), TYPES)
    write(df, service, "types", mode="overwrite")
    got = read(spark, service, "types")
    assert got.schema == df.schema
    assert_df_equality(got.orderBy("id"), df.orderBy("id"), allow_nan_equality=True)


def test_empty_dataset_and_empty_partitions(spark: Any, service: ServiceProcess) -> None:
    empty = numbers(spark, 0)
    write(empty, service, "empty", mode="overwrite")
    assert read(spark, service, "empty").count() == 0
    assert read(spark, service, "empty").schema == empty.schema
    sparse = spark.range(0, 3, numPartitions=8).selectExpr("id")  # several empty partitions
    write(sparse, service, "sparse", mode="overwrite")
    assert sorted(r.id for r in read(spark, service, "sparse").collect()) == [0, 1, 2]


def test_many_small_splits_and_a_few_large_ones(spark: Any, service: ServiceProcess) -> None:
    many = numbers(spark, 20_000, partitions=24)  # 24 small files: 24 splits
    write(many, service, "many_splits", mode="overwrite")
    few = numbers(spark, 40_000, partitions=2)  # 2 files, each far below splitSize
    write(few, service, "few_splits", mode="overwrite")
    got_many = read(spark, service, "many_splits", splitSize="1MB", fileOpenCost="1MB")
    got_few = read(spark, service, "few_splits", splitSize="1GB")
    packed = read(spark, service, "many_splits")  # 128MB, each file counted 64KB more
    cores = driver_cores()
    assert got_many.rdd.getNumPartitions() == 24  # each file over 1MB with its open cost
    # far below the target: spread over the driver's cores (as Spark's minPartitionNum)
    assert got_few.rdd.getNumPartitions() == min(2, cores)
    assert packed.rdd.getNumPartitions() == min(24, cores)
    sizes = [len(p) for p in packed.rdd.glom().collect()]
    assert max(sizes) - min(sizes) <= 20_000 // 24 + 1  # evenly: files differ by one at most
    apart = read(spark, service, "few_splits", splitSize="1GB", fileOpenCost="1GB")
    assert apart.rdd.getNumPartitions() == 2  # a file as costly as the target: one each
    assert_df_equality(got_many, many, ignore_row_order=True)
    assert_df_equality(got_few, few, ignore_row_order=True)


def test_a_task_that_fails_leaves_the_dataset_unchanged(
    spark: Any, service: ServiceProcess
) -> None:
    write(numbers(spark, 10), service, "atomic", mode="overwrite")
    before = service.client().describe("atomic")

    def explode(it: Any) -> Any:
        from pyspark import TaskContext

        for batch in it:
            if TaskContext.get().partitionId() == 1:
                raise RuntimeError("boom in task 1")
            yield batch

    bad = numbers(spark, 1000, partitions=3).mapInArrow(explode, numbers(spark, 0).schema)
    with pytest.raises(Exception, match="boom in task 1"):
        write(bad, service, "atomic")
    after = service.client().describe("atomic")
    assert (after.version, after.rows) == (before.version, before.rows)
    assert read(spark, service, "atomic").count() == 10


def test_a_retried_task_writes_each_row_exactly_once(spark: Any, service: ServiceProcess) -> None:
    def flaky(it: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for i, batch in enumerate(it):
            yield batch
            if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and i == 0:
                raise RuntimeError("first attempt dies after sending a batch")

    df = numbers(spark, 50_000, partitions=2)
    flaky_df = df.repartition(2).mapInArrow(flaky, df.schema)
    write(flaky_df, service, "retried", mode="overwrite")
    got = read(spark, service, "retried")
    assert got.count() == 50_000 and got.select("id").distinct().count() == 50_000


def test_service_down_names_the_url(spark: Any) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"quic://127.0.0.1:{port}"
    with pytest.raises(Exception, match=f"127.0.0.1:{port}"):
        spark.read.format("aqueduct").option("url", url).option("insecure", "false").option(
            "connectTimeout", "2s"
        ).option("retries", "0").load("anything").count()


def test_each_error_is_its_own_clear_error(
    spark: Any, service: ServiceProcess, secured_service: ServiceProcess
) -> None:
    with pytest.raises(Exception, match=r"DatasetNotFound|does not exist"):
        read(spark, service, "no_such_dataset").count()
    write(numbers(spark, 3), service, "strict", mode="overwrite")
    mismatched = spark.range(3).selectExpr("cast(id as string) as id")
    with pytest.raises(Exception, match=r"SchemaMismatch|schema"):
        write(mismatched, service, "strict")
    wrong = {**secured_service.options, "token": "wrong"}
    with pytest.raises(Exception, match=r"Unauthenticated|token"):
        spark.read.format("aqueduct").options(**wrong).load("x").count()
    with pytest.raises(Exception, match="unknown option 'splitsize2'"):
        read(spark, service, "strict", splitSize2="1").count()
