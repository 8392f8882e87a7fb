"""Where the datasets live: names, table directories, filesystems, and Delta table handles.

Every dataset is a Delta table in ``<root>/<name>``; the root is a local directory or an
object-store URI (``s3://bucket/prefix``, ``file:///...``) with ``storage_options`` for
deltalake. :class:`Tables` maps a name to its location and opens the table at the version a
call needs (time travel included).

The latest state is kept per dataset (:class:`LatestState`): the log's tail (version,
protocol, metadata, app transactions, live files; :mod:`.log_tail`), loaded once from a
deltalake table and brought forward by reading the commit files written since, by name, never
listing the log; the :class:`Snapshot` reads share, whose file list a plan loads on first use
(deltalake, forward from the last one loaded); and the commit times, listed once and then
extended. So ``begin``, a commit's checks, ``describe`` and a stream's offsets cost a few file
stats however long the log is; loading a table (a listing, and a replay from the last
checkpoint) happens once per dataset, or when the log cannot tell (dropped, cleaned up).
Snapshots of older versions (time travel) are kept in a small LRU. Every cache is keyed by the
size and mtime of the commit file of the version it holds, so a dataset dropped and created
again misses it; the state of at most ``_STATE_CACHE_SIZE`` datasets is kept.

Time travel to a time before the first commit gives version 0 in deltalake; here it is
:class:`VersionNotFound`. Commit times are the commit files' modification times made monotonic,
as in deltalake and Spark (:mod:`.delta_log`).

Never fork a process after using this module: deltalake's runtime panics in forked children.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable, PostCommitHookProperties
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler

from aqueduct_spark.protocol import (
    Conflict,
    DatasetError,
    DatasetNotFound,
    InternalError,
    InvalidRequest,
    VersionNotFound,
    require_int,
)

from . import delta_log, log_tail
from .snapshots import LatestState as LatestState
from .snapshots import Snapshot as Snapshot

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_META_CACHE_SIZE = 256
_STATE_CACHE_SIZE = 64
_SNAPSHOT_CACHE_SIZE = 16
_WALK_LIMIT = 64
_TICK = dt.timedelta(milliseconds=1)


_FIRST = os.path.basename(delta_log.commit_path(0))


_file_key = log_tail.file_key
_looked = threading.local()
"""``names``: the datasets whose log this thread's request looked at (:meth:`Tables.one_look`)."""


def _utc(ts: dt.datetime) -> dt.datetime:
    if not isinstance(ts, dt.datetime):
        raise InvalidRequest(f"timestamp must be a datetime, got {type(ts).__name__}")
    return ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)


class Tables:
    """The Delta tables of the datasets under ``root``, one in ``<root>/<name>`` each.

    ``root`` is a local directory (created if missing) or a URI: ``s3://bucket/prefix``,
    ``gs://...``, ``az://...``, ``file:///abs/path``; ``storage_options`` go to deltalake
    unchanged (e.g. ``AWS_ENDPOINT_URL``, ``AWS_REGION``). A local directory is read and
    written through pyarrow's local filesystem, URIs through deltalake's object store.
    Thread-safe.
    """

    commit_hooks: PostCommitHookProperties | None = None
    """deltalake's post-commit hooks for this store's commits; None: deltalake's defaults (a
    checkpoint inside every 100th commit). The service's maintenance turns them off and does
    that work after the commits instead (:mod:`.maintenance`)."""

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
        self._states: OrderedDict[str, LatestState] = OrderedDict()
        self._snapshots: OrderedDict[tuple[Any, ...], Snapshot] = OrderedDict()
        self._filesystems: OrderedDict[str, pafs.FileSystem] = OrderedDict()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"

    def validate_name(self, name: str) -> str:
        """``name`` if it is a valid dataset name, else :class:`InvalidRequest`."""
        if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
            raise InvalidRequest(
                f"invalid dataset name {name!r}: use 1-128 letters, digits, '_', '-' or '.', "
                "starting with a letter or digit, without '..' or '/'"
            )
        return name

    def uri(self, name: str) -> str:
        """The table's location as deltalake takes it."""
        return os.path.join(self.root, name) if self._native else f"{self.root}/{name}"

    def delta_options(self) -> dict[str, str] | None:
        """The storage options for deltalake calls (None for none)."""
        return self.storage_options or None

    def local_dir(self, name: str) -> str | None:
        """The table's directory on the local disk; None on an object store."""
        return None if self._local_root is None else os.path.join(self._local_root, name)

    def filesystem(self, name: str, create: bool = False) -> pafs.FileSystem:
        """A filesystem rooted at the table directory: paths are relative to the table.
        On an object store one is kept per dataset (making one costs about 10 ms)."""
        local = self.local_dir(name)
        if self._native:
            assert local is not None
            return pafs.SubTreeFileSystem(local, pafs.LocalFileSystem())
        if local is not None and not os.path.isdir(local):
            # deltalake's store for file:// URIs needs the directory
            if not create:
                raise DatasetNotFound(f"dataset {name!r} does not exist")
            os.makedirs(local, exist_ok=True)
        with self._lock:
            fs = self._filesystems.get(name)
            if fs is not None:
                self._filesystems.move_to_end(name)
                return fs
        fs = pafs.PyFileSystem(DeltaStorageHandler(self.uri(name), options=self.delta_options()))
        with self._lock:
            self._filesystems[name] = fs
            while len(self._filesystems) > _STATE_CACHE_SIZE:
                self._filesystems.popitem(last=False)
        return fs

    def root_filesystem(self) -> pafs.FileSystem:
        """A filesystem rooted at the root itself (paths relative to it): the local disk
        for a local or ``file://`` root, else the object store."""
        if self._local_root is not None:
            return pafs.SubTreeFileSystem(self._local_root, pafs.LocalFileSystem())
        return pafs.PyFileSystem(DeltaStorageHandler(self.root, options=self.delta_options()))

    def make_dir(self, name: str, directory: str) -> None:
        """Create a directory of the table (object stores have none to create)."""
        local = self.local_dir(name)
        if local is not None:
            os.makedirs(os.path.join(local, directory), exist_ok=True)

    def remove_empty_dirs(self, name: str, paths: Sequence[str]) -> None:
        """Remove the directories that deleting ``paths`` left empty (local storage only)."""
        local = self.local_dir(name)
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

    def open_table(
        self, name: str, version: int | None = None, timestamp: dt.datetime | None = None
    ) -> DeltaTable:
        """The table at its latest version, at ``version``, or at the last version committed
        at or before ``timestamp``."""
        self.validate_name(name)
        if version is not None and timestamp is not None:
            raise InvalidRequest("give a version or a timestamp to time travel to, not both")
        if version is not None and require_int(version, "version") < 0:
            raise InvalidRequest(
                f"version must be >= 0, got {version}; pick one from aqueduct history {name}"
            )
        if timestamp is not None:
            if not self.exists(name):
                raise DatasetNotFound(f"dataset {name!r} does not exist")
            version = delta_log.version_at(self.filesystem(name), name, _utc(timestamp))
        try:
            return DeltaTable(self.uri(name), version=version, storage_options=self.delta_options())
        except DeltaError as exc:
            if version is None or not self.exists(name):
                if isinstance(exc, TableNotFoundError):
                    raise DatasetNotFound(f"dataset {name!r} does not exist") from exc
                raise delta_error(name, exc) from exc
            # (a version whose log was cleaned up is "table not found" to deltalake)
            raise VersionNotFound(
                f"dataset {name!r} has no version {version} (the latest is "
                f"{self.latest_version(name)}; old versions go when the log is cleaned up); "
                f"pick one from aqueduct history {name}"
            ) from exc

    def snapshot(
        self, name: str, version: int | None = None, timestamp: dt.datetime | None = None
    ) -> Snapshot:
        """The table at its latest version, at ``version``, or at the last version committed
        at or before ``timestamp`` (as :meth:`open_table`), from the per-dataset state: the
        latest version costs two file stats when nothing was committed since, and only the
        new commits when something was."""
        self.validate_name(name)
        if version is None and timestamp is None:
            return self._latest(name)
        if timestamp is not None:
            if version is not None:
                raise InvalidRequest("give a version or a timestamp to time travel to, not both")
            if not self.exists(name):
                raise DatasetNotFound(f"dataset {name!r} does not exist")
            version = delta_log.version_at(self.filesystem(name), name, _utc(timestamp))
        version = require_int(version, "version")
        if version < 0:
            raise InvalidRequest(
                f"version must be >= 0, got {version}; pick one from aqueduct history {name}"
            )
        key = (
            name,
            version,
            _file_key(self.filesystem(name).get_file_info(delta_log.commit_path(version))),
        )
        with self._lock:
            if key[2] is not None and key in self._snapshots:
                self._snapshots.move_to_end(key)
                return self._snapshots[key]
            warm = name in self._states
        # the latest version is often the one asked for (a stream's, a plan's just before)
        if key[2] is not None and (warm or version == self.latest_version(name)):
            latest = self._latest(name)
            if latest.version == version:
                return latest
        snap = Snapshot.of(self.open_table(name, version))
        if key[2] is not None:  # (a version whose commit file was cleaned up is not kept)
            with self._lock:
                self._snapshots[key] = snap
                while len(self._snapshots) > _SNAPSHOT_CACHE_SIZE:
                    self._snapshots.popitem(last=False)
        return snap

    def _state(self, name: str) -> LatestState:
        with self._lock:
            state = self._states.get(name)
            if state is None:
                state = self._states[name] = LatestState()
                while len(self._states) > _STATE_CACHE_SIZE:
                    self._states.popitem(last=False)
            self._states.move_to_end(name)
            return state

    def _refresh(self, name: str, state: LatestState, fresh: bool = False) -> log_tail.Tail:
        """Bring ``state``'s tail to the latest version (under its lock): the commits since,
        read from their files; a load of the table (one listing of the log) only the first
        time, or when the log cannot tell (:mod:`.log_tail`). Inside :meth:`one_look`, once
        per dataset unless ``fresh``."""
        looked: set[tuple[int, str]] | None = getattr(_looked, "names", None)
        if (
            looked is not None
            and not fresh
            and state.tail is not None
            and (id(self), name) in looked
        ):
            return state.tail
        fs = self.filesystem(name)
        if state.tail is not None:
            try:
                if log_tail.advance(state.tail, fs):
                    state.updates += 1
                if looked is not None:
                    looked.add((id(self), name))
                return state.tail
            except (log_tail.Reload, OSError, ValueError, KeyError, TypeError, DeltaError):
                pass
        state.tail = state.table = state.snapshot = state.times = None
        table = self.open_table(name)
        state.loads += 1
        state.tail = log_tail.load(table, fs)
        state.table = table
        if looked is not None:
            looked.add((id(self), name))
        return state.tail

    @contextlib.contextmanager
    def one_look(self) -> Iterator[None]:
        """Within the block (one request's work, in this thread) each dataset's log is looked
        at once: the first :meth:`exists`, :meth:`snapshot` or :meth:`latest_state` brings
        its kept state to the latest version (about three object-store requests for each
        time, which a begin and a commit each made twice or more), the later ones take that
        version. A commit's own look (``latest_state(fresh=True)``) still asks, and its
        put-if-absent of the next version fails whenever another commit came first."""
        if getattr(_looked, "names", None) is not None:
            yield
            return
        _looked.names = set()
        try:
            yield
        finally:
            _looked.names = None

    @contextlib.contextmanager
    def latest_state(self, name: str, *, fresh: bool = False) -> Iterator[LatestState]:
        """The kept state of dataset ``name``, its tail brought to the latest version, held
        (its lock) for the ``with`` block: commits check and write under it (``fresh``:
        looked at again even inside :meth:`one_look`). Whatever breaks in the block, the
        state is loaded afresh next time."""
        self.validate_name(name)
        state = self._state(name)
        with state.lock:
            self._refresh(name, state, fresh)
            try:
                yield state
            except BaseException:
                state.tail = state.table = state.snapshot = state.times = None
                raise

    def _latest(self, name: str) -> Snapshot:
        state = self._state(name)
        with state.lock:
            tail = self._refresh(name, state)
            snap = state.snapshot
            if snap is None or (snap.version, state.key) != (tail.version, tail.key):
                load = functools.partial(self._files, name, state, tail.version, tail.table_id)
                state.snapshot = snap = Snapshot.of_tail(tail, load)
                state.key = tail.key
            return snap

    def _files(self, name: str, state: LatestState, version: int, table_id: str) -> pa.Table:
        """The live files of version ``version`` of the table ``table_id`` (a snapshot's,
        on first use): from the state's reader table, brought forward to it (deltalake reads
        the commits since), or a table loaded at that version."""
        with state.files_lock:
            reader = state.reader
            if reader is None or reader.version() > version:
                reader = self.open_table(name, version)
                if reader.version() == version and str(reader.metadata().id) == table_id:
                    state.reader = reader
            elif reader.version() < version:
                reader.load_as_version(version)
            if str(reader.metadata().id) != table_id:
                state.reader = None
                raise DatasetNotFound(
                    f"dataset {name!r} was dropped and created again while it was read"
                )
            return pa.table(reader.get_add_actions(flatten=True))

    def commit_times(self, name: str) -> dict[int, dt.datetime]:
        """Every version of dataset ``name`` with its commit time, as
        :func:`.delta_log.commit_times` gives them: listed once, then kept and extended with
        a stat of each new commit file. Versions the log has cleaned up since may linger at
        the start: callers check the oldest one they use."""
        state = self._state(name)
        with state.lock:
            tail = self._refresh(name, state)
            fs = self.filesystem(name)
            times = state.times
            if times:
                new = range(max(times) + 1, tail.version + 1)
                infos = fs.get_file_info([delta_log.commit_path(v) for v in new]) if new else []
                if any(i.type != pafs.FileType.File or i.mtime is None for i in infos):
                    times = None  # cleaned up meanwhile: list again
                else:
                    times = dict(times)
                    last = times[max(times)]
                    for v, info in zip(new, infos, strict=True):
                        mtime = info.mtime.astimezone(dt.UTC)
                        last = times[v] = mtime if mtime > last else last + _TICK
            if not times:
                times = delta_log.commit_times(fs)
            state.times = times
            return times

    def kept_latest(self, name: str) -> Snapshot | None:
        """The latest snapshot of ``name`` if its state is kept (brought up to date: a few
        file stats, and the new commits if any); None rather than loading the table."""
        with self._lock:
            state = self._states.get(name)
        if state is None or state.tail is None:
            return None
        return self._latest(name)

    def forget(self, name: str) -> None:
        """Drop every cached state of dataset ``name`` (after dropping it)."""
        with self._lock:
            self._states.pop(name, None)
            self._filesystems.pop(name, None)
            for cache in (self._pinned_cache, self._snapshots):
                for key in [k for k in cache if k[0] == name]:
                    del cache[key]

    def exists(self, name: str) -> bool:
        """Whether ``name`` is a Delta table. Its first commit or checkpoint pointer says so
        (a stat or two; a HEAD request or two on an object store); else (a log cleaned up
        without a pointer, or no table) deltalake's test, which lists the whole log (20 ms
        at 1,000 versions locally, page after page on an object store: every request asks)."""
        self.validate_name(name)
        if self._kept_and_looked(name):
            return True
        local = self.local_dir(name)
        if local is not None:
            log = os.path.join(local, "_delta_log")
            if any(os.path.isfile(os.path.join(log, f)) for f in (_FIRST, "_last_checkpoint")):
                return True
        else:
            found = self.filesystem(name).get_file_info(
                [delta_log.commit_path(0), "_delta_log/_last_checkpoint"]
            )
            if any(info.type == pafs.FileType.File for info in found):
                return True
        return bool(DeltaTable.is_deltatable(self.uri(name), storage_options=self.delta_options()))

    def _kept_and_looked(self, name: str) -> bool:
        """Inside :meth:`one_look`: whether ``name``'s kept state is (now) at its latest
        version, which says it exists (its commit file unchanged) without a stat more."""
        looked: set[tuple[int, str]] | None = getattr(_looked, "names", None)
        if looked is None:
            return False
        if (id(self), name) in looked:
            return True
        with self._lock:
            state = self._states.get(name)
        if state is None or state.tail is None:
            return False
        with state.lock:
            try:
                self._refresh(name, state)
            except Exception:  # dropped, replaced, unreadable: the stats say
                return False
        return True

    def latest_version(self, name: str) -> int:
        """The latest version of dataset ``name``. From the state kept for it when there is
        one (two file stats, and the new commits only when there are some: the version after
        the kept one is probed, as :meth:`snapshot` does); else from a listing of the log."""
        self.validate_name(name)
        with self._lock:
            state = self._states.get(name)
        if state is not None and state.tail is not None:
            return self._latest(name).version
        local = self.local_dir(name)
        if local is not None and self.exists(name):
            # names only: the listing with commit times stats every file of the log
            try:
                names = os.listdir(os.path.join(local, "_delta_log"))
            except FileNotFoundError:
                names = []
            found = [int(n[:20]) for n in names if delta_log.is_commit_file(n)]
            if found:
                return max(found)
        versions = delta_log.commit_times(self.filesystem(name)) if self.exists(name) else {}
        if not versions:
            raise DatasetNotFound(f"dataset {name!r} does not exist")
        return max(versions)

    def table_id(self, name: str) -> str:
        """The table's identity, Delta's ``metaData.id``: fixed when the table is created, so
        a dataset dropped and created again under the same name has another one. Streaming
        offsets carry it (as Delta's source does) to notice a checkpoint of another table.
        Read from version 0's commit while the log has it (one small file, cached), since
        the id never changes; else from the kept latest snapshot. No listing of the log."""
        if not self.exists(name):
            raise DatasetNotFound(f"dataset {name!r} does not exist")
        first = self.filesystem(name).get_file_info(delta_log.commit_path(0))
        if first.type == pafs.FileType.File:
            return self.pinned_meta(name, 0)[2]
        return self.snapshot(name).table_id

    def pinned(self, name: str, version: int) -> tuple[pa.Schema, tuple[str, ...]]:
        """Schema and partition columns of one version, cached: a version never changes."""
        schema, parts, _ = self.pinned_meta(name, version)
        return schema, parts

    def pinned_meta(self, name: str, version: int) -> tuple[pa.Schema, tuple[str, ...], str]:
        """Schema, partition columns and table id of one version, cached by its commit file.

        Without loading the table where the log tells: walking back through the commit
        files from ``version`` to the nearest version already known, or whose commit set
        the metadata (a stream reads versions in order: one commit file each). Past
        ``_WALK_LIMIT`` commits, or where the log was cleaned up, from the loaded table."""
        self.validate_name(name)
        if require_int(version, "version") < 0:
            raise InvalidRequest(
                f"version must be >= 0, got {version}; pick one from aqueduct history {name}"
            )
        fs = self.filesystem(name)
        walked: list[tuple[Any, ...]] = []
        meta: tuple[pa.Schema, tuple[str, ...], str] | None = None
        v = version
        while v >= 0 and meta is None and len(walked) < _WALK_LIMIT:
            info = fs.get_file_info(delta_log.commit_path(v))
            if info.type != pafs.FileType.File:
                break
            key = (name, v, info.size, info.mtime_ns)
            with self._lock:
                state = self._states.get(name)
                if key in self._pinned_cache:
                    self._pinned_cache.move_to_end(key)
                    meta = self._pinned_cache[key]
                    break
            snap, snap_key = (state.snapshot, state.key) if state is not None else (None, None)
            if snap is not None and snap.version == v and snap_key == key[2:]:
                meta = (snap.schema, snap.partition_by, snap.table_id)
                break
            walked.append(key)
            try:
                meta = _metadata(delta_log.read_log(fs, v))
            except (ValueError, KeyError, TypeError, DeltaError):
                break  # metadata this code cannot read: the table's own loader can
            v -= 1
        if meta is None:
            snap = self.snapshot(name, version)
            meta = (snap.schema, snap.partition_by, snap.table_id)
        with self._lock:
            for key in walked:
                self._pinned_cache[key] = meta
            while len(self._pinned_cache) > _META_CACHE_SIZE:
                self._pinned_cache.popitem(last=False)
        return meta


def _metadata(actions: Sequence[dict[str, Any]]) -> tuple[pa.Schema, tuple[str, ...], str] | None:
    """Schema, partition columns and table id a commit's ``metaData`` action sets, if any."""
    for action in actions:
        md = action.get("metaData")
        if isinstance(md, dict):
            schema = pa.schema(DeltaSchema.from_json(md["schemaString"]).to_arrow())
            return schema, tuple(md.get("partitionColumns") or ()), str(md["id"])
    return None


def delta_error(name: str, exc: DeltaError) -> DatasetError:
    """The dataset error a deltalake failure on dataset ``name`` means."""
    if "Unsupported table features" in str(exc):  # a conflict that no retry heals
        return InvalidRequest(
            f"dataset {name!r} uses Delta table features the service cannot write ({exc}); "
            "write to it with Spark, or create the dataset without those features"
        )
    if isinstance(exc, CommitFailedError):
        return Conflict(f"a commit to dataset {name!r} failed: {exc}; retry it")
    if isinstance(exc, TableNotFoundError):
        return DatasetNotFound(f"dataset {name!r} does not exist")
    return InternalError(f"Delta Lake error on dataset {name!r}: {exc}")
