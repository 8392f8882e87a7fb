"""Table maintenance (checkpoints, log cleanup, compaction, vacuum, restore, delete) and the
change feed, on real Delta tables; the change feed is checked against deltalake's own."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
from pathlib import Path

import pyarrow as pa
import pytest
from delta_store_helpers import read, write
from deltalake import DeltaTable

from aqueduct_spark.protocol import DataLoss, InvalidRequest, VersionNotFound
from aqueduct_spark.service import changes, maintenance
from aqueduct_spark.service.admission import FairPool
from aqueduct_spark.service.maintenance import Maintenance, MaintenanceConfig
from aqueduct_spark.service.store import Store
from aqueduct_spark.testing import ServiceProcess

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])


def rows(*ids: int) -> pa.Table:
    return pa.table({"id": list(ids), "s": [f"v{i}" for i in ids]}, schema=SCHEMA)


@pytest.fixture
def local(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "root"))


def ids(store: Store, name: str, **kw: object) -> list[int]:
    return sorted(read(store, name, columns=["id"], **kw)["id"].to_pylist())


def log_names(store: Store, name: str) -> list[str]:
    return sorted(os.listdir(os.path.join(store._local_root or "", name, "_delta_log")))


# -- compaction, pinned readers, vacuum --------------------------------------------------------


def test_compaction_keeps_rows_and_pinned_readers_until_vacuum_retention(local: Store) -> None:
    local.create("d", SCHEMA)
    for i in range(6):
        write(local, "d", rows(i))
    pinned = local.plan("d")  # a reader pinned to version 6: six small files
    assert len(pinned.splits) == 6
    result = maintenance.compact(local, "d")
    assert result["committed"] and result["files_removed"] == 6 and result["files_added"] == 1
    assert ids(local, "d") == list(range(6)) and local.describe("d").files == 1
    # Compaction is no new data: a stream reads nothing from it, history says so.
    assert local.version_files("d", result["version"]) == []
    assert local.history("d")[-1].data_change is False
    assert maintenance.compact(local, "d")["committed"] is False  # nothing left to do

    def read_pinned() -> list[int]:
        return sorted(i for s in pinned.splits for b in local.scan(s) for i in b["id"].to_pylist())

    assert read_pinned() == list(range(6))
    assert local.vacuum("d", retention=dt.timedelta(hours=1)) == []  # within the retention
    assert read_pinned() == list(range(6))
    assert len(local.vacuum("d", retention=dt.timedelta(0))) == 6  # the retention passed
    with pytest.raises(DataLoss, match="vacuumed"):
        read_pinned()
    assert ids(local, "d") == list(range(6))


def test_checkpoints_and_log_cleanup_keep_the_table_readable(local: Store) -> None:
    local.create("d", SCHEMA)
    config = MaintenanceConfig(
        enabled=True, checkpoint_interval=5, log_retention=dt.timedelta(0), compact_min_files=4
    )
    m = Maintenance(local, config, FairPool(2))
    assert local.commit_hooks is maintenance.NO_HOOKS
    for i in range(12):
        write(local, "d", rows(i))
    m.maintain("d")  # 12 versions, 12 small files: compaction, then a checkpoint
    assert local.latest_version("d") == 13  # 12 appends and the compaction
    assert [n for n in log_names(local, "d") if ".checkpoint." in n] == [
        f"{13:020d}.checkpoint.parquet"
    ]
    assert ids(local, "d") == list(range(12)) and local.describe("d").files == 1
    assert local.describe("d", version=3).version == 3  # one checkpoint: nothing cleaned yet
    for i in range(12, 17):
        write(local, "d", rows(i))
    m.maintain("d")  # a second checkpoint: the log before the first goes (retention 0)
    names = log_names(local, "d")
    assert [int(n[:20]) for n in names if ".checkpoint." in n] == [13, 19]  # 19: compacted
    assert min(int(n[:20]) for n in names if n.endswith(".json")) == 13
    with pytest.raises(VersionNotFound):
        local.describe("d", version=3)
    assert local.describe("d", version=13).version == 13
    write(local, "d", rows(99))
    assert ids(local, "d") == [*range(17), 99]
    assert [v.version for v in local.history("d")] == list(range(13, 21))


def test_log_cleanup_keeps_what_the_retention_covers(local: Store) -> None:
    local.create("d", SCHEMA)
    for i in range(3):
        write(local, "d", rows(i))
    local.open_table("d").create_checkpoint()
    fs = local.filesystem("d")
    assert maintenance.cleanup_log(fs, dt.timedelta(hours=1)) == 0
    assert local.describe("d", version=0).version == 0


def test_maintenance_runs_after_commits_in_the_pool_and_is_off_by_default(local: Store) -> None:
    local.create("d", SCHEMA)
    for i in range(4):
        write(local, "d", rows(i))

    async def run(config: MaintenanceConfig) -> None:
        m = Maintenance(local, config, FairPool(2))
        m.after_commit("d", 4)
        await m.wait_idle()

    asyncio.run(run(MaintenanceConfig()))
    assert local.describe("d").files == 4
    asyncio.run(run(MaintenanceConfig(enabled=True, compact_min_files=3)))
    assert local.describe("d").files == 1 and ids(local, "d") == [0, 1, 2, 3]


# -- restore and delete ------------------------------------------------------------------------


def test_restore_and_delete(local: Store) -> None:
    local.create("d", SCHEMA)
    write(local, "d", rows(1, 2, 3))
    write(local, "d", rows(4))
    deleted = maintenance.delete(local, "d", "id >= 2 AND id <= 3")
    assert deleted["rows_deleted"] == 2 and ids(local, "d") == [1, 4]
    restored = maintenance.restore(local, "d", 1)
    assert restored["version"] == 4 and ids(local, "d") == [1, 2, 3]
    assert ids(local, "d", version=3) == [1, 4]
    with pytest.raises(InvalidRequest, match="no column 'nope' in the dataset; name one of its"):
        maintenance.delete(local, "d", "nope = 1")
    with pytest.raises(InvalidRequest, match="predicate"):
        maintenance.delete(local, "d", " ")
    with pytest.raises(VersionNotFound, match="no version 9"):
        maintenance.restore(local, "d", 9)


# -- version ranges and the change feed --------------------------------------------------------


def history_of_every_kind(store: Store) -> None:
    """Appends, an overwrite, a delete, a restore and a compaction."""
    store.create("d", SCHEMA)  # 0
    write(store, "d", rows(1, 2, 3))  # 1
    write(store, "d", rows(4, 5))  # 2
    write(store, "d", rows(10, 11), mode="overwrite")  # 3
    write(store, "d", rows(12, 13))  # 4
    maintenance.delete(store, "d", "id = 12")  # 5: a change file
    maintenance.restore(store, "d", 2)  # 6
    write(store, "d", rows(20))  # 7
    maintenance.compact(store, "d")  # 8: no change


def feed_rows(store: Store, name: str, start: int, end: int | None = None) -> list[tuple]:
    out = []
    found = changes.feed(store, name, start, end, change_feed=True)
    for entry in found["versions"]:
        for split in entry["files"]:
            for batch in changes.scan_change(store, split):
                out += [tuple(r.values()) for r in batch.to_pylist()]
    return out


def test_change_feed_matches_deltalake(local: Store) -> None:
    history_of_every_kind(local)
    ours = feed_rows(local, "d", 0)
    theirs = pa.table(DeltaTable(local.uri("d")).load_cdf(0)).to_pylist()

    def key(r: tuple) -> tuple:
        return (r[3], r[2], r[0])  # version, change type, id

    assert sorted(r[:4] for r in ours) == sorted(
        (r["id"], r["s"], r["_change_type"], r["_commit_version"]) for r in theirs
    )
    assert {r[2] for r in ours} == {"insert", "delete"}
    # commit timestamps are history's (commit file times); deltalake's are a few ms earlier
    times = {v.version: v.timestamp for v in local.history("d")}
    assert all(r[4] == times[r[3]] for r in ours)
    theirs_t = {r["_commit_version"]: r["_commit_timestamp"] for r in theirs}
    assert all(
        abs(times[v] - t.replace(tzinfo=dt.UTC)) < dt.timedelta(seconds=2)
        for v, t in theirs_t.items()
    )
    # a range, by version and by time
    assert sorted(feed_rows(local, "d", 3, 3), key=key) == sorted(
        (r for r in ours if r[3] == 3), key=key
    )
    by_time = changes.feed(
        local, "d", starting_timestamp=times[4], ending_timestamp=times[5], change_feed=True
    )
    assert [e["version"] for e in by_time["versions"]] == [4, 5]


def test_version_ranges_count_what_each_version_removed(local: Store) -> None:
    history_of_every_kind(local)
    found = changes.feed(local, "d", 1, 8)
    by_version = {e["version"]: e for e in found["versions"]}
    assert [len(by_version[v]["files"]) for v in range(1, 9)] == [1, 1, 1, 1, 1, 2, 1, 0]
    assert [by_version[v]["removes"] for v in range(1, 9)] == [0, 0, 2, 0, 1, 2, 0, 0]
    assert found["latest"] == 8 and found["schema"] == SCHEMA
    with pytest.raises(VersionNotFound, match="no version 9"):
        changes.feed(local, "d", 9)
    assert changes.feed(local, "d", 5, 20)["versions"][-1]["version"] == 8


def test_change_feed_needs_the_table_property(local: Store) -> None:
    local.create("d", SCHEMA)
    write(local, "d", rows(1))
    local.open_table("d").alter.set_table_properties({changes.CDF_KEY: "false"})  # an old table
    write(local, "d", rows(2))
    with pytest.raises(InvalidRequest, match="did not record its change feed at version 2"):
        changes.feed(local, "d", 0, change_feed=True)
    maintenance.delete(local, "d", "id = 1")  # turns it on again first
    assert [r[2] for r in feed_rows(local, "d", 5)] == ["delete"]
    assert changes.feed(local, "d", 0)["versions"][3]["files"]  # the plain range is fine


# -- through the service -----------------------------------------------------------------------


def test_maintenance_requests_through_the_service(service: ServiceProcess) -> None:
    c = service.client()
    c.create("maint", SCHEMA)
    for i in range(3):
        c.append("maint", rows(i))
    assert c.compact("maint")["files_removed"] == 3
    assert c.delete("maint", "id = 1")["rows_deleted"] == 1
    assert sorted(c.read("maint")["id"].to_pylist()) == [0, 2]
    assert c.restore("maint", 3)["committed"]
    assert sorted(c.read("maint")["id"].to_pylist()) == [0, 1, 2]
    assert c.vacuum("maint", dry_run=True) == []
    feed = c.feed("maint", starting_version=5, ending_version=5, change_feed=True)
    (entry,) = feed["versions"]
    schema = pa.schema([*feed["schema"], *changes.CHANGE_FIELDS])
    got = [r for s in entry["files"] for b in c.scan(s, schema=schema) for r in b.to_pylist()]
    assert [(r["id"], r["_change_type"], r["_commit_version"]) for r in got] == [(1, "delete", 5)]


def test_the_commands(service: ServiceProcess, capsys: pytest.CaptureFixture[str]) -> None:
    from aqueduct_spark import cli

    c = service.client()
    c.create("maint_cli", SCHEMA)
    for i in range(3):
        c.append("maint_cli", rows(i))
    conn = ["--url", service.url, "--fingerprint", service.fingerprint]
    assert cli.main(["compact", "maint_cli", *conn]) == 0
    assert cli.main(["delete", "maint_cli", "--where", "id = 0", *conn]) == 0
    assert cli.main(["restore", "maint_cli", "--version", "3", *conn]) == 0
    assert cli.main(["vacuum", "maint_cli", "--dry-run", *conn]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "maint_cli: version 4 rewrote 3 files into 1",
        "maint_cli: version 5 deleted 1 rows",
        "maint_cli: version 6 restores version 3 (3 files back, 1 removed)",
        "would delete 0 files",
    ]
    assert cli.main(["delete", "maint_cli", "--where", "idd = 1", *conn]) == 1
    err = capsys.readouterr().err
    # one line of ours, with the closest column (Delta's own text named neither clearly)
    assert "delete from dataset 'maint_cli' where 'idd = 1': no column 'idd' in the dataset " in err
    assert "(did you mean 'id'?)" in err and "DeltaTable" not in err


def test_history_names_what_each_version_did(
    service: ServiceProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """``aqueduct history`` (issue 27): an overwrite is an overwrite, not ``WRITE``; a delete
    shows the rows it removed, not the rows its rewrite kept; a vacuum is one line."""
    from aqueduct_spark import cli

    c = service.client()
    c.create("hist_cli", SCHEMA)
    c.append("hist_cli", rows(0, 1, 2))
    c.overwrite("hist_cli", rows(*range(10)))
    c.delete("hist_cli", "id < 3")
    c.restore("hist_cli", 2)
    c.vacuum("hist_cli", retention_hours=0)
    conn = ["--url", service.url, "--fingerprint", service.fingerprint]
    assert cli.main(["history", "hist_cli", *conn]) == 0
    lines = capsys.readouterr().out.splitlines()
    label_and_text = [  # without the commit time, and any size as "(n B)"
        (line.split()[0], re.sub(r"\(\d+ B\)", "(n B)", " ".join(line.split()[3:])))
        for line in lines
    ]
    assert label_and_text[:5] == [
        ("v0", "create"),
        ("v1", "append +3 rows (n B)"),
        ("v2", "overwrite wrote 10 rows (n B)"),
        ("v3", "delete -3 rows where id < 3"),
        ("v4", "restore to version 2"),
    ]
    (label, text), *_ = label_and_text[5:]
    assert label == "v5-6" and re.fullmatch(r"vacuum [1-9]\d* files deleted", text), lines
    assert len(lines) == 6
    versions = c.offsets("hist_cli")["versions"]
    assert [(v["operation"], v["action"], v["rows_removed"]) for v in versions[2:4]] == [
        ("WRITE", "overwrite", None),
        ("DELETE", "delete", 3),
    ]


@pytest.mark.parametrize(
    ("info", "described"),
    [  # commits of other writers, as Spark's Delta and deltalake record them
        (
            {"operation": "WRITE", "operationParameters": {"mode": "Overwrite"}},
            ("overwrite", None, ""),
        ),
        ({"operation": "WRITE", "operationParameters": {"mode": "Append"}}, ("append", None, "")),
        ({"operation": "STREAMING UPDATE"}, ("append", None, "")),
        (
            {
                "operation": "DELETE",
                "operationParameters": {"predicate": '["(id < 3)"]'},
                "operationMetrics": {"numDeletedRows": "3"},
            },
            ("delete", 3, 'where ["(id < 3)"]'),
        ),
        ({"operation": "MERGE", "operationMetrics": {"numTargetRowsDeleted": 2}}, ("merge", 2, "")),
        (
            {"operation": "VACUUM END", "operationMetrics": {"numDeletedFiles": 4}},
            ("vacuum end", None, "4 files deleted"),
        ),
        ({"operation": "ADD COLUMN"}, ("add columns", None, "")),
        ({"operation": "CHANGE COLUMN"}, ("change column", None, "")),
    ],
)
def test_history_names_other_writers_commits(info: dict[str, object], described: object) -> None:
    from aqueduct_spark.service.history import described as describe

    assert describe(info, []) == described


def test_serve_flags_default_to_the_config() -> None:
    from aqueduct_spark.cli.arguments import build_parser
    from aqueduct_spark.cli.maintenance import maintenance_config

    args = build_parser().parse_args(["serve"])
    assert maintenance_config(args) == MaintenanceConfig()
    on = build_parser().parse_args(["serve", "--maintenance", "--checkpoint-interval", "10"])
    assert maintenance_config(on) == MaintenanceConfig(enabled=True, checkpoint_interval=10)


def test_change_feed_of_a_partitioned_dataset_matches_deltalake(local: Store) -> None:
    schema = pa.schema([("id", pa.int64()), ("day", pa.date32())])

    def data(*ids: int) -> pa.Table:
        days = [dt.date(2026, 1, 1 + i % 2) for i in ids]
        return pa.table({"id": list(ids), "day": days}, schema=schema)

    local.create("p", schema, partition_by=["day"])
    write(local, "p", data(1, 2, 3, 4), partition_by=["day"])
    maintenance.delete(local, "p", "id = 3")
    write(local, "p", data(5, 6), mode="overwrite", partition_by=["day"])
    ours = sorted((r[0], r[1], r[2], r[3]) for r in feed_rows(local, "p", 0))
    theirs = pa.table(DeltaTable(local.uri("p")).load_cdf(0)).to_pylist()
    assert ours == sorted(
        (r["id"], r["day"], r["_change_type"], r["_commit_version"]) for r in theirs
    )
    assert len(ours) == 4 + 1 + 3 + 2


def test_a_long_range_loads_the_table_a_few_times_not_once_a_version(
    local: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    local.create("d", SCHEMA)
    for i in range(30):
        write(local, "d", rows(i))
    loads = []
    opened = Store.open_table
    monkeypatch.setattr(
        Store, "open_table", lambda self, *a, **k: loads.append(a) or opened(self, *a, **k)
    )
    found = changes.feed(Store(local.root), "d", 1, change_feed=True)
    assert len(found["versions"]) == 30 and len(loads) <= 3


def test_a_dataset_created_again_is_maintained_afresh(local: Store) -> None:
    m = Maintenance(local, MaintenanceConfig(enabled=True, checkpoint_interval=3), FairPool(2))
    local.create("d", SCHEMA)
    for i in range(8):
        write(local, "d", rows(i))
    m.maintain("d")
    local.drop("d")
    local.create("d", SCHEMA)
    for i in range(3):
        write(local, "d", rows(i))
    m.maintain("d")
    assert [n for n in log_names(local, "d") if ".checkpoint." in n] == [
        f"{3:020d}.checkpoint.parquet"
    ]
