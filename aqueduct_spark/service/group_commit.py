"""Group commit: concurrent appends to one dataset inside a process share one Delta commit.

A Delta commit on an object store costs a few round trips (read the log's tail, a conditional
put of the next version, find the version landed at), and writers of one table take turns
at it: commits per second, not rows, are the ceiling when many small appends arrive at once.
Here the first writer to arrive becomes the *leader* and commits what every writer queued
behind it meanwhile, in one commit; the others wait for that commit's outcome, each told its
own (its rows, the version, or its own error). When the leader is done, the first waiter
still queued leads the next batch. A writer alone commits at once, as before: nothing waits
for company.

Each writer's checks run in its own thread before it queues; what the batch adds to them
(app transactions already applied, files already committed, a schema changed meanwhile) is
decided per writer by the batch's commit function, so one writer's failure never fails
another's append. Two writers with the same ``unique`` key (an app id: Delta allows one
``txn`` action per app in a commit) never share a batch.

``AQUEDUCT_GROUP_COMMIT=0`` in the service's environment turns grouping off (every append
commits on its own: the baseline of ``benchmarks/bench_commits.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from aqueduct_spark.protocol import (
    CommitResult,
    Conflict,
    InternalError,
    InvalidRequest,
    SchemaMismatch,
    StagedFile,
)

from . import delta_log, delta_types, staging
from .tables import Tables, delta_error

T = TypeVar("T")
R = TypeVar("R")

MAX_BATCH = 64
"""Appends one commit takes at most (their files all go into one log entry)."""
METADATA_KEY = "aqueduct"  # our key in each commit's commitInfo
APPEND_ATTEMPTS = 6
_BACKOFF_BASE = 0.05  # seconds; doubled per attempt, capped, fully jittered
_BACKOFF_CAP = 2.0


def enabled() -> bool:
    return os.environ.get("AQUEDUCT_GROUP_COMMIT", "1").strip().lower() not in ("0", "off", "no")


@dataclass(eq=False)
class _Waiter(Generic[T]):
    item: T
    key: Hashable | None
    done: bool = False
    outcome: Any = None


@dataclass(eq=False)
class _Group:
    cond: threading.Condition = field(default_factory=threading.Condition)
    queue: list[_Waiter[Any]] = field(default_factory=list)
    busy: bool = False  # a leader is committing a batch
    users: int = 0


class Groups:
    """One queue per key (a dataset of one root); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[Hashable, _Group] = {}
        self.batches = 0  # commits made (for tests and benchmarks)
        self.grouped = 0  # appends that shared a commit with another

    def submit(
        self,
        key: Hashable,
        item: T,
        commit: Callable[[list[T]], list[R | Exception]],
        unique: Hashable | None = None,
    ) -> R:
        """Queue ``item`` and return its outcome (or raise its error). ``commit(batch)``
        runs in the leader's thread and returns one outcome per item, in order."""
        with self._lock:
            group = self._groups.setdefault(key, _Group())
            group.users += 1
        waiter = _Waiter(item, unique)
        try:
            with group.cond:
                group.queue.append(waiter)
                while not waiter.done:
                    if group.busy:
                        group.cond.wait()
                        continue
                    batch = self._take(group)
                    group.busy = True
                    group.cond.release()
                    try:
                        self._run(batch, commit)
                    finally:
                        group.cond.acquire()
                        group.busy = False
                        group.cond.notify_all()
        finally:
            with self._lock:
                group.users -= 1
                if not group.users:
                    del self._groups[key]
        if isinstance(waiter.outcome, Exception):
            raise waiter.outcome
        result: R = waiter.outcome
        return result

    @staticmethod
    def _take(group: _Group) -> list[_Waiter[Any]]:
        batch: list[_Waiter[Any]] = []
        keys: set[Hashable] = set()
        rest: list[_Waiter[Any]] = []
        for w in group.queue:
            if len(batch) >= MAX_BATCH or (w.key is not None and w.key in keys):
                rest.append(w)  # the next batch
                continue
            batch.append(w)
            if w.key is not None:
                keys.add(w.key)
        group.queue[:] = rest
        return batch

    def _run(self, batch: list[_Waiter[Any]], commit: Callable[[list[Any]], list[Any]]) -> None:
        try:
            outcomes = commit([w.item for w in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"group commit: {len(outcomes)} outcomes for {len(batch)}")
        except Exception as exc:  # every waiter hears it, none waits forever
            outcomes = [exc] * len(batch)
        except BaseException:  # the leader is interrupted: its followers must not wait on
            for w in batch:
                w.outcome = InternalError("the commit this append waited for was interrupted")
                w.done = True
            raise
        for w, outcome in zip(batch, outcomes, strict=True):
            w.outcome = outcome
            w.done = True
        with self._lock:
            self.batches += 1
            if len(batch) > 1:
                self.grouped += len(batch)


GROUPS = Groups()
"""The process's queues: every Store of one root shares them."""


@dataclass(eq=False)
class _Latest:
    lock: threading.RLock = field(default_factory=threading.RLock)
    table: DeltaTable | None = None
    fs: Any = None
    mark: tuple[int, Any] = (-1, None)  # a version and its commit file's (size, mtime)


class Snapshots:
    """The latest version of each dataset to commit on: one Delta table handle per dataset
    kept up to date with ``update_incremental`` (it reads the new commits only; a full load
    replays the log from the last checkpoint, up to 100 commit files: 10-100x slower on an
    object store). Reads take their immutable :meth:`Tables.snapshot` instead; a commit
    needs the handle itself (its app transactions, ``create_write_transaction``).
    A dataset dropped and created again is noticed by its commit file changing, and loaded
    afresh. Thread-safe: a handle is used by one thread at a time, under its lock."""

    def __init__(self, size: int = 64) -> None:
        self._lock = threading.Lock()
        self._size = size
        self._latest: OrderedDict[Hashable, _Latest] = OrderedDict()

    @contextlib.contextmanager
    def table(self, tables: Tables, name: str) -> Iterator[DeltaTable]:
        """The latest version's handle, for use inside the ``with`` block only."""
        key = (tables.root, name)
        with self._lock:
            entry = self._latest.pop(key, None) or _Latest()
            self._latest[key] = entry
            while len(self._latest) > self._size:
                self._latest.popitem(last=False)
        with entry.lock:
            try:
                yield self._refresh(tables, name, entry)
            except BaseException:
                entry.table = None  # whatever broke, the next use loads afresh
                raise

    @staticmethod
    def _refresh(tables: Tables, name: str, entry: _Latest) -> DeltaTable:
        def mark(info: Any) -> Any:
            return (info.size, info.mtime_ns) if info.type == pafs.FileType.File else None

        if entry.table is not None:
            try:
                version, key = entry.mark
                here, after = entry.fs.get_file_info(
                    [delta_log.commit_path(version), delta_log.commit_path(version + 1)]
                )
                if mark(here) == key:  # still the table we loaded
                    if mark(after) is None:
                        return entry.table  # nothing committed since: no listing
                    entry.table.update_incremental()  # lists the log (locally all of it)
                    version = entry.table.version()
                    entry.mark = (
                        version,
                        mark(entry.fs.get_file_info(delta_log.commit_path(version))),
                    )
                    return entry.table
            except (DeltaError, OSError):
                pass
        entry.table = None
        entry.fs = tables.filesystem(name)
        table = tables.open_table(name)
        entry.mark = (
            table.version(),
            mark(entry.fs.get_file_info(delta_log.commit_path(table.version()))),
        )
        entry.table = table
        return table

    def advance(self, tables: Tables, name: str) -> None:
        """After a commit through the handle (inside :meth:`table`): bring it to the version
        committed (deltalake leaves the handle where it was) and offer its snapshot to
        ``tables``, so that neither the next commit nor the next request (``begin``,
        ``describe``, a stream's ``offsets``) lists the log again for this commit."""
        with self._lock:
            entry = self._latest.get((tables.root, name))
        if entry is None or entry.table is None:
            return
        with entry.lock:  # (re-entered: the committing thread holds it)
            table = self._refresh(tables, name, entry)
            tables.offer(name, table)

    def filesystem(self, tables: Tables, name: str) -> Any:
        """The dataset's filesystem, as :meth:`Tables.filesystem` (kept: making one for an
        object store costs about 10 ms)."""
        with self._lock:
            entry = self._latest.get((tables.root, name))
        return entry.fs if entry is not None and entry.fs is not None else tables.filesystem(name)


SNAPSHOTS = Snapshots()


def check_partitioning(
    name: str, table_parts: tuple[str, ...], partition_by: Sequence[str]
) -> None:
    if tuple(partition_by) not in ((), table_parts):
        raise SchemaMismatch(
            f"dataset {name!r} is partitioned by {list(table_parts)}, the write by "
            f"{list(partition_by)}; partitioning cannot change: write with "
            f"partition_by={list(table_parts)}, or drop and recreate the dataset"
        )


def append(
    tables: Tables,
    name: str,
    given: pa.Schema,
    partition_by: Sequence[str],
    files: Sequence[StagedFile],
    fs: Any,
    app_id: str | None,
    app_version: int | None,
    check_schema: Callable[[Tables, str, pa.Schema, str], pa.Schema],
) -> CommitResult | None:
    """Append ``files`` to the existing dataset ``name`` in the next group commit: checked
    here, in the writer's thread, then queued. None: the append takes the ordinary path
    (its columns need a protocol feature the table lacks)."""
    with SNAPSHOTS.table(tables, name) as table:
        done = already_applied(table, app_id, app_version)
        parts = tuple(table.metadata().partition_columns)
        features = table.protocol().reader_features or []
    if done is not None:
        return done
    check_partitioning(name, parts, partition_by)
    write_schema = check_schema(tables, name, given, "append")
    if delta_types.needs_timestamp_ntz(write_schema) and "timestampNtz" not in features:
        return None
    adds = staging.verify_staged(name, fs, files, write_schema, parts, set())
    return GROUPS.submit(
        (tables.root, name),
        Append(adds, write_schema, parts, app_id, app_version),
        lambda b: commit_appends(tables, name, b),
        app_id,
    )


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...) of a commit that lost to others:
    "full jitter", so writers that collided spread out instead of colliding again."""
    return random.uniform(0, min(_BACKOFF_CAP, _BACKOFF_BASE * 2**attempt))


@dataclass(frozen=True)
class Append:
    """One writer's checked append, waiting for a group commit."""

    adds: list[AddAction]
    schema: pa.Schema
    parts: tuple[str, ...]
    app_id: str | None
    app_version: int | None


def commit_appends(
    tables: Tables, name: str, batch: list[Append]
) -> list[CommitResult | Exception]:
    """Commit the appends of several writers as one Delta commit; each gets its own outcome.

    Per writer: an app transaction already applied is ``committed=False`` and left out, a
    file already committed or a schema changed meanwhile fails that writer alone. A commit
    that loses to concurrent ones (beyond what deltalake's own retries rebase) is retried
    with jittered backoff; after the last attempt every writer left gets :class:`Conflict`.
    """
    out: dict[int, CommitResult | Exception] = {}
    group_id = uuid.uuid4().hex
    failure: CommitFailedError | None = None
    for attempt in range(APPEND_ATTEMPTS):
        if failure is not None:
            time.sleep(backoff(attempt))
        with SNAPSHOTS.table(tables, name) as table:
            fs = SNAPSHOTS.filesystem(tables, name)
            status = _commit_batch(tables, name, table, fs, batch, out, group_id)
        if isinstance(status, CommitFailedError):
            failure = status  # an append rebases onto anything: reload, check again, retry
            continue
        break
    conflict = Conflict(
        f"the append to dataset {name!r} conflicted with concurrent commits "
        f"{APPEND_ATTEMPTS} times ({failure}); its staged files are kept: retry the commit"
    )
    return [out.get(i, conflict) for i in range(len(batch))]


def _commit_batch(
    tables: Tables,
    name: str,
    table: DeltaTable,
    fs: Any,
    batch: list[Append],
    out: dict[int, CommitResult | Exception],
    group_id: str,
) -> CommitFailedError | None:
    """One attempt of :func:`commit_appends`: outcomes go into ``out``; a commit that lost
    is returned, to be retried."""
    current = pa.schema(table.schema().to_arrow())
    parts = tuple(table.metadata().partition_columns)
    active = {unquote(p) for p in pa.table(table.get_add_actions()).column("path").to_pylist()}
    live = []
    for i, append in enumerate(batch):
        if i in out:
            continue
        done = already_applied(table, append.app_id, append.app_version)
        if done is not None:
            out[i] = done
        elif append.schema != current or append.parts != parts:
            out[i] = Conflict(
                f"the schema of dataset {name!r} changed while the append waited to "
                "commit; its staged files are kept: check the schema, stage again"
            )
        elif any(a.path in active for a in append.adds):
            out[i] = InvalidRequest(
                f"staged files of this append are already part of dataset {name!r}: it was "
                "committed before (give a commit an app_id and app_version to make repeating "
                "it safe)"
            )
        else:
            live.append(i)
    if not live:
        return None
    adds: list[AddAction | RemoveAction] = [a for i in live for a in batch[i].adds]
    meta = {**commit_meta("append", batch[live[0]].adds, group_id), "writers": len(live)}
    for i in live[1:]:
        own = commit_meta("append", batch[i].adds)
        meta.update({k: meta[k] + own[k] for k in ("rows", "bytes", "files")})
        meta["txns"] = sorted({*meta["txns"], *own["txns"]})
    meta["data_change"] = bool(adds)
    txns = [
        Transaction(a.app_id, a.app_version)
        for a in (batch[i] for i in live)
        if a.app_id is not None and a.app_version is not None
    ]
    before = table.version()
    try:
        table.create_write_transaction(
            adds,
            mode="append",
            schema=DeltaSchema.from_arrow(current),
            partition_by=list(parts),
            commit_properties=CommitProperties(
                custom_metadata={METADATA_KEY: meta}, app_transactions=txns or None
            ),
            post_commithook_properties=tables.commit_hooks,
        )
    except CommitFailedError as exc:
        return exc
    except DeltaError as exc:
        error = delta_error(name, exc)
        out.update((i, error) for i in live)
        return None
    version = find_commit(tables, name, before, group_id, fs)
    SNAPSHOTS.advance(tables, name)
    for i in live:
        own = commit_meta("append", batch[i].adds, group_id)
        out[i] = CommitResult(version, own["rows"], own["bytes"], own["files"], True)
    return None


def find_commit(tables: Tables, name: str, before: int, commit_id: str, fs: Any = None) -> int:
    """The version our commit landed at (after deltalake's retries, maybe much later): the
    commits after ``before`` are read in turn (usually the first is ours)."""
    fs = fs or tables.filesystem(name)
    version = before + 1
    while actions := delta_log.read_log(fs, version):
        meta = delta_log.commit_info(actions).get(METADATA_KEY)
        if isinstance(meta, dict) and meta.get("commit_id") == commit_id:
            return version
        version += 1
    raise InternalError(f"the commit to dataset {name!r} succeeded but is not in its log")


def already_applied(
    table: DeltaTable, app_id: str | None, app_version: int | None
) -> CommitResult | None:
    if app_id is None or app_version is None:
        return None
    last = table.transaction_version(app_id)
    if last is not None and last >= app_version:
        return CommitResult(table.version(), 0, 0, 0, False)
    return None


def commit_meta(mode: str, adds: Sequence[AddAction], commit_id: str = "") -> dict[str, Any]:
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
