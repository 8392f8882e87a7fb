"""The writer options Delta users reach for first (issue 20, item 6): replaceWhere,
mergeSchema and txnAppId/txnVersion from Spark; Delta's other names answered with what to use
instead; and what Spark does with ``DataFrameWriter.partitionBy``."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from aqueduct_spark.datasource.delta_names import DELTA_ANSWERS
from aqueduct_spark.datasource.options import OPTIONS, OptionError, parse
from aqueduct_spark.testing import ServiceProcess

URL = "quic://127.0.0.1:4433"


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("maxFilesPerTrigger", "maxRowsPerTrigger"),
        ("partitionOverwriteMode", "replaceWhere"),
        ("ignoreChanges", "drop the option"),
        ("maxRecordsPerFile", "drop the option"),
    ],
)
def test_a_delta_option_is_answered_with_what_to_use(name: str, answer: str) -> None:
    with pytest.raises(OptionError, match=rf"option '{name}' is Delta Lake's.*{answer}"):
        parse({"url": URL, "path": "d", name: "1"})


def test_no_delta_answer_shadows_an_option() -> None:
    """An option taken under Delta's name is never answered as if it were not."""
    taken = {o.name.lower() for o in OPTIONS}
    assert not taken & set(DELTA_ANSWERS)


def test_delta_write_options_are_taken() -> None:
    opts = parse(
        {
            "url": URL,
            "path": "d",
            "mergeSchema": "true",
            "replaceWhere": "day = '2026-01-01'",
            "txnAppId": "loader",
            "txnVersion": "3",
        }
    )
    assert (opts.merge_schema, opts.replace_where) == (True, "day = '2026-01-01'")
    assert (opts.txn_app_id, opts.txn_version) == ("loader", 3)
    with pytest.raises(OptionError, match="txnAppId and txnVersion together"):
        parse({"url": URL, "path": "d", "txnAppId": "loader"})


def _writer(df: Any, service: ServiceProcess, mode: str, **options: str) -> Any:
    return df.write.format("aqueduct").options(**service.options, **options).mode(mode)


@pytest.mark.spark
def test_replace_where_merge_schema_and_txn_from_spark(spark: Any, service: ServiceProcess) -> None:
    name = f"wo_{uuid.uuid4().hex[:8]}"
    days = spark.createDataFrame([(1, "mon"), (2, "tue"), (3, "tue")], "id long, day string")
    _writer(days, service, "append", partitionBy="day").save(name)
    tue = spark.createDataFrame([(9, "tue")], "id long, day string")
    _writer(tue, service, "overwrite", replaceWhere="day = 'tue'").save(name)
    with service.client() as c:
        assert sorted(c.read(name).to_pylist(), key=lambda r: r["id"]) == [
            {"id": 1, "day": "mon"},
            {"id": 9, "day": "tue"},
        ]
        assert c.describe(name).version == 1  # one commit for the removes and the new rows

        wed = spark.createDataFrame([(4, "wed", 0.5)], "id long, day string, score double")
        _writer(wed, service, "append", mergeSchema="true").save(name)
        assert c.describe(name).schema.names == ["id", "day", "score"]

        for _ in range(2):  # a rerun of the same txnVersion commits nothing
            _writer(wed, service, "append", txnAppId="load", txnVersion="1").save(name)
        assert c.describe(name).rows == 4

        with pytest.raises(Exception, match=r"do not match replaceWhere"):
            _writer(wed, service, "overwrite", replaceWhere="day = 'mon'").save(name)
        assert c.describe(name).rows == 4


@pytest.mark.spark
def test_the_partition_by_method_is_refused_by_spark_itself(
    spark: Any, service: ServiceProcess
) -> None:
    """PySpark 4.3 does not pass ``DataFrameWriter.partitionBy`` to a Python data source:
    Spark fails the write before any of the source's code runs (so no dataset appears). If
    this test fails, Spark now passes it on, and the writer should honour it."""
    name = f"pb_{uuid.uuid4().hex[:8]}"
    df = spark.createDataFrame([(1, "mon")], "id long, day string")
    with pytest.raises(Exception, match="provided partitioning") as failed:
        _writer(df, service, "append").partitionBy("day").save(name)
    assert "identity(day)" in str(failed.value)
    with service.client() as c:
        assert name not in [d.name for d in c.list()]


@pytest.mark.spark
@pytest.mark.parametrize(
    ("expression", "where"),
    [
        ("""parse_json('{"a": 1}')""", "doc"),
        ("""named_struct('inner', parse_json('[1]'))""", "doc.inner"),
    ],
)
def test_a_variant_column_is_refused_at_write_naming_the_fix(
    spark: Any, service: ServiceProcess, expression: str, where: str
) -> None:
    """Issue 20, item 8: Spark hands a variant to Python as a struct of two binary columns;
    stored like that it would silently change type. Refused on the driver, before any task."""
    name = f"var_{uuid.uuid4().hex[:8]}"
    df = spark.range(1).selectExpr("id", f"{expression} AS doc")
    with pytest.raises(Exception, match=rf"column '{where}' has Spark type variant") as failed:
        _writer(df, service, "append").save(name)
    assert "to_json(" in str(failed.value) and "parse_json(" in str(failed.value)
    with service.client() as c:
        assert name not in [d.name for d in c.list()]
