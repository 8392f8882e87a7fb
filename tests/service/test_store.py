"""The Delta store: datasets, names, writes (append, overwrite, create), transactions, cleanup."""

from __future__ import annotations

import datetime as dt
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from delta_store_helpers import data_files, read, stage, write
from deltalake import DeltaTable, write_deltalake

from aqueduct_spark.protocol import (
    Conflict,
    DataLoss,
    DatasetError,
    DatasetExists,
    DatasetNotFound,
    InvalidRequest,
    SchemaMismatch,
    StagedFile,
    VersionNotFound,
)
from aqueduct_spark.service import delta_commit, group_commit
from aqueduct_spark.service.store import Store

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string()), ("p", pa.string())])


def rows(ids: range, p: str | None = "a") -> pa.Table:
    return pa.table(
        {"id": list(ids), "s": [f"v{i}" for i in ids], "p": [p] * len(ids)}, schema=SCHEMA
    )


@pytest.fixture(params=["local", "file-uri"])
def store(request: pytest.FixtureRequest, tmp_path) -> Store:
    """A store on a local directory, and one through deltalake's object store (file://)."""
    root = tmp_path / "root"
    return Store(str(root) if request.param == "local" else root.as_uri())


@pytest.fixture
def local(tmp_path) -> Store:
    return Store(str(tmp_path / "root"))


def table_dir(store: Store, name: str) -> str:
    return os.path.join(store._local_root or "", name)


def ids_of(store: Store, name: str, **kw) -> list[int]:
    return sorted(read(store, name, columns=["id"], **kw)["id"].to_pylist())


# -- datasets and names --------------------------------------------------------------------------


def test_create_describe_list_drop(store: Store) -> None:
    info = store.create("b", SCHEMA, partition_by=["p"])
    assert (info.name, info.version, info.rows, info.files, info.bytes) == ("b", 0, 0, 0, 0)
    assert info.schema == SCHEMA and info.partition_by == ("p",)
    assert info.created is not None and info.created == info.updated
    store.create("a", pa.schema([("x", pa.int32())]))
    os.makedirs(os.path.join(table_dir(store, "not-a-table"), "junk"))
    assert [i.name for i in store.list()] == ["a", "b"]
    assert store.exists("a") and not store.exists("nope")
    assert DeltaTable(table_dir(store, "b")).version() == 0
    assert store.plan("b").splits == []

    store.drop("b")
    assert not store.exists("b") and not os.path.exists(table_dir(store, "b"))
    assert [i.name for i in store.list()] == ["a"]
    for call in (store.describe, store.drop, store.latest_version, store.history):
        with pytest.raises(DatasetNotFound, match="'b'"):
            call("b")
    with pytest.raises(DatasetNotFound):
        store.plan("b")


def test_create_existing(local: Store) -> None:
    local.create("d", SCHEMA)
    with pytest.raises(DatasetExists, match="already exists") as e:
        local.create("d", SCHEMA)
    assert e.value.code == "ALREADY_EXISTS" and isinstance(e.value, DatasetError)
    assert local.create("d", SCHEMA.remove_metadata(), exist_ok=True).version == 0
    with pytest.raises(SchemaMismatch, match="id: dataset type int64 vs given type string"):
        local.create(
            "d",
            pa.schema([("id", pa.string()), ("s", pa.string()), ("p", pa.string())]),
            exist_ok=True,
        )
    with pytest.raises(SchemaMismatch, match="partition"):
        local.create("d", SCHEMA, partition_by=["p"], exist_ok=True)


@pytest.mark.parametrize(
    "name", ["../etc", "a/b", ".hidden", "", "x" * 129, "a..b", "-a", "a b", "a\\b", "_x", "é"]
)
def test_invalid_names(local: Store, name: str) -> None:
    for call in (
        lambda: local.validate_name(name),
        lambda: local.create(name, SCHEMA),
        lambda: local.describe(name),
        lambda: local.exists(name),
        lambda: local.drop(name),
        lambda: write(local, name, rows(range(3))),
    ):
        with pytest.raises(InvalidRequest, match="letters, digits") as e:
            call()
        assert e.value.code == "INVALID_REQUEST"
    assert os.listdir(local.root) == []


@pytest.mark.parametrize("name", ["a", "A-1_b.c", "0", "x" * 128])
def test_valid_names(local: Store, name: str) -> None:
    assert local.validate_name(name) == name
    local.create(name, SCHEMA)
    assert os.path.isdir(os.path.join(local.root, name, "_delta_log"))


def test_invalid_name_type(local: Store) -> None:
    with pytest.raises(InvalidRequest):
        local.validate_name(None)  # type: ignore[arg-type]


# -- writes --------------------------------------------------------------------------------------


def test_append_overwrite_and_create_when_missing(store: Store) -> None:
    r = write(store, "d", rows(range(0, 100)))  # missing: the append creates it
    assert (r.version, r.rows, r.committed) == (0, 100, True) and r.files == 1
    assert r.bytes == store.describe("d").bytes
    r = write(store, "d", rows(range(100, 150)))
    assert (r.version, r.rows) == (1, 50)
    assert ids_of(store, "d") == list(range(150))
    r = write(store, "d", rows(range(500, 510)), mode="overwrite")
    assert (r.version, r.rows) == (2, 10)
    assert ids_of(store, "d") == list(range(500, 510))
    info = store.describe("d")
    assert (info.version, info.rows, info.files) == (2, 10, 1)
    direct = DeltaTable(table_dir(store, "d")).to_pyarrow_table()
    assert direct.sort_by("id").equals(read(store, "d").sort_by("id"))

    r = write(store, "o", rows(range(7)), mode="overwrite")  # overwrite also creates
    assert (r.version, r.rows) == (0, 7)
    r = write(store, "c", rows(range(3)), mode="create")
    assert (r.version, r.rows) == (0, 3)
    with pytest.raises(DatasetExists):
        write(store, "c", rows(range(3)), mode="create")
    schema, staged = stage(store, "c2", rows(range(3)), mode="create")
    write(store, "c2", rows(range(1)))
    with pytest.raises(DatasetExists):  # created by someone else between stage and commit
        store.commit("c2", "create", schema, (), staged)


def test_overwrite_schema(local: Store) -> None:
    write(local, "d", rows(range(10)), partition_by=["p"])
    other = pa.table({"id": [1, 2], "p": ["x", "y"], "extra": [1.5, None]})
    with pytest.raises(SchemaMismatch, match="overwrite_schema=True"):
        write(local, "d", other, mode="overwrite", partition_by=["p"])
    write(local, "d", other, mode="overwrite", partition_by=["p"], overwrite_schema=True)
    info = local.describe("d")
    assert info.schema.names == ["id", "p", "extra"] and info.rows == 2
    assert read(local, "d").sort_by("id").to_pylist() == other.to_pylist()
    with pytest.raises(SchemaMismatch, match="partition columns"):
        write(local, "d", pa.table({"id": [1]}), mode="overwrite", overwrite_schema=True)
    # the first timestamp without time zone needs a protocol upgrade deltalake does not make
    naive = pa.table({"id": [3], "p": ["z"], "k": [dt.datetime(2020, 1, 1)]})
    write(local, "d", naive, mode="overwrite", partition_by=["p"], overwrite_schema=True)
    assert DeltaTable(table_dir(local, "d")).to_pyarrow_table().to_pylist() == naive.to_pylist()
    assert read(local, "d").to_pylist() == naive.to_pylist()


def test_partitioning_cannot_change(local: Store) -> None:
    """deltalake would commit such an overwrite and leave a table nobody can open."""
    write(local, "d", rows(range(10)), partition_by=["p"])
    for mode in ("append", "overwrite"):
        with pytest.raises(SchemaMismatch, match="partitioned by \\['p'\\]"):
            write(local, "d", rows(range(3)), mode=mode, partition_by=["s"], overwrite_schema=True)
    with pytest.raises(SchemaMismatch, match="stage with partition_by=\\['p'\\]"):
        write(local, "d", rows(range(3)))  # staged unpartitioned
    assert local.describe("d").version == 0 and len(read(local, "d")) == 10
    # the refused commits kept their staged files (a commit may be retried); clean them up
    assert len(local.cleanup_orphans("d", older_than=dt.timedelta(0))) == 1 + 3 + 3
    assert len(data_files(table_dir(local, "d"))) == 2  # p=a/ and its one file
    write(local, "d", rows(range(3), p="b"), partition_by=["p"])
    assert local.describe("d").rows == 13


def test_schema_mismatch_messages(local: Store) -> None:
    write(local, "d", rows(range(3)))
    bad = pa.schema([("id", pa.int32()), ("s", pa.string()), ("q", pa.string())])
    with pytest.raises(SchemaMismatch) as e:
        local.check_schema("d", bad, "append")
    msg = str(e.value)
    assert "id: dataset type int64 vs given type int32" in msg
    assert "p: string in the dataset, missing from the data" in msg
    assert "q: not in the dataset" in msg and "Cast or rename" in msg
    assert e.value.code == "SCHEMA_MISMATCH"
    with pytest.raises(SchemaMismatch, match="id: dataset type int64 vs given type int32"):
        local.commit("d", "append", bad, (), [])
    # large/view types, nullability, metadata and column order are compatible
    ok = pa.schema(
        [
            pa.field("p", pa.large_string(), nullable=False),
            ("s", pa.string_view()),
            pa.field("id", pa.int64(), nullable=False),
        ],
        metadata={b"k": b"v"},
    )
    assert local.check_schema("d", ok, "append") == SCHEMA
    with pytest.raises(DatasetExists):
        local.check_schema("d", SCHEMA, "create")
    with pytest.raises(InvalidRequest, match="write mode"):
        local.check_schema("d", SCHEMA, "upsert")
    assert local.check_schema(None, ok, "append").field("p").type == pa.string()


def test_not_null_columns(local: Store) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("s", pa.string())])
    local.create("d", schema)
    w = local.open_stage("d", "t1", "0", local.check_schema("d", schema, "append"))
    with pytest.raises(SchemaMismatch, match=r"'id' of dataset 'd' is NOT NULL.*1 null"):
        w.write(pa.record_batch({"id": [1, None], "s": ["a", "b"]}))
    w.write(pa.record_batch({"id": [1, 2], "s": ["a", None]}))  # nullable input, no nulls: fine
    local.commit("d", "append", schema, (), w.close())
    assert read(local, "d").to_pylist() == [{"id": 1, "s": "a"}, {"id": 2, "s": None}]


def test_parallel_writers_one_commit(store: Store) -> None:
    """8 tasks stage concurrently (in threads), the driver commits all of them at once."""
    store.create("d", SCHEMA, partition_by=["p"])
    schema = store.check_schema("d", SCHEMA, "append")
    txn = uuid.uuid4().hex

    def task(k: int) -> list[StagedFile]:
        w = store.open_stage("d", txn, f"task-{k}", schema, ["p"], row_group_bytes=16 << 10)
        for j in range(5):
            base = k * 5000 + j * 1000
            w.write(rows(range(base, base + 1000), p=["a", "b", None][j % 3]).to_batches()[0])
        return w.close()

    with ThreadPoolExecutor(8) as pool:
        staged = [f for files in pool.map(task, range(8)) for f in files]
    assert store.describe("d").version == 0  # nothing visible before the commit
    assert len(staged) == 8 * 3 and all(txn in f.path for f in staged)
    r = store.commit("d", "append", schema, ["p"], staged)
    assert (r.version, r.rows, r.files) == (1, 40_000, 24)
    assert ids_of(store, "d") == list(range(40_000))
    assert store.describe("d").rows == 40_000


def test_abort_leaves_no_trace(store: Store) -> None:
    write(store, "d", rows(range(10)), partition_by=["p"])
    before = data_files(table_dir(store, "d"))
    txn = uuid.uuid4().hex
    schema, staged = stage(
        store, "d", rows(range(10, 40), p="new dir"), partition_by=["p"], txn=txn
    )
    _, staged2 = stage(store, "d", rows(range(40, 50), p="a"), partition_by=["p"], txn=txn)
    # a writer never closed (its task died): its file is found by the transaction id in its
    # name; an object store shows no file before the upload completes
    dead = store.open_stage("d", txn, "dead", schema, ["p"], row_group_bytes=1)
    dead.write(rows(range(50, 60), p="c").to_batches()[0])
    assert store.abort_txn("d", txn, staged) == (3 if store._native else 2)
    dead.abort()
    assert store.abort_txn("d", txn, staged + staged2) == 0  # idempotent
    assert data_files(table_dir(store, "d")) == before
    assert store.latest_version("d") == 0 and ids_of(store, "d") == list(range(10))
    with pytest.raises(InvalidRequest, match="Stage the data again"):
        store.commit("d", "append", schema, ["p"], staged)
    with pytest.raises(InvalidRequest, match="not of transaction"):
        store.abort_txn("d", "other", staged)


def test_abort_of_a_create_leaves_no_directory(store: Store) -> None:
    txn = uuid.uuid4().hex
    stage(store, "new", rows(range(10), p="x y"), partition_by=["p"], txn=txn, tasks=2)
    assert not store.exists("new")
    assert store.abort_txn("new", txn) == 2
    assert not os.path.exists(table_dir(store, "new"))
    assert store.abort_txn("new", txn) == 0
    writer = store.open_stage("new", txn, "0", SCHEMA)
    writer.write(rows(range(5)))
    writer.abort()
    writer.abort()
    assert not os.path.exists(table_dir(store, "new"))
    with pytest.raises(InvalidRequest, match="aborted"):
        writer.write(rows(range(5)))


def test_abort_never_deletes_committed_files(local: Store) -> None:
    txn = uuid.uuid4().hex
    schema, staged = stage(local, "d", rows(range(10)), txn=txn)
    local.commit("d", "append", schema, (), staged)
    assert local.abort_txn("d", txn, staged) == 0  # e.g. the commit's answer was lost
    assert ids_of(local, "d") == list(range(10))


def test_idempotent_commit(store: Store) -> None:
    r = write(store, "d", rows(range(10)), app_id="job-1", app_version=1)
    assert r.committed and store.transaction_version("d", "job-1") == 1
    schema, again = stage(store, "d", rows(range(10)))
    r = store.commit("d", "append", schema, (), again, app_id="job-1", app_version=1)
    assert not r.committed and (r.version, r.rows, r.files) == (0, 0, 0)
    r = store.commit("d", "append", schema, (), again, app_id="job-1", app_version=0)
    assert not r.committed
    assert store.describe("d").rows == 10 and store.latest_version("d") == 0
    assert store.transaction_version("d", "other") is None
    r = store.commit("d", "append", schema, (), again, app_id="job-1", app_version=2)
    assert r.committed and r.version == 1 and store.transaction_version("d", "job-1") == 2
    assert store.describe("d").rows == 20
    with pytest.raises(InvalidRequest, match="already part of dataset"):
        store.commit("d", "append", schema, (), again)  # a plain repeat would duplicate rows
    with pytest.raises(InvalidRequest, match="together"):
        store.commit("d", "append", schema, (), again, app_id="job-1")


def test_concurrent_identical_idempotent_commits(local: Store) -> None:
    local.create("d", SCHEMA)
    schema, staged = stage(local, "d", rows(range(10)))
    barrier = threading.Barrier(4)

    def commit(_: int) -> bool:
        barrier.wait()
        return local.commit("d", "append", schema, (), staged, app_id="a", app_version=7).committed

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(commit, range(4)))
    assert results.count(True) == 1 and local.describe("d").rows == 10


@pytest.mark.parametrize("trial", range(2))
def test_concurrent_create_race(local: Store, trial: int) -> None:
    """Writers appending to a missing dataset at once: one creates it, the others append."""
    n = 6
    barrier = threading.Barrier(n)
    staged = [stage(local, "race", rows(range(k * 100, k * 100 + 100))) for k in range(n)]

    def commit(k: int) -> int:
        barrier.wait()
        return local.commit("race", "append", staged[k][0], (), staged[k][1]).version

    with ThreadPoolExecutor(n) as pool:
        versions = sorted(pool.map(commit, range(n)))
    # appends that wait together share a commit (group commit): versions repeat, none skipped
    assert versions[0] == 0 and sorted(set(versions)) == list(range(versions[-1] + 1))
    history = local.history("race")
    assert [h.version for h in history] == sorted(set(versions))
    assert [h.operation for h in history].count("CREATE TABLE") == 1
    assert ids_of(local, "race") == list(range(n * 100))


def test_concurrent_create_mode_race(local: Store) -> None:
    n = 4
    barrier = threading.Barrier(n)
    staged = [stage(local, "race", rows(range(k, k + 1)), mode="create") for k in range(n)]

    def commit(k: int) -> str:
        barrier.wait()
        try:
            local.commit("race", "create", staged[k][0], (), staged[k][1])
            return "created"
        except DatasetExists:
            return "exists"

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(commit, range(n)))
    assert results.count("created") == 1 and local.describe("race").rows == 1


def test_overwrite_conflict_is_reported(local: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from deltalake.exceptions import CommitFailedError

    write(local, "d", rows(range(3)))
    schema, staged = stage(local, "d", rows(range(3, 6)))

    def fail(*args, **kwargs):
        raise CommitFailedError("a concurrent transaction deleted data this operation read")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", fail)  # deltalake's path
    monkeypatch.setattr(delta_commit, "put_if_absent", lambda *a: None)  # every version taken
    monkeypatch.setattr(group_commit.time, "sleep", lambda s: None)
    with pytest.raises(Conflict, match="retry the commit") as e:
        local.commit("d", "overwrite", schema, (), staged)  # the service's own
    assert e.value.code == "CONFLICT"
    with pytest.raises(Conflict, match="retry the commit"):
        local.commit("d", "overwrite", schema, (), staged, replaces=0)  # began before: deltalake
    with pytest.raises(Conflict):
        local.commit("d", "append", schema, (), staged)  # after our retries


def test_commit_checks_staged_files(local: Store, tmp_path) -> None:
    write(local, "d", rows(range(3)))
    schema, staged = stage(local, "d", rows(range(3, 6)))
    f = staged[0]
    bad_paths = ["../x/part-t-0-" + "0" * 32 + ".parquet", "_delta_log/x.parquet", "/abs.parquet"]
    for path in bad_paths:
        with pytest.raises(InvalidRequest, match="invalid data file path"):
            local.commit("d", "append", schema, (), [StagedFile(**{**f.to_dict(), "path": path})])
    with pytest.raises(InvalidRequest, match="not the name of a file staged"):
        local.commit(
            "d", "append", schema, (), [StagedFile(**{**f.to_dict(), "path": "x.parquet"})]
        )
    with pytest.raises(InvalidRequest, match="listed twice"):
        local.commit("d", "append", schema, (), [f, f])
    # staged for another dataset
    _, other = stage(local, "e", rows(range(3)))
    with pytest.raises(InvalidRequest, match="does not exist in dataset 'd'"):
        local.commit("d", "append", schema, (), other)
    # written with another schema
    _, narrow = stage(local, "d", pa.table({"id": [1]}), mode="overwrite", overwrite_schema=True)
    with pytest.raises(SchemaMismatch, match="stage it again"):
        local.commit("d", "append", schema, (), narrow)
    # tampered statistics are recomputed from the file
    lying = StagedFile(**{**f.to_dict(), "stats": '{"numRecords": 1000}', "rows": 1000})
    r = local.commit("d", "append", schema, (), [lying])
    assert r.rows == 3 and local.describe("d").rows == 6


def test_dicts_are_accepted_for_staged_files(local: Store) -> None:
    schema, staged = stage(local, "d", rows(range(4)))
    r = local.commit("d", "append", schema, (), [f.to_dict() for f in staged])
    assert r.rows == 4
    with pytest.raises(InvalidRequest, match="missing fields"):
        local.commit("d", "append", schema, (), [{"path": "x"}])


# -- versions ------------------------------------------------------------------------------------


def test_time_travel(store: Store) -> None:
    write(store, "d", rows(range(0, 10)))
    write(store, "d", rows(range(10, 30)))
    write(store, "d", rows(range(100, 105)), mode="overwrite")
    assert ids_of(store, "d", version=0) == list(range(10))
    assert ids_of(store, "d", version=1) == list(range(30))
    assert ids_of(store, "d") == list(range(100, 105))
    assert store.describe("d", version=1).rows == 30
    plan0 = store.plan("d", version=0)
    assert plan0.version == 0 and all(s.version == 0 for s in plan0.splits)

    history = store.history("d")
    for h in history:
        expected = max(v.version for v in history if v.timestamp <= h.timestamp)
        assert store.describe("d", timestamp=h.timestamp).version == expected
    naive = history[0].timestamp.replace(tzinfo=None)
    assert store.describe("d", timestamp=naive).version == 0  # naive means UTC
    future = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    assert store.describe("d", timestamp=future).version == 2
    with pytest.raises(VersionNotFound, match="no version at") as e:
        store.plan("d", timestamp=history[0].timestamp - dt.timedelta(seconds=1))
    assert e.value.code == "VERSION_NOT_FOUND"
    with pytest.raises(VersionNotFound, match="no version 99"):
        store.describe("d", version=99)
    with pytest.raises(InvalidRequest, match=">= 0"):
        store.plan("d", version=-1)
    with pytest.raises(InvalidRequest, match="not both"):
        store.plan("d", version=1, timestamp=future)
    with pytest.raises(InvalidRequest, match="integer"):
        store.plan("d", version="1")  # type: ignore[arg-type]


def test_history(local: Store) -> None:
    write(local, "d", rows(range(10)))
    write(local, "d", rows(range(10, 30)), tasks=2)
    write(local, "d", rows(range(5)), mode="overwrite")
    # a commit made by another writer: what it added comes from its add actions
    write_deltalake(table_dir(local, "d"), rows(range(1000, 1007)), mode="append")
    h = local.history("d")
    assert [v.version for v in h] == [0, 1, 2, 3]
    assert [v.rows_added for v in h] == [10, 20, 5, 7]
    assert [v.files_added for v in h] == [1, 2, 1, 1]
    assert all(v.data_change and v.bytes_added > 0 for v in h)
    assert h[0].operation == "CREATE TABLE" and h[1].operation == "WRITE"
    assert [v.timestamp for v in h] == sorted(v.timestamp for v in h)
    assert [v.version for v in local.history("d", since_version=2)] == [2, 3]
    assert local.history("d", since_version=9) == []
    local.vacuum("d", retention=dt.timedelta(0))
    tail = local.history("d", since_version=4)
    assert [v.operation for v in tail] == ["VACUUM START", "VACUUM END"]
    assert not any(v.data_change or v.rows_added for v in tail)


# -- cleanup -------------------------------------------------------------------------------------


def age(table: str, paths: list[str], hours: float) -> None:
    t = (dt.datetime.now() - dt.timedelta(hours=hours)).timestamp()
    for p in paths:
        os.utime(os.path.join(table, p), (t, t))


def test_cleanup_orphans(store: Store) -> None:
    table = table_dir(store, "d")
    write(store, "d", rows(range(10)), partition_by=["p"])
    committed = [p for p in data_files(table) if p.endswith(".parquet")]
    _, old = stage(store, "d", rows(range(10), p="gone"), partition_by=["p"])
    _, young = stage(store, "d", rows(range(10)), partition_by=["p"])
    age(table, committed + [f.path for f in old], hours=3)
    assert store.cleanup_orphans("d", dry_run=True) == [f.path for f in old]
    assert os.path.exists(os.path.join(table, old[0].path))
    assert store.cleanup_orphans("d", older_than=dt.timedelta(hours=1)) == [f.path for f in old]
    left = data_files(table)
    assert not os.path.exists(os.path.join(table, "p=gone"))
    assert set(committed) | {young[0].path} <= set(left)
    assert store.cleanup_orphans("d", older_than=dt.timedelta(0)) == [young[0].path]
    assert ids_of(store, "d") == list(range(10))
    with pytest.raises(DatasetNotFound):
        store.cleanup_orphans("nope")


def test_cleanup_orphans_of_a_create_that_never_committed(local: Store) -> None:
    _, staged = stage(local, "new", rows(range(10)), tasks=2)
    age(table_dir(local, "new"), [f.path for f in staged], hours=2)
    assert sorted(local.cleanup_orphans("new")) == sorted(f.path for f in staged)
    assert not os.path.exists(table_dir(local, "new"))


def test_vacuum(local: Store) -> None:
    table = table_dir(local, "d")
    write(local, "d", rows(range(10), p="x y/z"), partition_by=["p"])
    first = [p for p in data_files(table) if p.endswith(".parquet")]
    write(local, "d", rows(range(20, 25)), mode="overwrite", partition_by=["p"])
    _, orphan = stage(local, "d", rows(range(3)), partition_by=["p"])
    assert local.vacuum("d") == []  # default retention: 7 days
    assert sorted(local.vacuum("d", retention=dt.timedelta(0), dry_run=True)) == sorted(
        [*first, orphan[0].path]
    )
    assert os.path.exists(os.path.join(table, first[0]))
    removed = local.vacuum("d", retention=dt.timedelta(0))
    assert sorted(removed) == sorted([*first, orphan[0].path])
    assert not any(os.path.exists(os.path.join(table, p)) for p in removed)
    assert not os.path.exists(os.path.join(table, "p=x%20y%2Fz"))  # emptied directories go too
    assert ids_of(local, "d") == list(range(20, 25))
    with pytest.raises(DataLoss):  # version 0's file is gone now
        read(local, "d", version=0)
    with pytest.raises(InvalidRequest):
        local.vacuum("d", retention=dt.timedelta(hours=-1))


def test_data_loss_when_a_committed_file_is_deleted(store: Store) -> None:
    write(store, "d", rows(range(100)), partition_by=["p"])
    plan = store.plan("d")
    os.remove(os.path.join(table_dir(store, "d"), plan.splits[0].path))
    with pytest.raises(DataLoss, match="missing") as e:
        store.scan(plan.splits[0])
    assert e.value.code == "DATA_LOSS"
    with pytest.raises(DataLoss):  # planning reads footers of large files
        store.plan("d", split_bytes=1)
