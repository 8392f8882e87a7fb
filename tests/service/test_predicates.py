"""The one condition language (replaceWhere, delete, --where, filter=, Spark pushdown): parsed
by sqlglot's Spark dialect, literals bound to their column's type, evaluated with SQL's
three-valued logic; anything else refused with a message naming column, type and value."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from aqueduct_spark.protocol import InvalidRequest, to_wire_filters
from aqueduct_spark.service import binding, predicates

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
    expression = binding.bind(condition, ROWS.schema)
    marked = ROWS.append_column("i", pa.array(range(4)))
    return marked.filter(binding.is_true(expression)).column("i").to_pylist()


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
        ("region = 'it''s'", []),  # Spark: adjacent literals join ('its')
        ("region = \"eu-1\" OR region = 'it\\'s'", [0]),
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
        ("n >", "cannot read it at column 3 .*something is missing"),
        ("n = 1 n", "unexpected 'n' after 'n = 1'"),
        ("n = @", "cannot read it"),
        ("n NOT 1", "cannot read it"),
        ("nope = 1", "no column 'nope' in the dataset; name one of its columns: n, region, day"),
        ("regoin = 'x'", r"no column 'regoin' in the dataset \(did you mean 'region'\?\)"),
        ("region = eu", "to compare with the text eu, quote it: 'eu'"),
        ("s.b = 1", "struct 's' has no field 'b'; name one of its fields: a"),
        ("n = 'one'", r"cannot compare column 'n' \(int64\) with 'one': not a number.* n = 42"),
        ("region = true", r"column 'region' \(string\) with true: bool is not text"),
        ("at > 'soon'", r"column 'at' \(timestamp\[us, tz=UTC\]\) with 'soon': not a timestamp"),
        ("day = '2026-01-01T10:00'", r"'day' \(date32\[day\]\) .* not a date.* day = '2026-01-31'"),
        (
            "price = 'abc'",
            r"'price' \(decimal128\(5, 2\)\) with 'abc': not a number.* price = 1.50",
        ),
        ("flag = 1", "not a boolean"),
        ("day = DATE 'soon'", "DATE 'soon' is not a date"),
        ("NOT n", "is not a true-or-false condition"),
        ("region LIKE 1", "LIKE needs a 'quoted pattern'"),
        ("n LIKE '1%'", "LIKE needs a text column, and 'n' is int64"),
        ("upper(region) = 'X'", "'UPPER\\(region\\)' is not accepted here"),
        ("n IN (SELECT 1)", "IN takes a list of values, not a query"),
        ("n = 1; n = 2", "write one condition, not several statements"),
    ],
)
def test_a_bad_condition_says_what_is_wrong(condition: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message) as failed:
        binding.bind(condition, ROWS.schema)
    assert str(failed.value).startswith(f"replaceWhere {condition!r}: ")


@pytest.mark.parametrize(
    ("condition", "rows"),
    [
        # a literal takes its column's type: text that reads as a number, a date, a decimal
        ("n = '2'", [1]),
        ("n IN ('1', '3')", [0, 2]),
        ("price = '1.5'", [0, 1, 2]),
        ("price < 1.505", [0, 1, 2]),  # more digits than the column's scale: still exact
        ("day = '2026-01-02'", [1]),
        # a SQL number against text is the text as written (leading zeros kept)
        ("region = 01", []),
        # naive against a zoned column: that zone (UTC); zoned against naive: UTC wall-clock
        ("at >= '2026-01-03'", [2, 3]),
        ("at >= TIMESTAMP_NTZ '2026-01-03 00:00:00'", [2, 3]),
        ("at < '2026-01-02T01:00:00+02:00'", [0]),
        ("local >= '2026-01-01 03:00'", [2, 3]),
        ("local = TIMESTAMP '2026-01-01 03:00:00+01:00'", [1]),
        ("local > '2026-01-01'", [0, 1, 2, 3]),
        ("startswith(region, 'eu') AND NOT endswith(region, '2')", [0]),
        ("contains(region, 'u-')", [0, 3]),
        ("region ILIKE 'EU-%'", [0, 3]),
        ("flag = 'true'", [0, 3]),
    ],
)
def test_literals_take_the_type_of_their_column(condition: str, rows: list[int]) -> None:
    assert matching(condition) == rows


def test_structured_predicates_bind_like_text() -> None:
    """The wire form (Python's filter= tuples, Spark's pushed filters) follows the same rules;
    a datetime without a zone travels as a typed literal, not as CBOR (which has none)."""
    wire = to_wire_filters(
        [
            ("local", ">=", dt.datetime(2026, 1, 1, 2)),
            ("at", "<", dt.datetime(2026, 1, 4)),  # naive: the column's zone, UTC
            ("n", "in", ["1", 2, 3]),
            ("price", "==", "1.50"),
        ]
    )
    assert wire[0] == [">=", ["local"], {"timestamp_ntz": "2026-01-01T02:00:00"}]
    condition = binding.Condition.from_wire(wire)
    assert condition is not None
    marked = ROWS.append_column("i", pa.array(range(4)))
    expression = binding.is_true(condition.bind(ROWS.schema))
    assert marked.filter(expression).column("i").to_pylist() == [1, 2]
    utc = binding.Condition.from_wire(
        to_wire_filters([("local", "<", dt.datetime(2026, 1, 1, 3, tzinfo=UTC))])
    )
    assert utc is not None
    assert marked.filter(binding.is_true(utc.bind(ROWS.schema))).column("i").to_pylist() == [
        0,
        1,
    ]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            [("city", "==")],
            r"filter \('city', '=='\): '==' needs a value: write \('city', '==', value\)",
        ),
        ([("city", "~=", 1)], r"unknown operator '~='.* use one of =="),
        ([("city", "in", "Oslo")], "'in' needs a list of values"),
        ([("city", "is_null", 1)], "'is_null' takes no value"),
        ([("", "==", 1)], "column '' is not a name"),
        ([("city", "==", object())], "cannot be a filter value"),
        ([("city", "startswith", "O")], r"did you mean 'starts_with'\?"),
        (3, "filter= takes a list of predicates or SQL text"),
        (["  "], "the condition is empty"),
    ],
)
def test_client_filters_are_checked_before_they_are_sent(given: object, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        to_wire_filters(given)


def test_a_delete_predicate_becomes_typed_delta_sql() -> None:
    """Delta's engine compares only equal types: every literal is written in its column's
    type, or the column is cast to the literal's wider one."""
    condition = binding.Condition.from_text(
        "at >= '2026-01-02' AND local < '2026-01-01 03:00' AND price = 1.5 AND price < 1.555 "
        "AND n < 2.5 AND day = '2026-01-01' AND region IN ('eu-1', NULL) AND n <=> 2 "
        "AND contains(region, 'u')",
        "delete where",
    )
    sql = condition.to_delta_sql(ROWS.schema)
    for part in (
        """("at" >= arrow_cast('2026-01-02T00:00:00', 'Timestamp(Microsecond, Some("UTC"))'))""",
        """("local" < arrow_cast('2026-01-01T03:00:00', 'Timestamp(Microsecond, None)'))""",
        """("price" = CAST('1.5' AS DECIMAL(5, 2)))""",
        """(CAST("price" AS DECIMAL(6, 3)) < CAST('1.555' AS DECIMAL(6, 3)))""",
        """(CAST("n" AS DOUBLE) < 2.5)""",
        """("day" = DATE '2026-01-01')""",
        """(("region" = 'eu-1') OR ("region" = NULL))""",
        """("n" IS NOT DISTINCT FROM 2)""",
        """(strpos("region", 'u') > 0)""",
    ):
        assert part in sql
