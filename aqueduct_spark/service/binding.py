"""Binding a condition (:mod:`.predicates`) to a dataset's schema: every literal compared with
a column takes that column's type, on every path (CLI, Python, Spark pushdown, replaceWhere,
delete), so ``ts > '2026-01-01'``, ``day = '2026-01-31'``, ``price = 1.50`` and
``zip = '01234'`` mean what they say. The bound tree becomes a pyarrow expression (reads,
replaceWhere) or Delta SQL with explicit types (delete, run by Delta Lake).

The rules, by the column's type (a value that does not fit is refused, naming the column,
its type and the value, with an example of what fits):

- text: quoted text as is; a SQL number as written (``zip = 01234`` is ``'01234'``);
  a Python number is refused (quote it).
- integers, floats: numbers; text that reads as a number (``'42'``). A fraction against an
  integer column compares as a double (``n > 1.5``).
- decimals: numbers and numeric text, exactly (``1.50``, ``'1.5'``).
- dates: dates and ISO text (``'2026-01-31'``).
- timestamps: datetimes, dates (midnight) and ISO 8601 text (``'2026-01-31'``,
  ``'2026-01-31 12:00:00'``, ``'2026-01-31T12:00:00+01:00'``). Zones as Spark and Delta
  read them with ``spark.sql.session.timeZone`` set to the column's zone:
  a value without a zone against a zoned column (Spark's ``TIMESTAMP``; Delta stores it in
  UTC) means that zone's wall-clock time, so UTC; a value with a zone against a column
  without one (``TIMESTAMP_NTZ``, wall-clock) is converted to UTC wall-clock time first;
  naive against naive is the wall-clock time as written. The service never uses its own
  machine's or the client's local zone.
- booleans: true/false (and the text ``'true'``/``'false'``); binary: bytes or text (UTF-8).
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
import zoneinfo
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from aqueduct_spark.protocol import InvalidRequest

from .predicates import Node, columns, from_wire, parse, parse_timestamp, render

_IN_AS_ISIN = 32
"""An IN list longer than this becomes one ``isin`` (an OR of equalities skips files better,
but a pushed IN of thousands of values would be a tree as deep)."""
_UNITS = {"s": "Second", "ms": "Millisecond", "us": "Microsecond", "ns": "Nanosecond"}


def _zone(tz: str) -> dt.tzinfo:
    if tz.upper() in ("UTC", "Z", "+00:00", "ETC/UTC"):
        return dt.UTC
    m = re.fullmatch(r"([+-])(\d\d):?(\d\d)", tz)
    if m:
        offset = dt.timedelta(hours=int(m[2]), minutes=int(m[3]))
        return dt.timezone(offset if m[1] == "+" else -offset)
    return zoneinfo.ZoneInfo(tz)


def _example(t: pa.DataType) -> str:
    if pa.types.is_timestamp(t):
        zone = f" ({t.tz})" if t.tz else " (wall-clock)"
        return f"'2026-01-31 12:00:00'{zone} or '2026-01-31T12:00:00+01:00'"
    if pa.types.is_date(t):
        return "'2026-01-31'"
    if pa.types.is_decimal(t):
        return "1.50"
    if pa.types.is_integer(t):
        return "42"
    if pa.types.is_floating(t):
        return "2.5"
    if pa.types.is_boolean(t):
        return "true"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "X'00ff'"
    return "'text'"


class Condition:
    """A parsed condition: SQL text or wire predicates (ANDed), not yet bound to a schema.
    ``label`` opens every error about it (``filter "ts > 'x'"``)."""

    def __init__(self, node: Node, label: str) -> None:
        self.node, self.label = node, label

    @classmethod
    def from_text(cls, text: Any, what: str = "condition") -> Condition:
        if not isinstance(text, str):
            raise InvalidRequest(
                f"{what} must be SQL text, not {text!r}; give e.g. \"day >= '2026-01-01'\""
            )
        return cls(parse(text, f"{what} {text!r}"), f"{what} {text!r}")

    @classmethod
    def from_wire(cls, filters: Any) -> Condition | None:
        """The AND of a request's ``filters`` (None or empty: no condition)."""
        if filters is None:
            return None
        if not isinstance(filters, list):
            raise InvalidRequest(
                f"filters must be a list of predicates, got {filters!r}: give e.g. "
                '[[">", ["id"], 3]] or ["id > 3"]'
            )
        nodes = [from_wire(f) for f in filters]
        if not nodes:
            return None
        node = nodes[0]
        for n in nodes[1:]:
            node = ("and", node, n)
        # SQL text as the user wrote it (in parentheses beside others), the rest rendered
        parts = [
            f if isinstance(f, str) else render(n) for f, n in zip(filters, nodes, strict=True)
        ]
        if len(parts) > 1:
            parts = [
                f"({p})" if isinstance(f, str) else p for f, p in zip(filters, parts, strict=True)
            ]
        shown = " AND ".join(parts)
        return cls(node, f"filter {shown!r}")

    def columns(self) -> set[str]:
        return columns(self.node)

    def bind(self, schema: pa.Schema) -> pc.Expression:
        return Binder(schema, self.label).bind(self.node)

    def to_delta_sql(self, schema: pa.Schema) -> str:
        return Binder(schema, self.label).delta_sql(self.node)


class Binder:
    """Binds trees to one schema; ``label`` opens every error (``filter "ts > 'x'"``)."""

    def __init__(self, schema: pa.Schema, label: str) -> None:
        self.schema, self.label = schema, label

    # -- columns and values ------------------------------------------------------------

    def column_type(self, path: tuple[str, ...], other: Node | None = None) -> pa.DataType:
        t: Any = self.schema
        for depth, name in enumerate(path):
            names = t.names if depth == 0 else [t.field(i).name for i in range(t.num_fields)]
            if name not in names:
                near = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
                hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
                unquoted = other is not None and other[0] == "col" and other[1][0] in names
                if depth == 0 and unquoted and not near:  # `mode = bus`: text without quotes
                    hint = f" (to compare with the text {name}, quote it: '{name}')"
                where = (
                    f"no column {name!r} in the dataset"
                    if depth == 0
                    else f"struct {'.'.join(path[:depth])!r} has no field {name!r}"
                )
                raise InvalidRequest(
                    f"{self.label}: "
                    f"{where}{hint}; name one of its {'columns' if depth == 0 else 'fields'}: "
                    f"{', '.join(names)}"
                )
            if depth + 1 < len(path) and not pa.types.is_struct(t.field(name).type):
                raise InvalidRequest(
                    f"{self.label}: "
                    f"{'.'.join(path[: depth + 1])!r} is a {t.field(name).type} column, not a "
                    "struct; name its fields only for a struct column"
                )
            t = t.field(name).type
        return t

    def value(
        self, lit: Node, t: pa.DataType | None, column: str
    ) -> tuple[Any, pa.DataType | None]:
        """``lit``'s value in the type family of ``t`` (None: no column to follow), and the
        Arrow type to make its scalar with (None: pyarrow infers it)."""
        v, written = lit[1], lit[2]
        if v is None or t is None:
            return v, None

        def refuse(what: str) -> InvalidRequest:
            shown = written if written is not None else render(lit)
            return InvalidRequest(
                f"{self.label}: "
                f"cannot compare column {column!r} ({t}) with {shown}: {what}; compare it with "
                f"a value of its type, e.g. {column} = {_example(t)}"
            )

        if pa.types.is_string(t) or pa.types.is_large_string(t):
            if isinstance(v, str):
                return v, t
            if written is not None:  # a SQL number against text: the digits as written
                return written, t
            raise refuse(f"{type(v).__name__} is not text (quote it)")
        if isinstance(v, str) and not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            v = self._from_text(v, t, refuse)
        if isinstance(v, bool) != pa.types.is_boolean(t):
            raise refuse(
                "true/false only compares with a boolean column"
                if isinstance(v, bool)
                else "not a boolean"
            )
        if pa.types.is_boolean(t):
            return v, t
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            if isinstance(v, int):  # pyarrow picks int64 or uint64 for it
                return v, None if pa.types.is_integer(t) else pa.float64()
            if isinstance(v, float | Decimal):
                return float(v), pa.float64()
            raise refuse("not a number")
        if pa.types.is_decimal(t):
            if isinstance(v, int | Decimal):
                return Decimal(v), None
            if isinstance(v, float):
                return Decimal(repr(v)), None
            raise refuse("not a number")
        if pa.types.is_date(t):
            if isinstance(v, dt.datetime) or not isinstance(v, dt.date):
                raise refuse("not a date")
            return v, t
        if pa.types.is_timestamp(t):
            if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
                v = dt.datetime(v.year, v.month, v.day)
            if not isinstance(v, dt.datetime):
                raise refuse("not a timestamp")
            return self._timestamp(v, t), pa.timestamp("us" if t.unit != "ns" else "ns", t.tz)
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            if isinstance(v, str):
                return v.encode(), t
            if isinstance(v, bytes):
                return v, t
            raise refuse("not bytes")
        raise refuse(f"a {t} column cannot be compared with a value")

    @staticmethod
    def _timestamp(v: dt.datetime, t: pa.DataType) -> dt.datetime:
        if t.tz is not None:  # zoned: a naive value is the column zone's wall-clock time
            return v if v.tzinfo is not None else v.replace(tzinfo=_zone(t.tz))
        if v.tzinfo is not None:  # zone-less (wall-clock) column: an instant as UTC time
            return v.astimezone(dt.UTC).replace(tzinfo=None)
        return v

    @staticmethod
    def _from_text(v: str, t: pa.DataType, refuse: Any) -> Any:
        s = v.strip()
        if pa.types.is_timestamp(t):
            parsed = parse_timestamp(s)
            if parsed is None:
                raise refuse("not a timestamp")
            return parsed
        if pa.types.is_date(t):
            try:
                return dt.date.fromisoformat(s)
            except ValueError:
                raise refuse("not a date") from None
        if pa.types.is_boolean(t):
            if s.lower() in ("true", "false"):
                return s.lower() == "true"
            raise refuse("not a boolean")
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
            try:
                return int(s) if re.fullmatch(r"[+-]?\d+", s) else Decimal(s)
            except InvalidOperation:
                raise refuse("not a number") from None
        return v

    # -- pyarrow expressions -----------------------------------------------------------

    def bind(self, node: Node) -> pc.Expression:
        expression = self._expr(node)
        try:  # evaluating it on no rows finds what binding cannot: `NOT n`, types that do not mix
            self.schema.empty_table().filter(expression)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise InvalidRequest(
                f"{self.label}: "
                f"it is not a true-or-false condition on the dataset's columns ({exc}); write "
                "a comparison such as \"day >= '2026-01-01'\""
            ) from None
        return expression

    def _scalar(self, lit: Node, other: Node | None) -> pc.Expression:
        t = self.column_type(other[1]) if other is not None and other[0] == "col" else None
        column = ".".join(other[1]) if other is not None and other[0] == "col" else ""
        value, typ = self.value(lit, t, column)
        try:
            if value is None:
                return pc.scalar(pa.scalar(None, t if t is not None else pa.null()))
            return pc.scalar(pa.scalar(value, typ) if typ is not None else value)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
            raise InvalidRequest(
                f"{self.label}: "
                f"{render(lit)} does not fit column {column!r} ({t}): {exc}; compare it with a "
                f"value of its type, e.g. {column} = {_example(t) if t is not None else 1}"
            ) from None

    def _operand(self, n: Node, other: Node | None = None) -> pc.Expression:
        if n[0] == "lit":
            return self._scalar(n, other)
        if n[0] == "col":
            self.column_type(n[1], other)
            return pc.field(*n[1]) if len(n[1]) > 1 else pc.field(n[1][0])
        return self._expr(n)

    def _text_column(self, n: Node, what: str) -> pc.Expression:
        if n[0] == "col":
            t = self.column_type(n[1])
            if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                raise InvalidRequest(
                    f"{self.label}: "
                    f"{what} needs a text column, and {'.'.join(n[1])!r} is {t}; compare it with "
                    f"=, <, > and a value such as {_example(t)}"
                )
        return self._operand(n)

    def _expr(self, n: Node) -> pc.Expression:
        kind = n[0]
        if kind in ("col", "lit"):
            return self._operand(n)
        if kind in ("and", "or"):
            a, b = self._expr(n[1]), self._expr(n[2])
            return a & b if kind == "and" else a | b
        if kind == "not":
            return ~self._expr(n[1])
        if kind == "null":
            return self._operand(n[1]).is_null()
        if kind == "cmp":
            op, a, b = n[1], self._operand(n[2], n[3]), self._operand(n[3], n[2])
            if op == "<=>":
                return (a.is_null() & b.is_null()) | (a.is_valid() & b.is_valid() & (a == b))
            return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[
                op
            ]
        if kind == "in":
            left = self._operand(n[1])
            items = [self._scalar(v, n[1]) for v in n[2]]
            if len(items) <= _IN_AS_ISIN:  # an OR of equalities keeps SQL's NULL semantics
                out = left == items[0]
                for item in items[1:]:
                    out = out | (left == item)
                return out
            return self._isin(left, n)
        if kind == "between":
            left = self._operand(n[1])
            return (left >= self._operand(n[2], n[1])) & (left <= self._operand(n[3], n[1]))
        if kind == "like":
            return pc.match_like(self._text_column(n[1], "LIKE"), pattern=n[2], ignore_case=n[3])
        if kind == "text":
            f = self._text_column(n[2], n[1])
            fn = {"starts_with": pc.starts_with, "ends_with": pc.ends_with}
            return fn.get(n[1], pc.match_substring)(f, pattern=n[3])
        raise AssertionError(kind)

    def _isin(self, left: pc.Expression, n: Node) -> pc.Expression:
        """``IN`` of many values as one ``isin``, with SQL's NULLs: unknown when the column is
        null, or when nothing matched and the list holds a NULL (isin says false there, which
        NOT would turn into true)."""
        t = self.column_type(n[1][1]) if n[1][0] == "col" else None
        column = ".".join(n[1][1]) if n[1][0] == "col" else ""
        values = [self.value(v, t, column)[0] for v in n[2]]
        present = [v for v in values if v is not None]
        unknown = pc.scalar(pa.scalar(None, pa.bool_()))
        try:
            array = pa.array(present, t if t is not None and present else None)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise InvalidRequest(
                f"{self.label}: the IN list does not fit column {column!r} ({t}): {exc}; "
                "compare it with values of its type"
            ) from None
        matched = left.isin(array) if present else pc.scalar(False)
        if len(present) < len(values):
            matched = pc.if_else(matched, pc.scalar(True), unknown)
        return pc.if_else(left.is_valid(), matched, unknown)

    # -- Delta SQL -------------------------------------------------------------------

    def delta_sql(self, node: Node) -> str:
        """The tree as SQL for Delta Lake's own engine (``DeltaTable.delete``), every literal
        written with its bound type, so Delta selects the rows :meth:`bind` would."""
        self.bind(node)  # the same checks, the same errors
        return self._sql(node)

    def _sql_operand(self, n: Node) -> str:
        if n[0] == "col":
            return ".".join('"' + p.replace('"', '""') + '"' for p in n[1])
        if n[0] == "lit":
            return _sql_literal(self.value(n, None, "")[0], None)
        return self._sql(n)

    def _sql_pair(self, a: Node, b: Node) -> tuple[str, str]:
        """Both sides of a comparison. Delta's engine compares only equal types (not
        decimal(10,2) with decimal(11,3), nor int32 with a double), so a literal goes in the
        column's type, or the column is cast to the literal's wider one."""
        if a[0] == "lit" and b[0] == "col":
            right, left = self._sql_pair(b, a)
            return left, right
        if not (a[0] == "col" and b[0] == "lit"):
            return self._sql_operand(a), self._sql_operand(b)
        column, t = self._sql_operand(a), self.column_type(a[1])
        value, _ = self.value(b, t, ".".join(a[1]))
        if value is None or isinstance(value, bool):
            return column, _sql_literal(value, t)
        if pa.types.is_decimal(t) and isinstance(value, Decimal):
            _, digits, exponent = value.as_tuple()
            scale = max(0, -int(exponent))
            whole = max(0, len(digits) + int(exponent))
            if scale <= t.scale and whole <= t.precision - t.scale:
                return column, f"CAST('{value}' AS DECIMAL({t.precision}, {t.scale}))"
            s = max(scale, t.scale)
            wide = f"DECIMAL({min(38, max(whole, t.precision - t.scale) + s)}, {s})"
            return f"CAST({column} AS {wide})", f"CAST('{value}' AS {wide})"
        if pa.types.is_integer(t) and isinstance(value, float):
            return f"CAST({column} AS DOUBLE)", _sql_literal(value, t)
        if pa.types.is_integer(t) and isinstance(value, int):
            try:
                pa.scalar(value, t)
            except (OverflowError, pa.ArrowInvalid):
                return f"CAST({column} AS BIGINT)", str(value)  # beyond the column's width
        return column, _sql_literal(value, t)

    def _sql(self, n: Node) -> str:
        kind = n[0]
        if kind in ("col", "lit"):
            return self._sql_operand(n)
        if kind in ("and", "or"):
            return f"({self._sql(n[1])} {kind.upper()} {self._sql(n[2])})"
        if kind == "not":
            return f"(NOT {self._sql(n[1])})"
        if kind == "null":
            return f"({self._sql_operand(n[1])} IS NULL)"
        if kind == "cmp":
            a, b = self._sql_pair(n[2], n[3])
            op = {"==": "=", "<=>": "IS NOT DISTINCT FROM"}.get(n[1], n[1])
            return f"({a} {op} {b})"
        if kind == "in":  # ORed equalities: each literal paired with the column (as IN is)
            return "(" + " OR ".join(self._sql(("cmp", "==", n[1], v)) for v in n[2]) + ")"
        if kind == "between":
            low, high = ("cmp", ">=", n[1], n[2]), ("cmp", "<=", n[1], n[3])
            return f"({self._sql(low)} AND {self._sql(high)})"
        if kind == "like":
            return f"({self._sql_operand(n[1])} {'ILIKE' if n[3] else 'LIKE'} {_sql_literal(n[2], None)})"
        if kind == "text":
            x, text = self._sql_operand(n[2]), _sql_literal(n[3], None)
            if n[1] == "contains":
                return f"(strpos({x}, {text}) > 0)"
            return f"({n[1]}({x}, {text}))"
        raise AssertionError(kind)


def _sql_literal(value: Any, t: pa.DataType | None) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            repr(value)
            if value == value and abs(value) != float("inf")
            else f"CAST('{value}' AS DOUBLE)"
        )
    if isinstance(value, Decimal):
        _, digits, exponent = value.as_tuple()
        scale = max(0, -int(exponent))
        precision = min(38, max(len(digits), scale + 1))
        return f"CAST('{value}' AS DECIMAL({precision}, {scale}))"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, dt.datetime):
        unit = _UNITS[t.unit] if t is not None and pa.types.is_timestamp(t) else "Microsecond"
        if value.tzinfo is not None:
            text = value.astimezone(dt.UTC).replace(tzinfo=None).isoformat()
            return f"arrow_cast('{text}', 'Timestamp({unit}, Some(\"UTC\"))')"
        return f"arrow_cast('{value.isoformat()}', 'Timestamp({unit}, None)')"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    raise AssertionError(type(value))


def bind(text: str, schema: pa.Schema, what: str = "replaceWhere") -> pc.Expression:
    """SQL ``text`` as a pyarrow expression over tables of ``schema``, literals in the types
    of the columns they are compared with."""
    return Condition.from_text(text, what).bind(schema)


def text_columns(text: str, what: str = "replaceWhere") -> Sequence[str]:
    """The top-level columns SQL ``text`` reads, sorted."""
    return sorted(Condition.from_text(text, what).columns())


def is_true(expression: pc.Expression) -> pc.Expression:
    """Rows where ``expression`` is true (null counts as not true)."""
    return pc.coalesce(expression, pc.scalar(False))
