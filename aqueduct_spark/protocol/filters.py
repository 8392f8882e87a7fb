"""Filters pushed down to scans (§7 of ``docs/dataset-protocol.md``), decoded into pyarrow
expressions by the service; the client encodes them in the same form."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .errors import InvalidRequest

# A filter is a list of conjunctive predicates, each a list [op, column, value?] where
# column is a list of field names (a path into structs) and value a CBOR value (ints,
# floats, strings, bytes, booleans, datetimes, dates, Decimals; a list for "in").

UNARY_OPS = ("is_null", "is_not_null")
BINARY_OPS = ("==", "!=", "<", "<=", ">", ">=", "<=>", "in", "starts_with", "ends_with", "contains")
NOT = "not"


def _field(path: Sequence[str]) -> pc.Expression:
    if not path or not all(isinstance(p, str) for p in path):
        raise InvalidRequest(
            f"filter column must be a non-empty list of names, got {path!r}; name a column: 'a', or 'a.b' for a struct's field"
        )
    return pc.field(*path) if len(path) > 1 else pc.field(path[0])


def _scalar(value: Any) -> Any:
    if isinstance(
        value, decimal.Decimal | dt.datetime | dt.date | bool | int | float | str | bytes
    ):
        return value
    if value is None:
        return None
    raise InvalidRequest(
        f"unsupported filter value {value!r}: compare with a number, text, bytes, a boolean, a date, a datetime, a Decimal or None"
    )


def predicate_to_expression(pred: Any) -> pc.Expression:
    if not isinstance(pred, list | tuple) or not pred:
        raise InvalidRequest(
            f"malformed filter predicate {pred!r}: write (column, op, value), e.g. ('id', '>', 3)"
        )
    op = pred[0]
    if op == NOT:
        if len(pred) != 2:
            raise InvalidRequest(
                f"'not' takes one predicate, got {pred!r}: write ['not', predicate]"
            )
        return ~predicate_to_expression(pred[1])
    if op in UNARY_OPS:
        if len(pred) != 2:
            raise InvalidRequest(
                f"{op!r} takes a column only, got {pred!r}: write (column, {op!r})"
            )
        f = _field(pred[1])
        return f.is_null() if op == "is_null" else f.is_valid()
    if op not in BINARY_OPS or len(pred) != 3:
        raise InvalidRequest(
            f"unknown filter {pred!r}: use one of the operators {', '.join((*BINARY_OPS, *UNARY_OPS, NOT))}"
        )
    f, value = _field(pred[1]), pred[2]
    if op == "in":
        if not isinstance(value, list | tuple):
            raise InvalidRequest(
                f"'in' needs a list of values, got {value!r}: write e.g. ('id', 'in', [1, 2])"
            )
        values = [_scalar(v) for v in value]
        present = [v for v in values if v is not None]
        # SQL: x IN (...) is NULL when x is NULL, or when nothing matched and the list holds
        # a NULL; pyarrow's isin says false there, which NOT would turn into true.
        unknown = pc.scalar(pa.scalar(None, pa.bool_()))
        matched = f.isin(present) if present else pc.scalar(False)
        if None in values:
            matched = pc.if_else(matched, pc.scalar(True), unknown)
        return pc.if_else(f.is_valid(), matched, unknown)
    value = _scalar(value)
    if op == "<=>":  # null-safe equality
        return f.is_null() if value is None else (f == value) & f.is_valid()
    if value is None:  # a comparison with NULL is unknown (not false: NOT must keep it out)
        return pc.scalar(pa.scalar(None, pa.bool_()))
    if op == "==":
        return f == value
    if op == "!=":
        return f != value
    if op == "<":
        return f < value
    if op == "<=":
        return f <= value
    if op == ">":
        return f > value
    if op == ">=":
        return f >= value
    if op == "starts_with":
        return pc.starts_with(f, pattern=value)
    if op == "ends_with":
        return pc.ends_with(f, pattern=value)
    return pc.match_substring(f, pattern=value)


def filters_to_expression(filters: Any) -> pc.Expression | None:
    """The AND of the predicates, or None for no filter."""
    if filters is None:
        return None
    if not isinstance(filters, list | tuple):
        raise InvalidRequest(
            f"filters must be a list of predicates, got {filters!r}: give e.g. [('id', '>', 3)]"
        )
    expr: pc.Expression | None = None
    for pred in filters:
        e = predicate_to_expression(pred)
        expr = e if expr is None else expr & e
    return expr
