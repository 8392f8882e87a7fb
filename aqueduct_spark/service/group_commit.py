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

import json
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from aqueduct_spark.protocol import (
    CommitResult,
    Conflict,
    DatasetError,
    InternalError,
    InvalidRequest,
    SchemaMismatch,
    StagedFile,
)

from . import constraints, delta_commit, delta_log, delta_types, log_tail, staging
from .tables import LatestState, Tables, delta_error

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
    with tables.latest_state(name) as state:
        assert state.tail is not None
        done = tail_applied(state, app_id, app_version)
        parts = state.tail.partition_by
        features = state.tail.protocol.get("readerFeatures") or []
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
    checked: set[constraints.Rules] = field(default_factory=set, compare=False)
    """The constraints its rows were found to satisfy (a rebase checks new ones only)."""


def commit_appends(
    tables: Tables, name: str, batch: list[Append]
) -> list[CommitResult | Exception]:
    """Commit the appends of several writers as one Delta commit; each gets its own outcome.

    Per writer: an app transaction already applied is ``committed=False`` and left out, a
    file already committed or a schema changed meanwhile fails that writer alone. A commit
    that loses to concurrent ones (beyond the immediate rebases: :data:`REBASES`) is retried
    with jittered backoff; after the last attempt every writer left gets :class:`Conflict`.
    """
    out: dict[int, CommitResult | Exception] = {}
    group_id = uuid.uuid4().hex
    failure: CommitFailedError | None = None
    for attempt in range(APPEND_ATTEMPTS):
        if failure is not None:
            time.sleep(backoff(attempt))
        with tables.latest_state(name, fresh=True) as state:
            status = _commit_batch(tables, name, state, batch, out, group_id)
        if isinstance(status, CommitFailedError):
            failure = status  # an append rebases onto anything: reload, check again, retry
            continue
        break
    conflict = Conflict(
        f"the append to dataset {name!r} conflicted with concurrent commits "
        f"{APPEND_ATTEMPTS} times ({failure}); its staged files are kept: retry the commit"
    )
    return [out.get(i, conflict) for i in range(len(batch))]


REBASES = 15
"""Commits won by others that one attempt rebases onto at once (as deltalake's default
retries), checking each writer again, before it backs off."""


def _commit_batch(
    tables: Tables,
    name: str,
    state: LatestState,
    batch: list[Append],
    out: dict[int, CommitResult | Exception],
    group_id: str,
) -> CommitFailedError | None:
    """One attempt of :func:`commit_appends` (under the dataset's kept state, its tail at
    the latest version): outcomes go into ``out``; a commit that lost is returned, to be
    retried."""
    tail = state.tail
    assert tail is not None
    fs = tables.filesystem(name)
    put = delta_commit.putter(tables, name) if delta_commit.blocker(tail) is None else None
    own = put is not None
    for _ in range(REBASES if own else 1):
        live = _check(name, state, batch, out, fs)
        if not live:
            return None
        adds: list[AddAction] = [a for i in live for a in batch[i].adds]
        meta = {**commit_meta("append", batch[live[0]].adds, group_id), "writers": len(live)}
        for i in live[1:]:
            mine = commit_meta("append", batch[i].adds)
            meta.update({k: meta[k] + mine[k] for k in ("rows", "bytes", "files")})
            meta["txns"] = sorted({*meta["txns"], *mine["txns"]})
        meta["data_change"] = bool(adds)
        txns = [
            (a.app_id, a.app_version)
            for a in (batch[i] for i in live)
            if a.app_id is not None and a.app_version is not None
        ]
        if put is not None:
            version = tail.version + 1
            actions = delta_commit.actions(tail, adds, txns, meta, METADATA_KEY)
            key = put(version, delta_commit.encode(actions))
            if key is None:  # another writer won this version: read it, check again
                try:
                    log_tail.advance(tail, fs)
                except (log_tail.Reload, OSError, ValueError, KeyError, TypeError) as exc:
                    state.tail = None  # the log moved far: load it, then try again
                    return CommitFailedError(f"Transaction failed: the log moved on ({exc})")
                blocked = delta_commit.blocker(tail)
                if blocked is not None:  # a concurrent commit added what only deltalake writes
                    return CommitFailedError(f"Transaction failed: the table now has {blocked}")
                continue  # the next round checks every writer against the new version
            tail.apply(version, key, actions)
            delta_commit.after_commit(
                tables.uri(name),
                tables.delta_options(),
                tail.configuration,
                version,
                tables.commit_hooks,
                checkpoint=True,
            )
        else:
            result = _deltalake_commit(tables, name, state, [*adds], txns, meta, group_id)
            if not isinstance(result, int):
                if isinstance(result, CommitFailedError):
                    return result
                out.update((i, result) for i in live)
                return None
            version = result
        for i in live:
            mine = commit_meta("append", batch[i].adds, group_id)
            out[i] = CommitResult(version, mine["rows"], mine["bytes"], mine["files"], True)
        return None
    return CommitFailedError(
        f"Transaction failed: {REBASES} versions in a row were taken by other writers"
    )


def _check(
    name: str,
    state: LatestState,
    batch: list[Append],
    out: dict[int, CommitResult | Exception],
    fs: Any,
) -> list[int]:
    """The writers of ``batch`` still to commit against the latest version (the state's
    tail); the outcome of each other one goes into ``out``."""
    tail = state.tail
    assert tail is not None
    rules = constraints.rules(tail.configuration, tail.metadata["schemaString"])
    live = []
    for i, append in enumerate(batch):
        if i in out:
            continue
        done = tail_applied(state, append.app_id, append.app_version)
        if done is not None:
            out[i] = done
        elif append.schema != tail.schema or append.parts != tail.partition_by:
            out[i] = Conflict(
                f"the schema of dataset {name!r} changed while the append waited to "
                "commit; its staged files are kept: check the schema, stage again"
            )
        elif any(a.path in tail.live for a in append.adds):
            out[i] = InvalidRequest(
                f"staged files of this append are already part of dataset {name!r}: it was "
                "committed before (give a commit an app_id and app_version to make repeating "
                "it safe)"
            )
        elif rules and rules not in append.checked:
            try:  # the table's constraints as of this version: each row must satisfy them
                constraints.check(name, fs, append.adds, tail.schema, rules)
                append.checked.add(rules)
                live.append(i)
            except InvalidRequest as exc:
                out[i] = exc
        else:
            live.append(i)
    return live


def _deltalake_commit(
    tables: Tables,
    name: str,
    state: LatestState,
    adds: list[AddAction | RemoveAction],
    txns: list[tuple[str, int]],
    meta: dict[str, Any],
    group_id: str,
) -> int | CommitFailedError | DatasetError:
    """The append committed by deltalake (an object store, or a table whose features only
    deltalake writes): the version it landed at, or why not. The dataset's state is let go
    while deltalake commits (round trips to the store): the other writers' checks and the
    reads of the dataset go on meanwhile, and the writers arriving queue for the next
    group commit (this one is the only commit of the dataset the process makes)."""
    tail, table = state.tail, state.table
    assert tail is not None and table is not None
    if table.version() < tail.version:
        table.load_as_version(tail.version)  # the commits since (listed after its version)
    before, configuration = tail.version, tail.configuration
    state.lock.release()
    try:
        table.create_write_transaction(
            adds,
            mode="append",
            schema=DeltaSchema.from_arrow(tail.schema),
            partition_by=list(tail.partition_by),
            commit_properties=CommitProperties(
                custom_metadata={METADATA_KEY: meta},
                app_transactions=[Transaction(a, v) for a, v in txns] or None,
            ),
            post_commithook_properties=delta_commit.hooks(tables.commit_hooks),
        )
    except CommitFailedError as exc:
        healing = delta_error(name, exc)
        return exc if isinstance(healing, Conflict) else healing  # Conflict: retried
    except DeltaError as exc:
        return delta_error(name, exc)
    finally:
        state.lock.acquire()
    fs = tables.filesystem(name)
    version = find_commit(tables, name, before, group_id, fs)
    try:
        if state.tail is not None:
            log_tail.advance(state.tail, fs)  # the new commit, as the next writer's base
    except (log_tail.Reload, OSError, ValueError, KeyError, TypeError):
        state.tail = None  # loaded afresh by the next use
    delta_commit.after_commit(
        tables.uri(name),
        tables.delta_options(),
        configuration,
        version,
        tables.commit_hooks,
        checkpoint=False,
    )
    return version


def _commit_id(actions: Sequence[dict[str, Any]]) -> Any:
    meta = delta_log.commit_info(actions).get(METADATA_KEY)
    return meta.get("commit_id") if isinstance(meta, dict) else None


def find_commit(tables: Tables, name: str, before: int, commit_id: str, fs: Any = None) -> int:
    """The version our commit landed at (after deltalake's retries, maybe much later): the
    commits after ``before`` are read in turn (usually the first is ours)."""
    fs = fs or tables.filesystem(name)
    version = before + 1
    while actions := delta_log.read_log(fs, version):
        if _commit_id(actions) == commit_id:
            return version
        version += 1
    raise InternalError(f"the commit to dataset {name!r} succeeded but is not in its log")


def tail_applied(
    state: LatestState, app_id: str | None, app_version: int | None
) -> CommitResult | None:
    """As :func:`already_applied`, from the kept state's tail (the latest version)."""
    if app_id is None or app_version is None:
        return None
    assert state.tail is not None
    last = state.tail.txn_version(app_id, state.table)
    if last is not None and last >= app_version:
        return CommitResult(state.tail.version, 0, 0, 0, False)
    return None


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
