"""SQL predicates as users write them for ``replaceWhere`` (``date >= '2026-01-01' AND
region IN ('eu', 'us')``), parsed and bound to a table's schema as a pyarrow expression.

The grammar is the part of Spark SQL a row condition needs, no more::

    expr      := or
    or        := and ("OR" and)*
    and       := not ("AND" not)*
    not       := "NOT" not | predicate
    predicate := operand [cmp operand | "IS" ["NOT"] "NULL"
                          | ["NOT"] "IN" "(" literal ("," literal)* ")"
                          | ["NOT"] "BETWEEN" operand "AND" operand
                          | ["NOT"] "LIKE" 'pattern']
    operand   := "(" expr ")" | literal | column
    cmp       := = | == | != | <> | < | <= | > | >= | <=>
    literal   := number | 'text' | "text" | TRUE | FALSE | NULL | DATE 'd' | TIMESTAMP 't'
    column    := name ("." name)*   (a name is a word or `back quoted`)

Keywords are case-insensitive. A literal compared with a column takes the column's type
(``'2026-01-01'`` against a date column is that date; a timestamp without a zone is UTC).
Logic is SQL's three-valued logic (pyarrow's Kleene ``and``/``or``): a row "matches" only when
the predicate is true, never when it is null.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from aqueduct_spark.protocol import InvalidRequest

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[lLdD]?)
    | (?P<str>'(?:[^']|'')*'|"(?:[^"]|"")*")
    | (?P<quoted>`(?:[^`]|``)+`)
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op><=>|<=|>=|<>|!=|==|[=<>(),.])
    )""",
    re.X,
)
_CMP = {"=": "==", "==": "==", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_KEYWORDS = {"and", "or", "not", "in", "is", "null", "between", "like", "true", "false"}

Node = tuple[Any, ...]
"""("col", path) ("lit", value) ("cmp", op, a, b) ("and"|"or", a, b) ("not", a)
("null", a) ("in", a, values) ("between", a, lo, hi) ("like", a, pattern)"""


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                self.fail(f"cannot read {text[pos:].strip()[:20]!r}")
            assert m is not None
            kind = m.lastgroup or ""
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def fail(self, why: str) -> None:
        raise InvalidRequest(
            f"replaceWhere {self.text!r}: {why}. Write a condition on columns such as "
            "\"day >= '2026-01-01' AND region IN ('eu', 'us')\" (comparisons, AND, OR, NOT, "
            "IN, BETWEEN, LIKE, IS NULL; literals: numbers, 'text', true, false, DATE '...', "
            "TIMESTAMP '...')"
        )

    def peek(self) -> str:
        if self.i >= len(self.tokens):
            return ""
        kind, text = self.tokens[self.i]
        return text.lower() if kind == "word" else text

    def take(self, *expected: str) -> str:
        got = self.peek()
        if expected and got not in expected:
            self.fail(f"expected {' or '.join(expected)} but found {got or 'the end'!r}")
        self.i += 1
        return got

    def parse(self) -> Node:
        if not self.tokens:
            self.fail("the condition is empty")
        node = self.expr()
        if self.i < len(self.tokens):
            self.fail(f"unexpected {self.tokens[self.i][1]!r}")
        return node

    def expr(self) -> Node:
        node = self.conj()
        while self.peek() == "or":
            self.take()
            node = ("or", node, self.conj())
        return node

    def conj(self) -> Node:
        node = self.neg()
        while self.peek() == "and":
            self.take()
            node = ("and", node, self.neg())
        return node

    def neg(self) -> Node:
        if self.peek() == "not":
            self.take()
            return ("not", self.neg())
        return self.predicate()

    def predicate(self) -> Node:
        left = self.operand()
        op = self.peek()
        if op in _CMP or op == "<=>":
            self.take()
            return ("cmp", _CMP.get(op, op), left, self.operand())
        if op == "is":
            self.take()
            negate = self.peek() == "not"
            if negate:
                self.take()
            self.take("null")
            node: Node = ("null", left)
            return ("not", node) if negate else node
        negate = op == "not"
        if negate:
            self.take()
        if self.peek() == "in":
            self.take()
            self.take("(")
            values = [self.literal()]
            while self.peek() == ",":
                self.take()
                values.append(self.literal())
            self.take(")")
            node = ("in", left, values)
        elif self.peek() == "between":
            self.take()
            lo = self.operand()
            self.take("and")
            node = ("between", left, lo, self.operand())
        elif self.peek() == "like":
            self.take()
            pattern = self.literal()
            if not isinstance(pattern[1], str):
                self.fail("LIKE needs a 'quoted pattern'")
            node = ("like", left, pattern[1])
        elif negate:
            self.fail("NOT here must be followed by IN, BETWEEN or LIKE")
        else:
            return left  # a boolean column or literal on its own
        return ("not", node) if negate else node

    def operand(self) -> Node:
        if self.peek() == "(":
            self.take()
            node = self.expr()
            self.take(")")
            return node
        if (
            self.i < len(self.tokens)
            and (
                self.tokens[self.i][0] == "quoted"
                or (self.tokens[self.i][0] == "word" and self.peek() not in _KEYWORDS)
            )
            and not self._typed_literal()
        ):
            path = [self._name()]
            while self.peek() == ".":
                self.take()
                path.append(self._name())
            return ("col", tuple(path))
        return self.literal()

    def _typed_literal(self) -> bool:
        nxt = self.tokens[self.i + 1][0] if self.i + 1 < len(self.tokens) else ""
        return self.peek() in ("date", "timestamp") and nxt == "str"

    def _name(self) -> str:
        if self.i >= len(self.tokens) or self.tokens[self.i][0] not in ("word", "quoted"):
            self.fail("expected a column name")
        kind, text = self.tokens[self.i]
        self.i += 1
        return text[1:-1].replace("``", "`") if kind == "quoted" else text

    def literal(self) -> Node:
        if self.i >= len(self.tokens):
            self.fail("expected a value but found the end")
        kind, text = self.tokens[self.i]
        word = self.peek()
        if word in ("date", "timestamp") and self._typed_literal():
            self.i += 1
            raw = self.literal()[1]
            try:
                if word == "date":
                    return ("lit", dt.date.fromisoformat(raw))
                return ("lit", _timestamp(raw))
            except ValueError:
                self.fail(f"{word.upper()} {raw!r} is not ISO 8601")
        self.i += 1
        if kind == "str":
            return ("lit", text[1:-1].replace(text[0] * 2, text[0]))
        if kind == "num":
            body = text.rstrip("lLdD")
            if re.fullmatch(r"\d+", body):
                return ("lit", int(body))
            return ("lit", Decimal(body) if "e" not in body.lower() else float(body))
        if word in ("true", "false", "null"):
            return ("lit", {"true": True, "false": False, "null": None}[word])
        self.fail(f"expected a value but found {text!r}")
        raise AssertionError  # unreachable: fail raised


def _timestamp(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def parse(text: str) -> Node:
    """The syntax tree of a predicate; :class:`InvalidRequest` saying what is wrong."""
    if not isinstance(text, str):
        raise InvalidRequest(
            f"replaceWhere must be text, got {type(text).__name__}; give the condition as SQL text, e.g. \"day >= '2026-01-01'\""
        )
    return _Parser(text).parse()


def columns(node: Node) -> set[str]:
    """The top-level columns a predicate reads."""
    if node[0] == "col":
        return {node[1][0]}
    if node[0] == "lit":
        return set()
    out: set[str] = set()
    for child in node[1:]:
        for item in child if isinstance(child, list) else [child]:
            if isinstance(item, tuple):
                out |= columns(item)
    return out


def bind(text: str, schema: pa.Schema) -> pc.Expression:
    """``text`` as a pyarrow expression over tables of ``schema``, literals in the types of
    the columns they are compared with; :class:`InvalidRequest` naming an unknown column or a
    literal that does not fit its column."""
    node = parse(text)

    def column_type(path: tuple[str, ...]) -> pa.DataType:
        t: Any = schema
        for depth, name in enumerate(path):
            names = t.names if depth == 0 else [t.field(i).name for i in range(t.num_fields)]
            if name not in names:
                where = "the dataset" if depth == 0 else f"struct {'.'.join(path[:depth])!r}"
                raise InvalidRequest(
                    f"replaceWhere {text!r} names column {'.'.join(path)!r}, which is not in "
                    f"{where} (columns: {names}); name one of those columns"
                )
            t = t.field(name).type
        return t

    def typed(value: Any, t: pa.DataType | None) -> pc.Expression:
        if value is None or t is None:
            return pc.scalar(value)
        textual = pa.types.is_string(t) or pa.types.is_binary(t)
        if textual and not isinstance(value, str):
            raise InvalidRequest(
                f"replaceWhere {text!r} compares a {t} column with {value!r}; compare it "
                "with 'quoted text'"
            )
        try:
            if pa.types.is_timestamp(t) and isinstance(value, str | dt.datetime):
                value = _timestamp(value) if isinstance(value, str) else value
                if value.tzinfo is None:
                    value = value.replace(tzinfo=dt.UTC)
                if t.tz is None:  # timestamp_ntz: the wall-clock time as written, in UTC
                    value = value.astimezone(dt.UTC).replace(tzinfo=None)
            if isinstance(value, Decimal | float) and not pa.types.is_decimal(t):
                return pc.scalar(float(value))  # 1.5 against an integer: compared as doubles
            return pc.scalar(pa.scalar(value).cast(t))
        except (ValueError, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise InvalidRequest(
                f"replaceWhere {text!r}: {value!r} is not a value of type {t} ({exc}); compare the column with a value of its type"
            ) from None

    def operand(n: Node, other: Node | None = None) -> pc.Expression:
        if n[0] == "lit":
            t = column_type(other[1]) if other is not None and other[0] == "col" else None
            return typed(n[1], t)
        return expr(n)

    def expr(n: Node) -> pc.Expression:
        kind = n[0]
        if kind == "col":
            column_type(n[1])
            return pc.field(*n[1]) if len(n[1]) > 1 else pc.field(n[1][0])
        if kind == "lit":
            return pc.scalar(n[1])
        if kind in ("and", "or"):
            a, b = expr(n[1]), expr(n[2])
            return a & b if kind == "and" else a | b
        if kind == "not":
            return ~expr(n[1])
        if kind == "null":
            return operand(n[1]).is_null()
        if kind == "cmp":
            op, a, b = n[1], operand(n[2], n[3]), operand(n[3], n[2])
            if op == "<=>":
                both_null = a.is_null() & b.is_null()
                return both_null | (a.is_valid() & b.is_valid() & (a == b))
            return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[
                op
            ]
        if kind == "in":
            left = operand(n[1])
            t = column_type(n[1][1]) if n[1][0] == "col" else None
            out: pc.Expression | None = None
            for lit in n[2]:  # OR of equalities keeps SQL's NULL semantics of IN
                eq = left == typed(lit[1], t)
                out = eq if out is None else out | eq
            assert out is not None
            return out
        if kind == "like":  # SQL's % and _, as pyarrow's match_like takes them
            return pc.match_like(operand(n[1]), pattern=n[2])
        if kind == "between":
            left = operand(n[1])
            return (left >= operand(n[2], n[1])) & (left <= operand(n[3], n[1]))
        raise AssertionError(kind)

    expression = expr(node)
    try:  # evaluating it on no rows finds what binding cannot: `NOT n`, types that do not mix
        schema.empty_table().filter(expression)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise InvalidRequest(
            f"replaceWhere {text!r} is not a true-or-false condition on the dataset's columns "
            f"({exc}); write a comparison such as \"day >= '2026-01-01'\""
        ) from None
    return expression


def is_true(expression: pc.Expression) -> pc.Expression:
    """Rows where ``expression`` is true (null counts as not true)."""
    return pc.coalesce(expression, pc.scalar(False))
