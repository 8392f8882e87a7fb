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
from collections.abc import Iterator, Sequence
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError
from deltalake.fs import DeltaStorageHandler
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
    require_int,
    staged_list,
)

from . import commits, delta_log, delta_types, scan, staging
from .changes import TABLE_PROPERTIES
from .commits import METADATA_KEY, commit_meta
from .tables import NAME_RE, Tables, delta_error

_MIN_RETENTION = dt.timedelta(days=7)


class Store(Tables):
    """Named datasets under ``root``, each a Delta table in ``<root>/<name>`` (see
    :class:`~.tables.Tables` for ``root`` and ``storage_options``)."""

    # -- describing --------------------------------------------------------------------------------

    def _info(self, name: str, table: DeltaTable) -> DatasetInfo:
        version = table.version()
        adds = pa.table(table.get_add_actions(flatten=False))
        times = delta_log.commit_times(self.filesystem(name))
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
        return self._info(name, self.open_table(name, version, timestamp))

    def transaction_version(self, name: str, app_id: str) -> int | None:
        """The last app transaction version committed for ``app_id``, or None."""
        v = self.open_table(name).transaction_version(app_id)
        return None if v is None else int(v)

    def history(self, name: str, since_version: int | None = None) -> list[VersionInfo]:
        """What each version did and added, oldest first, from ``since_version`` on (as far back
        as the log goes). Timestamps are the commit times time travel uses."""
        if since_version is not None and require_int(since_version, "since_version") < 0:
            raise InvalidRequest(f"since_version must be >= 0, got {since_version}")
        if not self.exists(name):
            raise DatasetNotFound(f"dataset {name!r} does not exist")
        fs = self.filesystem(name)
        times = delta_log.commit_times(fs)
        versions = [v for v in sorted(times) if v >= (since_version or 0)]
        out = []
        for v, actions in zip(versions, delta_log.read_logs(fs, versions), strict=True):
            info = delta_log.commit_info(actions)
            meta = info.get(METADATA_KEY)
            if isinstance(meta, dict) and {"rows", "bytes", "files"} <= meta.keys():
                added = (int(meta["rows"]), int(meta["bytes"]), int(meta["files"]))
                change = bool(meta.get("data_change", True))
            else:  # a commit made by another writer
                *counts, change = delta_log.added_by(actions)
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
        with self._lock:
            for key in [k for k in self._pinned_cache if k[0] == name]:
                del self._pinned_cache[key]

    # -- reading -----------------------------------------------------------------------------------

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
        table = self.open_table(name, version, timestamp)
        v = table.version()
        schema = pa.schema(table.schema().to_arrow())
        parts = tuple(table.metadata().partition_columns)
        _, out_schema = scan.project(schema, columns)
        splits = scan.plan_splits(
            dataset=name,
            version=v,
            fs=self.filesystem(name),
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
        fs = self.filesystem(name)
        actions = delta_log.read_log(fs, version)
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
        _, parts = self.pinned(name, latest)
        if parts:
            try:
                table = self.open_table(name, version, None)
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
            files = [
                (unquote(a["path"]), {}, delta_log.num_records(a), int(a["size"])) for a in adds
            ]
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
        schema, parts = self.pinned(split.dataset, split.version)
        cols, out_schema = scan.project(schema, columns)
        filt = scan.check_filter(schema, filter)
        scan.partition_expression(schema, parts, split.partition)
        fs = self.filesystem(split.dataset)
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
                raise InvalidRequest(f"{what} must be positive, got {n}")
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

    def _delete_unreferenced(self, name: str, fs: pafs.FileSystem, paths: set[str]) -> list[str]:
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
                raise InvalidRequest(f"staged file {f.path!r} is not of transaction {txn!r}")
            given.add(f.path)
        local = self.local_dir(name)
        if local is not None and not os.path.isdir(local):
            return 0
        fs = self.filesystem(name)
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
        local = self.local_dir(name)
        if local is not None and not os.path.isdir(local):
            raise DatasetNotFound(f"dataset {name!r} does not exist")
        fs = self.filesystem(name)
        cutoff = dt.datetime.now(dt.UTC) - older_than
        old = {i.path for i in staging.staged_files(fs) if i.mtime is not None and i.mtime < cutoff}
        if dry_run:
            return sorted(old - delta_log.referenced_paths(fs)) if old else []
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
        table = self.open_table(name)
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
            self.remove_empty_dirs(name, removed)
        orphans = self.cleanup_orphans(name, older_than=retention, dry_run=dry_run)
        return sorted(set(removed) | set(orphans))

    # last: a method named ``list`` shadows the builtin in later annotations of the class
    def list(self) -> list[DatasetInfo]:
        """Every dataset under the root, sorted by name."""
        if self._local_root is not None:
            names = [e.name for e in os.scandir(self._local_root) if e.is_dir()]
        else:
            root = pafs.PyFileSystem(DeltaStorageHandler(self.root, options=self.delta_options()))
            infos = root.get_file_info(pafs.FileSelector("", allow_not_found=True))
            names = [i.base_name for i in infos if i.type == pafs.FileType.Directory]
        out = []
        for name in sorted(names):
            if not NAME_RE.match(name) or ".." in name:
                continue
            with contextlib.suppress(DatasetNotFound):  # not a table, or dropped meanwhile
                out.append(self.describe(name))
        return out
