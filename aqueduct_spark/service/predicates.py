"""The one condition language: every place a user writes a row condition (the CLI's
``--where`` and ``delete --where``, the Python client's ``filter=``, ``replaceWhere``, Spark's
pushed filters) comes here, is parsed into one small syntax tree, and is bound to the
dataset's schema by :mod:`.binding` (literals take their column's type).

Text is Spark SQL, parsed by sqlglot's Spark dialect (a maintained parser, so quoting, escapes,
precedence and typed literals are Spark's, not ours). The part of it a row condition needs is
accepted; anything else (functions other than the string tests, subqueries, arithmetic) is
refused with a message listing what is::

    comparisons  = == != <> < <= > >= <=>        AND, OR, NOT, parentheses
    IN (...), BETWEEN ... AND ..., IS [NOT] NULL, [NOT] LIKE / ILIKE 'pattern'
    startswith(c, 'x'), endswith(c, 'x'), contains(c, 'x')
    literals     42, 1.5, -3, 1e3, 'text', TRUE, FALSE, NULL, X'00ff',
                 DATE '2026-01-31', TIMESTAMP '2026-01-31 12:00:00[+01:00]', TIMESTAMP_NTZ '...'
    columns      name, `quoted name`, struct.field

The structured predicates of the wire form (``["<", ["ts"], value]``, see
``protocol.filters``) become the same tree. A ``binding.Condition`` is parsed once per request
and bound once per schema (a scan of several versions binds to each): see :mod:`.binding`.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal, InvalidOperation
from typing import Any, NoReturn

from aqueduct_spark.protocol import InvalidRequest
from aqueduct_spark.protocol.filters import BINARY_OPS, NOT, UNARY_OPS, decode_value

Node = tuple[Any, ...]
"""("col", path) ("lit", value, written) ("cmp", op, a, b) ("and"|"or", a, b) ("not", a)
("null", a) ("in", a, [lit, ...]) ("between", a, lo, hi) ("like", a, pattern, ignore_case)
("text", "starts_with"|"ends_with"|"contains", a, pattern).
``written`` is the text of a SQL number literal as written (``01234``), else None."""

ACCEPTED = (
    "comparisons (= != <> < <= > >= <=>), AND, OR, NOT, IN (...), BETWEEN ... AND ..., "
    "IS [NOT] NULL, LIKE 'a%', startswith/endswith/contains(column, 'text'); literals: "
    "numbers, 'text', true, false, NULL, DATE '2026-01-31', TIMESTAMP '2026-01-31 12:00:00'"
)
_CMP = {
    "EQ": "==",
    "NEQ": "!=",
    "LT": "<",
    "LTE": "<=",
    "GT": ">",
    "GTE": ">=",
    "NullSafeEQ": "<=>",
}
_TEXT = {"StartsWith": "starts_with", "EndsWith": "ends_with", "Contains": "contains"}
_TIMESTAMPS = {"TIMESTAMP", "TIMESTAMPTZ", "TIMESTAMPLTZ", "TIMESTAMPNTZ", "DATETIME"}


def parse(text: str, label: str = "condition") -> Node:
    """The syntax tree of SQL condition ``text``; :class:`InvalidRequest` saying what is wrong."""
    import sqlglot  # the service's dependency only: imported on the first condition

    if not text.strip():
        _refuse(label, "the condition is empty")
    try:
        tree = sqlglot.parse(text, read="spark")
    except sqlglot.ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        where = f" at column {first['col']}" if first.get("col") else ""
        near = (first.get("start_context") or "") + (first.get("highlight") or "")
        why = _parse_reason(str(first.get("description") or exc))
        _refuse(label, f"cannot read it{where} (after {near.strip()!r}): {why}")
    except sqlglot.errors.TokenError as exc:
        _refuse(label, f"cannot read it: {exc}")
    statements = [t for t in tree if t is not None]
    if len(statements) != 1:
        _refuse(label, "write one condition, not several statements")
    return _convert(statements[0], label)


def _parse_reason(description: str) -> str:
    if "Required keyword" in description:
        return "something is missing, e.g. the value after an operator"
    return description.split(". Line")[0]


def _refuse(label: str, why: str) -> NoReturn:
    raise InvalidRequest(
        f"{label}: {why}. Write a condition such as \"day >= '2026-01-01' AND region IN ('eu', 'us')\" ({ACCEPTED})"
    )


def _convert(e: Any, label: str) -> Node:
    from sqlglot import exp

    def conv(e: Any) -> Node:
        kind = type(e).__name__
        if isinstance(e, exp.Paren):
            return conv(e.this)
        if isinstance(e, exp.And | exp.Or):
            return (kind.lower(), conv(e.this), conv(e.expression))
        if isinstance(e, exp.Not):
            return ("not", conv(e.this))
        if kind in _CMP:
            return ("cmp", _CMP[kind], conv(e.this), conv(e.expression))
        if isinstance(e, exp.Is):
            if not isinstance(e.expression, exp.Null):
                _refuse(label, f"{e.sql('spark')!r}: only IS NULL and IS NOT NULL are accepted")
            return ("null", conv(e.this))
        if isinstance(e, exp.In):
            if e.args.get("query") is not None or e.args.get("unnest") is not None:
                _refuse(label, "IN takes a list of values, not a query")
            items = [conv(v) for v in e.expressions]
            if not items or any(i[0] != "lit" for i in items):
                _refuse(label, "IN takes a list of values, e.g. city IN ('Oslo', 'Bergen')")
            return ("in", conv(e.this), items)
        if isinstance(e, exp.Between):
            return ("between", conv(e.this), conv(e.args["low"]), conv(e.args["high"]))
        if isinstance(e, exp.Like | exp.ILike):
            pattern = conv(e.expression)
            if pattern[0] != "lit" or not isinstance(pattern[1], str):
                _refuse(label, "LIKE needs a 'quoted pattern'")
            node: Node = ("like", conv(e.this), pattern[1], isinstance(e, exp.ILike))
            return ("not", node) if e.args.get("negate") else node
        if kind in _TEXT:
            text = conv(e.expression)
            if text[0] != "lit" or not isinstance(text[1], str):
                _refuse(label, f"{kind.lower()} needs 'quoted text' to look for")
            return ("text", _TEXT[kind], conv(e.this), text[1])
        if isinstance(e, exp.Alias):  # `n = 1 n`: a word after a complete condition
            _refuse(label, f"unexpected {e.alias!r} after {e.this.sql('spark')!r}")
        if isinstance(e, exp.Column | exp.Dot):
            return ("col", tuple(_path(e, label)))
        return _literal(e, label)

    return conv(e)


def _path(e: Any, label: str) -> list[str]:
    from sqlglot import exp

    if isinstance(e, exp.Column):
        return [p.name for p in e.parts]
    if isinstance(e, exp.Dot) and isinstance(e.expression, exp.Identifier):
        return [*_path(e.this, label), e.expression.name]
    _refuse(label, f"{e.sql('spark')!r} is not a column: name a column or struct.field")


def _literal(e: Any, label: str) -> Node:
    from sqlglot import exp

    if isinstance(e, exp.Literal):
        if e.is_string:
            return ("lit", e.this, None)
        return ("lit", _number(e.this, label), e.this)
    if isinstance(e, exp.Neg) and isinstance(e.this, exp.Literal) and not e.this.is_string:
        return ("lit", -_number(e.this.this, label), f"-{e.this.this}")
    if isinstance(e, exp.Concat) and all(
        isinstance(x, exp.Literal) and x.is_string for x in e.expressions
    ):  # Spark joins adjacent literals: 'it''s' is 'its' (a quote inside is \' or "it's")
        return ("lit", "".join(x.this for x in e.expressions), None)
    if isinstance(e, exp.Boolean):
        return ("lit", bool(e.this), None)
    if isinstance(e, exp.Null):
        return ("lit", None, None)
    if isinstance(e, exp.HexString):
        try:
            return ("lit", bytes.fromhex(e.this), None)
        except ValueError:
            _refuse(label, f"X'{e.this}' is not hexadecimal bytes")
    if isinstance(e, exp.Cast | exp.TryCast) and isinstance(e.this, exp.Literal | exp.Neg):
        inner = _literal(e.this, label)
        to = e.to.this.name
        if to == "DATE":
            try:
                return ("lit", dt.date.fromisoformat(str(inner[1]).strip()), None)
            except ValueError:
                _refuse(label, f"DATE {inner[1]!r} is not a date: write DATE '2026-01-31'")
        if to in _TIMESTAMPS:
            value = parse_timestamp(str(inner[1]))
            if value is None:
                _refuse(
                    label,
                    f"TIMESTAMP {inner[1]!r} is not a timestamp: write TIMESTAMP "
                    "'2026-01-31 12:00:00' (a zone such as +01:00 may follow)",
                )
            if to == "TIMESTAMPNTZ":
                value = value.replace(tzinfo=None)
            return ("lit", value, None)
        return inner  # 10L, 1.5BD, CAST(1 AS INT): the literal; binding gives it the column's type
    _refuse(label, f"{e.sql('spark')!r} is not accepted here")


def parse_timestamp(text: str) -> dt.datetime | None:
    """ISO 8601 text as a datetime (naive when it names no zone); None if it is not one."""
    s = text.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    s = re.sub(r"\s+(?=[+-]\d\d:?\d\d$)", "", s)  # '2026-01-01 12:00 +01:00'
    try:
        return dt.datetime.fromisoformat(s)
    except ValueError:
        return None


def _number(text: str, label: str) -> int | Decimal | float:
    try:
        if text.isdigit():
            return int(text)
        if "e" in text.lower():
            return float(text)
        return Decimal(text)
    except (ValueError, InvalidOperation):
        _refuse(label, f"{text!r} is not a number")


def from_wire(pred: Any) -> Node:
    """One wire predicate (see ``protocol.filters``) as a syntax tree."""
    if isinstance(pred, str):
        return parse(pred, f"filter {pred!r}")
    if not isinstance(pred, list) or not pred or not isinstance(pred[0], str):
        raise InvalidRequest(
            f"malformed filter predicate {pred!r}: write [op, column, value], e.g. "
            '[">", ["id"], 3], or SQL text'
        )
    op = pred[0]
    if op == NOT and len(pred) == 2:
        return ("not", from_wire(pred[1]))
    if op in UNARY_OPS and len(pred) == 2:
        node: Node = ("null", _column(pred[1], pred))
        return node if op == "is_null" else ("not", node)
    if op not in BINARY_OPS or len(pred) != 3:
        raise InvalidRequest(
            f"unknown filter {pred!r}: use one of the operators "
            f"{', '.join((*BINARY_OPS, *UNARY_OPS, NOT))}"
        )
    col = _column(pred[1], pred)
    if op == "in":
        if not isinstance(pred[2], list):
            raise InvalidRequest(
                f"'in' needs a list of values, got {pred[2]!r}: write ['in', ['id'], [1, 2]]"
            )
        return ("in", col, [("lit", decode_value(v), None) for v in pred[2]])
    value = decode_value(pred[2])
    if op in ("starts_with", "ends_with", "contains"):
        if not isinstance(value, str):
            raise InvalidRequest(
                f"{op!r} needs text to look for, got {value!r}: write [{op!r}, ['col'], 'text']"
            )
        return ("text", op, col, value)
    return ("cmp", op, col, ("lit", value, None))


def _column(path: Any, pred: Any) -> Node:
    if not isinstance(path, list) or not path or not all(isinstance(p, str) and p for p in path):
        raise InvalidRequest(
            f"filter {pred!r}: the column must be a non-empty list of names, got {path!r}; "
            "['a'] for column a, ['a', 'b'] for field b of struct a"
        )
    return ("col", tuple(path))


def render(n: Node) -> str:
    """A tree as SQL-like text, for messages."""
    kind = n[0]
    if kind == "col":
        return ".".join(p if p.isidentifier() else f"`{p}`" for p in n[1])
    if kind == "lit":
        v = n[1]
        if n[2] is not None:
            return str(n[2])
        if v is None:
            return "NULL"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return "'" + v.replace("'", "''") + "'"
        if isinstance(v, int | float | Decimal):
            return str(v)
        return repr(v) if isinstance(v, bytes) else f"'{v.isoformat()}'"
    if kind in ("and", "or"):
        return f"({render(n[1])} {kind.upper()} {render(n[2])})"
    if kind == "not":
        return f"NOT {render(n[1])}"
    if kind == "null":
        return f"{render(n[1])} IS NULL"
    if kind == "cmp":
        return f"{render(n[2])} {n[1]} {render(n[3])}"
    if kind == "in":
        return f"{render(n[1])} IN ({', '.join(render(v) for v in n[2])})"
    if kind == "between":
        return f"{render(n[1])} BETWEEN {render(n[2])} AND {render(n[3])}"
    if kind == "like":
        return f"{render(n[1])} {'ILIKE' if n[3] else 'LIKE'} {render(('lit', n[2], None))}"
    return f"{n[1]}({render(n[2])}, {render(('lit', n[3], None))})"


def columns(node: Node) -> set[str]:
    """The top-level columns a tree reads."""
    if node[0] == "col":
        return {node[1][0]}
    out: set[str] = set()
    for child in node[1:]:
        for item in child if isinstance(child, list) else [child]:
            if isinstance(item, tuple):
                out |= columns(item)
    return out
