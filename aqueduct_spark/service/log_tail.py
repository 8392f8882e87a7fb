"""The latest version of a Delta table, kept from its commit files: no listing of the log.

A Delta reader finds the latest version by listing ``_delta_log``. On a local disk that reads
the whole directory, and Delta keeps 30 days of commit files by default: 43,000 entries for a
stream committing once a minute, each costing every listing a few microseconds. deltalake
lists the log three times per commit (the latest version, its post-commit snapshot, and its
expired-log cleanup, which lists every entry with its metadata even on S3), so its commit
cost grows with the log for as long as a stream runs.

:class:`Tail` is what the service needs of the latest version: its number, protocol and
metadata, the app transactions committed since it was loaded, and the live files (path, size,
rows). It is loaded once from a deltalake table (one listing), then brought forward by
:func:`advance`, which does what a Delta reader does after its listing, without the listing:
it probes for the commit file after the kept version and reads each one found. That is exact
because commit files appear atomically, in order, and are never rewritten:

- the kept version's own commit file is compared (size, mtime) each time, so a table
  dropped and created again under the name is noticed and loaded afresh;
- log cleanup deletes commit files only below a checkpoint, and every writer (Spark,
  deltalake, this service) points ``_last_checkpoint`` at a checkpoint it writes: a pointer
  past the kept version while the next commit file is missing means the log moved on
  without us, and the tail is loaded afresh (as it is when the pointer is far ahead: a load
  from the checkpoint is cheaper than reading hundreds of commits one by one).

Not thread-safe: the owner (:mod:`.tables`) uses one tail under its dataset's lock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema

from . import delta_log

LAST_CHECKPOINT = "_delta_log/_last_checkpoint"
RELOAD_GAP = 200
"""Versions behind a new checkpoint past which the tail is loaded afresh instead of reading
the commits in between one by one."""

FileKey = tuple[int, int] | None
"""A file's (size, mtime in ns); None when it does not exist."""


_STATS = ThreadPoolExecutor(8, thread_name_prefix="aqueduct-stat")
"""Stats of an object store's files made at once (:func:`stats`)."""


def stats(fs: pafs.FileSystem, paths: list[str]) -> list[pafs.FileInfo]:
    """``fs.get_file_info(paths)``; on an object store (deltalake's filesystem, which stats
    one path after another, each a LIST and a HEAD request) all at once: one round trip's
    wait instead of one per path."""
    if not isinstance(fs, pafs.PyFileSystem) or len(paths) < 2:
        return list(fs.get_file_info(paths))
    return list(_STATS.map(fs.get_file_info, paths))


def file_key(info: pafs.FileInfo) -> FileKey:
    return (info.size, info.mtime_ns) if info.type == pafs.FileType.File else None


class Reload(Exception):
    """The tail cannot be brought forward from the log's commits: load it afresh."""


@dataclass
class Tail:
    """The latest version of one table as its log says (see the module docstring)."""

    version: int
    key: FileKey
    """The (size, mtime) of version ``version``'s commit file: the table's identity."""
    protocol: dict[str, Any]
    """The ``protocol`` action in force (minReaderVersion, minWriterVersion, features)."""
    metadata: dict[str, Any]
    """The ``metaData`` action in force (id, schemaString, partitionColumns, configuration)."""
    schema: pa.Schema
    live: dict[str, tuple[int, int]]
    """The live data files: storage path (not URL-encoded) -> (size, rows)."""
    base: int
    """The version the tail was loaded at; ``txns`` holds what commits after it recorded."""
    txns: dict[str, int] = field(default_factory=dict)
    pointer: tuple[FileKey, int] = (None, -1)
    """``_last_checkpoint`` when last read: its key and the version it names (-1: none)."""
    rows: int = 0
    bytes: int = 0

    def __post_init__(self) -> None:
        self.rows = sum(r for _, r in self.live.values())
        self.bytes = sum(s for s, _ in self.live.values())

    @property
    def table_id(self) -> str:
        return str(self.metadata["id"])

    @property
    def partition_by(self) -> tuple[str, ...]:
        return tuple(self.metadata.get("partitionColumns") or ())

    @property
    def configuration(self) -> dict[str, str]:
        return dict(self.metadata.get("configuration") or {})

    def apply(self, version: int, key: FileKey, actions: Iterable[Mapping[str, Any]]) -> None:
        """Make the commit of ``version`` (the next one) part of the tail. :class:`Reload`
        when it belongs to another table (its metadata names another id)."""
        if version != self.version + 1:
            raise Reload(f"commit {version} does not follow version {self.version}")
        for action in actions:
            if isinstance(add := action.get("add"), dict):
                path = unquote(add["path"])
                self._drop(path)
                size, rows = int(add.get("size") or 0), delta_log.num_records(add)
                self.live[path] = (size, rows)
                self.rows += rows
                self.bytes += size
            elif isinstance(remove := action.get("remove"), dict):
                self._drop(unquote(remove["path"]))
            elif isinstance(txn := action.get("txn"), dict):
                self.txns[str(txn["appId"])] = int(txn["version"])
            elif isinstance(md := action.get("metaData"), dict):
                if str(md.get("id")) != self.table_id:
                    raise Reload("the table was replaced")
                self.metadata = dict(md)
                self.schema = schema_of(md)
            elif isinstance(protocol := action.get("protocol"), dict):
                self.protocol = dict(protocol)
        self.version, self.key = version, key

    def _drop(self, path: str) -> None:
        gone = self.live.pop(path, None)
        if gone is not None:
            self.rows -= gone[1]
            self.bytes -= gone[0]

    def txn_version(self, app_id: str, handle: DeltaTable | None) -> int | None:
        """The last version app ``app_id`` recorded, as of the tail's version: from the
        commits read since the tail was loaded, else from ``handle`` (a deltalake table of
        this table at the tail's base version or later)."""
        if app_id in self.txns:
            return self.txns[app_id]
        if handle is None:
            return None
        found = handle.transaction_version(app_id)
        return None if found is None else int(found)


def schema_of(metadata: Mapping[str, Any]) -> pa.Schema:
    return pa.schema(DeltaSchema.from_json(metadata["schemaString"]).to_arrow())


def load(table: DeltaTable, fs: pafs.FileSystem) -> Tail:
    """The tail of ``table`` (a deltalake table just loaded at its latest version)."""
    version = table.version()
    here, pointer = fs.get_file_info([delta_log.commit_path(version), LAST_CHECKPOINT])
    protocol = table.protocol()
    md = table.metadata()
    metadata = {
        "id": str(md.id),
        "name": md.name,
        "description": md.description,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": table.schema().to_json(),
        "partitionColumns": list(md.partition_columns),
        "configuration": dict(md.configuration),
        "createdTime": md.created_time,
    }
    adds = pa.table(table.get_add_actions(flatten=False)).select(
        ["path", "size_bytes", "num_records"]
    )
    live = {
        unquote(p): (int(s), int(n or 0))
        for p, s, n in zip(
            adds.column("path").to_pylist(),
            adds.column("size_bytes").to_pylist(),
            adds.column("num_records").to_pylist(),
            strict=True,
        )
    }
    return Tail(
        version=version,
        key=file_key(here),
        protocol={
            "minReaderVersion": protocol.min_reader_version,
            "minWriterVersion": protocol.min_writer_version,
            **(
                {"readerFeatures": list(protocol.reader_features)}
                if protocol.reader_features
                else {}
            ),
            **(
                {"writerFeatures": list(protocol.writer_features)}
                if protocol.writer_features
                else {}
            ),
        },
        metadata=metadata,
        schema=pa.schema(table.schema().to_arrow()),
        live=live,
        base=version,
        pointer=(file_key(pointer), _pointer_version(fs) if file_key(pointer) else -1),
    )


def _pointer_version(fs: pafs.FileSystem) -> int:
    """The version ``_last_checkpoint`` names (-1: none, or unreadable)."""
    try:
        with fs.open_input_stream(LAST_CHECKPOINT) as f:
            return int(json.loads(f.read())["version"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return -1


def advance(tail: Tail, fs: pafs.FileSystem) -> list[tuple[int, list[dict[str, Any]]]]:
    """Bring ``tail`` to the latest version; returns the commits read on the way (version,
    actions). :class:`Reload` when only a load can: the table was dropped or replaced, the
    log moved on past a cleanup, or is far ahead. The tail is left half-updated then: the
    caller drops it."""
    v = tail.version
    here, after, pointer = stats(
        fs, [delta_log.commit_path(v), delta_log.commit_path(v + 1), LAST_CHECKPOINT]
    )
    if file_key(here) != tail.key:
        raise Reload(f"version {v}'s commit file changed: the table was dropped or replaced")
    if file_key(pointer) != tail.pointer[0]:
        tail.pointer = (file_key(pointer), _pointer_version(fs) if file_key(pointer) else -1)
    if tail.pointer[1] > v + RELOAD_GAP:
        raise Reload(f"a checkpoint at version {tail.pointer[1]}, far past {v}")
    read: list[tuple[int, list[dict[str, Any]]]] = []
    info = after
    while info.type == pafs.FileType.File:
        actions = delta_log.read_log(fs, v + 1)
        if not actions:
            raise Reload(f"commit {v + 1} vanished while it was read (log cleanup)")
        tail.apply(v + 1, file_key(info), actions)
        read.append((v + 1, actions))
        v += 1
        info = fs.get_file_info(delta_log.commit_path(v + 1))
    if tail.pointer[1] > v:
        raise Reload(f"a checkpoint at version {tail.pointer[1]} past the last commit found")
    return read
