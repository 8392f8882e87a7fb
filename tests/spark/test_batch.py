"""The Spark batch connector in Spark local mode against a real service process."""

from __future__ import annotations

import datetime as dt
import decimal
import socket
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, Row
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


@pytest.mark.parametrize("pushdown", [False, True], ids=["no-pushdown", "pushdown"])
def test_filters_give_the_same_rows_with_and_without_pushdown(
    spark: Any, service: ServiceProcess, pushdown: bool
) -> None:
    data = numbers(spark, 100).withColumn(
        "s", F.when(F.col("id") % 10 == 3, None).otherwise(F.col("s"))
    )
    write(data, service, "filtered", mode="overwrite")
    spark.conf.set("spark.sql.python.filterPushdown.enabled", str(pushdown).lower())
    try:
        for condition in FILTERS:
            got = read(spark, service, "filtered").filter(condition)
            want = data.filter(condition)
            assert_df_equality(got, want, ignore_row_order=True), condition
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def test_sql_usage(spark: Any, service: ServiceProcess) -> None:
    write(numbers(spark, 50), service, "sqlds", mode="overwrite")
    options = ", ".join(f"{k} '{v}'" for k, v in service.options.items())
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW sqlds USING aqueduct OPTIONS (path 'sqlds', {options})"
    )
    assert spark.sql("SELECT count(*) AS n, sum(id) AS total FROM sqlds").collect() == [
        Row(n=50, total=1225)
    ]


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
    few = numbers(spark, 400_000, partitions=2)  # 2 large files
    write(few, service, "few_splits", mode="overwrite")
    got_many = read(spark, service, "many_splits", splitSize="1MB")
    got_few = read(spark, service, "few_splits", splitSize="1GB")
    assert got_many.rdd.getNumPartitions() == 24
    assert got_few.rdd.getNumPartitions() == 2
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
