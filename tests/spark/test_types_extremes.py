"""Every Spark type at the ends of its range survives a write and a read through Delta, and a
type Delta cannot hold fails with a clear error naming the column (issue 17, item 3)."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pytest
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

from aqueduct_spark.testing import ServiceProcess

pytestmark = pytest.mark.spark

INNER = StructType([StructField("a", IntegerType()), StructField("b", StringType())])
TYPES = StructType(
    [
        StructField("id", LongType(), False),
        StructField("bool", BooleanType()),
        StructField("i8", ByteType()),
        StructField("i16", ShortType()),
        StructField("i32", IntegerType()),
        StructField("i64", LongType()),
        StructField("f32", FloatType()),
        StructField("f64", DoubleType()),
        StructField("dec0", DecimalType(38, 0)),
        StructField("dec18", DecimalType(38, 18)),
        StructField("dec38", DecimalType(38, 38)),
        StructField("s", StringType()),
        StructField("bin", BinaryType()),
        StructField("date", DateType()),
        StructField("ts", TimestampType()),
        StructField("ntz", TimestampNTZType()),
        StructField("arr", ArrayType(LongType())),
        StructField("m", MapType(StringType(), DoubleType())),
        StructField("st", INNER),
        StructField("deep", ArrayType(MapType(StringType(), ArrayType(INNER)))),
    ]
)

NINES = "9" * 38
FIRST = dt.datetime(1, 1, 1)  # Spark's and Delta's first microsecond, and their last:
LAST = dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
F32_MAX = 3.4028234663852886e38


def rows() -> list[tuple[Any, ...]]:
    nan, inf = float("nan"), float("inf")
    top = (
        1, True, 127, 32767, 2**31 - 1, 2**63 - 1, F32_MAX, 1.7976931348623157e308,
        decimal.Decimal(NINES), decimal.Decimal(f"{NINES[:20]}.{NINES[:18]}"),
        decimal.Decimal(f"0.{NINES}"),
        "最後 ✓", b"\xff" * 3, dt.date(9999, 12, 31), LAST.replace(tzinfo=dt.UTC), LAST,
        [2**63 - 1, None], {"k": inf, "null": None}, (2**31 - 1, None),
        [{"x": [(1, None), None]}, None, {}],
    )  # fmt: skip
    bottom = (
        2, False, -128, -32768, -(2**31), -(2**63), -F32_MAX, -1.7976931348623157e308,
        decimal.Decimal(f"-{NINES}"), decimal.Decimal(f"-{NINES[:20]}.{NINES[:18]}"),
        decimal.Decimal(f"-0.{NINES}"),
        "", b"", dt.date(1, 1, 1), FIRST.replace(tzinfo=dt.UTC), FIRST,
        [], {}, (None, None), [],
    )  # fmt: skip
    special = (
        3, None, 0, 0, 0, 0, nan, nan, decimal.Decimal(0), decimal.Decimal("1e-18"),
        decimal.Decimal("1e-38"),
        "\x00", b"\x00", dt.date(1970, 1, 1), dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
        dt.datetime(1970, 1, 1), [None], {"nan": nan}, (None, ""), [None, {"e": []}],
    )  # fmt: skip
    infinities = (
        4, None, None, None, None, None, -inf, inf, None, None, None, None, None, None, None,
        None, None, {"-inf": -inf}, None, [{"n": None}],
    )  # fmt: skip
    tiny = (
        5, None, None, None, None, None, 1.401298464324817e-45, 5e-324, None, None, None,
        None, None, None, LAST.replace(microsecond=0, tzinfo=dt.UTC), FIRST.replace(second=1),
        None, None, None, None,
    )  # fmt: skip
    nulls = (6, *([None] * (len(TYPES) - 1)))
    return [top, bottom, special, infinities, tiny, nulls]


def write(df: DataFrame, service: ServiceProcess, name: str) -> None:
    df.write.format("aqueduct").options(**service.options).mode("overwrite").save(name)


def as_text(df: DataFrame) -> list[str]:
    """Each row as Spark prints it, every digit of decimals, floats and microseconds, and NaN
    nested in a map (pyspark's collect() cannot convert a timestamp of the year 1, and chispa
    compares NaN only at the top level)."""
    micros = {
        "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
        "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    }
    text = df.orderBy("id").select(F.to_json(F.struct("*"), micros).alias("j"))
    return [r.j for r in text.collect()]


def test_every_type_round_trips_at_its_extremes(spark: Any, service: ServiceProcess) -> None:
    df = spark.createDataFrame(rows(), TYPES)
    write(df, service, "extremes")
    got = spark.read.format("aqueduct").options(**service.options).load("extremes")
    assert got.schema == df.schema
    assert as_text(got) == as_text(df)
    assert "9999-12-31T23:59:59.999999Z" in as_text(got)[0]
    assert '"f64":"NaN"' in as_text(got)[2]


@pytest.mark.parametrize(
    ("column", "expression"),
    [
        ("span", "INTERVAL '1 02:03:04' DAY TO SECOND"),
        ("months", "INTERVAL '1-2' YEAR TO MONTH"),
        ("nothing", "NULL"),
    ],
)
def test_a_type_delta_cannot_hold_fails_naming_the_column(
    spark: Any, service: ServiceProcess, column: str, expression: str
) -> None:
    df = spark.range(1).selectExpr("id", f"{expression} AS {column}")
    with pytest.raises(Exception) as failed:
        write(df, service, f"cannot_{column}")
    text = str(failed.value)
    assert "SchemaMismatch" in text and f"column {column!r}" in text, text
    assert "Delta Lake cannot store" in text and "cast it" in text, text
