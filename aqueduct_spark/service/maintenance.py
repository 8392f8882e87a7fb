"""Table maintenance: checkpoints, log cleanup, compaction and vacuum, done by the service.

A dataset a stream writes to every few seconds makes thousands of versions and small files a
day. Left alone, every commit and every read gets slower: the log grows (deltalake replays it
from the last checkpoint), the ``_delta_log`` listing grows, and reads open one small file
after another. :class:`Maintenance` keeps a table small, after commits, in the service's
worker threads (as one more owner of the :class:`~.admission.FairPool`, so it takes at most
its share of the threads and never delays an append's reply):

- a **checkpoint** every ``checkpoint_interval`` versions (deltalake's ``create_checkpoint``);
- **log cleanup**: commit files and checkpoints older than ``log_retention`` that newer
  checkpoints make unnecessary are deleted (Delta's expired-log rule, keeping one checkpoint
  interval more for readers loading the table meanwhile; versions before it can no longer be
  time travelled to);
- **compaction** of small files once ``compact_min_files`` files under
  ``compact_target_bytes`` have gathered (deltalake's ``optimize.compact``). A compaction
  commit only rearranges rows, so its actions say ``dataChange=false``: streams read nothing
  from it, and the change feed shows nothing for it. The files it replaces stay on storage, so
  readers pinned to older versions still read them, until vacuum;
- **vacuum** every ``vacuum_interval``: files removed over ``vacuum_retention`` ago are
  deleted (``Store.vacuum``); only then can versions that need them no longer be read.

With maintenance on, the service turns off deltalake's own post-commit hooks (a checkpoint
written inside every hundredth commit, and log cleanup with it) and does that work here,
after the commit's reply. Off (the default), deltalake's hooks stay as they are.

The same operations run on request (``compact``, ``vacuum``, ``restore``, ``delete``; the
``aqueduct`` commands of the same names): :func:`compact`, :func:`restore`, :func:`delete`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, PostCommitHookProperties
from deltalake.exceptions import DeltaError

from aqueduct_spark.protocol import (
    Conflict,
    InternalError,
    InvalidRequest,
    VersionNotFound,
    require_int,
)

from .binding import Condition
from .changes import ensure_change_feed
from .commits import METADATA_KEY
from .store import Store
from .tables import delta_error

log = logging.getLogger("aqueduct.maintenance")

_LOG_FILE_RE = re.compile(r"^(\d{20})\.(json|crc|checkpoint(\.\d+\.\d+)?\.parquet)$")
_CHECKPOINT_RE = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")
_PREDICATE_ERRORS = ("sql parser error", "Schema error", "Error during planning", "Cast error")
"""What deltalake's errors about a delete's predicate (not about the table) say."""
NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
"""Commits made while the service maintains its tables: no checkpoint, no cleanup inline."""


@dataclass(frozen=True)
class MaintenanceConfig:
    """What the service does to keep its tables small (``aqueduct serve --maintenance``)."""

    enabled: bool = False
    """The one switch: off, the service does nothing after commits (deltalake still writes a
    checkpoint every 100 versions inside the commit that reaches it)."""
    checkpoint_interval: int = 100
    """Write a checkpoint once this many versions were committed since the last one."""
    log_retention: dt.timedelta = dt.timedelta(days=30)
    """Keep the log of this long back (the reach of time travel); older commit files that a
    newer checkpoint replaces are deleted."""
    compact_min_files: int = 50
    """Compact once a dataset has this many files under ``compact_target_bytes``."""
    compact_target_bytes: int = 128 << 20
    """Size of the files compaction writes."""
    vacuum_retention: dt.timedelta = dt.timedelta(days=7)
    """Delete files removed (by compaction, overwrite, delete) this long ago. A reader pinned
    to an older version, or a stream that far behind, can no longer read it."""
    vacuum_interval: dt.timedelta = dt.timedelta(hours=24)
    """How often each dataset is vacuumed."""

    def __post_init__(self) -> None:
        for name in ("checkpoint_interval", "compact_min_files", "compact_target_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"MaintenanceConfig.{name} must be at least 1")
        for name in ("log_retention", "vacuum_retention", "vacuum_interval"):
            if getattr(self, name) < dt.timedelta(0):
                raise ValueError(f"MaintenanceConfig.{name} must not be negative")


@dataclass
class _Dataset:
    """What the maintenance of one dataset knows, kept between commits (in memory only)."""

    checkpoint: int = -1
    """Version of the newest checkpoint known (-1: not looked yet)."""
    compacted: int = -1
    """Version at which small files were last counted."""
    vacuumed: float = field(default_factory=time.monotonic)
    """When the last vacuum ran (the service start counts as one)."""
    running: bool = False
    again: bool = False
    latest: int = 0


class Maintenance:
    """Runs the maintenance that commits make due, one dataset at a time, in ``pool``."""

    def __init__(self, store: Store, config: MaintenanceConfig, pool: Any) -> None:
        self.store = store
        self.config = config
        self._pool = pool
        self._datasets: dict[str, _Dataset] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        if config.enabled:
            store.commit_hooks = NO_HOOKS

    def after_commit(self, name: str, version: int) -> None:
        """Note a commit (on the event loop: cheap); start maintenance if some is due."""
        if not self.config.enabled:
            return
        state = self._datasets.setdefault(name, _Dataset())
        if version < state.latest and not state.running:  # dropped and created again
            state = self._datasets[name] = _Dataset()
        state.latest = max(state.latest, version)
        if not self._due(state):
            return
        if state.running:
            state.again = True
            return
        state.running = True
        task = asyncio.get_running_loop().create_task(self._run(name, state))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _due(self, state: _Dataset) -> bool:
        cfg = self.config
        return (
            state.checkpoint < 0
            or state.latest - state.checkpoint >= cfg.checkpoint_interval
            or state.latest - state.compacted >= cfg.compact_min_files
            or time.monotonic() - state.vacuumed >= cfg.vacuum_interval.total_seconds()
        )

    async def _run(self, name: str, state: _Dataset) -> None:
        try:
            while True:
                state.again = False
                try:
                    await self._pool.run(self, self.maintain, name, state)
                except Exception as exc:  # maintenance never fails a request; next time again
                    log.warning("maintenance of dataset %s failed: %s", name, exc)
                if not (state.again and self._due(state)):
                    return
        finally:
            state.running = False

    def maintain(self, name: str, state: _Dataset | None = None) -> None:
        """Whatever is due for dataset ``name`` (blocking; a worker thread)."""
        state = state or self._datasets.setdefault(name, _Dataset())
        cfg = self.config
        if not self.store.exists(name):
            return
        fs = self.store.filesystem(name)
        if state.checkpoint < 0:
            state.checkpoint = newest_checkpoint(fs)
        # the state the service keeps of the table (its new commits only), not a load of the
        # log: most runs find nothing due
        snap = self.store.snapshot(name)
        if snap.version < state.checkpoint:  # dropped and created again
            state.checkpoint = newest_checkpoint(fs)
            state.compacted = -1
        state.latest = max(state.latest, snap.version)
        version = snap.version
        if state.latest - state.compacted >= cfg.compact_min_files:
            state.compacted = state.latest
            if small_files(snap.files, cfg.compact_target_bytes) >= cfg.compact_min_files:
                version = int(compact(self.store, name, cfg.compact_target_bytes)["version"])
        if version - state.checkpoint >= cfg.checkpoint_interval:
            table = self.store.open_table(name)
            table.create_checkpoint()
            state.checkpoint = table.version()
            deleted = cleanup_log(fs, cfg.log_retention)
            log.info(
                "dataset %s: checkpoint at version %d; %d expired log files deleted",
                name,
                state.checkpoint,
                deleted,
            )
        if time.monotonic() - state.vacuumed >= cfg.vacuum_interval.total_seconds():
            state.vacuumed = time.monotonic()
            removed = self.store.vacuum(name, retention=cfg.vacuum_retention)
            if removed:
                log.info("dataset %s: vacuum deleted %d files", name, len(removed))

    async def wait_idle(self) -> None:
        """Wait for the maintenance running now (tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def newest_checkpoint(fs: pafs.FileSystem) -> int:
    """The version of the newest checkpoint in the log (0 when there is none: version 0 is
    where replaying the log starts): from ``_last_checkpoint`` (one small file), else from a
    listing of the log. (That pointer may lag behind a checkpoint just written: then the next
    checkpoint comes a little early, which is harmless.)"""
    try:
        with fs.open_input_stream("_delta_log/_last_checkpoint") as f:
            return int(json.loads(f.read())["version"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        pass
    found = [int(m.group(1)) for m in map(_CHECKPOINT_RE.match, _log_names(fs)) if m]
    return max(found, default=0)


def small_files(files: pa.Table, target_bytes: int) -> int:
    """How many of the live files (a snapshot's add actions) are smaller than
    ``target_bytes``."""
    if not files.num_rows:
        return 0
    return int(pc.sum(pc.less(files["size_bytes"], target_bytes)).as_py() or 0)


def _log_names(fs: pafs.FileSystem) -> list[str]:
    try:
        infos = fs.get_file_info(pafs.FileSelector("_delta_log", allow_not_found=True))
    except FileNotFoundError:
        return []
    return [i.base_name for i in infos]


def cleanup_log(fs: pafs.FileSystem, retention: dt.timedelta, now: float | None = None) -> int:
    """Delete the log files that Delta's expired-log rule lets go, less one checkpoint
    interval: everything before the *second* newest checkpoint older than ``retention``.
    Versions from there on stay loadable, older ones are gone for time travel. The one
    interval more is for readers loading the table meanwhile: one that listed the log just
    before the newest checkpoint was written reads the one before it, which must still be
    there. Oldest first, so an interrupted cleanup leaves an unbroken log. Returns how many
    files were deleted."""
    try:
        infos = fs.get_file_info(pafs.FileSelector("_delta_log", allow_not_found=True))
    except FileNotFoundError:
        return 0
    cutoff = (time.time() if now is None else now) - retention.total_seconds()
    expired = [
        int(m.group(1))
        for i in infos
        if (m := _CHECKPOINT_RE.match(i.base_name))
        and i.mtime is not None
        and i.mtime.timestamp() <= cutoff
    ]
    if len(expired) < 2:
        return 0
    keep_from = sorted(expired)[-2]
    doomed = sorted(
        (int(m.group(1)), i.path)
        for i in infos
        if (m := _LOG_FILE_RE.match(i.base_name)) and int(m.group(1)) < keep_from
    )
    for _, path in doomed:
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(path)
    return len(doomed)


# -- on request ----------------------------------------------------------------------------


def compact(store: Store, name: str, target_bytes: int = 128 << 20) -> dict[str, Any]:
    """Rewrite the dataset's small files into files of about ``target_bytes`` (one commit with
    ``dataChange=false``: readers see the same rows, streams nothing new)."""
    if require_int(target_bytes, "target_bytes") < 1:
        raise InvalidRequest(
            f"target_bytes must be positive, got {target_bytes}; give a file size in bytes"
        )
    table = store.open_table(name)
    before = table.version()
    try:
        metrics = table.optimize.compact(
            target_size=target_bytes,
            commit_properties=_recorded("compact"),
            post_commithook_properties=store.commit_hooks,
        )
    except DeltaError as exc:
        raise _failed("compaction", name, exc) from exc
    added, removed = int(metrics.get("numFilesAdded", 0)), int(metrics.get("numFilesRemoved", 0))
    return {
        "version": table.version(),
        "committed": table.version() > before,
        "files_added": added,
        "files_removed": removed,
    }


def restore(store: Store, name: str, version: int) -> dict[str, Any]:
    """Make the dataset's data what it was at ``version``, as a new version (the versions in
    between stay in the history)."""
    if require_int(version, "version") < 0:
        raise InvalidRequest(
            f"version must be >= 0, got {version}; pick one from aqueduct history {name}"
        )
    table = store.open_table(name)
    latest = table.version()
    if version > latest:
        raise VersionNotFound(
            f"dataset {name!r} has no version {version} to restore (the latest is {latest})"
        )
    store.open_table(name, version)  # VersionNotFound, clearly, if the log is gone
    try:
        metrics = table.restore(
            version,
            commit_properties=_recorded("restore"),
            post_commithook_properties=store.commit_hooks,
        )
    except DeltaError as exc:
        raise _failed(f"restore to version {version}", name, exc) from exc
    return {
        "version": table.version(),
        "committed": table.version() > latest,
        "files_restored": int(metrics.get("numRestoredFile", 0)),
        "files_removed": int(metrics.get("numRemovedFile", 0)),
    }


def delete(store: Store, name: str, predicate: str) -> dict[str, Any]:
    """Delete the rows matching ``predicate``, a condition in the one language of every
    filter (:mod:`.predicates`), bound to the dataset's types and handed to Delta Lake's
    delete as SQL with explicit types (:meth:`.binding.Binder.delta_sql`). The deleted rows
    go to the change feed."""
    if not isinstance(predicate, str) or not predicate.strip():
        raise InvalidRequest(
            'delete needs a predicate naming the rows, e.g. "id < 100"; to delete every '
            "row, overwrite the dataset with no rows or drop it"
        )
    condition = Condition.from_text(predicate, f"delete from dataset {name!r} where")
    table = ensure_change_feed(store, name)
    before = table.version()
    sql = condition.to_delta_sql(store.snapshot(name).schema)
    try:
        metrics = table.delete(
            sql,
            commit_properties=_recorded("delete"),
            post_commithook_properties=store.commit_hooks,
        )
    except Exception as exc:  # deltalake raises a plain Exception for a bad cast
        text = delta_text(exc)
        if any(what in str(exc) for what in _PREDICATE_ERRORS):
            raise InvalidRequest(
                f"{condition.label}: Delta Lake could not evaluate it ({text}); write the "
                "predicate in SQL over the dataset's columns, e.g. \"id < 100 AND s = 'x'\""
            ) from exc
        if not isinstance(exc, DeltaError):
            raise
        raise _failed("delete", name, exc) from exc
    return {
        "version": table.version(),
        "committed": table.version() > before,
        "rows_deleted": int(metrics.get("num_deleted_rows", 0)),
    }


def delta_text(exc: BaseException) -> str:
    """Delta Lake's message on one line: without the repeated ``Generic DeltaTable error:
    External error:`` layers and the backtrace frames that some errors carry."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    kept = [ln for ln in lines if ln and not re.match(r"^\d+:", ln)]
    text = " ".join(kept)
    text = re.sub(
        r"(Generic DeltaTable error|External error|Kernel error|Generic error):\s*", "", text
    )
    text = re.sub(r"\s+at \S+:\d+(:\d+)?", "", text)  # frames: at ./nptl/pthread_create.c:442:8
    return text.strip().rstrip(".") or type(exc).__name__


def _recorded(mode: str) -> CommitProperties:
    """The commit's record of what made it (``aqueduct history`` shows Delta's operation)."""
    return CommitProperties(custom_metadata={METADATA_KEY: {"mode": mode}})


def _failed(what: str, name: str, exc: DeltaError) -> Exception:
    error = delta_error(name, exc)
    if isinstance(error, Conflict):
        return Conflict(
            f"the {what} of dataset {name!r} conflicted with a concurrent commit; "
            f"run it again ({delta_text(exc)})"
        )
    if isinstance(error, InternalError):
        return InternalError(
            f"the {what} of dataset {name!r} failed in Delta Lake: {delta_text(exc)}"
        )
    return error
