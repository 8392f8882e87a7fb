"""``replaceWhere``: an overwrite of only the rows that match a predicate, in one Delta commit.

The commit that publishes the new data also removes every data file, of the version the
overwrite began at, in which some row matches; a file where only some rows match is rewritten
first with the other rows (copy on write), and the rewrite is added in that same commit. So
readers see the old rows or the new ones, never both and never neither. As for a whole
overwrite (:func:`.commits.commit`), rows appended after the overwrite began are kept, and a
file it must remove that a concurrent commit removed first is :class:`Conflict`.

Like Delta's own ``replaceWhere``, every row written must match the predicate: a write that
would put rows outside the part it replaces is refused.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from aqueduct_spark.protocol import Conflict, InvalidRequest

from . import binding, scan, staging
from .delta_stats import stats_from_metadata

_THREADS = 8
"""Data files read (and copied) at once: the work is I/O and Arrow, which release the GIL."""


@dataclass
class Replacement:
    """What a replaceWhere commit adds and removes besides its own data."""

    removes: list[RemoveAction] = field(default_factory=list)
    rewrites: list[AddAction] = field(default_factory=list)


def _complete(
    table: pa.Table | None,
    rows: int,
    schema: pa.Schema,
    partition_by: Sequence[str],
    values: Mapping[str, Any],
    names: Sequence[str],
) -> pa.Table:
    """Columns ``names`` in the table's types: from ``table`` where it has them, partition
    columns from the file's values, columns the file lacks (a later schema's) as nulls."""
    arrays = []
    for name in names:
        t = schema.field(name).type
        if table is not None and name in table.column_names:
            arrays.append(table.column(name).cast(t))
        elif name in partition_by and values.get(name) is not None:
            arrays.append(pa.array([values[name]] * rows, t))
        else:
            arrays.append(pa.nulls(rows, t))
    return pa.table(arrays, names=list(names)) if names else pa.table({"_": pa.nulls(rows)})


def _matching(
    fs: pafs.FileSystem,
    path: str,
    schema: pa.Schema,
    partition_by: Sequence[str],
    values: Mapping[str, Any],
    expression: pc.Expression,
    needed: Sequence[str],
) -> tuple[int, int]:
    """(rows matching, rows) of one data file. Reads only the predicate's stored columns;
    a predicate on partition columns alone reads no data at all."""
    stored = [c for c in needed if c not in partition_by]
    with fs.open_input_file(path) as fh:
        pf = pq.ParquetFile(fh)
        rows = pf.metadata.num_rows
        if stored:
            present = [c for c in stored if c in pf.schema_arrow.names]
            table = _complete(pf.read(columns=present), rows, schema, partition_by, values, needed)
            return table.filter(binding.is_true(expression)).num_rows, rows
    one = _complete(None, min(rows, 1), schema, partition_by, values, needed)
    return (rows if one.filter(binding.is_true(expression)).num_rows else 0), rows


def _typed(values: Mapping[str, str | None], schema: pa.Schema) -> dict[str, Any]:
    """Delta partition strings (as staged files carry them) as values of the columns' types."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        out[k] = None if v is None else pa.scalar(v).cast(schema.field(k).type).as_py()
    return out


def check_written(
    dataset: str,
    fs: pafs.FileSystem,
    adds: Sequence[AddAction],
    schema: pa.Schema,
    partition_by: Sequence[str],
    text: str,
) -> None:
    """Refuse a write whose rows do not all match ``text`` (InvalidRequest, with a count)."""
    expression = binding.bind(text, schema)
    needed = binding.text_columns(text)
    stray = 0
    for add in adds:
        values = _typed(add.partition_values, schema)
        matching, rows = _matching(fs, add.path, schema, partition_by, values, expression, needed)
        stray += rows - matching
    if stray:
        raise InvalidRequest(
            f"{stray} of the rows written to dataset {dataset!r} do not match replaceWhere "
            f"{text!r}; an overwrite with replaceWhere may only write rows that its condition "
            "selects. Filter the data with the same condition, or widen the condition"
        )


def replacement(
    dataset: str,
    fs: pafs.FileSystem,
    began: DeltaTable | None,
    active: set[str],
    schema: pa.Schema,
    partition_by: Sequence[str],
    text: str,
    txn: str,
) -> Replacement:
    """The removes and rewrites that take the rows matching ``text`` out of the files of
    ``began`` (the version the overwrite began at; None: there was no table)."""
    out = Replacement()
    if began is None:
        return out
    expression = binding.bind(text, schema)
    needed = binding.text_columns(text)
    files = pa.table(began.get_add_actions(flatten=True)).to_pylist()
    # the log's statistics and partition values rule out most files without opening them
    candidates = [files[i] for i in scan.prune(schema, partition_by, files, expression)]

    def judge(f: dict[str, Any]) -> tuple[str, int, dict[str, Any], int, int]:
        path = unquote(f["path"])
        values = {c: f.get(f"partition.{c}") for c in partition_by}
        try:
            matching, rows = _matching(fs, path, schema, partition_by, values, expression, needed)
        except FileNotFoundError:
            matching, rows = -1, 0  # removed and vacuumed meanwhile: a conflict if it was ours
        return path, int(f["size_bytes"]), values, matching, rows

    now = int(time.time() * 1000)
    partial = []
    with ThreadPoolExecutor(_THREADS) as pool:
        for path, size, values, matching, rows in pool.map(judge, candidates):
            if matching == 0:
                continue
            if path not in active or matching < 0:
                raise Conflict(
                    f"the replaceWhere overwrite of dataset {dataset!r} conflicted with a "
                    f"concurrent commit: {path!r}, which holds rows it replaces, was removed "
                    "meanwhile (another overwrite won); its staged files are kept: retry the "
                    "commit, or run the overwrite again"
                )
            out.removes.append(RemoveAction(path, True, now, size))
            if matching < rows:  # some rows stay: they go on in a copy without the others
                partial.append((path, values))
        copies = [
            pool.submit(_rewrite, fs, path, schema, partition_by, expression, needed, values, txn)
            for path, values in partial
        ]
        wait(copies)
    out.rewrites = [c.result() for c in copies if c.exception() is None]
    failed = [e for c in copies if (e := c.exception()) is not None]
    if failed:
        discard(fs, out.rewrites)
        raise failed[0]
    return out


def _rewrite(
    fs: pafs.FileSystem,
    path: str,
    schema: pa.Schema,
    partition_by: Sequence[str],
    expression: pc.Expression,
    needed: Sequence[str],
    values: Mapping[str, Any],
    txn: str,
) -> AddAction:
    """A copy of the data file at ``path`` without the rows ``expression`` selects."""
    with fs.open_input_file(path) as fh:
        table = pq.read_table(fh)
    extra = [c for c in needed if c not in table.column_names]
    whole = table
    if extra:
        filled = _complete(None, table.num_rows, schema, partition_by, values, extra)
        for name in extra:
            whole = whole.append_column(name, filled.column(name))
    keep = whole.filter(pc.invert(binding.is_true(expression))).select(table.column_names)
    directory = path.rsplit("/", 1)[0] if "/" in path else ""
    name = staging.staged_file_name(txn, "replace")
    new = f"{directory}/{name}" if directory else name
    with fs.open_output_stream(new) as sink:
        writer = pq.ParquetWriter(sink, table.schema, compression="snappy")
        writer.write_table(keep, row_group_size=max(1, keep.num_rows))
        writer.close()
        md = writer.writer.metadata
    return AddAction(
        path=new,
        size=int(fs.get_file_info(new).size or 0),
        partition_values={k: staging.encode_partition_value(v) for k, v in values.items()},
        modification_time=int(time.time() * 1000),
        data_change=True,
        stats=stats_from_metadata(md, table.schema),
    )


def discard(fs: pafs.FileSystem, rewrites: Sequence[AddAction]) -> None:
    """Delete the rewritten files of a commit that did not happen."""
    for add in rewrites:
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(add.path)
