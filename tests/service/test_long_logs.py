"""Issue 31, item 2: with appends committed from the kept tail of the log, everything that
reads a long log still answers as deltalake's own readers do: time travel to any version the
log keeps, the change feed across all of it, a stream starting far behind. A few hundred
versions here; 10,000 in ``make slow``."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from delta_store_helpers import stage, write
from deltalake import DeltaTable

from aqueduct_spark.service import changes, delta_log, maintenance
from aqueduct_spark.service.store import MAX_VERSION_RANGE, Store
from benchmarks.versions_data import append_versions

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])


def rows(lo: int, n: int) -> pa.Table:
    return pa.table(
        {"id": pa.array(range(lo, lo + n), pa.int64()), "s": [f"r{i}" for i in range(lo, lo + n)]}
    )


def long_log(store: Store, bulk: int) -> int:
    """A dataset whose log mixes every kind of commit a month of a stream leaves: ``bulk``
    versions written as a Delta writer writes them (a checkpoint on the way), appends the
    service commits itself, a delete that records change files (deltalake's commit), appends
    again, a complete-mode overwrite the service commits itself, and appends after it. Returns the latest version."""
    store.create("t", SCHEMA)
    table_dir = Path(store.uri("t"))
    batch = rows(10_000_000, 3)
    append_versions(table_dir, batch, bulk, checkpoint=True, checkpoint_every=max(100, bulk // 3))
    for k in range(20):
        write(store, "t", rows(100 * k, 5), app_id="stream", app_version=k)
    maintenance.delete(store, "t", "id >= 500 AND id < 1000")  # versions with change files
    for k in range(20, 30):
        write(store, "t", rows(100 * k, 5), app_id="stream", app_version=k)
    # a complete-mode micro-batch: an overwrite the service commits itself, then appends
    began = store.snapshot("t").version
    schema, files = stage(store, "t", rows(5000, 4), mode="overwrite")
    store.commit("t", "overwrite", schema, (), files, replaces=began)
    for k in range(30, 32):
        write(store, "t", rows(100 * k, 5), app_id="stream", app_version=k)
    return store.snapshot("t").version


def scanned(store: Store, version: int | None = None) -> list[tuple[int, str]]:
    plan = store.plan("t", version=version)
    got = [b for split in plan.splits for b in store.scan(split)]
    table = pa.Table.from_batches(got, schema=plan.schema) if got else rows(0, 0)
    return sorted(zip(table.column("id").to_pylist(), table.column("s").to_pylist(), strict=True))


def delta_rows(store: Store, version: int | None = None) -> list[tuple[int, str]]:
    table = DeltaTable(store.uri("t"), version=version).to_pyarrow_table()
    return sorted(zip(table.column("id").to_pylist(), table.column("s").to_pylist(), strict=True))


def feed_rows(store: Store, start: int, end: int) -> list[tuple[int, str, int]]:
    found = changes.feed(store, "t", start, end, change_feed=True)
    out = []
    for entry in found["versions"]:
        for split in entry["files"]:
            for b in changes.scan_change(store, split, ["id", "_change_type", "_commit_version"]):
                out += zip(*(b.column(c).to_pylist() for c in b.schema.names), strict=True)
    return sorted(out)


def delta_feed(store: Store, start: int, end: int) -> list[tuple[int, str, int]]:
    cdf = DeltaTable(store.uri("t")).load_cdf(starting_version=start, ending_version=end)
    table = pa.table(cdf.read_all())
    cols = ["id", "_change_type", "_commit_version"]
    return sorted(zip(*(table.column(c).to_pylist() for c in cols), strict=True))


def check_long_log(store: Store, bulk: int) -> None:
    latest = long_log(store, bulk)
    assert latest == bulk + 34
    engines = [
        delta_log.commit_info(delta_log.read_log(store.filesystem("t"), v))["engineInfo"]
        for v in (bulk + 1, bulk + 21, bulk + 32)
    ]
    assert [e.split("/")[0].split(":")[0] for e in engines] == [
        "aqueduct-spark", "delta-rs", "aqueduct-spark"
    ]  # fmt: skip
    # time travel: a bulk version, after the delete, before the overwrite, the latest
    for version in (bulk // 2, bulk + 21, bulk + 31, None):
        expected = delta_rows(store, version)
        assert scanned(store, version) == expected, version
        assert store.describe("t", version=version).rows == len(expected)
    # the change feed across the whole log, as deltalake's load_cdf reads it
    assert feed_rows(store, 1, latest) == delta_feed(store, 1, latest)
    # a stream from the first version, catching up range by range: every row added once
    seen: list[int] = []
    for first in range(1, latest + 1, MAX_VERSION_RANGE):
        last = min(first + MAX_VERSION_RANGE - 1, latest)
        for files in store.versions_files("t", first, last).values():
            seen += (
                [i for b in store.scan(files) for i in b.column("id").to_pylist()] if files else []
            )
    added = delta_feed(store, 1, latest)
    assert sorted(seen) == sorted(i for i, kind, _ in added if kind == "insert")
    assert [v.version for v in store.history("t", since_version=latest - 2)] == [
        latest - 2,
        latest - 1,
        latest,
    ]


def test_a_few_hundred_versions_read_as_deltalake_reads_them(tmp_path: Path) -> None:
    check_long_log(Store(tmp_path), 250)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 5,000 and 10,000 small files read by both readers: minutes
def test_ten_thousand_versions_read_as_deltalake_reads_them(tmp_path: Path) -> None:
    check_long_log(Store(tmp_path), 10_000)
    assert len(os.listdir(tmp_path / "t" / "_delta_log")) > 10_000
