"""Reading CSV files for ``aqueduct import``: types from the whole file, values that do not fit
named by file, line, column and value.

pyarrow's CSV reader does the parsing, the type inference and the conversion (its
``read_csv``, ``ConvertOptions.column_types`` and ``invalid_row_handler``). What this module
adds is the frame around it:

- **Chunks.** A file is read in chunks of about :data:`CHUNK_BYTES` that end at a line end.
  pyarrow ends a row at every line end (its default, ``newlines_in_values=False``), so a chunk
  holds whole rows, and the chunk's first line number makes every error's line exact. Memory
  stays at a few chunks whatever the file's size.
- **Types from the whole file.** Where no type is given (``--schema``, the dataset's own), a
  first pass reads every chunk with pyarrow's inference and joins the chunks' types: integers
  and floating point make floating point, dates and timestamps make timestamps; columns of
  nothing but empty values, and times of day (which Delta cannot store), are text.
- **A stray value is an error, not a text column.** A column that pyarrow can only read as
  text although most of its values are numbers, times or booleans (say ``3.2km`` among
  distances) fails the import at the first value that is not, unless ``--allow-strings``
  (or ``--schema COLUMN:string``) says text is meant. Which values look like numbers, times
  or booleans is decided only for that: by :data:`_KINDS`, patterns of what pyarrow accepts.
- **Errors with their place.** A row with too few or too many fields, or a value that does
  not fit its column's type, fails with the file, the line, the column and the value, and
  the fix. Nothing is written then: the import's transaction is aborted.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from aqueduct_core.errors import AqueductError

CHUNK_BYTES = 16 << 20
"""Bytes of CSV parsed at once (whole lines; a longer line makes its chunk longer)."""


class CsvError(AqueductError, ValueError):
    """A CSV file cannot be imported as it is: the message names the file, the line, the
    column and the value, and the fix (``aqueduct import`` exits with status 2)."""

    remedy = "correct the file where the message says, or give the column's type with --schema"


def delimiter_of(path: str) -> str:
    return "\t" if path.lower().endswith(".tsv") else ","


# -- --schema ------------------------------------------------------------------------------

_TYPE_NAMES: dict[str, pa.DataType] = {
    **dict.fromkeys(("string", "str", "text", "utf8", "varchar"), pa.string()),
    **dict.fromkeys(("bigint", "long", "int64"), pa.int64()),
    **dict.fromkeys(("int", "integer", "int32"), pa.int32()),
    **dict.fromkeys(("smallint", "short", "int16"), pa.int16()),
    **dict.fromkeys(("tinyint", "byte", "int8"), pa.int8()),
    **dict.fromkeys(("double", "float64"), pa.float64()),
    **dict.fromkeys(("float", "real", "float32"), pa.float32()),
    **dict.fromkeys(("boolean", "bool"), pa.bool_()),
    **dict.fromkeys(("date", "date32"), pa.date32()),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")


def parse_schema(text: str) -> dict[str, pa.DataType]:
    """``--schema "id:bigint,ts:timestamp,price:decimal(10,2)"`` as column -> Arrow type.
    Type names are Spark SQL's (``bigint``, ``double``, ``timestamp``, ``timestamp_ntz``, ...)
    or Arrow's (``int64``, ``float64``, ``string``, ...)."""
    types: dict[str, pa.DataType] = {}
    for pair in _split_pairs(text):
        name, sep, kind = pair.rpartition(":")
        name, kind = name.strip(), kind.strip().lower()
        if not sep or not name or not kind:
            raise CsvError(
                f"--schema {text!r}: {pair.strip()!r} is not COLUMN:TYPE; write "
                "e.g. --schema 'id:bigint,distance_km:double,ts:timestamp'"
            )
        decimal = _DECIMAL.fullmatch(kind)
        if decimal:
            types[name] = pa.decimal128(int(decimal[1]), int(decimal[2]))
        elif kind in _TYPE_NAMES:
            types[name] = _TYPE_NAMES[kind]
        else:
            near = difflib.get_close_matches(kind, list(_TYPE_NAMES), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise CsvError(
                f"--schema: unknown type {kind!r} for column {name!r}{hint}; use one of "
                f"{', '.join(sorted(set(_TYPE_NAMES)))} or decimal(P,S)"
            )
    return types


def _split_pairs(text: str) -> list[str]:
    """``a:int,b:decimal(10,2)`` at the commas outside parentheses."""
    pairs, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            pairs.append(text[start:i])
            start = i + 1
    pairs.append(text[start:])
    return [p for p in pairs if p.strip()]


# -- chunks of whole lines -----------------------------------------------------------------


@dataclass
class Chunk:
    path: str
    index: int
    first_line: int
    """Line number (from 1) of the chunk's first line in the file."""
    data: bytes

    def line_of_row(self, row: int, header: bool) -> int:
        """The file's line number of the chunk's ``row``-th row (from 0): pyarrow skips empty
        lines, and the first chunk starts with the header."""
        seen = -1 if header else 0
        for n, line in enumerate(self.data.split(b"\n")):
            if line.strip(b"\r"):
                if seen == row:
                    return self.first_line + n
                seen += 1
        return self.first_line  # not found: at least the chunk

    def line_of_text(self, text: str) -> int:
        """The line number of the first line that reads ``text``."""
        want = text.encode()
        for n, line in enumerate(self.data.split(b"\n")):
            if line.rstrip(b"\r") == want:
                return self.first_line + n
        return self.first_line

    @property
    def lines(self) -> str:
        last = self.first_line + self.data.count(b"\n")
        return f"lines {self.first_line:,}-{last:,}"


def chunks(path: str, size: int | None = None) -> Iterator[Chunk]:
    """``path`` in chunks of whole lines, of about ``size`` bytes (:data:`CHUNK_BYTES`)."""
    size = size or CHUNK_BYTES
    line, index, rest = 1, 0, b""
    with open(path, "rb") as f:
        while True:
            block = f.read(size)
            data = rest + block
            if not block:
                if data.strip():
                    yield Chunk(path, index, line, data)
                return
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # one line longer than a chunk: read on
                rest = data
                continue
            rest = data[cut:]
            yield Chunk(path, index, line, data[:cut])
            line += data.count(b"\n", 0, cut)
            index += 1


# -- reading one chunk ---------------------------------------------------------------------


@dataclass
class CsvFile:
    """How one file is read: its delimiter and columns (from its header line)."""

    path: str
    delimiter: str
    names: list[str] = field(default_factory=list)
    origins: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Per column whose type was given: where it came from, and the fix for a value that
    does not fit it."""
    _naive: bool = False

    def __post_init__(self) -> None:
        with open(self.path, "rb") as f:
            header = next((line for line in f if line.strip()), b"")
        if not header:
            raise CsvError(f"{self.path} is empty: a CSV file starts with a header line")
        self.names = pcsv.read_csv(
            pa.BufferReader(header), parse_options=pcsv.ParseOptions(delimiter=self.delimiter)
        ).column_names

    def read(
        self,
        chunk: Chunk,
        types: dict[str, pa.DataType],
        *,
        nulls: bool = False,
        threads: bool = True,
    ) -> pa.Table:
        """The chunk's rows, with ``types`` for the columns they name (pyarrow infers the
        rest; ``nulls``: empty text is null); a bad row or value raises :class:`CsvError`
        naming its line."""
        bad: list[Any] = []

        def invalid(row: Any) -> str:
            bad.append(row)
            return "error"

        options = {
            "read_options": pcsv.ReadOptions(
                use_threads=threads, column_names=None if chunk.index == 0 else self.names
            ),
            "parse_options": pcsv.ParseOptions(
                delimiter=self.delimiter, invalid_row_handler=invalid
            ),
            "convert_options": pcsv.ConvertOptions(column_types=types, strings_can_be_null=nulls),
        }
        try:
            return pcsv.read_csv(pa.BufferReader(chunk.data), **options)
        except pa.ArrowInvalid as exc:
            if bad and threads:  # which bad row pyarrow met first is open: read in order
                self.read(chunk, types, threads=False)
            if bad:
                raise self._bad_row(chunk, bad[0]) from None
            raise self._bad_value(chunk, types, str(exc)) from None

    def read_as(
        self, chunk: Chunk, types: dict[str, pa.DataType], *, nulls: bool = False
    ) -> pa.Table:
        """:meth:`read`, where a timestamp column with a zone also takes times written
        without one, as UTC (the dataset's convention): a chunk's times are either all with
        a zone or all without, and the way that worked is tried first on the next chunk."""
        zoned = [n for n, t in types.items() if pa.types.is_timestamp(t) and t.tz]
        errors: list[CsvError] = []
        for naive in (self._naive, not self._naive) if zoned else (False,):
            naive_types = dict.fromkeys(zoned if naive else (), pa.timestamp("us"))
            try:
                table = self.read(chunk, {**types, **naive_types}, nulls=nulls)
            except CsvError as exc:
                errors.append(exc)
                continue
            self._naive = naive
            for n in naive_types:
                if n in table.column_names:
                    i = table.column_names.index(n)
                    table = table.set_column(i, n, table.column(n).cast(types[n]))
            return table
        raise errors[0]

    def _bad_row(self, chunk: Chunk, row: Any) -> CsvError:
        line = chunk.line_of_text(row.text)
        return CsvError(
            f"{self.path} line {line}: {row.actual_columns} fields where the header has "
            f"{row.expected_columns} ({_shown(row.text)}). Fix: give every line "
            f"{row.expected_columns} fields separated by {_delimiter_name(self.delimiter)}; "
            "quote a field that contains one"
        )

    def _bad_value(self, chunk: Chunk, types: dict[str, pa.DataType], message: str) -> CsvError:
        """The first value of the chunk that its column's type cannot hold, found by reading
        the chunk as text and converting each typed column."""
        texts = self.read(chunk, dict.fromkeys(self.names, pa.string()))
        for name, kind in types.items():
            if name not in texts.column_names:
                continue
            row, value = _first_misfit(texts.column(name), kind)
            if row is not None:
                line = chunk.line_of_row(row, header=chunk.index == 0)
                origin, fix = self.origins.get(name, ("", "correct the value"))
                return CsvError(
                    f"{self.path} line {line}, column {name!r}: {_shown(value)} is not "
                    f"{_a(kind)}{', ' if origin else ''}{origin}. Fix: {fix}"
                )
        return CsvError(f"{self.path} {chunk.lines}: {message}")


def _first_misfit(texts: pa.ChunkedArray, kind: pa.DataType) -> tuple[int | None, str]:
    """The row and text of the first value of ``texts`` pyarrow's CSV reader cannot read as
    ``kind`` (by halving: a few conversions, not one per value)."""

    def fits(lo: int, hi: int) -> bool:
        piece = pa.table({"v": texts.slice(lo, hi - lo)})
        try:
            _reconvert(piece, kind)
        except pa.ArrowInvalid:
            return False
        return True

    lo, hi = 0, len(texts)
    if fits(lo, hi):
        return None, ""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(lo, mid):
            lo = mid
        else:
            hi = mid
    return lo, texts[lo].as_py()


def _reconvert(texts: pa.Table, kind: pa.DataType) -> None:
    """Convert a one-column table of CSV field texts to ``kind`` with pyarrow's CSV reader
    (one field a line: no delimiter, no quotes)."""
    data = "\n".join(texts.column(0).to_pylist()).encode() + b"\n"
    pcsv.read_csv(
        pa.BufferReader(data),
        read_options=pcsv.ReadOptions(column_names=["v"]),
        parse_options=pcsv.ParseOptions(delimiter="\x1f", quote_char=False),
        convert_options=pcsv.ConvertOptions(column_types={"v": kind}),
    )


def _shown(text: Any) -> str:
    text = str(text)
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _a(kind: pa.DataType) -> str:
    name = _KIND_NAMES.get(str(kind), str(kind))
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


_KIND_NAMES = {
    "int64": "integer (int64)",
    "int32": "integer (int32)",
    "double": "number (double)",
    "bool": "boolean (true or false)",
    "date32[day]": "date (2026-01-31)",
    "timestamp[us]": "timestamp without zone (2026-01-31 12:00:00)",
    "timestamp[us, tz=UTC]": "timestamp with a zone (2026-01-31T12:00:00Z)",
}


def _delimiter_name(d: str) -> str:
    return {",": "commas", "\t": "tabs"}.get(d, repr(d))


# -- types from the whole file -------------------------------------------------------------

_KINDS = {
    "number": r"(?i)^\s*[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*$|^\s*[+-]?inf(inity)?\s*$",
    "time": r"^\s*\d{4}-\d{2}-\d{2}([T ]\d{2}(:\d{2}(:\d{2}(\.\d+)?)?)?\s*(Z|[+-]\d{2}(:?\d{2})?)?)?\s*$",
    "boolean": r"(?i)^\s*(true|false)\s*$",
}
"""What a value of each kind looks like: only to tell a text column from a typed column with
a stray value in it. The types themselves are pyarrow's inference."""


def _kind_of(t: pa.DataType) -> str | None:
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return "time"
    if pa.types.is_boolean(t):
        return "boolean"
    return None


def _storable(t: pa.DataType) -> pa.DataType:
    """An inferred type as the dataset stores it: timestamps in microseconds, times of day
    (which Delta has no type for) and all-empty columns as text."""
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_time(t) or pa.types.is_null(t):
        return pa.string()
    return t


def _join(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """The type that holds values of both (pyarrow's loosening: int64 and double make double,
    a date and a timestamp make the timestamp), else text."""
    if a == b or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    pair = {str(a), str(b)}
    if pair == {"int64", "double"}:
        return pa.float64()
    if pair == {"date32[day]", "timestamp[us]"}:
        return pa.timestamp("us")
    return pa.string()


@dataclass
class _Column:
    """What the first pass learnt of one column whose type nobody gave."""

    type: pa.DataType = field(default_factory=pa.null)
    values: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    stray: dict[str, tuple[Chunk, int, str]] = field(default_factory=dict)
    """Per kind: the first value that does not look like it (chunk, row, text)."""

    def add(self, chunk: Chunk, column: pa.ChunkedArray) -> None:
        t = column.type if pa.types.is_null(column.type) else _storable(column.type)
        self.type = _join(self.type, t)
        n = len(column) - column.null_count
        self.values += n
        kind = _kind_of(t)
        if kind is not None:
            self.kinds[kind] = self.kinds.get(kind, 0) + n
        elif n and pa.types.is_string(column.type):
            for name, pattern in _KINDS.items():
                looks = pc.match_substring_regex(column, pattern)
                self.kinds[name] = self.kinds.get(name, 0) + (pc.sum(looks).as_py() or 0)
                row = pc.index(looks, False).as_py()
                if row >= 0 and name not in self.stray:
                    self.stray[name] = (chunk, row, column[row].as_py())


@dataclass
class Inferred:
    """The types of a set of CSV files, and their rows (for the progress bar)."""

    types: dict[str, pa.DataType]
    rows: int


def infer(
    files: list[CsvFile],
    given: dict[str, pa.DataType],
    *,
    allow_strings: bool,
    progress: Callable[[int], None] = lambda n: None,
) -> Inferred:
    """Read every chunk of ``files`` once: the columns' types from all their values (``given``
    ones as given, their values checked), and the rows."""
    columns: dict[str, _Column] = {}
    rows = 0
    for f in files:
        for name in f.names:
            if name not in given:
                columns.setdefault(name, _Column())
        for chunk in chunks(f.path):
            table = f.read_as(chunk, given, nulls=True)
            rows += table.num_rows
            for name, col in columns.items():
                if name in table.column_names:
                    col.add(chunk, table.column(name))
            progress(len(chunk.data))
    types = {}
    for name in dict.fromkeys(n for f in files for n in f.names):
        if name in given:
            types[name] = given[name]
            continue
        col = columns[name]
        t = _storable(col.type)
        if pa.types.is_string(t) and not allow_strings:
            _refuse_mixed(name, col)
        types[name] = t
    return Inferred(types, rows)


def _refuse_mixed(name: str, col: _Column) -> None:
    """A text column whose values are mostly of one kind fails at its first stray value."""
    if not col.kinds:
        return
    kind, count = max(col.kinds.items(), key=lambda kv: kv[1])
    if count * 2 <= col.values:
        return  # mostly text: a text column
    fix = (
        f"Fix: correct the value; or import the column as text with --schema "
        f"{_option_name(name)}:string (or another type), or every such column with "
        "--allow-strings"
    )
    if kind not in col.stray:  # every value looks like one, yet pyarrow reads no one type
        raise CsvError(
            f"column {name!r}: its values are {kind}s, but not all of one type (say, times "
            f"with and without a zone). {fix}"
        )
    chunk, row, value = col.stray[kind]
    line = chunk.line_of_row(row, header=chunk.index == 0)
    raise CsvError(
        f"{chunk.path} line {line}, column {name!r}: {_shown(value)} is not a {kind}, "
        f"though {count:,} of the column's {col.values:,} values are. {fix}"
    )


def _option_name(name: str) -> str:
    return name if re.fullmatch(r"[\w.-]+", name) else repr(name)


# -- the rows ------------------------------------------------------------------------------


def batches(f: CsvFile, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of ``f`` as batches of ``schema`` (by column name: a column of the file the
    schema lacks fails)."""
    _check_columns(f, schema)
    types = {n: schema.field(n).type for n in schema.names}
    for chunk in chunks(f.path):
        yield from f.read_as(chunk, types).to_batches(max_chunksize=65536)


def _check_columns(f: CsvFile, schema: pa.Schema) -> None:
    extra = [n for n in f.names if n not in schema.names]
    if extra:
        raise CsvError(
            f"{f.path} has columns the dataset does not: {', '.join(map(repr, extra))} (the "
            f"dataset's are {', '.join(schema.names)}). Fix: rename or drop them in the file, "
            "or import into a new dataset"
        )


def file_size(paths: list[str]) -> int:
    return sum(os.path.getsize(p) for p in paths)
