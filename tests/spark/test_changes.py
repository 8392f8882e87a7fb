"""Compaction under a running stream, versions that remove data, version ranges and the
change feed, in Spark local mode against a real service (issue 18 items 3 and 4)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from stream_helpers import SCHEMA, ids_of, rows, wait_rows

from aqueduct_spark.testing import ServiceProcess

pytestmark = pytest.mark.spark


def fresh(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def stream(spark: Any, svc: ServiceProcess, name: str, **options: str) -> Any:
    return spark.readStream.format("aqueduct").options(**svc.options, **options).load(name)


def batch(spark: Any, svc: ServiceProcess, name: str, **options: str) -> Any:
    return spark.read.format("aqueduct").options(**svc.options, **options).load(name)


def to_aqueduct(df: Any, svc: ServiceProcess, name: str, checkpoint: Path, **trigger: Any) -> Any:
    writer = df.writeStream.format("aqueduct").options(**svc.options)
    writer = writer.option("checkpointLocation", str(checkpoint))
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start(name)


def test_a_stream_reads_no_duplicates_across_compaction_and_fails_on_a_delete(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    src, dst = fresh("compact_src"), fresh("compact_dst")
    c = service.client()
    c.create(src, SCHEMA)
    for i in range(5):
        c.append(src, rows(i * 10, 10))
    q = to_aqueduct(
        stream(spark, service, src, startingVersion="earliest"), service, dst, tmp_path / "a"
    )
    try:
        wait_rows(c, dst, 50, q, timeout=240)
        assert c.compact(src)["files_removed"] == 5  # the rows again, in one new file
        c.append(src, rows(50, 10))
        wait_rows(c, dst, 60, q, timeout=240)
        time.sleep(1)  # nothing more may come
        assert ids_of(c, dst) == list(range(60))
        c.delete(src, "id < 5")
        with pytest.raises(
            Exception, match=r"(?s)DataChanged.*removes data.*skipChangeCommits"
        ) as e:
            q.awaitTermination(240)
        text = str(e.value)  # our line first, with no traceback or Java stack around it
        assert "Traceback" not in text and "\tat org.apache" not in text, text
        assert text.partition("DataChanged: ")[0].count("\n") == 0, text
        assert len(text.splitlines()) < 20, text
    finally:
        q.stop()
    assert ids_of(c, dst) == list(range(60))
    # skipChangeCommits: a new query from the start skips the delete, reads the rest once
    c.append(src, rows(60, 10))
    df = stream(spark, service, src, startingVersion="earliest", skipChangeCommits="true")
    again = fresh("compact_again")
    assert to_aqueduct(df, service, again, tmp_path / "b", availableNow=True).awaitTermination(120)
    assert ids_of(c, again) == list(range(70))


def test_change_feed_and_version_ranges_match_deltalake(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    name = fresh("cdf")
    c = service.client()
    c.create(name, SCHEMA)  # 0
    c.append(name, rows(0, 3))  # 1
    c.append(name, rows(3, 2))  # 2
    c.overwrite(name, rows(10, 2))  # 3
    c.append(name, rows(12, 2))  # 4
    c.delete(name, "id = 12")  # 5
    c.restore(name, 2)  # 6
    c.compact(name)  # 7: no change

    def key(r: Any) -> tuple:
        return (r["_commit_version"], r["_change_type"], r["id"], r["s"])

    expected = sorted(
        key(r) for r in pa.table(DeltaTable(f"{service.root}/{name}").load_cdf(0)).to_pylist()
    )
    got = batch(spark, service, name, readChangeFeed="true", startingVersion="0")
    assert got.columns == ["id", "s", "_change_type", "_commit_version", "_commit_timestamp"]
    assert sorted(key(r) for r in got.collect()) == expected
    ranged = batch(
        spark, service, name, readChangeFeed="true", startingVersion="3", endingVersion="5"
    )
    assert sorted(key(r) for r in ranged.collect()) == [k for k in expected if 3 <= k[0] <= 5]
    # the change feed as a stream: the same rows
    q = (
        stream(spark, service, name, readChangeFeed="true", startingVersion="earliest")
        .writeStream.format("memory")
        .queryName("cdf_stream")
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    assert sorted(key(r) for r in spark.table("cdf_stream").collect()) == expected
    # a plain version range reads what the versions added; removing versions fail or skip
    added = batch(spark, service, name, startingVersion="1", endingVersion="2")
    assert sorted(r.id for r in added.collect()) == [0, 1, 2, 3, 4]
    with pytest.raises(Exception, match=r"(?s)version 3 of dataset .* removes data"):
        batch(spark, service, name, startingVersion="1").collect()
    skipped = batch(spark, service, name, startingVersion="1", skipChangeCommits="true")
    assert sorted(r.id for r in skipped.collect()) == [0, 1, 2, 3, 4, 12, 13]
