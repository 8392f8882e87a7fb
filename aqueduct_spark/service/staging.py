"""Staged files: the Parquet files a write task leaves in a table directory before the commit.

A write is two-phase. Each task streams its batches into a :class:`StageWriter`, which writes
Parquet files straight into the table directory and returns a :class:`StagedFile` per file.
Nothing is visible yet: a Delta table is only what its log says. The driver then commits all
staged files of the write in one Delta commit (``Store.commit``), or aborts and the files are
deleted (``Store.abort_txn``). Files of a write that never finished are found again by name:

    part-<txn>-<task>-<32 hex digits>.parquet

``txn`` is 1-64 letters, digits or ``_`` (no ``-``, so the name parses back unambiguously; a
``uuid4().hex`` fits), ``task`` is 1-64 letters, digits, ``_`` or ``-``. Partitioned tables get
hive-style directories (``region=us%20west/``, nulls as ``__HIVE_DEFAULT_PARTITION__``), never a
path starting with ``_`` or ``.``, which Delta's vacuum skips.

Everything written is in Delta's types (:mod:`.delta_types`), and each staged file carries the
Delta statistics of its Parquet footer (:mod:`.delta_stats`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from aqueduct_spark.protocol import InvalidRequest, SchemaMismatch, StagedFile
from aqueduct_spark.protocol.parquet import leaf_count

from .delta_stats import stats_from_metadata
from .delta_types import conform_batch, delta_schema, same_type

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
TXN_RE = re.compile(r"^[A-Za-z0-9_]{1,64}$")
TASK_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
STAGED_NAME_RE = re.compile(
    r"^part-(?P<txn>[A-Za-z0-9_]{1,64})-(?P<task>[A-Za-z0-9_-]{1,64})-[0-9a-f]{32}\.parquet$"
)
ROW_GROUP_MAX_ROWS = 1 << 20
_VERIFY_THREADS = 8

# ---------------------------------------------------------------------------------------------
# Names


def check_txn(txn: str) -> str:
    if not isinstance(txn, str) or not TXN_RE.match(txn):
        raise InvalidRequest(
            f"invalid transaction id {txn!r}: use 1-64 letters, digits or '_' (uuid4().hex works)"
        )
    return txn


def check_task(task: str) -> str:
    if not isinstance(task, str) or not TASK_RE.match(task):
        raise InvalidRequest(f"invalid task id {task!r}: use 1-64 letters, digits, '_' or '-'")
    return task


def staged_file_name(txn: str, task: str) -> str:
    return f"part-{txn}-{task}-{secrets.token_hex(16)}.parquet"


def staged_txn(path: str) -> str | None:
    """The transaction id in a staged file's path, or None if it is not one of our names."""
    m = STAGED_NAME_RE.match(path.rsplit("/", 1)[-1])
    return m.group("txn") if m else None


def check_relative_path(path: str) -> str:
    """A path inside a table directory that cannot escape it or reach the Delta log."""
    parts = path.split("/") if isinstance(path, str) else []
    if (
        not parts
        or "\\" in path
        or "\x00" in path
        or any(p in ("", ".", "..") or p[0] in "_." for p in parts)
        or not parts[-1].endswith(".parquet")
    ):
        raise InvalidRequest(
            f"invalid data file path {path!r}: expected a relative path to a .parquet file "
            "inside the table, without '..' or components starting with '_' or '.'"
        )
    return path


# ---------------------------------------------------------------------------------------------
# Partitions

_PARTITION_TYPES = (
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_string,
    pa.types.is_boolean,
    pa.types.is_date,
    pa.types.is_timestamp,
    pa.types.is_decimal,
)


def check_partition_by(schema: pa.Schema, partition_by: Sequence[str]) -> tuple[str, ...]:
    if isinstance(partition_by, str):
        partition_by = [partition_by]
    cols = tuple(partition_by)
    for c in cols:
        if c not in schema.names:
            raise SchemaMismatch(
                f"partition column {c!r} is not in the schema (columns: {schema.names}); "
                "partition by columns of the data"
            )
        t = schema.field(c).type
        if not any(ok(t) for ok in _PARTITION_TYPES):
            raise SchemaMismatch(
                f"partition column {c!r} has type {t}; partition by a column of a primitive "
                "type (integer, string, date, timestamp, boolean, decimal, float)"
            )
    if len(set(cols)) != len(cols):
        raise SchemaMismatch(
            f"partition columns {list(cols)} contain duplicates; name each one once"
        )
    if len(cols) >= len(schema):
        raise SchemaMismatch(
            "at least one column must not be a partition column; partition by fewer columns"
        )
    return cols


def encode_partition_value(value: Any) -> str | None:
    """A typed value as a Delta partition value string (None for null and for '')."""
    if value is None or value == "":
        return None  # Delta (and Spark) store an empty string partition value as null
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return str(value.strftime("%Y-%m-%d %H:%M:%S.%f"))
    if isinstance(value, dt.date):
        return value.isoformat()
    raise InvalidRequest(
        f"cannot use {value!r} as a partition value; partition by a column of a primitive type (integer, string, date, timestamp, boolean, decimal, float)"
    )


def partition_dir(partition_by: Sequence[str], values: Mapping[str, str | None]) -> str:
    """Hive-style directories, percent-encoded like deltalake's own (``p=a%20b/q=1``)."""
    parts = []
    for c in partition_by:
        v = values[c]
        parts.append(f"{quote(c, safe='')}={quote(HIVE_NULL if v is None else v, safe='')}")
    return "/".join(parts)


def _split_by_partition(
    batch: pa.RecordBatch, partition_by: Sequence[str]
) -> Iterator[tuple[dict[str, str | None], pa.RecordBatch]]:
    keys = pa.Table.from_batches([batch.select(list(partition_by))])
    if all(pc.count_distinct(keys[c], mode="all").as_py() == 1 for c in partition_by):
        yield {c: encode_partition_value(keys[c][0].as_py()) for c in partition_by}, batch
        return
    row = "__aqueduct_row__"
    keys = keys.append_column(row, pa.array(np.arange(batch.num_rows, dtype=np.int64)))
    groups = keys.group_by(list(partition_by), use_threads=False).aggregate([(row, "list")])
    rows = groups[f"{row}_list"]
    for i in range(groups.num_rows):
        values = {c: encode_partition_value(groups[c][i].as_py()) for c in partition_by}
        yield values, batch.take(rows[i].values)


# ---------------------------------------------------------------------------------------------
# Committing and cleaning up


def staged_files(fs: pafs.FileSystem) -> list[pafs.FileInfo]:
    """Every file in the table directory named like a staged file (committed or not)."""
    try:
        infos = fs.get_file_info(pafs.FileSelector("", recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    return [
        i
        for i in infos
        if i.type == pafs.FileType.File
        and not i.path.startswith(("_", "."))
        and staged_txn(i.path) is not None
    ]


def verify_staged(
    dataset: str,
    fs: pafs.FileSystem,
    files: Sequence[StagedFile],
    schema: pa.Schema,
    partition_by: tuple[str, ...],
    active: set[str],
) -> list[AddAction]:
    """The add actions committing ``files`` to a table of ``schema``, after checking each one
    is ours, inside this table, not yet active, complete, and written with this schema. The
    statistics are recomputed from each file's own footer rather than trusted."""
    seen: set[str] = set()
    for f in files:
        check_relative_path(f.path)
        if staged_txn(f.path) is None:
            raise InvalidRequest(f"{f.path!r} is not the name of a file staged here")
        if f.path in seen:
            raise InvalidRequest(f"staged file {f.path!r} is listed twice")
        seen.add(f.path)
        if f.path in active:
            raise InvalidRequest(
                f"staged file {f.path!r} is already part of dataset {dataset!r}: it was "
                "committed before (give a commit an app_id and app_version to make repeating "
                "it safe)"
            )
        if set(f.partition_values) != set(partition_by):
            raise SchemaMismatch(
                f"staged file {f.path!r} is partitioned by {sorted(f.partition_values)}, dataset "
                f"{dataset!r} by {list(partition_by)}; stage with partition_by={list(partition_by)}"
            )
        where = f.path.rsplit("/", 1)[0] if "/" in f.path else ""
        if where != partition_dir(partition_by, f.partition_values):
            raise InvalidRequest(
                f"staged file {f.path!r} is not in the directory of its partition values"
            )
    file_schema = pa.schema([fd for fd in schema if fd.name not in partition_by])

    def check(f: StagedFile) -> AddAction:
        gone = InvalidRequest(
            f"staged file {f.path!r} does not exist in dataset {dataset!r}: it was aborted, "
            "expired with its transaction, cleaned up as an orphan, or staged for another "
            "dataset. Stage the data again"
        )
        info = fs.get_file_info(f.path)
        if info.type != pafs.FileType.File:
            raise gone
        try:
            with fs.open_input_file(f.path) as fh:
                md = pq.read_metadata(fh)
        except FileNotFoundError as exc:
            raise gone from exc
        except (OSError, pa.ArrowInvalid) as exc:
            raise InvalidRequest(f"staged file {f.path!r} is not Parquet: {exc}") from exc
        got = md.schema.to_arrow_schema()
        if got.names != file_schema.names or not all(
            same_type(a.type, b.type) for a, b in zip(got, file_schema, strict=True)
        ):
            raise SchemaMismatch(
                f"staged file {f.path!r} has the columns {got}, not the write's {file_schema}; "
                "stage it again with the schema check_schema returns"
            )
        return AddAction(
            path=f.path,
            size=int(info.size),
            partition_values=dict(f.partition_values),
            modification_time=f.modification_time,
            data_change=True,
            stats=stats_from_metadata(md, file_schema),
        )

    if len(files) <= 1:
        return [check(f) for f in files]
    with ThreadPoolExecutor(min(_VERIFY_THREADS, len(files))) as pool:
        return list(pool.map(check, files))


# ---------------------------------------------------------------------------------------------
# The writer

DICTIONARY_PAGE_BYTES = 1 << 20
"""The most a Parquet dictionary page takes per column chunk (pyarrow's default limit, past
which the writer falls back to plain encoding)."""
FOOTER_BYTES, FOOTER_BYTES_PER_CHUNK = 64 << 10, 9 << 10
"""A bound on a footer: its fixed part, and per column chunk (statistics of at most 4 KiB each
for the minimum and maximum, then the chunk's metadata)."""


def _upper_bound(table: pa.Table, leaves: Sequence[int]) -> int:
    """A bound on the bytes writing ``table`` as one row group takes: plain encoding takes no
    more than Arrow's buffers (a value as wide, offsets as lengths, levels no wider than the
    validity and offsets they replace), a dictionary page adds at most its limit (and never
    more than the values), and compression of data that does not compress adds a little."""
    total = 0
    for column, n in zip(table.columns, leaves, strict=True):
        size = column.nbytes
        total += size + min(size, n * DICTIONARY_PAGE_BYTES) + size // 16 + 1024 * n
    return total + (64 << 10)


def _write_group(f: _OpenFile, table: pa.Table) -> None:
    f.writer.write_table(table, row_group_size=max(1, table.num_rows))
    f.row_groups += 1


class _OpenFile:
    def __init__(self, path: str, sink: pa.NativeFile, writer: pq.ParquetWriter) -> None:
        self.path = path
        self.sink = sink
        self.writer = writer
        self.charged = 0  # bytes given to the meter for this file
        self.row_groups = 0


class _Partition:
    def __init__(self, values: dict[str, str | None], directory: str) -> None:
        self.values = values
        self.directory = directory
        self.batches: list[pa.RecordBatch] = []
        self.buffered_bytes = 0
        self.buffered_rows = 0
        self.file: _OpenFile | None = None


class StageWriter:
    """Streams the batches of one write task into staged Parquet files of one dataset.

    Get one from ``Store.open_stage``. Call :meth:`write` as batches arrive, then :meth:`close`
    for the :class:`StagedFile` list to hand to ``Store.commit``, or :meth:`abort` to delete
    everything written. Not thread-safe: one task, one thread at a time.

    Memory stays bounded: batches are buffered per partition until they make a row group of
    about ``row_group_bytes`` (and at most ``2 * row_group_bytes`` over all partitions), written
    out, and a file is closed once it reaches ``target_file_bytes``. Batches are cast to the
    dataset's Delta types; a batch whose columns do not match raises :class:`SchemaMismatch`
    and leaves the writer usable.
    """

    def __init__(
        self,
        *,
        dataset: str,
        filesystem: pafs.FileSystem,
        schema: pa.Schema,
        partition_by: Sequence[str],
        txn: str,
        task: str,
        target_file_bytes: int,
        row_group_bytes: int,
        make_dir: Callable[[str], None] | None = None,
        remove_empty_dirs: Callable[[Sequence[str]], None] | None = None,
    ) -> None:
        self.dataset = dataset
        self.txn = check_txn(txn)
        self.task = check_task(task)
        self.schema = delta_schema(schema)
        self.partition_by = check_partition_by(self.schema, partition_by)
        self._file_schema = pa.schema([f for f in self.schema if f.name not in self.partition_by])
        self._fs = filesystem
        self._target = max(1, int(target_file_bytes))
        self._rg_bytes = max(1, min(int(row_group_bytes), self._target))
        self._make_dir = make_dir
        self._remove_empty_dirs = remove_empty_dirs
        self._partitions: dict[tuple[str | None, ...], _Partition] = {}
        self._buffered = 0
        self._created: list[str] = []
        self._staged: list[StagedFile] = []
        self._state = "open"
        self.rows = 0
        self._leaves = [leaf_count(f.type) for f in self._file_schema]
        self.meter: Callable[[int], None] | None = None
        """Told every change of the bytes this writer has on storage, before it writes (an
        upper bound of what the next row group or footer takes) and after (the difference to
        what it took, often negative); it may raise to refuse the write (a staging quota).
        Set it before the first write."""

    def __enter__(self) -> StageWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            self.close()

    @property
    def staged(self) -> list[StagedFile]:
        """Files finished so far (all of them after :meth:`close`)."""
        return list(self._staged)

    def write(self, data: pa.RecordBatch | pa.Table) -> None:
        """Stage one batch (or table). Rows are visible only after the commit."""
        if self._state != "open":
            raise InvalidRequest(f"the stage writer of task {self.task!r} is already {self._state}")
        batches = data.to_batches() if isinstance(data, pa.Table) else [data]
        for batch in batches:
            if not isinstance(batch, pa.RecordBatch):
                raise InvalidRequest(f"expected a pyarrow.RecordBatch, got {type(batch).__name__}")
            batch = conform_batch(batch, self.schema, self.dataset)
            if batch.num_rows == 0:
                continue
            self.rows += batch.num_rows
            if self.partition_by:
                for values, part in _split_by_partition(batch, self.partition_by):
                    self._buffer(values, part)
            else:
                self._buffer({}, batch)

    def _buffer(self, values: dict[str, str | None], batch: pa.RecordBatch) -> None:
        key = tuple(values[c] for c in self.partition_by)
        part = self._partitions.get(key)
        if part is None:
            part = self._partitions[key] = _Partition(
                values, partition_dir(self.partition_by, values)
            )
        if self.partition_by:
            batch = batch.select(self._file_schema.names)
        part.batches.append(batch)
        part.buffered_bytes += batch.nbytes
        part.buffered_rows += batch.num_rows
        self._buffered += batch.nbytes
        if part.buffered_bytes >= self._rg_bytes or part.buffered_rows >= ROW_GROUP_MAX_ROWS:
            self._flush(part)
        while self._buffered > 2 * self._rg_bytes:
            self._flush(max(self._partitions.values(), key=lambda p: p.buffered_bytes))

    @property
    def buffered(self) -> int:
        """Bytes of batches held in memory, waiting to make a row group."""
        return self._buffered

    def flush(self) -> None:
        """Write out every partition's buffered batches now, as smaller row groups: what a
        write does when the service's memory for writes is wanted elsewhere
        (``write_buffers``)."""
        if self._state != "open":
            raise InvalidRequest(f"the stage writer of task {self.task!r} is already {self._state}")
        for part in self._partitions.values():
            self._flush(part)

    def _flush(self, part: _Partition) -> None:
        if not part.batches:
            return
        table = pa.Table.from_batches(part.batches, schema=self._file_schema)
        self._buffered -= part.buffered_bytes
        part.batches, part.buffered_bytes, part.buffered_rows = [], 0, 0
        if part.file is None:
            part.file = self._open(part)
        f = part.file
        self._metered(f, _upper_bound(table, self._leaves), lambda: _write_group(f, table))
        if part.file.sink.tell() >= self._target:
            self._finish(part)

    def _open(self, part: _Partition) -> _OpenFile:
        name = staged_file_name(self.txn, self.task)
        path = f"{part.directory}/{name}" if part.directory else name
        sink = None
        for attempt in range(3):
            if self._make_dir is not None:
                self._make_dir(part.directory)
            try:
                sink = self._fs.open_output_stream(path)
                break
            except FileNotFoundError:
                # an abort of another write removed the directory, empty a moment ago
                if attempt == 2:
                    raise
        assert sink is not None
        self._created.append(path)
        writer = pq.ParquetWriter(sink, self._file_schema, compression="snappy")
        return _OpenFile(path, sink, writer)

    def _finish(self, part: _Partition) -> None:
        f, part.file = part.file, None
        assert f is not None
        footer = FOOTER_BYTES + FOOTER_BYTES_PER_CHUNK * sum(self._leaves) * f.row_groups
        self._metered(f, footer, f.writer.close)
        md = f.writer.writer.metadata
        f.sink.close()
        info = self._fs.get_file_info(f.path)
        if self.meter is not None and info.size is not None and info.size != f.charged:
            self.meter(info.size - f.charged)  # what landed, whatever the stream counted
            f.charged = info.size
        mtime = info.mtime
        self._staged.append(
            StagedFile(
                path=f.path,
                size=int(info.size) if info.size is not None else 0,
                rows=md.num_rows,
                partition_values=dict(part.values),
                stats=stats_from_metadata(md, self._file_schema),
                modification_time=(
                    int(mtime.timestamp() * 1000) if mtime is not None else int(time.time() * 1000)
                ),
            )
        )

    def _metered(self, f: _OpenFile, bound: int, write: Callable[[], None]) -> None:
        """``write`` to ``f``, charged to the meter: ``bound`` before, the truth after."""
        if self.meter is not None:
            self.meter(bound)
            f.charged += bound
        write()
        if self.meter is not None:
            now = f.sink.tell()
            self.meter(now - f.charged)
            f.charged = now

    def close(self) -> list[StagedFile]:
        """Write out everything buffered and return the staged files (none if no rows)."""
        if self._state == "closed":
            return list(self._staged)
        if self._state != "open":
            raise InvalidRequest(f"the stage writer of task {self.task!r} is already {self._state}")
        try:
            for part in self._partitions.values():
                self._flush(part)
                if part.file is not None:
                    self._finish(part)
        except BaseException:
            self.abort()
            raise
        self._state = "closed"
        return list(self._staged)

    def abort(self) -> None:
        """Delete every file this writer created. Safe to call more than once."""
        if self._state == "aborted":
            return
        self._state = "aborted"
        self._buffered = 0
        for part in self._partitions.values():
            part.batches = []
            if part.file is not None:
                for closer in (part.file.writer.close, part.file.sink.close):
                    with contextlib.suppress(Exception):  # the file is deleted next anyway
                        closer()
                part.file = None
        for path in self._created:
            with contextlib.suppress(FileNotFoundError):
                self._fs.delete_file(path)
        if self._remove_empty_dirs is not None:
            self._remove_empty_dirs(self._created)
        self._created, self._staged = [], []
