"""The dataset store: named datasets as Delta Lake tables under one root, through ``deltalake``.

Every dataset is a Delta table in ``<root>/<name>``; the root is a local directory or an
object-store URI (``s3://bucket/prefix``, ``file:///...``) with ``storage_options`` for
deltalake. Tables written here are plain Delta tables that Spark, Polars, DuckDB and
``deltalake`` itself read directly.

:class:`Store` is synchronous and thread-safe; the service calls it from worker threads. Every
call opens the table at the version it needs. The one cache is the schema of a pinned version
for :meth:`Store.scan`, keyed by the size and mtime of that version's commit file, so a dataset
dropped and created again misses it.

Reads are :meth:`Store.plan` (splits pinned to one version, files skipped using the log's
statistics; :mod:`.scan`) and :meth:`Store.scan` (one split, streamed). Writes are two-phase
(:mod:`.staging`): each task streams into a ``StageWriter`` from :meth:`Store.open_stage`,
which leaves :class:`StagedFile` objects; :meth:`Store.commit` makes all of them visible in
one Delta commit and :meth:`Store.abort_txn` deletes them. Staged files no commit references
are invisible; :meth:`Store.cleanup_orphans` deletes them once they are old enough.

deltalake (1.6) behaviours worked around here:

- ``create_write_transaction`` validates almost nothing: not that files exist, not an append's
  schema, not a change of partition columns (which commits a table nobody can open again).
  :meth:`Store.commit` checks all of it and recomputes every file's statistics from its footer.
- An overwrite that brings the first timestamp-without-time-zone column commits without the
  protocol feature it needs (again a table nobody can open): the feature is added first.
- Concurrent creates of one table with retries can land as versions 0 *and* 1, so creates use
  ``max_commit_retries=0`` and the losers append.
- ``history()`` labels versions by counting down in commitInfo-timestamp order, which is not
  version order when writers race (and is wrong on a handle pinned to an old version). History
  is read from the log files instead (:mod:`.scan`). Commits made here record what they added in
  their custom metadata, because commits of staged files have no ``operationMetrics``.
- Time travel to a time before the first commit gives version 0 in deltalake; here it is
  :class:`VersionNotFound`. Commit times are the commit files' modification times made
  monotonic, as in deltalake and Spark, and ``history()`` reports the same times.
- Never fork a process after using this module: deltalake's runtime panics in forked children.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import re
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, TableFeatures, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from aqueduct_spark.protocol import (
    CommitResult,
    Conflict,
    DataLoss,
    DatasetError,
    DatasetExists,
    DatasetInfo,
    DatasetNotFound,
    InternalError,
    InvalidRequest,
    ScanPlan,
    SchemaMismatch,
    Split,
    StagedFile,
    VersionInfo,
    VersionNotFound,
    require_int,
    staged_list,
)

from . import scan, staging

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
MODES = ("append", "overwrite", "create")
METADATA_KEY = "aqueduct"  # our key in each commit's commitInfo
_APPEND_ATTEMPTS = 3
_META_CACHE_SIZE = 256
_MIN_RETENTION = dt.timedelta(days=7)


def _utc(ts: dt.datetime) -> dt.datetime:
    if not isinstance(ts, dt.datetime):
        raise InvalidRequest(f"timestamp must be a datetime, got {type(ts).__name__}")
    return ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise InvalidRequest(f"invalid write mode {mode!r}: use one of {list(MODES)}")


class Store:
    """Named datasets under ``root``, each a Delta table in ``<root>/<name>``.

    ``root`` is a local directory (created if missing) or a URI: ``s3://bucket/prefix``,
    ``gs://...``, ``az://...``, ``file:///abs/path``; ``storage_options`` go to deltalake
    unchanged (e.g. ``AWS_ENDPOINT_URL``, ``AWS_REGION``). A local directory is read and
    written through pyarrow's local filesystem, URIs through deltalake's object store.
    """

    def __init__(self, root: str | os.PathLike[str], storage_options: dict[str, str] | None = None):
        root = os.fspath(root)
        self.storage_options = dict(storage_options or {})
        self._local_root: str | None
        if "://" in root:
            self.root = root.rstrip("/")
            parsed = urlparse(root)
            self._local_root = unquote(parsed.path) if parsed.scheme == "file" else None
            self._native = False
        else:
            self.root = self._local_root = os.path.abspath(root)
            self._native = True
        if self._local_root is not None:
            os.makedirs(self._local_root, exist_ok=True)
        self._lock = threading.Lock()
        self._pinned_cache: OrderedDict[tuple[Any, ...], tuple[pa.Schema, tuple[str, ...], str]] = (
            OrderedDict()
        )

    def __repr__(self) -> str:
        return f"Store({self.root!r})"

    # -- names, locations, handles ----------------------------------------------------------------

    def validate_name(self, name: str) -> str:
        """``name`` if it is a valid dataset name, else :class:`InvalidRequest`."""
        if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
            raise InvalidRequest(
                f"invalid dataset name {name!r}: use 1-128 letters, digits, '_', '-' or '.', "
                "starting with a letter or digit, without '..' or '/'"
            )
        return name

    def _uri(self, name: str) -> str:
        return os.path.join(self.root, name) if self._native else f"{self.root}/{name}"

    def _opts(self) -> dict[str, str] | None:
        return self.storage_options or None

    def _local_dir(self, name: str) -> str | None:
        return None if self._local_root is None else os.path.join(self._local_root, name)

    def _fs(self, name: str, create: bool = False) -> pafs.FileSystem:
        """A filesystem rooted at the table directory: paths are relative to the table."""
        local = self._local_dir(name)
        if self._native:
            assert local is not None
            return pafs.SubTreeFileSystem(local, pafs.LocalFileSystem())
        if local is not None and not os.path.isdir(local):
            # deltalake's store for file:// URIs needs the directory
            if not create:
                raise DatasetNotFound(f"dataset {name!r} does not exist")
            os.makedirs(local, exist_ok=True)
        return pafs.PyFileSystem(DeltaStorageHandler(self._uri(name), options=self._opts()))

    def _make_dir(self, name: str, directory: str) -> None:
        """Create a directory of the table (object stores have none to create)."""
        local = self._local_dir(name)
        if local is not None:
            os.makedirs(os.path.join(local, directory), exist_ok=True)

    def _remove_empty_dirs(self, name: str, paths: Sequence[str]) -> None:
        """Remove the directories that deleting ``paths`` left empty (local storage only)."""
        local = self._local_dir(name)
        if local is None:
            return
        for d in sorted({os.path.dirname(p) for p in paths}, key=lambda d: -d.count("/")):
            while d:
                try:
                    os.rmdir(os.path.join(local, d))
                except OSError:
                    break
                d = os.path.dirname(d)
        if not os.path.isdir(os.path.join(local, "_delta_log")):
            with contextlib.suppress(OSError):
                os.rmdir(local)  # a dataset that was never created leaves nothing behind

    def _open(
        self, name: str, version: int | None = None, timestamp: dt.datetime | None = None
    ) -> DeltaTable:
        self.validate_name(name)
        if version is not None and timestamp is not None:
            raise InvalidRequest("give a version or a timestamp to time travel to, not both")
        if version is not None and require_int(version, "version") < 0:
            raise InvalidRequest(f"version must be >= 0, got {version}")
        if timestamp is not None:
            if not self.exists(name):
                raise DatasetNotFound(f"dataset {name!r} does not exist")
            version = scan.version_at(self._fs(name), name, _utc(timestamp))
        try:
            return DeltaTable(self._uri(name), version=version, storage_options=self._opts())
        except TableNotFoundError as exc:
            raise DatasetNotFound(
                f"dataset {name!r} does not exist; create it, or check the name (list datasets)"
            ) from exc
        except DeltaError as exc:
            if version is None or not self.exists(name):
                raise _store_error(name, exc) from exc
            raise VersionNotFound(
                f"dataset {name!r} has no version {version} (the latest is "
                f"{self.latest_version(name)}; old versions go when the log is cleaned up); "
                "pick a version from its history"
            ) from exc

    def exists(self, name: str) -> bool:
        self.validate_name(name)
        return bool(DeltaTable.is_deltatable(self._uri(name), storage_options=self._opts()))

    # -- describing -----------------------------------------------------------------------------

    def _info(self, name: str, table: DeltaTable) -> DatasetInfo:
        version = table.version()
        adds = pa.table(table.get_add_actions(flatten=False))
        times = scan.commit_times(self._fs(name))
        return DatasetInfo(
            name=name,
            version=version,
            schema=pa.schema(table.schema().to_arrow()),
            partition_by=tuple(table.metadata().partition_columns),
            rows=int(pc.sum(adds["num_records"]).as_py() or 0) if adds.num_rows else 0,
            bytes=int(pc.sum(adds["size_bytes"]).as_py() or 0) if adds.num_rows else 0,
            files=adds.num_rows,
            created=times.get(0),
            updated=times.get(version),
        )

    def describe(
        self, name: str, version: int | None = None, timestamp: dt.datetime | None = None
    ) -> DatasetInfo:
        """Schema, partitioning and size of a dataset: the latest version, or time travel."""
        return self._info(name, self._open(name, version, timestamp))

    def latest_version(self, name: str) -> int:
        versions = scan.commit_times(self._fs(name)) if self.exists(name) else {}
        if not versions:
            raise DatasetNotFound(f"dataset {name!r} does not exist")
        return max(versions)

    def transaction_version(self, name: str, app_id: str) -> int | None:
        """The last app transaction version committed for ``app_id``, or None."""
        v = self._open(name).transaction_version(app_id)
        return None if v is None else int(v)

    def history(self, name: str, since_version: int | None = None) -> list[VersionInfo]:
        """What each version did and added, oldest first, from ``since_version`` on (as far back
        as the log goes). Timestamps are the commit times time travel uses."""
        if since_version is not None and require_int(since_version, "since_version") < 0:
            raise InvalidRequest(f"since_version must be >= 0, got {since_version}")
        if not self.exists(name):
            raise DatasetNotFound(f"dataset {name!r} does not exist")
        fs = self._fs(name)
        times = scan.commit_times(fs)
        versions = [v for v in sorted(times) if v >= (since_version or 0)]
        out = []
        for v, actions in zip(versions, scan.read_logs(fs, versions), strict=True):
            info = scan.commit_info(actions)
            meta = info.get(METADATA_KEY)
            if isinstance(meta, dict) and {"rows", "bytes", "files"} <= meta.keys():
                added = (int(meta["rows"]), int(meta["bytes"]), int(meta["files"]))
                change = bool(meta.get("data_change", True))
            else:  # a commit made by another writer
                *counts, change = scan.added_by(actions)
                added = (int(counts[0]), int(counts[1]), int(counts[2]))
            out.append(
                VersionInfo(
                    version=v,
                    timestamp=times[v],
                    operation=str(info.get("operation", "")),
                    rows_added=added[0],
                    bytes_added=added[1],
                    files_added=added[2],
                    data_change=bool(change),
                )
            )
        return out

    # -- creating and dropping --------------------------------------------------------------------

    def create(
        self, name: str, schema: pa.Schema, partition_by: Sequence[str] = (), exist_ok: bool = False
    ) -> DatasetInfo:
        """Create an empty dataset (version 0). With ``exist_ok`` an existing dataset of the same
        schema and partitioning is returned instead of raising :class:`DatasetExists`."""
        self.validate_name(name)
        target = staging.delta_schema(schema)
        parts = staging.check_partition_by(target, partition_by)
        if not self.exists(name):
            try:
                create_table_with_add_actions(
                    self._uri(name),
                    DeltaSchema.from_arrow(target),
                    [],
                    mode="error",
                    partition_by=list(parts),
                    storage_options=self._opts(),
                    commit_properties=CommitProperties(
                        custom_metadata={METADATA_KEY: _commit_meta("create", [])},
                        max_commit_retries=0,  # racing creates would all land otherwise
                    ),
                )
                return self.describe(name)
            except DeltaError as exc:
                if not self.exists(name):
                    raise _store_error(name, exc) from exc
        if not exist_ok:
            raise DatasetExists(
                f"dataset {name!r} already exists; append to it, overwrite it, or drop it first"
            )
        info = self.describe(name)
        diffs = staging.schema_differences(info.schema, target)
        if info.partition_by != parts:
            diffs.append(f"partitioned by {list(info.partition_by)}, not {list(parts)}")
        if diffs:
            raise SchemaMismatch(
                f"dataset {name!r} exists with another schema: {'; '.join(diffs)}. Use the "
                "existing schema, or drop the dataset first"
            )
        return info

    def drop(self, name: str) -> None:
        """Delete the dataset with all its files and versions."""
        if not self.exists(name):
            raise DatasetNotFound(f"dataset {name!r} does not exist; nothing to drop")
        local = self._local_dir(name)
        if local is not None:
            # the log first: an interrupted drop leaves stray files, never a broken table
            shutil.rmtree(os.path.join(local, "_delta_log"), ignore_errors=True)
            shutil.rmtree(local, ignore_errors=True)
        else:
            fs = self._fs(name)
            everything = pafs.FileSelector("", recursive=True, allow_not_found=True)
            files = [i.path for i in fs.get_file_info(everything) if i.type == pafs.FileType.File]
            # (the deltalake handler's delete_dir_contents does not fit pyarrow's signature)
            for path in sorted(files, key=lambda p: not p.startswith("_delta_log/")):
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(path)
        with self._lock:
            for key in [k for k in self._pinned_cache if k[0] == name]:
                del self._pinned_cache[key]

    # -- reading --------------------------------------------------------------------------------

    def plan(
        self,
        name: str,
        version: int | None = None,
        timestamp: dt.datetime | None = None,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        split_bytes: int = 128 << 20,
    ) -> ScanPlan:
        """Split a scan of one version into :class:`Split` units for :meth:`scan`, skipping
        files ``filter`` cannot match. A file larger than ``split_bytes`` is split between row
        groups (so one row group larger than that stays one split). No files, no splits."""
        if require_int(split_bytes, "split_bytes") <= 0:
            raise InvalidRequest(f"split_bytes must be positive, got {split_bytes}")
        table = self._open(name, version, timestamp)
        v = table.version()
        schema = pa.schema(table.schema().to_arrow())
        parts = tuple(table.metadata().partition_columns)
        _, out_schema = scan.project(schema, columns)
        splits = scan.plan_splits(
            dataset=name,
            version=v,
            fs=self._fs(name),
            schema=schema,
            partition_by=parts,
            files=pa.table(table.get_add_actions(flatten=True)).to_pylist(),
            filter=scan.check_filter(schema, filter),
            split_bytes=split_bytes,
        )
        rows, nbytes = sum(s.rows for s in splits), sum(s.bytes for s in splits)
        return ScanPlan(name, v, out_schema, splits, rows, nbytes)

    def version_files(
        self, name: str, version: int, missing: list[str] | None = None
    ) -> list[Split]:
        """One split per data file that ``version`` added (its ``add`` actions with
        ``dataChange``; files a compaction re-adds are not new data), sorted by path: a stable
        order, since streaming offsets count files within a version.

        DataLoss if the version's log entry is gone, or if one of its files is gone
        (vacuumed); with a ``missing`` list, the paths of gone files are appended to it
        instead and their splits are still returned, so positions in the list stay stable."""
        self.validate_name(name)
        if require_int(version, "version") < 0:
            raise InvalidRequest(f"version must be >= 0, got {version}")
        latest = self.latest_version(name)
        if version > latest:
            raise VersionNotFound(
                f"dataset {name!r} has no version {version} yet (latest {latest})"
            )
        fs = self._fs(name)
        actions = scan.read_log(fs, version)
        if not actions:
            raise DataLoss(
                f"version {version} of dataset {name!r} is no longer in its log (cleaned up)"
            )
        adds = [
            a["add"]
            for a in actions
            if isinstance(a.get("add"), dict) and a["add"].get("dataChange", True)
        ]
        if not adds:
            return []
        # Partitioning never changes here: the latest version's (cached) says whether the
        # typed partition values are needed, which only a load of the version gives.
        _, parts = self._pinned(name, latest)
        if parts:
            try:
                table = self._open(name, version, None)
            except VersionNotFound as exc:
                raise DataLoss(
                    f"version {version} of dataset {name!r} cannot be loaded any more "
                    "(its log was cleaned up)"
                ) from exc
            parts = tuple(table.metadata().partition_columns)
            wanted = {unquote(a["path"]) for a in adds}
            files = [
                (
                    unquote(f["path"]),
                    {c: f.get(f"partition.{c}") for c in parts},
                    int(f.get("num_records") or 0),
                    int(f["size_bytes"]),
                )
                for f in pa.table(table.get_add_actions(flatten=True)).to_pylist()
                if unquote(f["path"]) in wanted
            ]
        else:
            files = [(unquote(a["path"]), {}, _num_records(a), int(a["size"])) for a in adds]
        files.sort(key=lambda f: f[0])
        splits = [
            Split(
                dataset=name,
                version=version,
                path=path,
                row_groups=None,
                partition=partition,
                rows=rows,
                bytes=size,
            )
            for path, partition, rows, size in files
        ]
        infos = fs.get_file_info([sp.path for sp in splits])
        gone = [i.path for i in infos if i.type == pafs.FileType.NotFound]
        if gone:
            if missing is None:
                raise DataLoss(
                    f"{len(gone)} data files of dataset {name!r} version {version} are gone "
                    f"(vacuumed), e.g. {gone[0]!r}"
                )
            missing.extend(gone)
        return splits

    def table_id(self, name: str) -> str:
        """The table's identity, Delta's ``metaData.id``: fixed when the table is created, so
        a dataset dropped and created again under the same name has another one. Streaming
        offsets carry it (as Delta's source does) to notice a checkpoint of another table."""
        return self._pinned_meta(name, self.latest_version(name))[2]

    def _pinned(self, name: str, version: int) -> tuple[pa.Schema, tuple[str, ...]]:
        """Schema and partition columns of one version, cached: a version never changes."""
        schema, parts, _ = self._pinned_meta(name, version)
        return schema, parts

    def _pinned_meta(self, name: str, version: int) -> tuple[pa.Schema, tuple[str, ...], str]:
        """Schema, partition columns and table id of one version, cached by its commit file."""
        self.validate_name(name)
        if require_int(version, "version") < 0:
            raise InvalidRequest(f"version must be >= 0, got {version}")
        info = self._fs(name).get_file_info(f"_delta_log/{version:020d}.json")
        key = (name, version, info.size, info.mtime_ns)
        if info.type == pafs.FileType.File:
            with self._lock:
                if key in self._pinned_cache:
                    self._pinned_cache.move_to_end(key)
                    return self._pinned_cache[key]
        table = self._open(name, version)
        metadata = table.metadata()
        meta = (
            pa.schema(table.schema().to_arrow()),
            tuple(metadata.partition_columns),
            str(metadata.id),
        )
        if info.type == pafs.FileType.File:
            with self._lock:
                self._pinned_cache[key] = meta
                while len(self._pinned_cache) > _META_CACHE_SIZE:
                    self._pinned_cache.popitem(last=False)
        return meta

    def scan(
        self,
        split: Split,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        batch_rows: int = 65536,
    ) -> Iterator[pa.RecordBatch]:
        """Stream the rows of one split: projected, filtered exactly, in the projected schema.

        Everything is checked before this returns (a bad split, columns or filter; a missing
        file is :class:`DataLoss`); rows are read as the iterator is consumed, at most a few
        batches ahead.
        """
        if not isinstance(split, Split):
            split = Split.from_dict(split)
        if require_int(batch_rows, "batch_rows") <= 0:
            raise InvalidRequest(f"batch_rows must be positive, got {batch_rows}")
        staging.check_relative_path(split.path)
        schema, parts = self._pinned(split.dataset, split.version)
        cols, out_schema = scan.project(schema, columns)
        filt = scan.check_filter(schema, filter)
        scan.partition_expression(schema, parts, split.partition)
        fs = self._fs(split.dataset)
        if fs.get_file_info(split.path).type != pafs.FileType.File:
            raise DataLoss(
                f"data file {split.path!r} of dataset {split.dataset!r} version {split.version} "
                "is missing: it was vacuumed or deleted outside the service. Read a later "
                "version (plan the scan again)"
            )
        return scan.read_split(
            fs=fs,
            schema=schema,
            partition_by=parts,
            split=split,
            columns=cols,
            out_schema=out_schema,
            filter=filt,
            batch_rows=batch_rows,
        )

    # -- writing --------------------------------------------------------------------------------

    def check_schema(
        self, name: str | None, schema: pa.Schema, mode: str, overwrite_schema: bool = False
    ) -> pa.Schema:
        """The schema a write of ``schema`` in ``mode`` will store its batches with.

        An append (or an overwrite without ``overwrite_schema``) needs the dataset's column
        names and types, equal once large/view/unsigned types are normalised (nullability may
        differ). Creating an existing dataset is :class:`DatasetExists`. A missing dataset is
        created by the commit with the given schema. ``name=None`` only normalises.
        """
        _check_mode(mode)
        given = staging.delta_schema(schema)
        if name is None or not self.exists(name):
            return given
        if mode == "create":
            raise DatasetExists(
                f"dataset {name!r} already exists; write with mode 'append' or 'overwrite'"
            )
        table = self._open(name)
        current = pa.schema(table.schema().to_arrow())
        if mode == "overwrite" and overwrite_schema:
            lost = [c for c in table.metadata().partition_columns if c not in given.names]
            if lost:
                raise SchemaMismatch(
                    f"the new schema of dataset {name!r} lacks its partition columns {lost}; "
                    "partitioning cannot change: keep them, or drop and recreate the dataset"
                )
            return given
        diffs = staging.schema_differences(current, given)
        if diffs:
            fix = "or overwrite with overwrite_schema=True" if mode == "overwrite" else ""
            raise SchemaMismatch(
                f"the data does not match the schema of dataset {name!r}: {'; '.join(diffs)}. "
                f"Cast or rename the columns to match the dataset (see describe) {fix}".rstrip()
            )
        return current

    def open_stage(
        self,
        name: str,
        txn: str,
        task: str,
        schema: pa.Schema,
        partition_by: Sequence[str] = (),
        target_file_bytes: int = 128 << 20,
        row_group_bytes: int = 32 << 20,
    ) -> staging.StageWriter:
        """A writer that stages one task's batches as files of dataset ``name``.

        ``schema`` is what :meth:`check_schema` returned; ``partition_by`` the dataset's
        partition columns when it exists (``DatasetInfo.partition_by``). Batches are buffered
        up to about ``row_group_bytes`` per row group; files roll at ``target_file_bytes``.
        """
        self.validate_name(name)
        for what, n in (
            ("target_file_bytes", target_file_bytes),
            ("row_group_bytes", row_group_bytes),
        ):
            if require_int(n, what) <= 0:
                raise InvalidRequest(f"{what} must be positive, got {n}")
        return staging.StageWriter(
            dataset=name,
            filesystem=self._fs(name, create=True),
            schema=schema,
            partition_by=partition_by,
            txn=txn,
            task=task,
            target_file_bytes=target_file_bytes,
            row_group_bytes=row_group_bytes,
            make_dir=lambda d: self._make_dir(name, d),
            remove_empty_dirs=lambda paths: self._remove_empty_dirs(name, paths),
        )

    def commit(
        self,
        name: str,
        mode: str,
        schema: pa.Schema,
        partition_by: Sequence[str],
        staged: Sequence[StagedFile],
        app_id: str | None = None,
        app_version: int | None = None,
        overwrite_schema: bool = False,
        replaces: int | None = None,
    ) -> CommitResult:
        """Make all ``staged`` files visible in one atomic Delta commit.

        ``append`` adds them, ``overwrite`` replaces all data with them, ``create`` requires the
        dataset to be missing. Append and overwrite create a missing dataset; of several writers
        racing to create it, one creates and the others then append (or overwrite).

        Isolation is Delta's default, WriteSerializable. ``replaces`` is the version an
        overwrite's transaction began at (-1: the dataset did not exist then); the overwrite
        removes the data of that version only, so a blind append committed meanwhile is kept,
        as if it came after the overwrite. If a concurrent commit removed some of that data
        (another overwrite), or an append meanwhile has the schema the overwrite replaces, the
        overwrite is :class:`Conflict`. Without ``replaces`` an overwrite replaces whatever the
        latest version holds when it commits. Every staged
        file must exist in this table, carry our name, and match the schema; its statistics are
        recomputed from its footer. With ``app_id``/``app_version`` the commit records a Delta
        app transaction; a commit whose ``app_version`` is not above the last one recorded for
        ``app_id`` is a no-op (``committed=False``; remove its files with :meth:`abort_txn`).
        """
        self.validate_name(name)
        _check_mode(mode)
        if (app_id is None) != (app_version is None):
            raise InvalidRequest("app_id and app_version go together: give both or neither")
        if app_id is not None and (not isinstance(app_id, str) or not app_id):
            raise InvalidRequest(f"app_id must be a non-empty string, got {app_id!r}")
        if app_version is not None and require_int(app_version, "app_version") < 0:
            raise InvalidRequest(f"app_version must be >= 0, got {app_version}")
        given = staging.delta_schema(schema)
        files = staged_list(staged)
        txns = None
        if app_id is not None and app_version is not None:
            txns = [Transaction(app_id, app_version)]
        commit_id = uuid.uuid4().hex
        fs = self._fs(name, create=True)
        failure: CommitFailedError | None = None
        for _ in range(_APPEND_ATTEMPTS):
            if not self.exists(name):
                parts = staging.check_partition_by(given, partition_by)
                adds = staging.verify_staged(name, fs, files, given, parts, set())
                meta = _commit_meta(mode, adds, commit_id)
                try:
                    create_table_with_add_actions(
                        self._uri(name),
                        DeltaSchema.from_arrow(given),
                        adds,
                        mode="error",
                        partition_by=list(parts),
                        storage_options=self._opts(),
                        commit_properties=CommitProperties(
                            custom_metadata={METADATA_KEY: meta},
                            max_commit_retries=0,  # see the module docstring
                            app_transactions=txns,
                        ),
                    )
                    return CommitResult(0, meta["rows"], meta["bytes"], meta["files"], True)
                except DeltaError as exc:
                    if not self.exists(name):
                        raise _store_error(name, exc) from exc
                    # lost the race to create it: write to the winner's table instead
            if mode == "create":
                raise DatasetExists(
                    f"dataset {name!r} already exists; write with mode 'append' or 'overwrite'"
                )
            table = self._open(name)
            done = _already_applied(table, app_id, app_version)
            if done is not None:
                return done
            table_parts = tuple(table.metadata().partition_columns)
            if tuple(partition_by) not in ((), table_parts):
                raise SchemaMismatch(
                    f"dataset {name!r} is partitioned by {list(table_parts)}, the write by "
                    f"{list(partition_by)}; partitioning cannot change: write with "
                    f"partition_by={list(table_parts)}, or drop and recreate the dataset"
                )
            write_schema = self.check_schema(name, given, mode, overwrite_schema)
            if staging.needs_timestamp_ntz(write_schema) and "timestampNtz" not in (
                table.protocol().reader_features or []
            ):
                # deltalake would commit the new schema without the feature: an unreadable table
                table.alter.add_feature(
                    TableFeatures.TimestampWithoutTimezone, allow_protocol_versions_increase=True
                )
                table = self._open(name)
            active = {
                unquote(p) for p in pa.table(table.get_add_actions()).column("path").to_pylist()
            }
            adds = staging.verify_staged(name, fs, files, write_schema, table_parts, active)
            meta = _commit_meta(mode, adds, commit_id)
            before = table.version()
            actions: list[AddAction | RemoveAction] = [*adds]
            delta_mode = mode
            if mode == "overwrite" and replaces is not None:
                removes = self._replaced(name, table, replaces, active, write_schema)
                if removes is not None:
                    # the data it began with, not what appends added meanwhile
                    actions += removes
                    delta_mode = "append"
            try:
                table.create_write_transaction(
                    actions,
                    mode=delta_mode,
                    schema=DeltaSchema.from_arrow(write_schema),
                    partition_by=list(table_parts),
                    commit_properties=CommitProperties(
                        custom_metadata={METADATA_KEY: meta}, app_transactions=txns
                    ),
                )
            except CommitFailedError as exc:
                failure = exc
                if delta_mode == "append":
                    # A blind append rebases onto anything; an overwrite that names its
                    # removes is checked again against what is there: reload and retry.
                    continue
                done = _already_applied(self._open(name), app_id, app_version)
                if done is not None:
                    return done
                break
            except DeltaError as exc:
                raise _store_error(name, exc) from exc
            version = self._find_commit(name, before, commit_id)
            return CommitResult(version, meta["rows"], meta["bytes"], meta["files"], True)
        raise Conflict(
            f"the {mode} of dataset {name!r} conflicted with concurrent commits ({failure}); "
            "its staged files are kept: retry the commit"
        ) from failure

    def _replaced(
        self,
        name: str,
        table: DeltaTable,
        replaces: int,
        active: set[str],
        write_schema: pa.Schema,
    ) -> list[RemoveAction] | None:
        """The removes of an overwrite that began at version ``replaces`` (WriteSerializable);
        None when it must replace everything there is (a new schema, nothing committed since).
        """
        if require_int(replaces, "replaces") < -1:
            raise InvalidRequest(f"replaces must be a version or -1, got {replaces}")
        if replaces > table.version():
            raise InvalidRequest(
                f"an overwrite of dataset {name!r} cannot begin at version {replaces}: the "
                f"latest is {table.version()}"
            )
        base: dict[str, int] = {}
        if replaces >= 0:
            try:
                began = self._open(name, replaces)
            except VersionNotFound as exc:
                raise Conflict(
                    f"the overwrite of dataset {name!r} began at version {replaces}, which is "
                    "no longer in its log; retry the overwrite"
                ) from exc
            if str(began.metadata().id) != str(table.metadata().id):
                raise Conflict(
                    f"dataset {name!r} was dropped and created again while the overwrite ran; "
                    "retry the overwrite"
                )
            adds = pa.table(began.get_add_actions(flatten=True))
            base = {
                unquote(p): int(n)
                for p, n in zip(
                    adds.column("path").to_pylist(),
                    adds.column("size_bytes").to_pylist(),
                    strict=True,
                )
            }
        gone = sorted(set(base) - active)
        if gone:
            raise Conflict(
                f"the overwrite of dataset {name!r} conflicted with a concurrent commit: since "
                f"version {replaces}, where the overwrite began, {len(gone)} of the files it "
                f"replaces were removed (e.g. {gone[0]!r}: another overwrite won); its staged "
                "files are kept: retry the commit, or run the overwrite again"
            )
        current = pa.schema(table.schema().to_arrow())
        if staging.schema_differences(current, write_schema):
            if active - set(base):
                raise Conflict(
                    f"the overwrite of dataset {name!r} replaces its schema, and rows appended "
                    f"since version {replaces}, where it began, have the old one; retry the "
                    "commit to replace them too, or append them again after the overwrite"
                )
            return None
        now = int(time.time() * 1000)
        return [RemoveAction(p, True, now, size) for p, size in sorted(base.items())]

    def _find_commit(self, name: str, before: int, commit_id: str) -> int:
        """The version our commit landed at (after deltalake's retries, maybe much later)."""
        fs = self._fs(name)
        later = [v for v in sorted(scan.commit_times(fs)) if v > before]
        for v, actions in zip(later, scan.read_logs(fs, later), strict=True):
            meta = scan.commit_info(actions).get(METADATA_KEY)
            if isinstance(meta, dict) and meta.get("commit_id") == commit_id:
                return v
        raise InternalError(f"the commit to dataset {name!r} succeeded but is not in its log")

    # -- cleaning up ----------------------------------------------------------------------------

    def _delete_unreferenced(self, name: str, fs: pafs.FileSystem, paths: set[str]) -> list[str]:
        doomed = sorted(paths - scan.referenced_paths(fs)) if paths else []
        deleted = []
        for p in doomed:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(p)
                deleted.append(p)
        self._remove_empty_dirs(name, deleted)
        return deleted

    def abort_txn(self, name: str, txn: str, staged: Sequence[StagedFile] = ()) -> int:
        """Delete the staged files of transaction ``txn`` that no version references: the
        ``staged`` ones and any other file named for ``txn``. Returns how many were deleted."""
        self.validate_name(name)
        staging.check_txn(txn)
        given = set()
        for f in staged_list(staged):
            if staging.staged_txn(staging.check_relative_path(f.path)) != txn:
                raise InvalidRequest(f"staged file {f.path!r} is not of transaction {txn!r}")
            given.add(f.path)
        local = self._local_dir(name)
        if local is not None and not os.path.isdir(local):
            return 0
        fs = self._fs(name)
        found = {i.path for i in staging.staged_files(fs) if staging.staged_txn(i.path) == txn}
        return len(self._delete_unreferenced(name, fs, found | given))

    def cleanup_orphans(
        self, name: str, older_than: dt.timedelta = dt.timedelta(hours=1), dry_run: bool = False
    ) -> list[str]:
        """Delete staged files (named like ours) that no version references and that are older
        than ``older_than``, which must be longer than any write still running. Returns their
        paths; ``dry_run`` only lists them. Works on a dataset whose create never committed."""
        self.validate_name(name)
        if not isinstance(older_than, dt.timedelta) or older_than < dt.timedelta(0):
            raise InvalidRequest(f"older_than must be a timedelta >= 0, got {older_than!r}")
        local = self._local_dir(name)
        if local is not None and not os.path.isdir(local):
            raise DatasetNotFound(f"dataset {name!r} does not exist")
        fs = self._fs(name)
        cutoff = dt.datetime.now(dt.UTC) - older_than
        old = {i.path for i in staging.staged_files(fs) if i.mtime is not None and i.mtime < cutoff}
        if dry_run:
            return sorted(old - scan.referenced_paths(fs)) if old else []
        return self._delete_unreferenced(name, fs, old)

    def vacuum(
        self, name: str, retention: dt.timedelta = _MIN_RETENTION, dry_run: bool = False
    ) -> list[str]:
        """Delete files removed from the table over ``retention`` ago (Delta's vacuum), and
        orphaned staged files older than ``retention``; returns their paths. Versions whose
        files are gone can no longer be read. ``retention`` is rounded up to whole hours; a
        retention under 7 days is honoured because passing it is explicit."""
        if not isinstance(retention, dt.timedelta) or retention < dt.timedelta(0):
            raise InvalidRequest(f"retention must be a timedelta >= 0, got {retention!r}")
        table = self._open(name)
        try:
            removed = table.vacuum(
                retention_hours=math.ceil(retention.total_seconds() / 3600),
                dry_run=dry_run,
                enforce_retention_duration=retention >= _MIN_RETENTION,
                full=False,  # "full" would also take staged files of running writes
            )
        except DeltaError as exc:
            raise InvalidRequest(f"vacuum of dataset {name!r} refused: {exc}") from exc
        if not dry_run:
            self._remove_empty_dirs(name, removed)
        orphans = self.cleanup_orphans(name, older_than=retention, dry_run=dry_run)
        return sorted(set(removed) | set(orphans))

    # last: a method named ``list`` shadows the builtin in later annotations of the class
    def list(self) -> list[DatasetInfo]:
        """Every dataset under the root, sorted by name."""
        if self._local_root is not None:
            names = [e.name for e in os.scandir(self._local_root) if e.is_dir()]
        else:
            root = pafs.PyFileSystem(DeltaStorageHandler(self.root, options=self._opts()))
            infos = root.get_file_info(pafs.FileSelector("", allow_not_found=True))
            names = [i.base_name for i in infos if i.type == pafs.FileType.Directory]
        out = []
        for name in sorted(names):
            if not NAME_RE.match(name) or ".." in name:
                continue
            with contextlib.suppress(DatasetNotFound):  # not a table, or dropped meanwhile
                out.append(self.describe(name))
        return out


def _num_records(add: dict[str, Any]) -> int:
    """numRecords from an add action's statistics (0 when it has none)."""
    try:
        return int(json.loads(add.get("stats") or "{}").get("numRecords") or 0)
    except (ValueError, TypeError, AttributeError):
        return 0


def _already_applied(
    table: DeltaTable, app_id: str | None, app_version: int | None
) -> CommitResult | None:
    if app_id is None or app_version is None:
        return None
    last = table.transaction_version(app_id)
    if last is not None and last >= app_version:
        return CommitResult(table.version(), 0, 0, 0, False)
    return None


def _commit_meta(mode: str, adds: Sequence[AddAction], commit_id: str = "") -> dict[str, Any]:
    """What a commit records about itself: for history(), and to find its version."""
    return {
        "commit_id": commit_id or uuid.uuid4().hex,
        "mode": mode,
        "rows": sum(int(json.loads(a.stats)["numRecords"]) for a in adds),
        "bytes": sum(a.size for a in adds),
        "files": len(adds),
        "data_change": bool(adds) or mode == "overwrite",
        "txns": sorted({t for t in (staging.staged_txn(a.path) for a in adds) if t}),
    }


def _store_error(name: str, exc: DeltaError) -> DatasetError:
    if isinstance(exc, CommitFailedError):
        return Conflict(f"a commit to dataset {name!r} failed: {exc}; retry it")
    if isinstance(exc, TableNotFoundError):
        return DatasetNotFound(f"dataset {name!r} does not exist")
    return InternalError(f"Delta Lake error on dataset {name!r}: {exc}")
