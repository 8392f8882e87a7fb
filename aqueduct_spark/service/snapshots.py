"""What the store keeps of a dataset's versions: :class:`Snapshot` (one version, as reads
need it) and :class:`LatestState` (the latest version, kept between requests; see
:mod:`.tables`)."""

from __future__ import annotations

import datetime as dt
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from . import log_tail


@dataclass(frozen=True)
class Snapshot:
    """What reads need of one version of a table, taken once (a version never changes).
    Its live files are loaded on first use (a plan needs them; ``begin``, ``describe`` and a
    commit's checks do not)."""

    version: int
    schema: pa.Schema
    partition_by: tuple[str, ...]
    table_id: str
    rows: int
    bytes: int
    file_count: int
    load: Callable[[], pa.Table] = field(repr=False, compare=False)
    """Returns the live files: ``get_add_actions(flatten=True)`` of that version."""

    @functools.cached_property
    def files(self) -> pa.Table:
        """The live files: ``get_add_actions(flatten=True)`` of that version."""
        return self.load()

    @functools.cached_property
    def paths(self) -> frozenset[str]:
        """The storage paths of the live files (the log's are URL-encoded once more), worked
        out once per snapshot: what a scan's splits are checked against (``split_files``)."""
        return frozenset(unquote(p) for p in self.files.column("path").to_pylist())

    @classmethod
    def of(cls, table: DeltaTable) -> Snapshot:
        metadata = table.metadata()
        files = pa.table(table.get_add_actions(flatten=True))
        return cls(
            version=table.version(),
            schema=pa.schema(table.schema().to_arrow()),
            partition_by=tuple(metadata.partition_columns),
            table_id=str(metadata.id),
            rows=int(pc.sum(files["num_records"]).as_py() or 0) if files.num_rows else 0,
            bytes=int(pc.sum(files["size_bytes"]).as_py() or 0) if files.num_rows else 0,
            file_count=files.num_rows,
            load=lambda: files,
        )

    @classmethod
    def of_tail(cls, tail: log_tail.Tail, load: Callable[[], pa.Table]) -> Snapshot:
        return cls(
            version=tail.version,
            schema=tail.schema,
            partition_by=tail.partition_by,
            table_id=tail.table_id,
            rows=tail.rows,
            bytes=tail.bytes,
            file_count=len(tail.live),
            load=load,
        )


class LatestState:
    """The latest state of one dataset, kept between requests: the log's tail (version,
    metadata, app transactions, live files; :mod:`.log_tail`), the snapshot reads take of
    it, and a deltalake table of it for what only deltalake does (a commit it makes, an app
    transaction older than the tail). ``lock`` guards all three; ``files_lock`` the table
    snapshots load their file lists with (``reader``), so a plan loading them never holds
    up a commit."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.tail: log_tail.Tail | None = None
        self.table: DeltaTable | None = None
        self.snapshot: Snapshot | None = None
        self.key: log_tail.FileKey = None  # of the snapshot's commit file
        self.files_lock = threading.Lock()
        self.reader: DeltaTable | None = None
        self.times: dict[int, dt.datetime] | None = None
        """Commit times of the versions in the log (listed once, then extended)."""
        self.loads = 0  # full loads of the log: a listing (tests count them)
        self.updates = 0  # refreshes that read new commit files (no listing)
