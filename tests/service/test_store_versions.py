"""Many small versions (issue 18, items 1 and 2): plans pack small files into tasks by bytes,
a task is scanned in one call, a stream's range of versions is listed from those versions'
commits alone, and the latest table state is kept and brought up to date incrementally."""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from delta_store_helpers import write
from deltalake import DeltaTable

from aqueduct_spark.protocol import DataLoss, DatasetNotFound, InvalidRequest, VersionNotFound
from aqueduct_spark.service import delta_log, tables
from aqueduct_spark.service.store import Store
from benchmarks.versions_data import build_versions

ROWS = 50  # per version
x = ds.field("id")


def versions(store: Store, name: str, count: int) -> pa.Table:
    """A dataset of ``count`` versions after version 0, one small file of ROWS rows each."""
    data = pa.table({"id": pa.array(range(count * ROWS), pa.int64())})
    data = data.append_column("s", pa.array([f"r{i}" for i in range(data.num_rows)]))
    build_versions(
        os.path.join(store.root, name),
        data.schema,
        [data.slice(i * ROWS, ROWS) for i in range(count)],
    )
    return data


def ids(batches: object) -> list[int]:
    return [i for b in batches for i in b["id"].to_pylist()]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, pa.Table]:
    store = Store(str(tmp_path_factory.mktemp("versions")))
    return store, versions(store, "many", 300)


def test_small_files_are_packed_by_bytes(many: tuple[Store, pa.Table]) -> None:
    store, data = many
    plan = store.plan("many", split_bytes=64 << 10, open_cost=4 << 10)
    sizes = {sp.bytes for sp in plan.splits}
    assert len(plan.splits) == 300 and plan.rows == data.num_rows
    per_task = (64 << 10) // (max(sizes) + (4 << 10))
    assert per_task >= 5  # the files are small: several share a task
    assert plan.tasks is not None
    # every split in exactly one task, tasks consecutive in the plan's order
    assert [i for t in plan.tasks for i in t] == list(range(300))
    for task in plan.tasks:
        cost = sum(plan.splits[i].bytes + (4 << 10) for i in task)
        assert cost <= 64 << 10 or len(task) == 1
    assert len(plan.tasks) <= -(-300 // per_task)
    # the default open cost (64 KiB) against the default target (128 MiB): one task of all
    assert [len(t) for t in store.plan("many").tasks or ()] == [300]
    # 1 MiB a file: 3 tasks' worth, shared evenly (not 127, 127 and 46)
    assert [len(t) for t in store.plan("many", open_cost=1 << 20).tasks or ()] == [100] * 3
    # an open cost as large as the target: one file a task, as before tasks existed
    assert len(store.plan("many", split_bytes=1 << 20, open_cost=1 << 20).tasks or ()) == 300


def test_a_small_table_is_spread_evenly_over_min_tasks(many: tuple[Store, pa.Table]) -> None:
    store, _ = many
    plan = store.plan("many", min_tasks=4)  # as Spark spreads a small table over its cores
    assert [len(t) for t in plan.tasks or ()] == [75] * 4
    assert [i for t in plan.tasks or () for i in t] == list(range(300))
    # the target still caps a task: more tasks than min_tasks when the table needs them
    capped = store.plan("many", min_tasks=2, split_bytes=64 << 10, open_cost=4 << 10)
    assert len(capped.tasks or ()) > 2
    # never more tasks than splits
    assert len(store.plan("many", min_tasks=10_000).tasks or ()) == 300
    with pytest.raises(InvalidRequest, match="min_tasks must be at least 1, got 0"):
        store.plan("many", min_tasks=0)


def test_a_task_reads_every_row_once_in_merged_batches(many: tuple[Store, pa.Table]) -> None:
    store, data = many
    plan = store.plan("many", split_bytes=64 << 10, open_cost=4 << 10)
    seen: list[int] = []
    for task in plan.tasks or ():
        batches = list(store.scan([plan.splits[i] for i in task], batch_rows=4 * ROWS))
        rows = sum(b.num_rows for b in batches)
        assert rows == sum(plan.splits[i].rows for i in task)
        # small files' batches are merged up to batch_rows, not one per file
        assert len(batches) == -(-rows // (4 * ROWS))
        assert all(b.schema == data.schema for b in batches)
        seen += ids(batches)
    assert sorted(seen) == list(range(data.num_rows))  # every row once


def test_filters_still_skip_files(many: tuple[Store, pa.Table]) -> None:
    store, _ = many
    flt = (x >= 1000) & (x < 1100)  # rows of versions 21 and 22 only
    plan = store.plan("many", filter=flt, open_cost=0)
    assert sorted(sp.path for sp in plan.splits) == ["part-000021.parquet", "part-000022.parquet"]
    assert plan.tasks == [(0, 1)]
    got = ids(store.scan(plan.splits, columns=["id"], filter=flt))
    assert sorted(got) == list(range(1000, 1100))


def test_large_files_split_by_row_groups_beside_small_ones(tmp_path) -> None:
    store = Store(str(tmp_path))
    big = pa.table({"id": pa.array(range(100_000), pa.int64())})
    write(store, "mixed", big, row_group_bytes=64 << 10, batch_rows=5000)
    for k in range(10):
        start = 100_000 + k * ROWS
        write(store, "mixed", pa.table({"id": pa.array(range(start, start + ROWS), pa.int64())}))
    (big_path,) = {sp.path for sp in store.plan("mixed").splits if sp.rows == 100_000}
    groups = pq.read_metadata(os.path.join(tmp_path, "mixed", big_path)).num_row_groups
    assert groups >= 4
    plan = store.plan("mixed", split_bytes=200 << 10, open_cost=1 << 10)
    ranges = [sp.row_groups for sp in plan.splits if sp.path == big_path]
    assert len(ranges) >= 2
    assert [g for r in ranges for g in r or ()] == list(range(groups))  # each group once
    small = [i for i, sp in enumerate(plan.splits) if sp.path != big_path]
    assert len(small) == 10
    assert plan.tasks is not None and len(plan.tasks) < len(plan.splits)
    holding_small = [t for t in plan.tasks if set(t) & set(small)]
    assert len(holding_small) <= 2  # the small ones packed together (beside a range maybe)
    got = ids(
        b for task in plan.tasks for b in store.scan([plan.splits[i] for i in task], columns=["id"])
    )
    assert sorted(got) == list(range(100_000 + 10 * ROWS)) and len(got) == len(set(got))


def test_a_scan_of_several_splits_checks_every_split(many: tuple[Store, pa.Table]) -> None:
    store, _ = many
    splits = store.plan("many").splits[:3]
    bad = splits[1].to_dict() | {"path": "../elsewhere.parquet"}
    with pytest.raises(InvalidRequest):
        store.scan([splits[0], bad, splits[2]])
    with pytest.raises(InvalidRequest, match="1 to"):
        store.scan([])


def test_a_range_of_versions_is_read_from_its_commits_alone(
    many: tuple[Store, pa.Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = many
    one_by_one = {v: store.version_files("many", v) for v in range(100, 200)}
    opened: list[object] = []
    read: list[int] = []
    real_read = delta_log.read_log
    monkeypatch.setattr(tables.Tables, "open_table", lambda *a, **k: opened.append(a))
    monkeypatch.setattr(delta_log, "read_log", lambda fs, v: read.append(v) or real_read(fs, v))
    ranged = store.versions_files("many", 100, 199)
    assert ranged == one_by_one
    assert opened == []  # no table load: the commit files of those versions only
    assert sorted(read) == list(range(100, 200))
    with pytest.raises(VersionNotFound):
        store.versions_files("many", 290, 301)
    with pytest.raises(InvalidRequest, match="to_version"):
        store.versions_files("many", 5, 4)


def test_a_range_with_vacuumed_files_or_cleaned_log(tmp_path) -> None:
    store = Store(str(tmp_path))
    versions(store, "gone", 6)
    os.remove(os.path.join(tmp_path, "gone", "part-000003.parquet"))
    with pytest.raises(DataLoss, match="version 3"):
        store.versions_files("gone", 1, 6)
    missing: dict[int, list[str]] = {}
    files = store.versions_files("gone", 1, 6, missing)
    assert missing == {3: ["part-000003.parquet"]} and len(files[3]) == 1
    os.remove(os.path.join(tmp_path, "gone", "_delta_log", f"{2:020d}.json"))
    with pytest.raises(DataLoss, match="no longer in its log"):
        store.versions_files("gone", 1, 6)


def test_partitioned_ranges_take_typed_values_from_one_snapshot(tmp_path) -> None:
    store = Store(str(tmp_path))
    for k in range(4):
        part = pa.table({"id": [k], "p": [f"p{k % 2}"], "d": pa.array([k], pa.int32())})
        write(store, "parts", part, partition_by=["p", "d"])
    ranged = store.versions_files("parts", 0, 3)
    assert ranged == {v: store.version_files("parts", v) for v in range(4)}
    assert [sp.partition for sp in ranged[3]] == [{"p": "p1", "d": 3}]


def state(store: Store, name: str) -> tables._State:
    return store._states[name]


def test_the_latest_version_is_exact_with_other_processes_committing(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """latest_version answers from the kept state (no listing of the log), yet sees every
    commit another process made, and a dataset dropped and created again by one."""
    store, other = Store(str(tmp_path)), Store(str(tmp_path))
    versions(store, "t", 5)
    assert store.snapshot("t").version == 5  # the state is warm

    def no_listing(*args: object) -> None:
        raise AssertionError("the log was listed")

    monkeypatch.setattr(tables.os, "listdir", no_listing)
    monkeypatch.setattr(tables.delta_log, "commit_times", no_listing)
    assert store.latest_version("t") == 5
    for expected in (6, 7):
        write(other, "t", pa.table({"id": [expected], "s": ["x"]}))
        assert store.latest_version("t") == expected
    assert state(store, "t").loads == 1
    monkeypatch.undo()
    other.drop("t")
    versions(other, "t", 2)
    assert store.latest_version("t") == 2


def test_the_latest_state_is_kept_and_updated_incrementally(tmp_path) -> None:
    store = Store(str(tmp_path))
    versions(store, "t", 20)
    assert store.describe("t").rows == 20 * ROWS
    assert (state(store, "t").loads, state(store, "t").updates) == (1, 0)
    store.describe("t")
    store.plan("t")
    assert (state(store, "t").loads, state(store, "t").updates) == (1, 0)  # nothing new
    write(store, "t", pa.table({"id": [-1], "s": ["new"]}))
    info = store.describe("t")
    assert (info.version, info.rows) == (21, 20 * ROWS + 1)
    # the state came from the handle the commit was made with: no listing of the log
    assert (state(store, "t").loads, state(store, "t").updates) == (1, 0)
    write(Store(str(tmp_path)), "t", pa.table({"id": [-2], "s": ["other"]}))  # another process
    info = store.describe("t")
    assert (info.version, info.rows) == (22, 20 * ROWS + 2)
    assert (state(store, "t").loads, state(store, "t").updates) == (1, 1)  # only the new commit
    assert store.describe("t", version=5).rows == 5 * ROWS  # time travel beside it
    assert store.plan("t", version=5).rows == 5 * ROWS
    # dropped and created again: the cached state is of another table and is not used
    store.drop("t")
    versions(store, "t", 3)
    assert (store.describe("t").version, store.describe("t").rows) == (3, 3 * ROWS)
    other = Store(str(tmp_path))  # another process drops and re-creates it meanwhile
    other.drop("t")
    versions(other, "t", 4)
    assert (store.describe("t").version, store.describe("t").rows) == (4, 4 * ROWS)
    assert store.table_id("t") == other.table_id("t")


def test_the_state_is_shared_safely_by_threads(tmp_path) -> None:
    store = Store(str(tmp_path))
    versions(store, "t", 5)
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                info = store.describe("t")
                assert info.rows == 5 * ROWS + (info.version - 5)
                plan = store.plan("t")
                assert plan.rows == 5 * ROWS + (plan.version - 5)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for k in range(8):
            write(store, "t", pa.table({"id": [-k], "s": ["w"]}))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert store.describe("t").version == 13


def test_the_cache_is_bounded(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tables, "_STATE_CACHE_SIZE", 2)
    monkeypatch.setattr(tables, "_SNAPSHOT_CACHE_SIZE", 2)
    store = Store(str(tmp_path))
    for name in ("a", "b", "c"):
        versions(store, name, 3)
        store.describe(name)
        for v in (1, 2):
            store.describe(name, version=v)
    assert list(store._states) == ["b", "c"]
    assert len(store._snapshots) == 2


def test_scanning_many_versions_loads_no_table_per_version(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(str(tmp_path))
    versions(store, "s", 200)
    loads: list[object] = []
    real = tables.Tables.open_table

    def counted(self: tables.Tables, *a: object, **k: object) -> object:
        loads.append(a)
        return real(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(tables.Tables, "open_table", counted)
    splits = [sp for files in store.versions_files("s", 0, 200).values() for sp in files]
    got = ids(store.scan(splits))
    assert sorted(got) == list(range(200 * ROWS))
    # the schema of each version from its commit file (walking back to version 0's
    # metadata once), not from a table loaded at each of the 200 versions
    assert len(loads) <= 1


def test_pinned_schemas_follow_metadata_changes(tmp_path) -> None:
    store = Store(str(tmp_path))
    write(store, "evolve", pa.table({"id": [1]}))
    write(store, "evolve", pa.table({"id": [2]}))
    wide = pa.table({"id": [3], "extra": ["x"]})
    write(store, "evolve", wide, mode="overwrite", overwrite_schema=True)
    write(store, "evolve", pa.table({"id": [4], "extra": ["y"]}))
    fresh = Store(str(tmp_path))
    for v in (3, 0, 2, 1):  # out of order: later versions walk back to cached ones
        table = fresh.open_table("evolve", v)
        want = (pa.schema(table.schema().to_arrow()), tuple(table.metadata().partition_columns))
        assert fresh.pinned("evolve", v) == want
    assert fresh.pinned("evolve", 3)[0].names == ["id", "extra"]
    assert fresh.pinned("evolve", 1)[0].names == ["id"]


def test_exists_and_latest_version_without_listing_the_log(tmp_path) -> None:
    store = Store(str(tmp_path))
    assert not store.exists("t")
    versions(store, "t", 12)
    assert store.exists("t") and store.latest_version("t") == 12
    DeltaTable(os.path.join(tmp_path, "t")).create_checkpoint()
    for v in range(0, 5):  # the log cleaned up below a checkpoint: still a table
        os.remove(os.path.join(tmp_path, "t", "_delta_log", f"{v:020d}.json"))
    assert store.exists("t") and store.latest_version("t") == 12
    store.drop("t")
    assert not store.exists("t")
    with pytest.raises(DatasetNotFound):
        store.latest_version("t")
