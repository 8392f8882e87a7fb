"""Filters bind their literals to the column's type on every path a user writes one (issue 27):
the CLI's ``--where`` and ``delete --where``, and the Python client's ``filter=``, over a real
``aqueduct serve``; timestamps with and without zone, dates, decimals, text that looks like a
number. A comparison that cannot be made is refused naming column, type and value.
(Spark's pushed filters: tests/spark/test_batch.py.)"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aqueduct_spark import cli
from aqueduct_spark.protocol import InvalidRequest
from aqueduct_spark.testing import ServiceProcess

UTC = dt.UTC
ROWS = pa.table(
    {
        "id": pa.array([1, 2, 3, 4], pa.int64()),
        "city": ["Oslo", "Bergen", "Oslo", None],
        "zip": ["01234", "5003", "0150", "9990"],
        # Spark's TIMESTAMP (an instant, stored in UTC) and TIMESTAMP_NTZ (wall-clock)
        "ts": pa.array(
            [dt.datetime(2026, 1, d, 12, tzinfo=UTC) for d in (1, 2, 3, 4)],
            pa.timestamp("us", "UTC"),
        ),
        "local": pa.array([dt.datetime(2026, 1, d, 12) for d in (1, 2, 3, 4)], pa.timestamp("us")),
        "day": pa.array([dt.date(2026, 1, d) for d in (1, 2, 3, 4)]),
        "price": pa.array(
            [Decimal(p) for p in ("1.50", "2.25", "3.00", "10.10")], pa.decimal128(10, 2)
        ),
    }
)


@pytest.fixture(scope="module")
def dataset(service: ServiceProcess) -> str:
    name = f"typed_{uuid.uuid4().hex[:8]}"
    with service.client() as c:
        c.overwrite(name, ROWS)
    return name


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        # a datetime without a zone against a zoned column: that zone (UTC)
        ([("ts", ">=", dt.datetime(2026, 1, 2, 12))], [2, 3, 4]),
        # one with a zone against a zone-less column: its UTC wall-clock time
        (
            [
                (
                    "local",
                    "<",
                    dt.datetime(2026, 1, 2, 13, 30, tzinfo=dt.timezone(dt.timedelta(hours=1))),
                )
            ],
            [1, 2],
        ),
        # naive against zone-less: the wall-clock time as written
        ([("local", "==", dt.datetime(2026, 1, 3, 12))], [3]),
        ([("ts", "<", "2026-01-02")], [1]),
        ([("day", "==", "2026-01-02")], [2]),
        ([("day", ">", dt.date(2026, 1, 3))], [4]),
        ([("price", "==", Decimal("1.5"))], [1]),
        ([("price", ">", "2.5")], [3, 4]),
        ([("zip", "==", "01234")], [1]),
        ([("id", "in", ["2", "3"])], [2, 3]),
        # SQL text, alone or beside tuples
        ("ts > '2026-01-02' AND city = 'Oslo'", [3]),
        (["zip = 01234", ("price", "<", 3)], [1]),
    ],
)
def test_python_filters_take_the_column_type(
    service: ServiceProcess, dataset: str, flt: Any, expected: list[int]
) -> None:
    with service.client() as c:
        assert ids(c.read(dataset, filter=flt)) == expected


@pytest.mark.parametrize(
    ("flt", "message"),
    [
        # was: IndexError: tuple index out of range
        ([("city", "==")], r"filter \('city', '=='\): '==' needs a value"),
        # was: a pyarrow schema dump and "compare each column with a value of its type"
        ([("citty", "==", "Oslo")], r"no column 'citty' in the dataset \(did you mean 'city'\?\)"),
        (
            [("ts", ">", "soon")],
            r"cannot compare column 'ts' \(timestamp\[us, tz=UTC\]\) with 'soon': not a "
            r"timestamp; compare it with a value of its type, e.g. ts = '2026-01-31 12:00:00'",
        ),
        ([("zip", "==", 1234)], r"column 'zip' \(string\) with 1234: int is not text \(quote it\)"),
        ("day = 'tuesday'", r"column 'day' \(date32\[day\]\) with 'tuesday': not a date"),
    ],
)
def test_a_filter_that_cannot_be_bound_says_why(
    service: ServiceProcess, dataset: str, flt: Any, message: str
) -> None:
    with service.client() as c, pytest.raises(InvalidRequest, match=message):
        c.read(dataset, filter=flt)


def test_the_cli_where_takes_sql_with_typed_literals(
    service: ServiceProcess, dataset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    conn = ["--url", service.url, "--fingerprint", service.fingerprint]

    def exported(*where: str) -> list[int]:
        args = ["export", dataset, str(out), "--force", "--columns", "id", *conn]
        for w in where:
            args += ["--where", w]
        assert cli.main(args) == 0, capsys.readouterr().err
        return sorted(pq.read_table(out).column("id").to_pylist())

    out = service.root.parent / f"{dataset}.parquet"
    # was: no kernel matching input types (timestamp[us], string)
    assert exported("ts > '2026-01-02'") == [2, 3, 4]
    assert exported("local >= '2026-01-03 12:00'", "day <= '2026-01-03'") == [3]
    assert exported("price = 2.25 OR zip = 0150") == [2, 3]
    assert exported("ts >= TIMESTAMP '2026-01-02T13:00:00+01:00'") == [2, 3, 4]
    capsys.readouterr()
    assert cli.main(["head", dataset, "--where", "ts > 'next week'", *conn]) == 1
    err = capsys.readouterr().err
    assert "cannot compare column 'ts' (timestamp[us, tz=UTC]) with 'next week'" in err
    assert "no kernel" not in err


def test_delete_binds_like_a_read(
    service: ServiceProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """``delete --where`` is the same language: Delta Lake runs it with typed literals (its
    own parser cannot compare a timestamp column with TIMESTAMP '...')."""
    name = f"typed_del_{uuid.uuid4().hex[:8]}"
    conn = ["--url", service.url, "--fingerprint", service.fingerprint]
    with service.client() as c:
        c.overwrite(name, ROWS)
        for where, left in [
            ("ts < '2026-01-02'", [2, 3, 4]),
            ("local = TIMESTAMP_NTZ '2026-01-02 12:00:00'", [3, 4]),
            ("day = '2026-01-03' OR price = 10.1", []),
        ]:
            assert cli.main(["delete", name, "--where", where, *conn]) == 0
            assert ids(c.read(name)) == left, where
        c.overwrite(name, ROWS)
        assert c.delete(name, "zip = 01234 AND city IN ('Oslo')")["rows_deleted"] == 1
    capsys.readouterr()
    assert cli.main(["delete", name, "--where", "citty = 'Oslo'", *conn]) == 1
    err = capsys.readouterr().err.strip()
    # was: Generic DeltaTable error: External error: Generic DeltaTable error: Schema error:
    # No field named citty. Did you mean 'city'?
    assert err.count("\n") == 0 and "DeltaTable" not in err
    assert f"delete from dataset {name!r} where \"citty = 'Oslo'\": no column 'citty'" in err
    assert "(did you mean 'city'?)" in err
