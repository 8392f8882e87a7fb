"""What a Delta writer must check of the rows it adds, and what it may not do to a table.

The Delta protocol leaves these to writers, and deltalake's ``create_write_transaction``, the
commit of files written beforehand that the service uses where it does not commit itself,
checks none of them (its ``write_deltalake`` checks them while it writes the data):

- CHECK constraints (``delta.constraints.<name>`` table properties) and column invariants
  (``delta.invariants`` in a field's metadata): every added row must make the expression
  true. As Spark's Delta checks them, NULL fails as false does (delta-rs lets NULL pass; the
  protocol asks for true). The expressions are Spark SQL; Polars' SQL evaluates them, and
  one it cannot evaluate refuses the write: nothing is ever committed unchecked.
- ``delta.appendOnly``: no commit may remove data, so an overwrite is refused.

Only tables that declare constraints pay for the check (the staged files are read once
more); :func:`rules` is empty for the others.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from aqueduct_spark.protocol import InvalidRequest

Rules = tuple[tuple[str, str], ...]
"""(name, Spark SQL expression) of each constraint a row must satisfy."""


def rules(configuration: Mapping[str, str], schema_string: str) -> Rules:
    """The CHECK constraints and column invariants of a table with this configuration and
    Delta schema string."""
    checks = tuple(
        (key[len("delta.constraints.") :], str(expr))
        for key, expr in sorted(configuration.items())
        if key.startswith("delta.constraints.")
    )
    return checks + _invariants(schema_string)


@functools.lru_cache(maxsize=256)
def _invariants(schema_string: str) -> Rules:
    """The column invariants of a Delta schema string (checked on every commit: cached)."""
    if "delta.invariants" not in schema_string:
        return ()
    found: list[tuple[str, str]] = []

    def walk(kind: Any, prefix: str) -> None:
        if not isinstance(kind, dict):
            return
        for f in kind.get("fields") or ():
            path = f"{prefix}{f['name']}"
            invariant = (f.get("metadata") or {}).get("delta.invariants")
            if invariant:
                try:
                    expr = json.loads(invariant)["expression"]["expression"]
                except (ValueError, KeyError, TypeError):
                    expr = str(invariant)
                found.append((f"invariant of {path}", str(expr)))
            walk(f.get("type"), f"{path}.")

    walk(json.loads(schema_string), "")
    return tuple(found)


def check_append_only(name: str, configuration: Mapping[str, str], what: str) -> None:
    """Refuse ``what`` (a commit that removes data) on a table with ``delta.appendOnly``."""
    if str(configuration.get("delta.appendOnly", "false")).lower() == "true":
        raise InvalidRequest(
            f"dataset {name!r} is append-only (delta.appendOnly=true), so its data cannot be "
            f"replaced by {what}: append instead, or unset the table property first "
            f"(ALTER TABLE ... SET TBLPROPERTIES ('delta.appendOnly' = 'false'))"
        )


def check(
    name: str,
    fs: pafs.FileSystem,
    adds: Sequence[AddAction],
    schema: pa.Schema,
    found: Rules,
) -> None:
    """Refuse the write of ``adds`` (files of a table of ``schema`` under ``fs``) unless
    every row satisfies every rule of ``found``."""
    if not found:
        return
    for add in adds:
        with fs.open_input_file(add.path) as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=CHECK_ROWS):
                _check_rows(name, _with_partitions(batch, add, schema), found)


CHECK_ROWS = 65_536
"""Rows checked at a time: memory stays that of one batch, whatever the file's size."""


def _with_partitions(batch: pa.RecordBatch, add: AddAction, schema: pa.Schema) -> pa.Table:
    """The rows of ``batch`` with the file's partition values as columns (a constraint may
    name them; the Parquet file does not hold them)."""
    table = pa.Table.from_batches([batch])
    for col, value in (add.partition_values or {}).items():
        kind = schema.field(col).type
        column = pa.array([value] * table.num_rows, pa.string()).cast(kind)
        table = table.append_column(pa.field(col, kind), column)
    return table


def _check_rows(name: str, table: pa.Table, found: Rules) -> None:
    import polars as pl

    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    for rule, expr in found:
        try:
            bad = frame.filter(~pl.sql_expr(expr).fill_null(False))
        except Exception as exc:  # Polars cannot evaluate it: never commit unchecked
            raise InvalidRequest(
                f"dataset {name!r} has the constraint {rule} ({expr}), which the service "
                f"cannot check ({exc}); write to it with Spark or "
                "deltalake, or drop the constraint"
            ) from exc
        if bad.height:
            row = bad.row(0, named=True)
            raise InvalidRequest(
                f"the write to dataset {name!r} violates its constraint {rule} ({expr}): "
                f"{bad.height} row(s) of a staged file, e.g. {row}; nothing was committed; "
                "remove or correct those rows and write again"
            )
