"""Group commit: concurrent appends to one dataset in one process share a Delta commit, each
writer still told its own outcome; appends that lose to other commits are retried with
jittered backoff, and what cannot be retried is a clear Conflict."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pytest
from delta_store_helpers import stage
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from aqueduct_spark.protocol import CommitResult, Conflict, InvalidRequest, SchemaMismatch
from aqueduct_spark.service import commits, delta_commit, delta_log, group_commit
from aqueduct_spark.service.store import Store

SCHEMA = pa.schema([("id", pa.int64())])


def ids(lo: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(lo, lo + n), pa.int64())})


def all_ids(store: Store, name: str) -> list[int]:
    return sorted(DeltaTable(store.uri(name)).to_pyarrow_table().column("id").to_pylist())


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "root")
    s.create("d", SCHEMA)
    return s


@pytest.fixture
def slow_leader(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first batch's commit takes 0.5 s, so every writer arriving meanwhile queues
    behind it; returns the size of each batch committed."""
    sizes: list[int] = []
    original = group_commit.commit_appends

    def commit_appends(tables: Any, name: str, batch: list[Any]) -> list[Any]:
        sizes.append(len(batch))
        if len(sizes) == 1:
            time.sleep(0.5)
        return original(tables, name, batch)

    monkeypatch.setattr(group_commit, "commit_appends", commit_appends)
    return sizes


def wait_queued(store: Store, name: str, n: int) -> None:
    """Until ``n`` appends wait in the group commit queue of dataset ``name``."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        group = group_commit.GROUPS._groups.get((store.root, name))
        if group is not None and len(group.queue) >= n:
            return
        time.sleep(0.005)
    raise AssertionError(f"{n} appends never queued")


def test_writers_queued_behind_a_commit_share_the_next_one(
    store: Store, slow_leader: list[int]
) -> None:
    n = 8
    staged = [stage(store, "d", ids(k * 10, k + 1)) for k in range(n)]
    results: dict[int, CommitResult] = {}

    def append(k: int) -> None:
        results[k] = store.commit("d", "append", staged[k][0], (), staged[k][1])

    first = threading.Thread(target=append, args=(0,))
    first.start()
    time.sleep(0.2)  # the first one is committing: the rest queue
    with ThreadPoolExecutor(n - 1) as pool:
        list(pool.map(append, range(1, n)))
    first.join()
    assert slow_leader == [1, n - 1]
    assert results[0].version == 1 and {results[k].version for k in range(1, n)} == {2}
    # each writer is told its own rows and files, and all of them are there once
    assert [results[k].rows for k in range(n)] == [k + 1 for k in range(n)]
    assert all(r.committed and r.files == 1 for r in results.values())
    assert all_ids(store, "d") == sorted(i for k in range(n) for i in range(k * 10, k * 11 + 1))
    history = store.history("d")
    assert [(h.version, h.rows_added) for h in history] == [(0, 0), (1, 1), (2, sum(range(2, 9)))]


def test_each_writer_keeps_its_own_app_transaction(store: Store, slow_leader: list[int]) -> None:
    """Exactly-once bookkeeping stays per writer: each writer's (app_id, version) is
    recorded; a writer whose transaction was applied already is told so, alone; two writers
    of one app id never share a commit (Delta allows one txn per app in a commit)."""
    first = stage(store, "d", ids(0, 1))
    store.commit("d", "append", *first[:1], (), first[1], app_id="q2", app_version=5)
    slow_leader.clear()
    plans = [("q0", 1), ("q1", 1), ("q2", 5), ("q0", 2)]  # q2@5 was applied already
    staged = [stage(store, "d", ids(100 + 10 * k, 3)) for k in range(len(plans))]
    results: dict[int, CommitResult] = {}

    def append(k: int) -> None:
        app_id, version = plans[k]
        schema, files = staged[k]
        results[k] = store.commit("d", "append", schema, (), files, app_id, version)

    blocker = stage(store, "d", ids(1000, 1))
    lead = threading.Thread(target=lambda: store.commit("d", "append", blocker[0], (), blocker[1]))
    lead.start()
    time.sleep(0.2)
    with ThreadPoolExecutor(len(plans)) as pool:
        # q0@2 queues after q0@1 (threads would reach the queue in any order)
        first = [pool.submit(append, k) for k in range(3)]
        wait_queued(store, "d", 2)
        last = pool.submit(append, 3)
        for f in [*first, last]:
            f.result()
    lead.join()
    # q2@5 is answered before it queues; q0@2 waits for the batch after q0@1's
    assert slow_leader == [1, 2, 1]
    assert [results[k].committed for k in range(4)] == [True, True, False, True]
    assert results[0].version == results[1].version < results[3].version
    table = DeltaTable(store.uri("d"))
    assert [table.transaction_version(a) for a in ("q0", "q1", "q2")] == [2, 1, 5]
    assert all_ids(store, "d") == [0, 100, 101, 102, 110, 111, 112, 130, 131, 132, 1000]


def test_one_writers_bad_append_fails_it_alone(store: Store, slow_leader: list[int]) -> None:
    done = stage(store, "d", ids(0, 2))
    store.commit("d", "append", done[0], (), done[1])
    slow_leader.clear()
    good = [stage(store, "d", ids(10 * k, 1)) for k in range(1, 4)]
    outcomes: dict[int, Any] = {}

    def append(k: int) -> None:
        schema, files = done if k == 0 else good[k - 1]  # 0 repeats a committed append
        try:
            outcomes[k] = store.commit("d", "append", schema, (), files)
        except Exception as exc:
            outcomes[k] = exc

    blocker = stage(store, "d", ids(1000, 1))
    lead = threading.Thread(target=lambda: store.commit("d", "append", blocker[0], (), blocker[1]))
    lead.start()
    time.sleep(0.2)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(append, range(4)))
    lead.join()
    assert slow_leader == [1, 4]
    assert isinstance(outcomes[0], InvalidRequest) and "already part of" in str(outcomes[0])
    assert all(isinstance(outcomes[k], CommitResult) for k in (1, 2, 3))
    assert all_ids(store, "d") == [0, 1, 10, 20, 30, 1000]


def test_a_lost_version_is_rebased_at_once_then_backed_off_then_conflict(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a local root the service writes the commit file itself, put only if absent: a
    version another writer took is read, the append checked again and put at the next
    version at once; only a run of losses backs off, and six of those are Conflict."""
    waits: list[float] = []
    monkeypatch.setattr(group_commit.time, "sleep", waits.append)
    original = delta_commit.put_if_absent
    taken = {"left": 2}

    def contended(table_dir: str, version: int, body: bytes) -> Any:
        if taken["left"]:  # another writer (deltalake's) takes the version first
            taken["left"] -= 1
            write_deltalake(store.uri("d"), ids(100 + version, 1), mode="append")
        return original(table_dir, version, body)

    monkeypatch.setattr(delta_commit, "put_if_absent", contended)
    schema, files = stage(store, "d", ids(0, 3))
    result = store.commit("d", "append", schema, (), files)
    assert (result.version, result.rows, waits) == (3, 3, [])  # after the two others'
    assert all_ids(store, "d") == [0, 1, 2, 101, 102]
    monkeypatch.setattr(delta_commit, "put_if_absent", lambda *a: None)  # always taken
    schema, files = stage(store, "d", ids(10, 3))
    with pytest.raises(Conflict, match="conflicted with concurrent commits 6 times"):
        store.commit("d", "append", schema, (), files)
    assert len(waits) == 5
    spread = {round(commits.backoff(4), 6) for _ in range(20)}
    assert len(spread) > 10 and max(spread) <= 1.6  # jittered, capped per attempt
    assert delta_log.commit_times(store.filesystem("d")).keys() == {0, 1, 2, 3}


def test_deltalakes_commit_is_retried_with_jittered_backoff_then_conflict(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table with a feature only deltalake writes (here a CHECK constraint) is committed
    by deltalake: a commit it reports lost is retried with backoff, then Conflict."""
    DeltaTable(store.uri("d")).alter.add_constraint({"positive": "id >= 0"})
    waits: list[float] = []
    monkeypatch.setattr(group_commit.time, "sleep", waits.append)
    original = DeltaTable.create_write_transaction
    failures = {"left": 2}

    def flaky(self: DeltaTable, *args: Any, **kw: Any) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise CommitFailedError("Transaction failed: version already exists")
        original(self, *args, **kw)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", flaky)
    schema, files = stage(store, "d", ids(0, 3))
    assert store.commit("d", "append", schema, (), files).rows == 3  # the third try lands
    assert len(waits) == 2 and 0 <= waits[0] <= 0.1 and 0 <= waits[1] <= 0.2
    failures["left"] = 99
    schema, files = stage(store, "d", ids(10, 3))
    with pytest.raises(Conflict, match="conflicted with concurrent commits 6 times"):
        store.commit("d", "append", schema, (), files)
    assert len(waits) == 2 + 5
    assert delta_log.commit_times(store.filesystem("d")).keys() == {0, 1, 2}
    assert all_ids(store, "d") == [0, 1, 2]


def test_a_dataset_dropped_and_created_again_is_seen_afresh(store: Store) -> None:
    """The latest version's handle is kept between commits (read incrementally): a table
    dropped and created again under the name is noticed, not appended to as the old one."""
    schema, files = stage(store, "d", ids(0, 2))
    assert store.commit("d", "append", schema, (), files).version == 1
    store.drop("d")
    other = pa.schema([("name", pa.string())])
    store.create("d", other)
    with pytest.raises(SchemaMismatch, match="does not match the schema"):
        store.check_schema("d", SCHEMA, "append")
    schema, files = stage(store, "d", pa.table({"name": ["a", "b", "c"]}))
    result = store.commit("d", "append", schema, (), files)
    assert (result.version, result.rows) == (1, 3)
    assert DeltaTable(store.uri("d")).to_pyarrow_table().num_rows == 3
