"""Filters as requests carry them (§7 of ``docs/dataset-protocol.md``): what a client may
send, checked and encoded here, on the client, so that a malformed filter fails at once with
a message naming it; the service parses and binds them to the dataset's types
(``service.predicates``, ``service.binding``).

A filter is a list of predicates, ANDed. Each is either a condition in SQL text
(``"ts > '2026-01-01' AND city = 'Oslo'"``) or a list ``[op, column, value?]``, where column is
a list of field names (a path into structs) and value a CBOR value: ints, floats, text, bytes,
booleans, zoned datetimes, dates, Decimals, null; a list for ``in``. A value CBOR cannot carry
travels as a one-entry map naming its type: a datetime without a zone is
``{"timestamp_ntz": "2026-01-01T12:00:00"}`` (wall-clock time, bound by the service to the
column's own zone convention, never to the client's local zone).
"""

from __future__ import annotations

import datetime as dt
import decimal
import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import InvalidRequest

UNARY_OPS = ("is_null", "is_not_null")
BINARY_OPS = ("==", "!=", "<", "<=", ">", ">=", "<=>", "in", "starts_with", "ends_with", "contains")
NOT = "not"
TIMESTAMP_NTZ = "timestamp_ntz"
"""The typed-literal key of a datetime without a zone."""

_ALIASES = {"=": "==", "<>": "!="}
"""What users write for an operator, as the wire spells it (``not in`` is ``not`` of ``in``)."""
_USER_OPS = (*BINARY_OPS, *UNARY_OPS, "not in", *_ALIASES)
_EXAMPLE = "('city', '==', 'Oslo'), ('ts', '>', datetime(2026, 1, 1)), ('id', 'in', [1, 2]), ('x', 'is_null'), or SQL text \"ts > '2026-01-01'\""


def _fail(pred: Any, why: str) -> InvalidRequest:
    return InvalidRequest(f"filter {pred!r}: {why}. Write a predicate as {_EXAMPLE}")


def _closest(word: str, choices: Sequence[str]) -> str:
    near = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {near[0]!r}?)" if near else ""


def encode_value(value: Any, pred: Any = None) -> Any:
    """A literal in its wire form: CBOR's own types, or a typed map for what CBOR lacks."""
    if value is None or isinstance(value, bool | int | float | str | bytes | decimal.Decimal):
        return value
    if isinstance(value, dt.datetime):
        if hasattr(value, "to_pydatetime"):  # pandas.Timestamp: the standard type
            value = value.to_pydatetime()
        if value.tzinfo is None or value.utcoffset() is None:
            return {TIMESTAMP_NTZ: value.replace(tzinfo=None).isoformat()}
        return value
    if isinstance(value, dt.date):
        return value
    item = getattr(value, "item", None)  # numpy scalars (np.int64, np.datetime64, ...)
    if callable(item) and not isinstance(value, list | tuple | Mapping):
        try:
            plain = item()
        except (TypeError, ValueError):
            plain = value
        if plain is not value and not hasattr(plain, "item"):
            return encode_value(plain, pred)
    raise _fail(
        pred if pred is not None else value,
        f"{value!r} ({type(value).__name__}) cannot be a filter value; compare with a number, "
        "text, bytes, a boolean, a date, a datetime, a Decimal or None",
    )


def decode_value(value: Any) -> Any:
    """A literal as the service binds it: typed maps become Python values (a naive datetime
    for ``timestamp_ntz``); :class:`InvalidRequest` for a map it does not know."""
    if isinstance(value, Mapping):
        if len(value) == 1 and TIMESTAMP_NTZ in value and isinstance(value[TIMESTAMP_NTZ], str):
            try:
                return dt.datetime.fromisoformat(value[TIMESTAMP_NTZ])
            except ValueError:
                pass
        raise InvalidRequest(
            f"filter value {dict(value)!r} is not a literal: a map must be "
            f'{{"{TIMESTAMP_NTZ}": "2026-01-01T12:00:00"}}'
        )
    return value


def _path(column: Any, pred: Any) -> list[str]:
    if isinstance(column, str):
        if not column or any(not part for part in column.split(".")):
            raise _fail(pred, f"column {column!r} is not a name")
        return column.split(".")
    if (
        isinstance(column, list | tuple)
        and column
        and all(isinstance(p, str) and p for p in column)
    ):
        return list(column)
    raise _fail(pred, f"the column must be a name such as 'city' or 'a.b', not {column!r}")


def _tuple(pred: tuple[Any, ...]) -> list[Any]:
    """A user's ``(column, op, value)`` or ``(column, op)`` as a wire predicate."""
    if len(pred) < 2:
        raise _fail(pred, "it names no operator")
    column, op = pred[0], pred[1]
    if not isinstance(op, str) or op.lower() not in _USER_OPS:
        shown = op if isinstance(op, str) else repr(op)
        raise _fail(
            pred,
            f"unknown operator {shown!r}{_closest(str(shown), _USER_OPS)}; use one of "
            f"{', '.join(_USER_OPS)}",
        )
    op = _ALIASES.get(op.lower(), op.lower())
    path = _path(column, pred)
    if op in UNARY_OPS:
        if len(pred) != 2:
            raise _fail(pred, f"{op!r} takes no value: write ({column!r}, {op!r})")
        return [op, path]
    if len(pred) != 3:
        missing = "needs a value" if len(pred) == 2 else "has more than one value"
        raise _fail(pred, f"{op!r} {missing}: write ({column!r}, {op!r}, value)")
    value = pred[2]
    if op in ("in", "not in"):
        if isinstance(value, str | bytes) or not isinstance(value, Sequence | set | frozenset):
            raise _fail(pred, f"{op!r} needs a list of values, e.g. ({column!r}, {op!r}, [1, 2])")
        values = [encode_value(v, pred) for v in value]
        return [NOT, ["in", path, values]] if op == "not in" else ["in", path, values]
    if op in ("starts_with", "ends_with", "contains") and not isinstance(value, str):
        raise _fail(pred, f"{op!r} needs text to look for, not {value!r}")
    return [op, path, encode_value(value, pred)]


def _wire(pred: list[Any]) -> list[Any]:
    """A predicate already in the wire form, checked and its values encoded."""
    if not pred or not isinstance(pred[0], str):
        raise _fail(pred, "a wire predicate starts with its operator")
    op = pred[0]
    if op == NOT:
        if len(pred) != 2:
            raise _fail(pred, "'not' takes one predicate: ['not', predicate]")
        return [NOT, _one(pred[1])]
    if op in UNARY_OPS:
        if len(pred) != 2:
            raise _fail(pred, f"{op!r} takes a column only: [{op!r}, ['col']]")
        return [op, _path(pred[1], pred)]
    if op not in BINARY_OPS:
        raise _fail(
            pred,
            f"unknown operator {op!r}{_closest(op, (*BINARY_OPS, *UNARY_OPS, NOT))}; the wire "
            f"form takes {', '.join((*BINARY_OPS, *UNARY_OPS, NOT))}",
        )
    if len(pred) != 3:
        raise _fail(pred, f"{op!r} takes a column and a value: [{op!r}, ['col'], value]")
    value = pred[2]
    if op == "in":
        if not isinstance(value, list | tuple):
            raise _fail(pred, "'in' needs a list of values")
        return [op, _path(pred[1], pred), [encode_value(v, pred) for v in value]]
    return [op, _path(pred[1], pred), encode_value(value, pred)]


def _one(pred: Any) -> Any:
    if isinstance(pred, str):
        if not pred.strip():
            raise _fail(pred, "the condition is empty")
        return pred  # SQL text: parsed by the service, which knows the columns' types
    if isinstance(pred, tuple):
        return _tuple(pred)
    if isinstance(pred, list):
        return _wire(pred)
    raise _fail(pred, f"a predicate is a tuple, a list or SQL text, not {type(pred).__name__}")


def to_wire_filters(filters: Any) -> list[Any] | None:
    """A client's ``filter=`` as the wire form: SQL text (one condition), or a list of
    predicates, each a tuple ``(column, op, value)`` / ``(column, op)``, a wire-form list, or
    SQL text. :class:`InvalidRequest` naming the predicate and what is wrong with it."""
    if filters is None:
        return None
    if isinstance(filters, str):
        return [_one(filters)]
    if (  # one predicate given bare: ("id", ">", 3) rather than [("id", ">", 3)]
        isinstance(filters, tuple)
        and len(filters) in (2, 3)
        and isinstance(filters[0], str)
        and isinstance(filters[1], str)
        and filters[1].lower() in _USER_OPS
    ):
        return [_tuple(filters)]
    if not isinstance(filters, list | tuple):
        raise _fail(filters, "filter= takes a list of predicates or SQL text")
    return [_one(f) for f in filters]
