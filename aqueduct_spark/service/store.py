"""The dataset store: named datasets as Delta Lake tables under one root, through ``deltalake``.

Tables written here are plain Delta tables that Spark, Polars, DuckDB and ``deltalake`` itself
read directly. Where each table lives, and how it is opened, is :mod:`.tables`.

:class:`Store` is synchronous and thread-safe; the service calls it from worker threads. Every
call opens the table at the version it needs.

Reads are :meth:`Store.plan` (splits pinned to one version, files skipped using the log's
statistics; :mod:`.scan`) and :meth:`Store.scan` (one split, streamed). Writes are two-phase
(:mod:`.staging`): each task streams into a ``StageWriter`` from :meth:`Store.open_stage`,
which leaves :class:`StagedFile` objects; :meth:`Store.commit` makes all of them visible in
one Delta commit (:mod:`.commits`) and :meth:`Store.abort_txn` deletes them. Staged files no
commit references are invisible; :meth:`Store.cleanup_orphans` deletes them once they are old
enough.

deltalake's ``history()`` labels versions by counting down in commitInfo-timestamp order, which
is not version order when writers race (and is wrong on a handle pinned to an old version).
History is read from the log files instead (:mod:`.delta_log`), with the times time travel uses.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError
from deltalake.transaction import create_table_with_add_actions

from aqueduct_spark.protocol import (
    DataLoss,
    DatasetExists,
    DatasetInfo,
    DatasetNotFound,
    InvalidRequest,
    ScanPlan,
    SchemaMismatch,
    Split,
    StagedFile,
    VersionInfo,
    VersionNotFound,
    pack_tasks,
    require_int,
    staged_list,
)

from . import changes, commits, delta_log, delta_types, history, scan, staging, txn_records
from .binding import Condition
from .changes import TABLE_PROPERTIES
from .commits import METADATA_KEY, commit_meta
from .pass_parquet import read_or_pass
from .resume import Skip
from .tables import NAME_RE, Snapshot, Tables, delta_error

_MIN_RETENTION = dt.timedelta(days=7)
OPEN_COST = 64 << 10
"""What opening one more file costs a scan task, in bytes (as Spark's
``spark.sql.files.openCostInBytes``): small files are packed into tasks by it. A small local
file costs the service about 0.35 ms of CPU to open and read (2,000 files of 100 rows), while
a megabyte costs a Spark read about 100 ms end to end, so the honest figure is a few KB; 64 KB
keeps a task of small files to about 2,000 of them (0.7 s of the service's CPU) at the
default 128 MiB target. The 1 MB used before made 16 tasks of 2,000 such files, and each task
costs Spark ~0.1 s of CPU of its own. On an object store a file costs a round trip or two:
raise it there."""
_PLAN_FIELDS = frozenset({"path", "size_bytes", "num_records"})
"""Fields of a version's file list that planning reads besides partition values and stats."""
MAX_SCAN_SPLITS = 100_000
MAX_VERSION_RANGE = 1000
"""Versions one ``changes`` request may list the files of."""


class Store(Tables):
    """Named datasets under ``root``, each a Delta table in ``<root>/<name>`` (see
    :class:`~.tables.Tables` for ``root`` and ``storage_options``)."""

    # -- describing --------------------------------------------------------------------------------

    def _info(self, name: str, snap: Snapshot) -> DatasetInfo:
        version = snap.version
        times = self.commit_times(name)
        first = self.filesystem(name).get_file_info(delta_log.commit_path(0))
        return DatasetInfo(
            name=name,
            version=version,
            schema=snap.schema,
            partition_by=snap.partition_by,
            rows=snap.rows,
            bytes=snap.bytes,
            files=snap.file_count,
            created=times.get(0) if first.type == pafs.FileType.File else None,
            updated=times.get(version),
        )

    def describe(
        self, name: str, version: int | None = None, timestamp: dt.datetime | None = None
    ) -> DatasetInfo:
        """Schema, partitioning and size of a dataset: the latest version, or time travel."""
        return self._info(name, self.snapshot(name, version, timestamp))

    def transaction_version(self, name: str, app_id: str) -> int | None:
        """The last app transaction version committed for ``app_id``, or None."""
        v = self.open_table(name).transaction_version(app_id)
        return None if v is None else int(v)

    def history(self, name: str, since_version: int | None = None) -> list[VersionInfo]:
        """What each version did and added, oldest first, from ``since_version`` on (as far back
        as the log goes). Timestamps are the commit times time travel uses."""
        if since_version is not None and require_int(since_version, "since_version") < 0:
            raise InvalidRequest(
                f"since_version must be >= 0, got {since_version}; give 0 for the whole history"
            )
        if not self.exists(name):
            raise DatasetNotFound(f"dataset {name!r} does not exist")
        fs = self.filesystem(name)
        since = since_version or 0
        # from the kept commit times (no listing) when the log still starts at or before
        # ``since`` (a stream's offsets ask from its last version); else listed
        kept = (
            since > 0 and fs.get_file_info(delta_log.commit_path(since)).type == pafs.FileType.File
        )
        times = self.commit_times(name) if kept else delta_log.commit_times(fs)
        return history.history(fs, times, [v for v in sorted(times) if v >= since])

    # -- creating and dropping ---------------------------------------------------------------------

    def create(
        self, name: str, schema: pa.Schema, partition_by: Sequence[str] = (), exist_ok: bool = False
    ) -> DatasetInfo:
        """Create an empty dataset (version 0). With ``exist_ok`` an existing dataset of the same
        schema and partitioning is returned instead of raising :class:`DatasetExists`."""
        self.validate_name(name)
        target = delta_types.delta_schema(schema)
        parts = staging.check_partition_by(target, partition_by)
        if not self.exists(name):
            try:
                create_table_with_add_actions(
                    self.uri(name),
                    DeltaSchema.from_arrow(target),
                    [],
                    mode="error",
                    partition_by=list(parts),
                    configuration=TABLE_PROPERTIES,
                    storage_options=self.delta_options(),
                    commit_properties=CommitProperties(
                        custom_metadata={METADATA_KEY: commit_meta("create", [])},
                        max_commit_retries=0,  # racing creates would all land otherwise
                    ),
                )
                return self.describe(name)
            except DeltaError as exc:
                if not self.exists(name):
                    raise delta_error(name, exc) from exc
        if not exist_ok:
            raise DatasetExists(
                f"dataset {name!r} already exists; append to it, overwrite it, or drop it first"
            )
        info = self.describe(name)
        diffs = delta_types.schema_differences(info.schema, target)
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
        local = self.local_dir(name)
        if local is not None:
            # the log first: an interrupted drop leaves stray files, never a broken table
            shutil.rmtree(os.path.join(local, "_delta_log"), ignore_errors=True)
            shutil.rmtree(local, ignore_errors=True)
        else:
            fs = self.filesystem(name)
            everything = pafs.FileSelector("", recursive=True, allow_not_found=True)
            files = [i.path for i in fs.get_file_info(everything) if i.type == pafs.FileType.File]
            # (the deltalake handler's delete_dir_contents does not fit pyarrow's signature)
            for path in sorted(files, key=lambda p: not p.startswith("_delta_log/")):
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(path)
        self.forget(name)

    # -- reading -----------------------------------------------------------------------------------

    def plan(
        self,
        name: str,
        version: int | None = None,
        timestamp: dt.datetime | None = None,
        columns: Sequence[str] | None = None,
        filter: Condition | pc.Expression | None = None,
        split_bytes: int = 128 << 20,
        open_cost: int = OPEN_COST,
        min_tasks: int = 1,
    ) -> ScanPlan:
        """Split a scan of one version into :class:`Split` units for :meth:`scan`, skipping
        files ``filter`` cannot match. A file larger than ``split_bytes`` is split between row
        groups (so one row group larger than that stays one split). No files, no splits.
        The splits are packed into tasks of about ``split_bytes``, each split counted with
        ``open_cost`` more, a small table spread over ``min_tasks`` (:func:`.pack_tasks`)."""
        if require_int(split_bytes, "split_bytes") <= 0:
            raise InvalidRequest(
                f"split_bytes must be positive, got {split_bytes}; leave it out for the default"
            )
        if require_int(open_cost, "open_cost") < 0:
            raise InvalidRequest(
                f"open_cost must be >= 0, got {open_cost}; leave it out for the default"
            )
        if require_int(min_tasks, "min_tasks") < 1:
            raise InvalidRequest(
                f"min_tasks must be at least 1, got {min_tasks}; leave it out for the default (1)"
            )
        snap = self.snapshot(name, version, timestamp)
        v, schema, parts = snap.version, snap.schema, snap.partition_by
        _, out_schema = scan.project(schema, columns)
        filter = scan.check_filter(schema, filter)
        files = snap.files
        if filter is None:  # the statistics serve only skipping: not converting them halves
            # a plan of 2,000 files (their timestamps become Python objects one by one)
            files = files.select(
                [c for c in files.column_names if c in _PLAN_FIELDS or c.startswith("partition.")]
            )
        splits = scan.plan_splits(
            dataset=name,
            version=v,
            fs=self.filesystem(name),
            schema=schema,
            partition_by=parts,
            files=files.to_pylist(),
            filter=filter,
            split_bytes=split_bytes,
        )
        rows, nbytes = sum(s.rows for s in splits), sum(s.bytes for s in splits)
        tasks = pack_tasks([s.bytes for s in splits], split_bytes, open_cost, min_tasks)
        return ScanPlan(name, v, out_schema, splits, rows, nbytes, tasks)

    def version_files(
        self, name: str, version: int, missing: list[str] | None = None
    ) -> list[Split]:
        """One split per data file that ``version`` added (its ``add`` actions with
        ``dataChange``; files a compaction re-adds are not new data), sorted by path: a stable
        order, since streaming offsets count files within a version.

        DataLoss if the version's log entry is gone, or if one of its files is gone
        (vacuumed); with a ``missing`` list, the paths of gone files are appended to it
        instead and their splits are still returned, so positions in the list stay stable."""
        gone: dict[int, list[str]] | None = None if missing is None else {}
        files = self.versions_files(name, version, version, gone)[version]
        if missing is not None and gone:
            missing.extend(gone.get(version, []))
        return files

    def versions_files(
        self,
        name: str,
        first: int,
        last: int,
        missing: dict[int, list[str]] | None = None,
        removes: dict[int, int] | None = None,
    ) -> dict[int, list[Split]]:
        """:meth:`version_files` of every version ``first..last`` at once (what a stream's
        micro-batch needs), from those versions' commit files alone: never the whole table.
        DataLoss if any of their log entries is gone; gone files as in :meth:`version_files`,
        by version in ``missing``. ``removes`` receives how many files each version removed
        as a change of data."""
        self.validate_name(name)
        if require_int(first, "version") < 0:
            raise InvalidRequest(
                f"version must be >= 0, got {first}; pick one from aqueduct history {name}"
            )
        if require_int(last, "to_version") < first or last - first >= MAX_VERSION_RANGE:
            raise InvalidRequest(
                f"to_version must be from version {first} to {first + MAX_VERSION_RANGE - 1}, "
                f"got {last}; ask for at most {MAX_VERSION_RANGE} versions at a time"
            )
        latest = self.latest_version(name)
        if last > latest:
            raise VersionNotFound(f"dataset {name!r} has no version {last} yet (latest {latest})")
        fs = self.filesystem(name)
        versions = list(range(first, last + 1))
        adds: dict[int, list[dict[str, Any]]] = {}
        for v, actions in zip(versions, delta_log.read_logs(fs, versions), strict=True):
            if not actions:
                raise DataLoss(
                    f"version {v} of dataset {name!r} is no longer in its log (cleaned up)"
                )
            adds[v] = [
                a["add"]
                for a in actions
                if isinstance(a.get("add"), dict) and a["add"].get("dataChange", True)
            ]
            if removes is not None:
                removes[v] = changes.removed_by(actions)
        # Partitioning never changes here: the latest version's (cached) says whether the
        # typed partition values are needed, which only a loaded table gives.
        _, parts = self.pinned(name, latest)
        typed = self._typed_partitions(name, adds) if parts else {}
        out: dict[int, list[Split]] = {}
        for v in versions:
            files = sorted(
                (
                    unquote(a["path"]),
                    typed[unquote(a["path"])][0] if parts else {},
                    typed[unquote(a["path"])][1] if parts else delta_log.num_records(a),
                    int(a["size"]),
                )
                for a in adds[v]
            )
            out[v] = [
                Split(
                    dataset=name,
                    version=v,
                    path=path,
                    row_groups=None,
                    partition=partition,
                    rows=rows,
                    bytes=size,
                )
                for path, partition, rows, size in files
            ]
        paths = [sp.path for files in out.values() for sp in files]
        found = {i.path: i.type for i in fs.get_file_info(paths)} if paths else {}
        for v, splits in out.items():
            gone = [sp.path for sp in splits if found[sp.path] == pafs.FileType.NotFound]
            if not gone:
                continue
            if missing is None:
                raise DataLoss(
                    f"{len(gone)} data files of dataset {name!r} version {v} are gone "
                    f"(vacuumed), e.g. {gone[0]!r}"
                )
            missing[v] = gone
        return out

    def _typed_partitions(
        self, name: str, adds: dict[int, list[dict[str, Any]]]
    ) -> dict[str, tuple[dict[str, Any], int]]:
        """Typed partition values and row counts of the files ``adds`` name, from the table
        at its latest version (one load for all of them); a file no longer live there from
        the table at the version that added it."""
        found: dict[str, tuple[dict[str, Any], int]] = {}

        def take(snap: Snapshot, wanted: set[str]) -> None:
            files = snap.files
            paths = [unquote(p) for p in files.column("path").to_pylist()]
            rows = files.column("num_records").to_pylist()
            cols = {c: files.column(f"partition.{c}").to_pylist() for c in snap.partition_by}
            for i, path in enumerate(paths):
                if path in wanted:
                    partition = {c: cols[c][i] for c in snap.partition_by}
                    found[path] = (partition, int(rows[i] or 0))

        take(self.snapshot(name), {unquote(a["path"]) for v in adds for a in adds[v]})
        for v, actions in adds.items():
            left = {unquote(a["path"]) for a in actions} - found.keys()
            if not left:
                continue
            try:
                snap = self.snapshot(name, v)
            except VersionNotFound as exc:
                raise DataLoss(
                    f"version {v} of dataset {name!r} cannot be loaded any more "
                    "(its log was cleaned up)"
                ) from exc
            take(snap, left)
        return found

    def scan(
        self,
        split: Split | Sequence[Split],
        columns: Sequence[str] | None = None,
        filter: Condition | pc.Expression | None = None,
        batch_rows: int = 65536,
        skip: Skip | None = None,
        passing: bool = False,
    ) -> Iterator[scan.Item]:
        """Stream the rows of one split, or of several one after the other (a plan's task):
        projected, filtered exactly, in the projected schema of each split's version, without
        the first rows ``skip`` leaves out (a resumed scan). The small batches of several
        splits are merged into batches of up to ``batch_rows``. With ``passing`` (the reader
        offered Parquet), row groups that need nothing done come as stored
        (:func:`.pass_parquet.read_or_pass`).

        Everything is checked before this returns (a bad split, columns or filter; a missing
        file is :class:`DataLoss`); rows are read as the iterator is consumed, at most a few
        batches ahead. Of several splits, only the first file's presence is checked here; a
        later one found missing fails the iteration with :class:`DataLoss`.
        """
        many = not isinstance(split, Split | Mapping)
        given: list[Any] = list(split) if many else [split]  # type: ignore[arg-type]
        if not given or len(given) > MAX_SCAN_SPLITS:
            raise InvalidRequest(
                f"a scan needs 1 to {MAX_SCAN_SPLITS} splits, got {len(given)}; scan the plan's splits in groups of at most {MAX_SCAN_SPLITS}"
            )
        splits = [s if isinstance(s, Split) else Split.from_dict(s) for s in given]
        if require_int(batch_rows, "batch_rows") <= 0:
            raise InvalidRequest(
                f"batch_rows must be positive, got {batch_rows}; leave it out for the default"
            )
        todo: list[tuple[scan.SplitReader, Split]] = []
        readers: dict[tuple[str, int], scan.SplitReader] = {}  # one look-up per version
        for sp in splits:
            staging.check_relative_path(sp.path)
            key = (sp.dataset, sp.version)
            reader = readers.get(key)
            if reader is None:
                schema, parts = self.pinned(*key)
                cols, out_schema = scan.project(schema, columns)
                reader = readers[key] = scan.SplitReader(
                    fs=self.filesystem(sp.dataset),
                    schema=schema,
                    partition_by=parts,
                    columns=cols,
                    out_schema=out_schema,
                    filter=scan.check_filter(schema, filter),
                    batch_rows=batch_rows,
                )
            if reader.partition_by or sp.partition:
                scan.partition_expression(reader.schema, reader.partition_by, sp.partition)
            todo.append((reader, sp))
        first = splits[0]
        if todo[0][0].fs.get_file_info(first.path).type != pafs.FileType.File:
            raise DataLoss(
                f"data file {first.path!r} of dataset {first.dataset!r} version {first.version} "
                "is missing: it was vacuumed or deleted outside the service. Read a later "
                "version (plan the scan again)"
            )

        def batches() -> Iterator[scan.Item]:
            for reader, sp in todo:
                yield from read_or_pass(reader, sp, skip, passing)

        return scan.coalesce(batches(), batch_rows) if many else batches()

    # -- writing -----------------------------------------------------------------------------------

    # checking a write's schema and committing it are the commit protocol's (:mod:`.commits`)
    check_schema = commits.check_schema

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
                raise InvalidRequest(
                    f"{what} must be positive, got {n}; leave it out for the default"
                )
        return staging.StageWriter(
            dataset=name,
            filesystem=self.filesystem(name, create=True),
            schema=schema,
            partition_by=partition_by,
            txn=txn,
            task=task,
            target_file_bytes=target_file_bytes,
            row_group_bytes=row_group_bytes,
            make_dir=lambda d: self.make_dir(name, d),
            remove_empty_dirs=lambda paths: self.remove_empty_dirs(name, paths),
        )

    commit = commits.commit

    # -- cleaning up -------------------------------------------------------------------------------

    def delete_unreferenced(self, name: str, fs: pafs.FileSystem, paths: set[str]) -> list[str]:
        """Delete those of ``paths`` (in ``fs``, the table's) no version references."""
        doomed = sorted(paths - delta_log.referenced_paths(fs)) if paths else []
        deleted = []
        for p in doomed:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(p)
                deleted.append(p)
        self.remove_empty_dirs(name, deleted)
        return deleted

    def abort_txn(self, name: str, txn: str, staged: Sequence[StagedFile] = ()) -> int:
        """Delete the staged files of transaction ``txn`` that no version references: the
        ``staged`` ones and any other file named for ``txn``. Returns how many were deleted."""
        self.validate_name(name)
        staging.check_txn(txn)
        given = set()
        for f in staged_list(staged):
            if staging.staged_txn(staging.check_relative_path(f.path)) != txn:
                raise InvalidRequest(
                    f"staged file {f.path!r} is not of transaction {txn!r}; commit each staged file with the transaction that staged it"
                )
            given.add(f.path)
        local = self.local_dir(name)
        if local is not None and not os.path.isdir(local):
            return 0
        fs = self.filesystem(name)
        found = {i.path for i in staging.staged_files(fs) if staging.staged_txn(i.path) == txn}
        return len(self.delete_unreferenced(name, fs, found | given))

    def cleanup_orphans(
        self, name: str, older_than: dt.timedelta = dt.timedelta(hours=1), dry_run: bool = False
    ) -> list[str]:
        """Delete staged files (named like ours) that no version references and that are older
        than ``older_than``, which must be longer than any write still running; a transaction
        with a record (:mod:`.txn_records`) counts as old as its last activity, whatever its
        files' ages. Returns their paths; ``dry_run`` only lists them. Works on a dataset whose
        create never committed."""
        self.validate_name(name)
        if not isinstance(older_than, dt.timedelta) or older_than < dt.timedelta(0):
            raise InvalidRequest(
                f"older_than must be a timedelta >= 0, got {older_than!r}; give e.g. timedelta(hours=1)"
            )
        local = self.local_dir(name)
        if local is not None and not os.path.isdir(local):
            raise DatasetNotFound(f"dataset {name!r} does not exist")
        fs = self.filesystem(name)
        cutoff = dt.datetime.now(dt.UTC) - older_than
        alive = txn_records.alive(self, name, since=cutoff)
        old = {
            i.path
            for i in staging.staged_files(fs)
            if i.mtime is not None and i.mtime < cutoff and staging.staged_txn(i.path) not in alive
        }
        if dry_run:
            return sorted(old - delta_log.referenced_paths(fs)) if old else []
        return self.delete_unreferenced(name, fs, old)

    def vacuum(
        self, name: str, retention: dt.timedelta = _MIN_RETENTION, dry_run: bool = False
    ) -> list[str]:
        """Delete files removed from the table over ``retention`` ago (Delta's vacuum), and
        orphaned staged files older than ``retention``; returns their paths. Versions whose
        files are gone can no longer be read. ``retention`` is rounded up to whole hours; a
        retention under 7 days is honoured because passing it is explicit."""
        if not isinstance(retention, dt.timedelta) or retention < dt.timedelta(0):
            raise InvalidRequest(
                f"retention must be a timedelta >= 0, got {retention!r}; give e.g. timedelta(days=7)"
            )
        table = self.open_table(name)
        try:
            removed = table.vacuum(
                retention_hours=math.ceil(retention.total_seconds() / 3600),
                dry_run=dry_run,
                enforce_retention_duration=retention >= _MIN_RETENTION,
                full=False,  # "full" would also take staged files of running writes
            )
        except DeltaError as exc:
            raise InvalidRequest(
                f"vacuum of dataset {name!r} refused: {exc}; vacuum with a longer retention"
            ) from exc
        if not dry_run:
            self.remove_empty_dirs(name, removed)
        orphans = self.cleanup_orphans(name, older_than=retention, dry_run=dry_run)
        return sorted(set(removed) | set(orphans))

    # last: a method named ``list`` shadows the builtin in later annotations of the class
    def list(self) -> list[DatasetInfo]:
        """Every dataset under the root, sorted by name."""
        if self._local_root is not None:
            names = [e.name for e in os.scandir(self._local_root) if e.is_dir()]
        else:
            root = self.root_filesystem()
            infos = root.get_file_info(pafs.FileSelector("", allow_not_found=True))
            names = [i.base_name for i in infos if i.type == pafs.FileType.Directory]
        out = []
        for name in sorted(names):
            if not NAME_RE.match(name) or ".." in name:
                continue
            with contextlib.suppress(DatasetNotFound):  # not a table, or dropped meanwhile
                out.append(self.describe(name))
        return out
