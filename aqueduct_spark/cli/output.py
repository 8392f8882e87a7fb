"""How ``cat`` and ``head`` print rows: a table for a person at a terminal, CSV for a pipe.

As ``psql`` and ``duckdb`` do, rows go to a terminal as an aligned table and to a pipe or a
file as CSV with one header line, unless ``--format`` says otherwise. Both stream: each batch
is printed (and flushed) as it arrives, so ``aqueduct cat trips | head`` shows rows at once
and a dataset larger than memory prints in constant memory. The table's column widths come
from the header and the first batch (at most :data:`MAX_WIDTH` characters; a longer value is
cut with ``…``), so that its first rows need not wait for the last.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import sys
from typing import IO, Any

import pyarrow as pa

MAX_WIDTH = 40
"""Widest a table column is printed; longer values end in ``…``."""
NULL = "NULL"
"""How the table shows a missing value (an empty text stays empty)."""


def rows_writer(fmt: str, schema: pa.Schema, out: IO[bytes] | None = None) -> RowsWriter:
    """A writer of ``fmt`` (``auto``: ``table`` on a terminal, else ``csv``) to ``out``
    (standard output)."""
    out = out if out is not None else sys.stdout.buffer
    if fmt == "auto":
        fmt = "table" if out.isatty() else "csv"
    if fmt == "table":
        return TableWriter(schema, out)
    if fmt == "csv":
        return CsvWriter(schema, out)
    if fmt == "json":
        return JsonWriter(schema, out)
    raise ValueError(f"unknown output format {fmt!r}: use auto, table, csv or json")


class RowsWriter:
    """Writes batches of rows of one schema; :meth:`close` ends the output."""

    def __init__(self, schema: pa.Schema, out: IO[bytes]) -> None:
        self.schema = schema
        self.out = out
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self._write(batch)
        self.rows += batch.num_rows
        self.out.flush()  # a reader at the other end of a pipe sees each batch as it comes

    def _write(self, batch: pa.RecordBatch) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.out.flush()


class CsvWriter(RowsWriter):
    """RFC 4180 CSV by pyarrow's writer: one header line, then the rows."""

    def __init__(self, schema: pa.Schema, out: IO[bytes]) -> None:
        import pyarrow.csv as pcsv

        super().__init__(schema, out)
        self._csv = pcsv.CSVWriter(out, schema)  # writes the header now: an empty result has it

    def _write(self, batch: pa.RecordBatch) -> None:
        self._csv.write_batch(batch)

    def close(self) -> None:
        self._csv.close()
        super().close()


class JsonWriter(RowsWriter):
    """One JSON object per row (JSON Lines); times as ISO 8601 text."""

    def _write(self, batch: pa.RecordBatch) -> None:
        lines = "".join(json.dumps(row, default=_json_value) + "\n" for row in batch.to_pylist())
        self.out.write(lines.encode())


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


class TableWriter(RowsWriter):
    """An aligned table, as ``psql`` prints one: a header, a rule, the rows (numbers to the
    right), and the row count at the end."""

    def __init__(self, schema: pa.Schema, out: IO[bytes]) -> None:
        super().__init__(schema, out)
        self.widths: list[int] | None = None
        self.right = [_is_number(f.type) for f in schema]

    def _write(self, batch: pa.RecordBatch) -> None:
        columns = [[_text(v) for v in column.to_pylist()] for column in batch.columns]
        if self.widths is None:
            self.widths = [
                min(MAX_WIDTH, max([len(f.name), *(len(v) for v in values)]))
                for f, values in zip(self.schema, columns, strict=True)
            ]
            self._line(self.schema.names)
            self.out.write(("-+-".join("-" * w for w in self.widths) + "\n").encode())
        for row in zip(*columns, strict=True):
            self._line(row)

    def _line(self, values: Any) -> None:
        assert self.widths is not None
        cells = []
        for value, width, right in zip(values, self.widths, self.right, strict=True):
            if len(value) > width:
                value = value[: width - 1] + "…"
            cells.append(value.rjust(width) if right else value.ljust(width))
        self.out.write((" | ".join(cells).rstrip() + "\n").encode())

    def close(self) -> None:
        if self.widths is None:  # no batch at all: still say what the columns are
            self.widths = [len(name) for name in self.schema.names]
            self._line(self.schema.names)
            self.out.write(("-+-".join("-" * w for w in self.widths) + "\n").encode())
        self.out.write(f"({self.rows:,} row{'' if self.rows == 1 else 's'})\n".encode())
        super().close()


def _is_number(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


def _text(value: Any) -> str:
    """One cell as a person reads it: ISO times, ``NULL`` for a missing value, one line."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, float | decimal.Decimal | int | dt.date | dt.time):
        return str(value)
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if not isinstance(value, str):  # lists, structs, maps
        value = json.dumps(value, default=_json_value, ensure_ascii=False)
    return str(value).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
