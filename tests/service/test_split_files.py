"""Which files a scan may read (``service.split_files``): every split the service hands out
passes, on the process that planned it and on a cold one (another worker), without loading
the table for a stream's files; a path the log does not show is refused before any row
moves. The same through a real service is in ``test_access.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from delta_store_helpers import stage, write

from aqueduct_spark.protocol import DatasetNotFound, InvalidRequest
from aqueduct_spark.service import changes, maintenance, split_files
from aqueduct_spark.service.store import Store


def ids(lo: int, hi: int) -> pa.Table:
    return pa.table({"id": pa.array(range(lo, hi), pa.int64())})


def splits(found: Any) -> list[dict[str, Any]]:
    return [s if isinstance(s, dict) else s.to_dict() for s in found]


def test_every_split_the_service_gives_passes(tmp_path: Path) -> None:
    store = Store(tmp_path)
    write(store, "t", ids(0, 3), mode="overwrite")  # v0
    write(store, "t", ids(3, 6))  # v1
    old = splits(store.plan("t").splits)  # version 1: two files
    streamed = splits(f for v in store.versions_files("t", 0, 1).values() for f in v)
    write(store, "t", ids(6, 9), mode="overwrite")  # v2: removes both
    maintenance.delete(store, "t", "id = 7")  # v3: change files
    feed = changes.feed(store, "t", 0, 3, change_feed=True)
    changed = [f for v in feed["versions"] for f in v["files"]]
    kinds = {f["change_type"] for f in changed}
    assert kinds == {None, "insert", "delete"}  # a change file, added and removed files
    latest = splits(store.plan("t").splits)

    cold = Store(tmp_path)  # another worker: nothing kept
    split_files.check(cold, "t", streamed)
    split_files.check(cold, "t", changed)
    assert "t" not in cold._states  # from the commits alone: no table loaded
    for s in (store, cold):
        for given in (old, streamed, changed, latest):
            split_files.check(s, "t", given)


def test_a_path_the_log_does_not_show_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path)
    write(store, "t", ids(0, 3), mode="overwrite")
    write(store, "t", ids(3, 6))
    _, staged = stage(store, "t", ids(100, 103))  # staged, never committed
    base = splits(store.plan("t").splits)[0]
    forged = {**base, "path": staged[0].path}
    with pytest.raises(InvalidRequest, match="not one of its files") as refused:
        split_files.check(store, "t", [base, forged])
    assert refused.value.details["path"] == staged[0].path
    with pytest.raises(InvalidRequest, match="not one of its files"):
        split_files.check(Store(tmp_path), "t", [forged])  # a cold process too
    feed = changes.feed(store, "t", 1, 1, change_feed=True)
    (insert,) = feed["versions"][0]["files"]
    for lie in (
        {**insert, "path": staged[0].path},  # a staged file as an insert
        {**insert, "change_type": "delete"},  # version 1 removed nothing
        {**insert, "commit_version": 0},  # added by another version
    ):
        with pytest.raises(InvalidRequest, match="not one of its files"):
            split_files.check(store, "t", [lie])
    store.drop("t")
    with pytest.raises(DatasetNotFound):
        split_files.check(store, "t", [base])
