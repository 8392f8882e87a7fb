"""The Structured Streaming source and sink in Spark local mode against a real service."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from stream_helpers import (
    SCHEMA,
    ids_of,
    rows,
    wait_rows,
    wait_until,
)

from aqueduct_spark.datasource.stream_writer import app_id
from aqueduct_spark.service.store import Store
from aqueduct_spark.testing import ServiceProcess

pytestmark = pytest.mark.spark


def fresh(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def source(spark: Any, svc: ServiceProcess, name: str, **options: str) -> DataFrame:
    return spark.readStream.format("aqueduct").options(**svc.options, **options).load(name)


def to_aqueduct(
    df: DataFrame,
    svc: ServiceProcess,
    name: str,
    checkpoint: Path,
    *,
    mode: str = "append",
    **trigger: Any,
) -> Any:
    writer = (
        df.writeStream.format("aqueduct")
        .options(**svc.options)
        .option("checkpointLocation", str(checkpoint))
        .outputMode(mode)
    )
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start(name)


def to_memory(df: DataFrame, table: str, **trigger: Any) -> Any:
    writer = df.writeStream.format("memory").queryName(table).outputMode("append")
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()


def memory_ids(spark: Any, table: str) -> list[int]:
    return sorted(r.id for r in spark.table(table).select("id").collect())


def batches(query: Any) -> list[int]:
    """Rows per micro-batch that read data, from the query's progress reports."""
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def source_progress(query: Any) -> list[dict[str, Any]]:
    """The source's part of each progress report that read data, offsets parsed (PySpark
    gives them as JSON text)."""
    out = []
    for p in query.recentProgress:
        if p["numInputRows"]:
            s = dict(p["sources"][0])
            for key in ("startOffset", "endOffset", "latestOffset"):
                if isinstance(s.get(key), str):
                    s[key] = json.loads(s[key])
            out.append(s)
    return out


def backlog(svc: ServiceProcess, name: str, versions: int, per_version: int) -> None:
    c = svc.client()
    c.create(name, SCHEMA)
    for i in range(versions):
        c.append(name, rows(i * per_version, per_version))


def started(query: Any) -> None:
    """Wait until a continuous query finished its first trigger: its reader has fixed where it
    starts (``initialOffset``: with startingVersion=latest, the version then latest), so what
    is appended from now on is new to it. The first trigger reports progress even when it read
    nothing; its status alone does not tell (before the query's thread runs, it is neither
    "Initializing sources" nor an active trigger, which let an append race the start)."""

    def first_trigger_done() -> bool:
        if not query.isActive:
            raise AssertionError(f"the query ended before its first trigger: {query.exception()}")
        return query.lastProgress is not None

    wait_until(first_trigger_done, 60, "the query's first trigger", step=0.05)


# -- source and sink end to end ----------------------------------------------------------


def test_rows_appended_while_a_stream_runs_arrive_exactly_once(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    src, dst = fresh("live_src"), fresh("live_dst")
    backlog(service, src, 2, 50)
    c = service.client()
    q = to_aqueduct(source(spark, service, src, startingVersion="earliest"), service, dst, tmp_path)
    try:
        for i in range(2, 8):
            c.append(src, rows(i * 50, 50))
            time.sleep(0.2)
        wait_rows(c, dst, 400, q)
        time.sleep(1)  # nothing more may come
    finally:
        q.stop()
    assert ids_of(c, dst) == list(range(400))
    # The sink's idempotency key: a Delta app transaction per query, versioned by batch id.
    last_batch = q.lastProgress["batchId"]
    assert Store(service.root).transaction_version(dst, app_id(q.id)) == last_batch


def test_available_now_with_max_rows_reads_the_backlog_in_limited_batches(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    src, dst = fresh("an_src"), fresh("an_dst")
    backlog(service, src, 10, 10)  # versions 1..10, one file of 10 rows each
    df = source(spark, service, src, startingVersion="earliest", maxRowsPerTrigger="30")
    q = to_aqueduct(df, service, dst, tmp_path, availableNow=True)
    assert q.awaitTermination(120)
    assert batches(q) == [30, 30, 30, 10]
    assert len(q.recentProgress) == 4  # no empty batches either
    c = service.client()
    assert ids_of(c, dst) == list(range(100))
    # Each micro-batch is one commit of the sink.
    assert c.describe(dst).version == 3  # versions 0..3: one per batch
    # Progress metrics: what the source has not planned yet, after each batch.
    offsets = [s["latestOffset"] for s in source_progress(q)]
    assert [o["rowsBehind"] for o in offsets] == [70, 40, 10, 0]
    assert [o["versionsBehind"] for o in offsets] == [7, 4, 1, 0]
    assert all(o["latestVersion"] == 10 for o in offsets)
    # Offsets are dataset positions; the last one is after version 10.
    table_id = Store(service.root).table_id(src)
    assert source_progress(q)[-1]["endOffset"] == {"version": 11, "file": 0, "tableId": table_id}


def test_read_limits_never_split_a_file_and_max_bytes_applies(
    spark: Any, service: ServiceProcess
) -> None:
    src = fresh("bytes_src")
    backlog(service, src, 8, 10)
    c = service.client()
    sizes = [f["bytes"] for v in range(1, 9) for f in c.changes(src, v)["files"]]
    limit = int(max(sizes) * 2.5)  # two files per batch
    expected, batch, total = [], 0, 0
    for size in sizes:
        if batch and total + size > limit:
            expected.append(batch * 10)
            batch, total = 0, 0
        batch, total = batch + 1, total + size
    expected.append(batch * 10)
    assert expected == [20, 20, 20, 20]
    df = source(spark, service, src, startingVersion="earliest", maxBytesPerTrigger=str(limit))
    q = to_memory(df, "bytes_limited", availableNow=True)
    assert q.awaitTermination(120)
    assert batches(q) == expected
    assert memory_ids(spark, "bytes_limited") == list(range(80))
    # A limit below one file still moves on, one whole file per batch.
    df = source(spark, service, src, startingVersion="5", maxRowsPerTrigger="3")
    q = to_memory(df, "rows_limited", availableNow=True)
    assert q.awaitTermination(120)
    assert batches(q) == [10, 10, 10, 10]
    assert memory_ids(spark, "rows_limited") == list(range(40, 80))


def test_restart_from_the_checkpoint_after_stop_loses_and_repeats_nothing(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    src, dst = fresh("restart_src"), fresh("restart_dst")
    backlog(service, src, 3, 20)
    c = service.client()

    def run() -> Any:
        df = source(spark, service, src, startingVersion="earliest", maxRowsPerTrigger="20")
        return to_aqueduct(df, service, dst, tmp_path / "ck")

    q = run()
    try:
        wait_rows(c, dst, 60, q)
        c.append(src, rows(60, 20))
        wait_rows(c, dst, 80, q)
    finally:
        q.stop()
    c.append(src, rows(80, 20))  # while no query runs
    c.append(src, rows(100, 20))
    q = run()
    try:
        c.append(src, rows(120, 20))
        wait_rows(c, dst, 140, q)
        time.sleep(1)
    finally:
        q.stop()
    assert ids_of(c, dst) == list(range(140))


@pytest.mark.slow  # a micro-batch of 50,000 rows caught running: 100 s at load 12
def test_a_graceful_stop_lets_the_running_batch_commit(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    """``query.stop()`` during a micro-batch cancels it (Spark's own ERROR lines: ``... is
    aborting``, ``TaskKilledException``, ``Aborting commit``) and nothing of it is written;
    ``stop_gracefully`` lets it finish: its rows are committed, and the query ends cleanly
    (tests/spark/test_stopping.py covers the waiting fast, against a stand-in query)."""
    from aqueduct_spark.datasource import stop_gracefully

    src, dst = fresh("graceful_src"), fresh("graceful_dst")
    c = service.client()
    c.create(src, SCHEMA)
    q = to_aqueduct(source(spark, service, src), service, dst, tmp_path / "ck")
    n = 50_000  # a micro-batch that takes a while to write
    try:
        wait_until(lambda: q.lastProgress, 240, "the first micro-batch to end")
        c.append(src, rows(0, n))  # the next micro-batch's tasks write these
        tracker = spark.sparkContext.statusTracker()
        wait_until(tracker.getActiveStageIds, 240, "the micro-batch's tasks", step=0.01)
        assert stop_gracefully(q, timeout=240)
    finally:
        q.stop()
    assert not q.isActive and q.exception() is None
    assert len(ids_of(c, dst)) == n  # was: [] (the batch was cancelled)


def test_a_replayed_batch_is_not_written_twice(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    """Spark replays a batch whose commit it did not record (a crash between the sink's
    commit and the checkpoint's commit log): the sink must see its key and do nothing."""
    src, dst = fresh("replay_src"), fresh("replay_dst")
    backlog(service, src, 4, 25)
    ck = tmp_path / "ck"

    def run() -> Any:
        df = source(spark, service, src, startingVersion="earliest", maxRowsPerTrigger="50")
        q = to_aqueduct(df, service, dst, ck, availableNow=True)
        assert q.awaitTermination(120)
        return q

    first = run()
    assert batches(first) == [50, 50]
    c = service.client()
    version = c.describe(dst).version
    # As if the driver died right after the sink's commit, before Spark's commit log:
    (ck / "commits" / "1").unlink()
    (ck / "commits" / ".1.crc").unlink(missing_ok=True)
    again = run()
    assert [p["batchId"] for p in again.recentProgress if p["numInputRows"]] == [1]
    assert batches(again) == [50]
    assert c.describe(dst).version == version  # no new commit
    assert ids_of(c, dst) == list(range(100))
    assert _only_committed(service, dst)  # the replay's staged files were removed


def _only_committed(svc: ServiceProcess, dataset: str) -> bool:
    """Every parquet file under the dataset is referenced by its table (the replay's staged
    files were removed)."""
    from deltalake import DeltaTable

    table = DeltaTable(str(svc.root / dataset))
    active = {str(Path(u.removeprefix("file://")).resolve()) for u in table.file_uris()}
    on_disk = {str(p.resolve()) for p in (svc.root / dataset).rglob("*.parquet")}
    return on_disk == active


def test_a_retried_task_in_a_micro_batch_writes_once(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    src, dst = fresh("flaky_src"), fresh("flaky_dst")
    backlog(service, src, 4, 500)

    def flaky(it: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for i, batch in enumerate(it):
            yield batch
            if ctx.attemptNumber() == 0 and ctx.partitionId() == 0 and i == 0:
                raise RuntimeError("the first attempt dies after sending a batch")

    df = source(spark, service, src, startingVersion="earliest", splitSize="1")
    df = df.repartition(2).mapInArrow(flaky, df.schema)
    q = to_aqueduct(df, service, dst, tmp_path, availableNow=True)
    assert q.awaitTermination(120)
    c = service.client()
    assert ids_of(c, dst) == list(range(2000))


def test_complete_mode_overwrites_the_sink_with_each_result(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    src, dst = fresh("agg_src"), fresh("agg_dst")
    backlog(service, src, 6, 10)
    df = source(spark, service, src, startingVersion="earliest", maxRowsPerTrigger="20")
    counts = df.groupBy((F.col("id") % 3).alias("k")).agg(F.count("*").alias("n"))
    q = to_aqueduct(counts, service, dst, tmp_path, mode="complete", availableNow=True)
    assert q.awaitTermination(120)
    assert batches(q) == [20, 20, 20]
    c = service.client()
    table = c.read(dst).sort_by("k")
    assert table.column("k").to_pylist() == [0, 1, 2]
    assert table.column("n").to_pylist() == [20, 20, 20]
    assert c.describe(dst).files <= 2  # each batch replaced the previous result


def test_a_partitioned_source_streams_with_its_partition_values(
    spark: Any, service: ServiceProcess
) -> None:
    src = fresh("parts_src")
    schema = pa.schema([("id", pa.int64()), ("day", pa.date32())])
    c = service.client()
    c.create(src, schema, partition_by=["day"])
    days = [dt.date(2026, 1, 1) + dt.timedelta(days=i % 3) for i in range(30)]
    for i in range(3):
        part = slice(i * 10, (i + 1) * 10)
        c.append(src, pa.table({"id": list(range(30))[part], "day": days[part]}, schema=schema))
    files = [f for v in (1, 2, 3) for f in c.changes(src, v)["files"]]
    assert sum(f["rows"] for f in files) == 30 and len(files) == 9  # a file per day
    df = source(spark, service, src, startingVersion="earliest", maxRowsPerTrigger="10")
    q = to_memory(df, "parts", availableNow=True)
    assert q.awaitTermination(120)
    assert sum(batches(q)) == 30
    got = sorted((r.id, r.day) for r in spark.table("parts").collect())
    assert got == sorted(zip(range(30), days, strict=True))


# -- where a new query starts --------------------------------------------------------------


def test_starting_version_earliest_number_and_timestamp(
    spark: Any, service: ServiceProcess
) -> None:
    src = fresh("start_src")
    backlog(service, src, 3, 10)  # versions 1..3: ids 0..29
    c = service.client()
    time.sleep(1.1)
    between = dt.datetime.now(dt.UTC)
    time.sleep(0.1)
    c.append(src, rows(30, 10))  # version 4
    c.append(src, rows(40, 10))  # version 5
    cases = {
        "earliest": ({"startingVersion": "earliest"}, list(range(50))),
        "version3": ({"startingVersion": "3"}, list(range(20, 50))),
        "timestamp": ({"startingTimestamp": between.isoformat()}, list(range(30, 50))),
        "future": ({"startingVersion": "9"}, []),
    }
    for table, (options, expected) in cases.items():
        q = to_memory(source(spark, service, src, **options), f"start_{table}", availableNow=True)
        assert q.awaitTermination(120)
        assert memory_ids(spark, f"start_{table}") == expected, table


def test_starting_version_latest_reads_only_later_versions(
    spark: Any, service: ServiceProcess
) -> None:
    src = fresh("latest_src")
    backlog(service, src, 2, 10)
    c = service.client()
    q = to_memory(source(spark, service, src), "start_latest")  # startingVersion=latest
    try:
        started(q)
        c.append(src, rows(100, 5))
        wait_until(lambda: memory_ids(spark, "start_latest"), 30, "the new rows")
        time.sleep(0.5)
    finally:
        q.stop()
    assert memory_ids(spark, "start_latest") == list(range(100, 105))


# -- admission control ---------------------------------------------------------------------


def test_min_rows_waits_for_more_data_up_to_max_trigger_delay(
    spark: Any, service: ServiceProcess
) -> None:
    src = fresh("minrows_src")
    backlog(service, src, 3, 20)  # a backlog of 60 rows: over the minimum
    c = service.client()
    df = source(
        spark,
        service,
        src,
        startingVersion="earliest",
        minRowsPerTrigger="50",
        maxTriggerDelay="5s",
    )
    q = to_memory(df, "minrows")

    def rows_in(n: int) -> bool:
        if not q.isActive:
            raise AssertionError(f"the query failed: {q.exception()}")
        return len(memory_ids(spark, "minrows")) == n

    try:
        wait_until(lambda: rows_in(60), 120, "the backlog")
        c.append(src, rows(60, 10))  # under the minimum: held back until the delay ends
        wait_until(lambda: rows_in(70), 60, "the delayed rows")
        appended = dt.datetime.now(dt.UTC)
        c.append(src, rows(70, 60))  # enough, no waiting (the backlog summed 3 versions)
        wait_until(lambda: rows_in(130), 60, "a full batch")
    finally:
        q.stop()
    assert memory_ids(spark, "minrows") == list(range(130))
    assert batches(q) == [60, 10, 60]
    # Spark's trigger times, not when the test saw the rows (a memory-table read takes
    # seconds under load): the delay runs from the backlog's batch, which the test saw late.
    backlog_at, delayed_at, full_at = (
        dt.datetime.fromisoformat(p["timestamp"]) for p in q.recentProgress if p["numInputRows"]
    )
    assert (delayed_at - backlog_at).total_seconds() >= 4.5  # held back for maxTriggerDelay
    # enough rows go in the next trigger: held back, it would start 5 s after the last batch
    assert (full_at - max(appended, delayed_at)).total_seconds() < 4.5


# -- data loss -----------------------------------------------------------------------------


@pytest.mark.parametrize("fail", [True, False], ids=["failOnDataLoss", "skip"])
def test_versions_vacuumed_under_a_checkpoint(
    spark: Any, service: ServiceProcess, tmp_path: Path, fail: bool
) -> None:
    src, dst = fresh("lost_src"), fresh("lost_dst")
    backlog(service, src, 2, 10)  # ids 0..19, read by the first run
    c = service.client()

    def run() -> Any:
        df = source(
            spark,
            service,
            src,
            startingVersion="earliest",
            failOnDataLoss=str(fail).lower(),
            skipChangeCommits="true",  # the overwrite below removes data
        )
        return to_aqueduct(df, service, dst, tmp_path / "ck", availableNow=True)

    assert run().awaitTermination(120)
    assert ids_of(c, dst) == list(range(20))
    c.append(src, rows(20, 10))  # versions 3 and 4: never read ...
    c.append(src, rows(30, 10))
    c.overwrite(src, rows(1000, 10))  # ... removed by version 5 ...
    removed = Store(service.root).vacuum(src, retention=dt.timedelta(0))
    assert removed  # ... and their files deleted
    c.append(src, rows(2000, 10))  # version 6
    q = run()
    if fail:
        with pytest.raises(Exception, match=r"(?s)needs version 3.*failOnDataLoss=false"):
            q.awaitTermination(120)
        assert ids_of(c, dst) == list(range(20))
    else:
        assert q.awaitTermination(120)
        # The vacuumed versions are skipped, and so is the overwrite (skipChangeCommits);
        # later versions are read.
        assert ids_of(c, dst) == [*range(20), *range(2000, 2010)]


# -- learning about new versions: push and polling ----------------------------------------


@pytest.mark.parametrize("push", [True, False], ids=["push", "poll"])
def test_new_versions_arrive_by_push_or_by_polling(
    spark: Any, service: ServiceProcess, push: bool
) -> None:
    src = fresh("notify_src")
    backlog(service, src, 1, 1)
    c = service.client()
    # Push: polling is set to an hour, so only a pushed notification can wake the query.
    # Poll: push is off, and a 300 ms poll finds the versions.
    options = {"pushNotifications": "true", "pollInterval": "1h"}
    if not push:
        options = {"pushNotifications": "false", "pollInterval": "300ms"}
    table = f"notify_{'push' if push else 'poll'}"
    q = to_memory(source(spark, service, src, **options), table)
    try:
        started(q)
        time.sleep(0.5)
        for i in range(3):
            c.append(src, rows(100 + i, 1))
            wait_until(lambda i=i: len(memory_ids(spark, table)) == i + 1, 20, f"append {i}")
    finally:
        q.stop()
    assert memory_ids(spark, table) == [100, 101, 102]


def test_offsets_are_canonical_json_and_an_idle_stream_plans_nothing(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    src, dst = fresh("idle_src"), fresh("idle_dst")
    backlog(service, src, 2, 5)
    c = service.client()
    q = to_aqueduct(source(spark, service, src, startingVersion="earliest"), service, dst, tmp_path)
    try:
        wait_rows(c, dst, 10, q)
        wait_until(lambda: batches(q) == [10], 30, "the backlog's progress report")
        time.sleep(2.5)  # idle: no version, no batch
        assert batches(q) == [10]
    finally:
        q.stop()
    logs = sorted(
        (p for p in (tmp_path / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
    )
    assert len(logs) == 1  # one batch for the backlog, none while idle
    source_offset = logs[-1].read_text().splitlines()[-1]
    table_id = Store(service.root).table_id(src)
    assert source_offset == json.dumps({"version": 3, "file": 0, "tableId": table_id})


def test_subscription_heartbeats_keep_a_quiet_subscription_alive(service: ServiceProcess) -> None:
    """Without commits, the service still sends a note (the latest version) every heartbeat:
    the client can tell a quiet dataset from a dead service."""
    src = fresh("beat_src")
    backlog(service, src, 1, 1)
    c = service.client()
    notes: list[int] = []
    sub = c.subscribe(src, notes.append, lambda alive: None)
    try:
        wait_until(lambda: notes, 10, "the first note")
        wait_until(lambda: len(notes) >= 2, 12, "a heartbeat", step=0.2)
        assert set(notes) == {1}
    finally:
        sub.cancel()


def test_changes_lists_what_a_version_added_and_what_is_gone(service: ServiceProcess) -> None:
    src = fresh("changes_src")
    backlog(service, src, 2, 10)
    c = service.client()
    first = c.changes(src, 1)
    assert [f["rows"] for f in first["files"]] == [10] and first["missing"] == []
    c.overwrite(src, pa.table({"id": [7], "s": ["x"]}, schema=SCHEMA))
    Store(service.root).vacuum(src, retention=dt.timedelta(0))
    from aqueduct_spark import protocol as P

    with pytest.raises(P.DataLoss):
        c.changes(src, 1)
    gone = c.changes(src, 1, missing_ok=True)
    assert gone["missing"] == [f["path"] for f in first["files"]]
    assert c.changes(src, 3)["files"][0]["rows"] == 1
