"""The dataset service end to end: a real ``aqueduct serve`` process, real Delta tables, the
Python client over real QUIC on loopback."""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import ServiceProcess
from deltalake import DeltaTable

from aqueduct_core.transport import TransportConfig
from aqueduct_spark import protocol as P

pytestmark = pytest.mark.quic


def table(n: int, start: int = 0) -> pa.Table:
    ids = pa.array(range(start, start + n), pa.int64())
    return pa.table(
        {
            "id": ids,
            "x": pc.multiply(ids.cast(pa.float64()), 0.5),
            "s": pa.array([f"row-{i}" for i in range(start, start + n)], pa.string()),
            "ts": pa.array(
                [
                    dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i)
                    for i in range(start, start + n)
                ],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )


def sorted_ids(t: pa.Table) -> list[int]:
    return sorted(t.column("id").to_pylist())


@pytest.fixture(params=["quic", "tcp"])
def over(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The transport of ``service.client()`` (the service listens on both, on one port)."""
    original = ServiceProcess.client

    def client(self: ServiceProcess, **options: Any) -> Any:
        options.setdefault("transport", request.param)
        return original(self, **options)

    monkeypatch.setattr(ServiceProcess, "client", client)
    return str(request.param)


def test_every_request_type(service: ServiceProcess, over: str) -> None:
    c = service.client()
    info = c.create("every", table(0).schema)
    assert c.transport == over
    assert info.version == 0 and info.rows == 0
    assert "every" in [d.name for d in c.list()]
    c.append("every", table(1000))
    c.append("every", table(500, 1000))
    described = c.describe("every")
    assert described.rows == 1500 and described.version == 2
    plan = c.plan("every", columns=["id", "s"], filter=[("id", ">=", 1200)])
    got = pa.Table.from_batches(
        [
            b
            for s in plan.splits
            for b in c.scan(s, schema=plan.schema, columns=["id", "s"], filter=[("id", ">=", 1200)])
        ],
        schema=plan.schema,
    )
    assert plan.schema.names == ["id", "s"] and sorted_ids(got) == list(range(1200, 1500))
    offsets = c.offsets("every")
    assert offsets["latest"] == 2 and [v["rows"] for v in offsets["versions"]] == [0, 1000, 500]
    changes = c.changes("every", 2)
    assert sum(f["rows"] for f in changes["files"]) == 500
    assert c.drop("every") is True
    with pytest.raises(P.DatasetNotFound):
        c.describe("every")
    assert c.drop("every", if_exists=True) is False


def test_time_travel_by_version_and_timestamp(service: ServiceProcess) -> None:
    c = service.client()
    c.overwrite("travel", table(10))
    before = dt.datetime.now(dt.UTC)
    time.sleep(1.1)  # commit times of the next version are at least a second apart
    c.append("travel", table(5, 10))
    assert c.read("travel").num_rows == 15
    assert c.read("travel", version=0).num_rows == 10
    assert c.read("travel", timestamp=before).num_rows == 10
    with pytest.raises(P.VersionNotFound):
        c.read("travel", version=99)


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ([("id", "==", 7)], [7]),
        ([("id", "!=", 7), ("id", "<", 10)], [0, 1, 2, 3, 4, 5, 6, 8, 9]),
        ([("id", "<", 3)], [0, 1, 2]),
        ([("id", "<=", 3)], [0, 1, 2, 3]),
        ([("id", ">", 96)], [97, 98, 99]),
        ([("id", ">=", 96)], [96, 97, 98, 99]),
        ([("id", "in", [3, 50, 1000])], [3, 50]),
        ([("s", "starts_with", "row-9")], [9, *range(90, 100)]),
        ([("s", "ends_with", "-42")], [42]),
        ([("s", "contains", "-7")], [7, *range(70, 80)]),
    ],
)
def test_filters_are_exact(service: ServiceProcess, flt: Any, expected: list[int]) -> None:
    c = service.client()
    c.overwrite("filters", table(100))
    assert sorted_ids(c.read("filters", filter=flt)) == expected


def test_many_parallel_writers_commit_together(service: ServiceProcess, over: str) -> None:
    name = f"parallel-{over}"
    c = service.client()
    schema = table(0).schema
    txn = c.begin(name, schema, mode="overwrite")
    results: dict[int, Any] = {}

    def task(i: int) -> None:
        results[i] = service.client().write_task(
            txn, table(1000, i * 1000).to_batches(max_chunksize=300), task=f"t{i}"
        )

    threads = [threading.Thread(target=task, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with pytest.raises(P.DatasetNotFound):  # nothing visible before the commit
        c.describe(name)
    result = c.commit(txn, [results[i] for i in range(8)])
    assert result["rows"] == 8000
    assert sorted_ids(c.read(name)) == list(range(8000))


def test_abort_leaves_no_trace(service: ServiceProcess) -> None:
    c = service.client()
    c.overwrite("aborted", table(10))
    version = c.describe("aborted").version
    files_before = _files(service.root / "aborted")
    txn = c.begin("aborted", table(0).schema)
    staged = c.write_task(txn, table(100, 10).to_batches())
    assert _files(service.root / "aborted") != files_before  # staged files exist
    assert c.abort(txn, [staged]) >= 1
    assert _files(service.root / "aborted") == files_before
    assert c.describe("aborted").version == version and c.read("aborted").num_rows == 10


def test_a_commit_that_finishes_removes_what_failed_attempts_staged(
    service: ServiceProcess,
) -> None:
    """``commit(..., finish=True)`` (the Spark writer's): the service answers ``finishing``
    and then deletes the transaction's staged files the commit left out (a task attempt that
    failed after staging), as the abort the writer no longer sends did; a bad transaction id
    is refused before anything is committed."""
    c = service.client()
    txn = c.begin("finished", table(0).schema)
    lost = c.write_task(txn, table(100, 10).to_batches())  # the failed attempt's
    kept = c.write_task(txn, table(5, 10).to_batches())
    staged = _files(service.root / "finished")
    with pytest.raises(P.InvalidRequest, match="invalid transaction id"):
        c.commit(replace(txn, txn="../x"), [kept], finish=True)
    result = c.commit(txn, [kept], finish=True)
    assert result["committed"] and result["finishing"] and result["rows"] == 5
    kept_file = {f["path"] for f in kept["staged"]}
    lost_file = {f["path"] for f in lost["staged"]}
    deadline = time.monotonic() + 10  # the clean-up runs after the answer
    while _files(service.root / "finished") & lost_file and time.monotonic() < deadline:
        time.sleep(0.02)
    left = _files(service.root / "finished")
    assert left & lost_file == set() and kept_file <= left, (staged, left)
    assert sorted_ids(c.read("finished")) == list(range(10, 15))


def test_repeated_idempotent_commit_changes_nothing(service: ServiceProcess) -> None:
    c = service.client()
    c.overwrite("idem", table(10))
    txn = c.begin("idem", table(0).schema)
    staged = c.write_task(txn, table(5, 10).to_batches())
    first = c.commit(txn, [staged], app_id="job-1", app_version=7)
    second = c.commit(txn, [staged], app_id="job-1", app_version=7)
    assert first["committed"] is True and second["committed"] is False
    assert c.read("idem").num_rows == 15


def test_errors_arrive_as_their_own_class(
    service: ServiceProcess, secured_service: ServiceProcess
) -> None:
    c = service.client()
    c.overwrite("errors", table(10))
    with pytest.raises(P.DatasetNotFound, match="nope"):
        c.describe("nope")
    with pytest.raises(P.DatasetExists):
        c.create("errors", table(0).schema)
    with pytest.raises(P.SchemaMismatch, match="id"):
        c.append("errors", pa.table({"id": pa.array(["not", "ints"])}))
    with pytest.raises(P.InvalidRequest, match=r"allowed|name"):
        c.describe("../etc")
    with pytest.raises(P.InvalidRequest):
        c.read("errors", filter=[("id", "~=", 1)])
    with pytest.raises(P.VersionNotFound):
        c.describe("errors", version=1234)
    with pytest.raises(P.Unauthenticated, match="token"):
        secured_service.client(token="wrong").list()
    with pytest.raises(P.Unauthenticated):
        secured_service.client(token=None).list()
    assert secured_service.client().list() == []


def test_data_loss_is_reported(service: ServiceProcess) -> None:
    c = service.client()
    c.overwrite("lossy", table(100))
    for f in (service.root / "lossy").rglob("*.parquet"):
        f.unlink()
    with pytest.raises(P.DataLoss):
        c.read("lossy")


def test_bad_input_gets_clear_errors_and_the_service_keeps_serving(
    service: ServiceProcess, over: str
) -> None:
    import asyncio

    from aqueduct_core.api import channel, oneshot
    from aqueduct_core.transport import ClientTLS, connect

    c = service.client()
    c.overwrite("sturdy", table(10))

    async def raw() -> list[Any]:
        conn = await connect(
            "127.0.0.1",
            service.port,
            tls=ClientTLS(fingerprint=service.fingerprint),
            transport=over,
        )
        answers = []
        for request in ({"op": "teleport"}, {"op": "describe"}, {"op": "describe", "dataset": 7}):
            reply, answer = oneshot()
            await conn.entrypoint.send({**request, "reply": reply})
            answers.append(await answer)
        await conn.entrypoint.send("not even a map")
        # a write whose channel carries bytes that are not Arrow
        txn_reply, txn_answer = oneshot()
        schema = table(0).schema
        await conn.entrypoint.send(
            {
                "op": "begin",
                "dataset": "sturdy",
                "mode": "append",
                "schema": P.schema_to_bytes(schema),
                "reply": txn_reply,
            }
        )
        txn = P.unwrap(await txn_answer)
        tx, rx = channel(headers=[(P.H_SCHEMA, P.schema_to_bytes(schema))], codec="raw")
        reply, answer = oneshot()
        await conn.entrypoint.send(
            {
                "op": "write",
                "dataset": "sturdy",
                "txn": txn["txn"],
                "task": "bad",
                "data": rx,
                "reply": reply,
            }
        )
        await tx.send(b"these bytes are not an Arrow record batch")
        tx.finish()
        answers.append(await answer)
        conn.entrypoint.finish()
        await conn.close()
        return answers

    answers = asyncio.run(raw())
    codes = [a["error"]["code"] for a in answers]
    assert codes == ["INVALID_REQUEST"] * 4
    assert "teleport" in answers[0]["error"]["message"]
    assert "not an Arrow" in answers[3]["error"]["message"]
    assert c.read("sturdy").num_rows == 10  # and other clients are served as before


def test_an_oversized_message_closes_only_that_connection(
    service: ServiceProcess, over: str
) -> None:
    """A raw peer sending one 100 MiB message (over the 64 MiB message limit) is cut off with
    close code 3 and a reason naming the limit; other clients are served as before."""
    import asyncio

    from aqueduct_core.api import channel, oneshot
    from aqueduct_core.errors import ConnectionLost
    from aqueduct_core.transport import ClientTLS, connect

    c = service.client()
    c.overwrite("limits", table(10))

    async def raw() -> str:
        conn = await connect(
            "127.0.0.1",
            service.port,
            tls=ClientTLS(fingerprint=service.fingerprint),
            transport=over,
        )
        assert conn.transport == over
        schema = table(0).schema
        tx, rx = channel(headers=[(P.H_SCHEMA, P.schema_to_bytes(schema))], codec="raw")
        reply, answer = oneshot()
        await conn.entrypoint.send(
            {
                "op": "write",
                "dataset": "limits",
                "txn": "t" * 32,
                "task": "big",
                "data": rx,
                "reply": reply,
            }
        )
        with pytest.raises(ConnectionLost) as lost:
            await tx.send(b"\0" * (100 << 20))
            await asyncio.wait_for(answer, 30)
        return str(lost.value)

    reason = asyncio.run(raw())
    assert "close code 3" in reason and "exceeds the limit" in reason
    assert c.read("limits").num_rows == 10


@pytest.mark.slow
def test_a_2_gib_batch_is_split_by_the_client(service: ServiceProcess) -> None:
    """A single 2 GiB batch is sent as slices under the message limit (zero-copy)."""
    import numpy as np

    c = service.client()
    n = 2 * 1024 * 1024 * 1024 // 8
    big = pa.RecordBatch.from_arrays([pa.array(np.arange(n, dtype=np.int64))], names=["v"])
    c.overwrite("big", big)
    del big
    assert c.describe("big").rows == n


def test_tables_written_through_the_service_are_plain_delta(service: ServiceProcess) -> None:
    c = service.client()
    data = table(2500)
    c.overwrite("plain", data)
    direct = DeltaTable(str(service.root / "plain")).to_pyarrow_table()
    assert direct.sort_by("id").equals(data.sort_by("id"))
    assert c.read("plain").sort_by("id").equals(data.sort_by("id"))


def test_push_notifications_arrive_after_commits(service: ServiceProcess, over: str) -> None:
    c = service.client()
    c.overwrite("pushed", table(1))
    seen: list[int] = []
    alive = threading.Event()
    got = threading.Event()

    def on_version(v: int) -> None:
        seen.append(v)
        if v >= 3:
            got.set()

    sub = c.subscribe("pushed", on_version, lambda ok: alive.set() if ok else None)
    try:
        assert alive.wait(10)
        c.append("pushed", table(1, 1))
        c.append("pushed", table(1, 2))
        c.append("pushed", table(1, 3))
        assert got.wait(10), f"saw {seen}"
        assert seen == sorted(seen) and seen[-1] >= 3
    finally:
        sub.cancel()


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet")}


def test_several_worker_processes_share_one_port(tmp_path: Path) -> None:
    """--workers 2: two service processes on one UDP port (SO_REUSEPORT); every client is
    served, and a write committed through one worker is read through any."""
    from aqueduct_spark.testing import start_service

    svc = start_service(tmp_path / "root", workers=2)
    try:
        writer = svc.client()
        writer.overwrite("shared", table(1000))
        clients = [svc.client(transport=TransportConfig(backend=b)) for b in ("aioquic", "qh3") * 3]
        for c in clients:
            assert c.read("shared").num_rows == 1000
        for c in clients:
            c.close()
    finally:
        svc.stop()
