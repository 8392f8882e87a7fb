"""The SQL conditions of replaceWhere: parsed, typed against the schema, evaluated with SQL's
three-valued logic; anything else refused with a message that shows what is accepted."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from aqueduct_spark.protocol import InvalidRequest
from aqueduct_spark.service import predicates

UTC = dt.UTC
ROWS = pa.table(
    {
        "n": [1, 2, 3, None],
        "region": ["eu-1", "us", None, "eu-2"],
        "day": pa.array([dt.date(2026, 1, d) for d in (1, 2, 3, 4)]),
        "at": pa.array(
            [dt.datetime(2026, 1, d, tzinfo=UTC) for d in (1, 2, 3, 4)], pa.timestamp("us", "UTC")
        ),
        "local": pa.array([dt.datetime(2026, 1, 1, h) for h in (1, 2, 3, 4)], pa.timestamp("us")),
        "price": pa.array([Decimal("1.50")] * 3 + [None], pa.decimal128(5, 2)),
        "flag": [True, False, None, True],
        "s": pa.array([{"a": i} for i in range(4)]),
    }
)


def matching(condition: str) -> list[int]:
    """Row numbers (0-3) for which ``condition`` is true."""
    expression = predicates.bind(condition, ROWS.schema)
    marked = ROWS.append_column("i", pa.array(range(4)))
    return marked.filter(predicates.is_true(expression)).column("i").to_pylist()


@pytest.mark.parametrize(
    ("condition", "rows"),
    [
        ("n = 2", [1]),
        ("n == 2 OR n <> 2", [0, 1, 2]),  # NULL is neither
        ("NOT (n = 2)", [0, 2]),
        ("n IS NULL", [3]),
        ("n IS NOT NULL AND n >= 2", [1, 2]),
        ("n IN (1, 3)", [0, 2]),
        ("n NOT IN (1, NULL)", []),  # SQL: NOT IN with a NULL is never true
        ("n BETWEEN 2 AND 3", [1, 2]),
        ("n NOT BETWEEN 2 AND 3", [0]),
        ("n > 1.5", [1, 2]),
        ("n <=> NULL", [3]),
        ("region LIKE 'eu-%'", [0, 3]),
        ("region NOT LIKE 'eu-%'", [1]),
        ("region = 'it''s'", []),
        ("day >= '2026-01-03'", [2, 3]),
        ("day = DATE '2026-01-02'", [1]),
        ("at < '2026-01-02'", [0]),  # no zone: UTC
        ("at = TIMESTAMP '2026-01-02T01:00:00+01:00'", [1]),
        ("local = '2026-01-01 02:00:00'", [1]),
        ("price = 1.5", [0, 1, 2]),
        ("flag", [0, 3]),
        ("flag = false", [1]),
        ("s.a >= 2 and `n` = 3", [2]),
        ("true", [0, 1, 2, 3]),
    ],
)
def test_a_condition_selects_the_rows_sql_would(condition: str, rows: list[int]) -> None:
    assert matching(condition) == rows


def test_columns_are_the_top_level_names_read() -> None:
    tree = predicates.parse("s.a = 1 AND (day > '2026-01-01' OR region LIKE 'x%')")
    assert predicates.columns(tree) == {"s", "day", "region"}


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        ("", "the condition is empty"),
        ("n >", "expected a value but found the end"),
        ("n = 1 n", "unexpected 'n'"),
        ("n = @", "cannot read '@'"),
        ("n NOT 1", "NOT here must be followed by IN, BETWEEN or LIKE"),
        ("nope = 1", "names column 'nope', which is not in the dataset"),
        ("s.b = 1", "not in struct 's'"),
        ("n = 'one'", "'one' is not a value of type int64"),
        ("region = 1", "compares a string column with 1"),
        ("day = DATE 'soon'", "DATE 'soon' is not ISO 8601"),
        ("NOT n", "is not a true-or-false condition"),
        ("region LIKE 1", "LIKE needs a 'quoted pattern'"),
    ],
)
def test_a_bad_condition_says_what_is_wrong(condition: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message) as failed:
        predicates.bind(condition, ROWS.schema)
    assert "replaceWhere" in str(failed.value)
