"""Issue 31: appends on a local root are committed by the service itself (put-if-absent of the
next commit file, :mod:`aqueduct_spark.service.delta_commit`) from the log's kept tail
(:mod:`aqueduct_spark.service.log_tail`): no listing of ``_delta_log``, so the cost of an
append does not grow with the log. The commits must stay Delta: other readers read them,
other writers (other processes, deltalake) race them safely, checkpoints still come every
interval, and tables with features only deltalake writes still go through deltalake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import polars as pl
import pyarrow as pa
import pytest
from delta_store_helpers import stage, write
from deltalake import DeltaTable, Field, Schema, TableFeatures, write_deltalake

from aqueduct_spark.protocol import Conflict, InvalidRequest
from aqueduct_spark.service import (
    constraints,
    delta_commit,
    delta_log,
    log_tail,
    maintenance,
    tables,
)
from aqueduct_spark.service.store import Store

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string())])


def rows(lo: int, n: int, p: str = "a") -> pa.Table:
    return pa.table({"id": pa.array(range(lo, lo + n), pa.int64()), "p": [p] * n}, schema=SCHEMA)


def log_entry(store: Store, name: str, version: int) -> list[dict[str, Any]]:
    return delta_log.read_log(store.filesystem(name), version)


def ids_of(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


def test_an_append_is_a_delta_commit_other_readers_read(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("t", SCHEMA, partition_by=["p"])
    awkward = ["a b", "100%", "é/ü", "x=y&z#?"]  # spaces, escapes, unicode, a slash
    for k, p in enumerate(awkward):
        write(store, "t", rows(10 * k, 3, p), partition_by=["p"], app_id="job", app_version=k)
    actions = log_entry(store, "t", 4)
    info = delta_log.commit_info(actions)
    assert info["operation"] == "WRITE" and info["engineInfo"].startswith("aqueduct-spark/")
    assert info["aqueduct"]["rows"] == 3 and info["readVersion"] == 3
    assert {"txn": {"appId": "job", "version": 3, "lastUpdated": info["timestamp"]}} in actions
    # deltalake (delta-kernel) and Polars read the same rows, partition values included
    table = DeltaTable(store.uri("t"))
    assert table.version() == 4 and table.transaction_version("job") == 3
    got = table.to_pyarrow_table()
    assert ids_of(got) == [0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32]
    assert sorted(set(got.column("p").to_pylist())) == sorted(awkward)
    polars = pl.read_delta(store.uri("t"))
    assert sorted(polars["id"].to_list()) == ids_of(got)
    assert dict(zip(polars["id"], polars["p"], strict=True))[30] == "x=y&z#?"
    # each add's path, decoded, is a file that exists (the log spells it as deltalake does)
    for add in (a["add"] for a in actions if "add" in a):
        assert "%" in add["path"] or add["path"].isascii()
        assert os.path.isfile(os.path.join(store.uri("t"), unquote(add["path"])))
    assert table.history(1)[0]["operation"] == "WRITE"


def test_the_append_path_lists_no_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """begin (schema check, snapshot), stage, commit, describe and a stream's offsets, over
    and over: after the first load nothing calls what lists ``_delta_log`` (a table load,
    deltalake's commit or update, the log listing of commit times)."""
    store = Store(tmp_path)
    store.create("t", SCHEMA)
    write(store, "t", rows(0, 2))
    store.describe("t")
    store.history("t", since_version=1)
    calls: list[str] = []

    def counted(what: str, real: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            calls.append(what)
            return real(*a, **k)

        return call

    monkeypatch.setattr(tables.Tables, "open_table", counted("load", tables.Tables.open_table))
    for method in ("update_incremental", "load_as_version", "create_write_transaction"):
        monkeypatch.setattr(DeltaTable, method, counted(method, getattr(DeltaTable, method)))
    monkeypatch.setattr(
        tables.delta_log, "commit_times", counted("listing", delta_log.commit_times)
    )
    for k in range(1, 21):
        store.check_schema("t", SCHEMA, "append")
        assert store.snapshot("t").version == k
        write(store, "t", rows(2 * k, 2), app_id="stream", app_version=k)
        info = store.describe("t")
        assert (info.version, info.rows, info.files) == (k + 1, 2 * k + 2, k + 1)
        assert [v.version for v in store.history("t", since_version=k)] == [k, k + 1]
    assert calls == []


def test_several_processes_append_to_one_local_root(tmp_path: Path) -> None:
    """Writers in two processes race for each next version: each append lands once, the
    versions follow one another, every app transaction is recorded."""
    store = Store(tmp_path)
    store.create("t", SCHEMA)
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import pyarrow as pa
        from delta_store_helpers import write
        from aqueduct_spark.service.store import Store
        w = int(sys.argv[1])
        store = Store({str(tmp_path)!r})
        for k in range(10):
            data = pa.table({{"id": [w * 100 + k], "p": ["a"]}})
            write(store, "t", data, app_id=f"writer-{{w}}", app_version=k)
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(w)]) for w in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    table = DeltaTable(store.uri("t"))
    assert table.version() == 20
    assert ids_of(table.to_pyarrow_table()) == sorted(
        w * 100 + k for w in range(2) for k in range(10)
    )
    assert [table.transaction_version(f"writer-{w}") for w in range(2)] == [9, 9]
    assert sorted(delta_log.commit_times(store.filesystem("t"))) == list(range(21))
    assert store.snapshot("t").version == 20  # this process sees them all


def test_a_request_looks_at_the_log_once_and_its_commit_still_sees_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside ``one_look`` (a begin's or a commit's request in the service) the exists,
    schema and snapshot checks bring the kept tail forward once (on an object store each
    look is three stats, two requests each); a commit in it still looks for itself, so an
    append another process committed meanwhile is kept and the next version taken."""
    a, b = Store(tmp_path), Store(tmp_path)  # two processes' views of one root
    a.create("t", SCHEMA)
    write(a, "t", rows(0, 2))
    looks: list[int] = []
    real = log_tail.advance
    monkeypatch.setattr(log_tail, "advance", lambda tail, fs: looks.append(1) or real(tail, fs))
    with a.one_look():
        assert a.exists("t")
        a.check_schema("t", SCHEMA, "append")
        assert a.snapshot("t").version == 1
        assert len(looks) == 1  # once, not three times
        write(b, "t", rows(2, 2))  # version 2, through the other process
        assert a.snapshot("t").version == 1  # this request's look stands
        assert write(a, "t", rows(4, 2)).version == 3  # its commit found version 2
    assert a.snapshot("t").version == 3  # a new request looks again
    table = DeltaTable(a.uri("t"))
    assert table.version() == 3 and ids_of(table.to_pyarrow_table()) == list(range(6))


def test_an_object_stores_stats_go_out_at_once() -> None:
    """The tail's look is three stats; on an object store (deltalake's filesystem stats one
    path after another, each a LIST and a HEAD) they go out together: one wait, not three."""
    import threading

    import pyarrow.fs as pafs

    together = threading.Barrier(3, timeout=10)  # passed only by three stats at once

    def get_file_info(self: Any, paths: list[str]) -> list[pafs.FileInfo]:
        together.wait()
        return [pafs.FileInfo(p, pafs.FileType.NotFound) for p in paths]

    def unused(*_: Any) -> Any:
        raise NotImplementedError

    methods: dict[str, Any] = dict.fromkeys(pafs.FileSystemHandler.__abstractmethods__, unused)
    store = type("Store", (pafs.FileSystemHandler,), {**methods, "get_file_info": get_file_info})
    paths = ["_delta_log/00000000000000000007.json", "_delta_log/00000000000000000008.json"]
    infos = log_tail.stats(pafs.PyFileSystem(store()), [*paths, log_tail.LAST_CHECKPOINT])
    assert [i.path for i in infos] == [*paths, log_tail.LAST_CHECKPOINT]  # in order


def test_checkpoints_come_every_interval(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("t", SCHEMA)
    DeltaTable(store.uri("t")).alter.set_table_properties({"delta.checkpointInterval": "5"})
    for k in range(12):  # versions 2..13
        write(store, "t", rows(k, 1))
    delta_commit.wait_checkpoints()
    log_dir = tmp_path / "t" / "_delta_log"
    made = sorted(int(f.name[:20]) for f in log_dir.glob("*.checkpoint.parquet"))
    assert made == [4, 9]  # deltalake's rule: after version v when (v + 1) % interval == 0
    assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] == 9
    for v in range(0, 9):  # a reader needs only the checkpoint and the commits after it
        (log_dir / f"{v:020d}.json").unlink()
    assert ids_of(DeltaTable(store.uri("t")).to_pyarrow_table()) == list(range(12))
    quiet = Store(tmp_path)  # with maintenance on, checkpoints are maintenance's
    quiet.commit_hooks = maintenance.NO_HOOKS
    for k in range(5):
        write(quiet, "t", rows(100 + k, 1))
    delta_commit.wait_checkpoints()
    assert sorted(int(f.name[:20]) for f in log_dir.glob("*.checkpoint.parquet")) == [4, 9]


def test_tables_with_features_only_deltalake_writes_use_its_commit(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("t", SCHEMA)
    DeltaTable(store.uri("t")).alter.add_constraint({"positive": "id >= 0"})
    write(store, "t", rows(0, 2))
    info = delta_log.commit_info(log_entry(store, "t", 2))
    assert info["engineInfo"].startswith("delta-rs") and info["aqueduct"]["rows"] == 2

    def tail(protocol: dict[str, Any], config: dict[str, str] | None = None, **meta: Any) -> Any:
        schema = {
            "type": "struct",
            "fields": [{"name": "x", "type": "long", "nullable": True, "metadata": meta}],
        }
        md = {"id": "i", "schemaString": json.dumps(schema), "configuration": config or {}}
        return log_tail.Tail(0, None, protocol, md, pa.schema([]), {}, 0)

    ok = tail({"minReaderVersion": 1, "minWriterVersion": 4})
    assert delta_commit.blocker(ok) is None
    features = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["timestampNtz"]}
    assert (
        delta_commit.blocker(tail({**features, "writerFeatures": ["timestampNtz", "appendOnly"]}))
        is None
    )
    assert "rowTracking" in str(
        delta_commit.blocker(tail({**features, "writerFeatures": ["rowTracking"]}))
    )
    assert delta_commit.blocker(tail({"minReaderVersion": 1, "minWriterVersion": 8})) is not None
    generated = tail(
        {"minReaderVersion": 1, "minWriterVersion": 4}, **{"delta.generationExpression": "1"}
    )
    assert "generationExpression" in str(delta_commit.blocker(generated))
    mapped = tail(
        {"minReaderVersion": 2, "minWriterVersion": 5}, {"delta.columnMapping.mode": "name"}
    )
    assert delta_commit.blocker(mapped) == "column mapping"


def test_a_tail_the_log_moved_far_from_is_loaded_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer commits many versions, checkpoints and cleans up the log behind it:
    the kept tail cannot be read forward and is loaded again; the next append lands after
    the other writer's last version, never in a gap the cleanup left."""
    store = Store(tmp_path)
    store.create("t", SCHEMA)
    write(store, "t", rows(0, 1))
    assert store.snapshot("t").version == 1
    for k in range(12):  # versions 2..13 by deltalake
        write_deltalake(store.uri("t"), rows(100 + k, 1), mode="append")
    DeltaTable(store.uri("t")).create_checkpoint()
    for v in range(1, 13):  # cleaned up: version 2 (the next for our tail) is gone
        os.remove(tmp_path / "t" / "_delta_log" / f"{v:020d}.json")
    assert write(store, "t", rows(50, 1)).version == 14
    monkeypatch.setattr(log_tail, "RELOAD_GAP", 3)
    for k in range(6):
        write_deltalake(store.uri("t"), rows(200 + k, 1), mode="append")
    DeltaTable(store.uri("t")).create_checkpoint()  # at 20, far past 14
    assert write(store, "t", rows(60, 1)).version == 21
    assert len(ids_of(DeltaTable(store.uri("t")).to_pyarrow_table())) == 1 + 12 + 1 + 6 + 1


def test_a_repeated_commit_of_the_same_files_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("t", SCHEMA)
    schema, files = stage(store, "t", rows(0, 3))
    assert store.commit("t", "append", schema, (), files).version == 1
    with pytest.raises(Exception, match="already part of dataset"):
        store.commit("t", "append", schema, (), files)
    assert store.describe("t").rows == 3


def test_overwrites_of_a_stream_in_complete_mode_load_no_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An overwrite that began at the latest version (a complete-mode micro-batch) is
    committed from the kept tail: its files replace every live one, a new schema comes in a
    metaData action, and nothing loads the table; a blind append that takes the version
    first is kept (WriteSerializable), as on deltalake's path."""
    store = Store(tmp_path)
    store.create("t", SCHEMA)
    write(store, "t", rows(0, 3))
    store.snapshot("t")
    loads: list[object] = []
    real = tables.Tables.open_table
    monkeypatch.setattr(
        tables.Tables, "open_table", lambda self, *a, **k: loads.append(a) or real(self, *a, **k)
    )
    for k in range(3):
        began = store.snapshot("t").version
        schema, files = stage(store, "t", rows(100 * k, 2), mode="overwrite")
        result = store.commit(
            "t", "overwrite", schema, (), files, app_id="q", app_version=k, replaces=began
        )
        assert result.version == began + 1
        assert ids_of(DeltaTable(store.uri("t")).to_pyarrow_table()) == [100 * k, 100 * k + 1]
    wide = pa.table({"id": pa.array([7], pa.int64()), "p": ["a"], "extra": [1.5]})
    schema, files = stage(store, "t", wide, mode="overwrite", overwrite_schema=True)
    store.commit("t", "overwrite", schema, (), files, overwrite_schema=True, replaces=4)
    assert loads == []
    table = DeltaTable(store.uri("t"))
    assert table.schema().to_arrow().names == ["id", "p", "extra"]
    assert table.to_pyarrow_table().column("extra").to_pylist() == [1.5]
    assert table.transaction_version("q") == 2
    # a blind append takes the version first: read, kept, the overwrite lands after it
    original = delta_commit.put_if_absent
    taken = {"left": 1}

    def contended(table_dir: str, version: int, body: bytes) -> Any:
        if taken["left"]:
            taken["left"] -= 1
            write_deltalake(store.uri("t"), wide.replace_schema_metadata(None), mode="append")
        return original(table_dir, version, body)

    monkeypatch.setattr(delta_commit, "put_if_absent", contended)
    again = pa.table({"id": pa.array([8], pa.int64()), "p": ["b"], "extra": [2.5]})
    schema, files = stage(store, "t", again, mode="overwrite")
    result = store.commit("t", "overwrite", schema, (), files, replaces=5)
    assert result.version == 7
    assert ids_of(DeltaTable(store.uri("t")).to_pyarrow_table()) == [7, 8]  # the append kept
    # change feed of the overwrite: the old file's rows deleted, the new inserted
    cdf = pa.table(
        DeltaTable(store.uri("t")).load_cdf(starting_version=7, ending_version=7).read_all()
    )
    assert sorted(zip(cdf["id"].to_pylist(), cdf["_change_type"].to_pylist(), strict=True)) == [
        (7, "delete"),
        (8, "insert"),
    ]


def test_appends_on_s3_are_conditional_puts_of_the_next_commit(seaweed: Any) -> None:
    """On S3 (SeaweedFS) with conditional puts declared, the service puts the next commit
    file with If-None-Match, as deltalake's own commit does, without deltalake's commit
    (which keeps every live file in memory and rewrites that list on each commit): a version
    deltalake's writer took first is read and the append lands after it."""
    store = Store(f"{seaweed.root}/own-commits", storage_options=seaweed.storage_options)
    store.create("t", SCHEMA)
    write(store, "t", rows(0, 2), app_id="job", app_version=1)
    actions = log_entry(store, "t", 1)
    assert delta_log.commit_info(actions)["engineInfo"].startswith("aqueduct-spark/")
    write_deltalake(
        store.uri("t"), rows(50, 1), mode="append", storage_options=seaweed.storage_options
    )
    schema, files = stage(store, "t", rows(10, 2))
    assert store.commit("t", "append", schema, (), files).version == 3  # version 2 taken
    table = DeltaTable(store.uri("t"), storage_options=seaweed.storage_options)
    assert ids_of(table.to_pyarrow_table()) == [0, 1, 10, 11, 50]
    assert table.transaction_version("job") == 1
    assert delta_commit.putter(Store(f"{seaweed.root}/x"), "t") is None  # no options: deltalake


def _race(store: Store, monkeypatch: pytest.MonkeyPatch, other: Any) -> None:
    """The next put of a commit file (a hard link, or S3's conditional put) first lets
    ``other`` (a real deltalake writer) commit the version it wanted."""
    left = [1]

    def wrap(real: Any) -> Any:
        def put(*a: Any) -> Any:
            if left[0]:
                left[0] -= 1
                other()
            return real(*a)

        return put

    monkeypatch.setattr(delta_commit, "put_if_absent", wrap(delta_commit.put_if_absent))
    real_putter = delta_commit.putter
    monkeypatch.setattr(delta_commit, "putter", lambda *a: (p := real_putter(*a)) and wrap(p))


def check_constraints_and_append_only(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a Delta writer must honour and deltalake's commit of staged files does not check:
    CHECK constraints (a NULL fails, as in Spark), also when deltalake adds one while our
    commit races for the version; and delta.appendOnly."""
    options = store.storage_options
    store.create("t", SCHEMA)
    write(store, "t", rows(0, 2))
    table = DeltaTable(store.uri("t"), storage_options=options)
    table.alter.add_constraint({"positive": "id >= 0"})
    with pytest.raises(InvalidRequest, match=r"violates its constraint positive \(id >= 0\)"):
        write(store, "t", rows(-3, 2))
    nulls = pa.table({"id": pa.array([None], pa.int64()), "p": ["a"]}, schema=SCHEMA)
    with pytest.raises(InvalidRequest, match="violates its constraint positive"):
        write(store, "t", nulls)
    assert write(store, "t", rows(5, 1)).version == 3  # rows that satisfy it commit
    assert ids_of(DeltaTable(store.uri("t"), storage_options=options).to_pyarrow_table()) == [
        0, 1, 5
    ]  # fmt: skip
    # deltalake adds a constraint just before our own commit: the rebased append is checked
    store.create("r", SCHEMA)
    write(store, "r", rows(0, 1))
    racer = DeltaTable(store.uri("r"), storage_options=options)
    _race(store, monkeypatch, lambda: racer.alter.add_constraint({"small": "id < 100"}))
    with pytest.raises(InvalidRequest, match=r"violates its constraint small \(id < 100\)"):
        write(store, "r", rows(200, 1))
    assert write(store, "r", rows(7, 1)).version == 3
    assert ids_of(DeltaTable(store.uri("r"), storage_options=options).to_pyarrow_table()) == [
        0, 7
    ]  # fmt: skip
    store.create("u", SCHEMA)
    write(store, "u", rows(0, 1))
    DeltaTable(store.uri("u"), storage_options=options).alter.set_table_properties(
        {"delta.appendOnly": "true"}
    )
    for replaces in (None, 2):
        schema, files = stage(store, "u", rows(9, 1), mode="overwrite")
        with pytest.raises(InvalidRequest, match="append-only"):
            store.commit("u", "overwrite", schema, (), files, replaces=replaces)
    assert write(store, "u", rows(10, 1)).version == 3
    assert ids_of(DeltaTable(store.uri("u"), storage_options=options).to_pyarrow_table()) == [
        0, 10
    ]  # fmt: skip


def test_constraints_and_append_only_on_a_local_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_constraints_and_append_only(Store(tmp_path), monkeypatch)
    # a constraint on a partition column (its values are in the path, not the file), checked
    # batch by batch: a violation in the last batch of a file is found
    monkeypatch.setattr(constraints, "CHECK_ROWS", 2)
    store = Store(tmp_path)
    store.create("parts", SCHEMA, partition_by=["p"])
    DeltaTable(store.uri("parts")).alter.add_constraint({"known": "p <> 'bad' AND id < 5"})
    for bad in (rows(0, 2, "bad"), rows(0, 6, "x")):
        with pytest.raises(InvalidRequest, match="violates its constraint known"):
            write(store, "parts", bad, partition_by=["p"])
    assert write(store, "parts", rows(0, 5, "ok"), partition_by=["p"]).rows == 5
    # a column invariant (legacy, writer version 2), as deltalake declares one
    invariant = json.dumps({"expression": {"expression": "id > 3"}})
    fields = [Field("id", "long", metadata={"delta.invariants": invariant}), Field("p", "string")]
    DeltaTable.create(str(tmp_path / "inv"), schema=Schema(fields))
    with pytest.raises(InvalidRequest, match=r"constraint invariant of id \(id > 3\)"):
        write(Store(tmp_path), "inv", rows(1, 5))
    assert write(Store(tmp_path), "inv", rows(4, 2)).version == 1


def test_constraints_and_append_only_on_s3(seaweed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    root = f"{seaweed.root}/constraints"
    check_constraints_and_append_only(
        Store(root, storage_options=seaweed.storage_options), monkeypatch
    )


def check_feature_race(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A version taken by a commit that enables what only deltalake may write (row tracking
    here, a protocol change) is not rebased onto by our own commit: the append goes to
    deltalake's commit, which cannot write that feature either, and the writer hears so at
    once (not a conflict retried six times); nothing is committed."""
    options = store.storage_options
    store.create("t", SCHEMA)
    write(store, "t", rows(0, 1))
    table = DeltaTable(store.uri("t"), storage_options=options)
    _race(
        store,
        monkeypatch,
        lambda: table.alter.add_feature(
            TableFeatures.RowTracking, allow_protocol_versions_increase=True
        ),
    )
    with pytest.raises(InvalidRequest, match=r"features the service cannot write.*RowTracking"):
        write(store, "t", rows(1, 1))
    after = DeltaTable(store.uri("t"), storage_options=options)
    assert after.version() == 2 and ids_of(after.to_pyarrow_table()) == [0]


def test_a_feature_added_while_an_append_races_is_not_rebased_onto(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_feature_race(Store(tmp_path), monkeypatch)


def test_a_feature_added_while_an_append_races_on_s3(
    seaweed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = f"{seaweed.root}/feature-race"
    check_feature_race(Store(root, storage_options=seaweed.storage_options), monkeypatch)


def check_deletion_vectors(store: Store) -> None:
    """A file with a deletion vector (as Spark's DELETE leaves one: remove, then add again
    with the vector) is only replaced by a remove that names that vector; a remove without
    it left the file live under deltalake's reader, its rows back after the overwrite."""
    options = store.storage_options
    store.create("t", SCHEMA)
    write(store, "t", rows(0, 3))
    DeltaTable(store.uri("t"), storage_options=options).alter.add_feature(
        TableFeatures.DeletionVectors, allow_protocol_versions_increase=True
    )
    add = next(a["add"] for a in log_entry(store, "t", 1) if "add" in a)
    vector = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 1}
    spark_delete = [
        {"commitInfo": {"timestamp": 1, "operation": "DELETE", "engineInfo": "Apache-Spark"}},
        {"remove": {"path": add["path"], "deletionTimestamp": 1, "dataChange": True}},
        {"add": {**add, "deletionVector": {**vector, "sizeInBytes": 34, "cardinality": 1}}},
    ]
    put = delta_commit.putter(store, "t")
    assert put is not None and put(3, delta_commit.encode(spark_delete)) is not None
    assert store.snapshot("t").version == 3
    schema, files = stage(store, "t", rows(9, 1), mode="overwrite")
    assert store.commit("t", "overwrite", schema, (), files, replaces=3).version == 4
    removed = [a["remove"] for a in log_entry(store, "t", 4) if "remove" in a]
    assert [r.get("deletionVector", {}).get("pathOrInlineDv") for r in removed] == [
        vector["pathOrInlineDv"]
    ]
    live = DeltaTable(store.uri("t"), storage_options=options).get_add_actions()
    assert [unquote(p) for p in pa.table(live).column("path").to_pylist()] == [files[0].path]
    write(store, "t", rows(20, 1))  # a commit since the overwrite began: it cannot name removes
    schema, files = stage(store, "t", rows(30, 1), mode="overwrite")
    with pytest.raises(Conflict, match="deletion vectors"):
        store.commit("t", "overwrite", schema, (), files, replaces=4)


def test_deletion_vectors_on_a_local_root(tmp_path: Path) -> None:
    check_deletion_vectors(Store(tmp_path))


def test_deletion_vectors_on_s3(seaweed: Any) -> None:
    check_deletion_vectors(
        Store(f"{seaweed.root}/deletion-vectors", storage_options=seaweed.storage_options)
    )
