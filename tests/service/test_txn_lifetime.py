"""A lifetime for write transactions (issue 32): one left open past ``--txn-lifetime-hours``
has its staged files deleted and its commit refused, while one that keeps writing is
untouched and commits; on a local root with two service processes (neither reaps what the
other keeps alive), on SeaweedFS, after a crash and a restart. The state is the store's
(``service.txn_records``), so the sweep's rules are also checked here without processes:
what a process that is gone left behind, and a sweep racing a write."""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from aqueduct_spark import protocol as P
from aqueduct_spark.client.models import Transaction
from aqueduct_spark.service import staging
from aqueduct_spark.service.access import ANYONE
from aqueduct_spark.service.store import Store
from aqueduct_spark.service.transactions import StagingConfig, Transactions
from aqueduct_spark.service.txn_records import DIR, EXPIRED, LIVE, Records
from aqueduct_spark.testing import SeaweedS3, ServiceProcess, start_service

pytestmark = pytest.mark.quic

LIFETIME_H = 0.001  # 3.6 s
LIFETIME = LIFETIME_H * 3600
FLAGS = ["--txn-lifetime-hours", str(LIFETIME_H), "--txn-sweep-seconds", "0.25"]
SCHEMA = pa.schema([("v", pa.int64())])


def batch(n: int = 1000) -> pa.RecordBatch:
    return pa.record_batch([pa.array(np.arange(n, dtype=np.int64))], schema=SCHEMA)


def wait_until(what: str, done: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


class KeepWriting:
    """Two transactions kept alive through one service, each in its own way: ``tasks``
    by short write tasks one after the other, ``stream`` by one task open the whole time
    whose batches come one every 0.3 s (the service keeps it alive while it streams)."""

    def __init__(self, svc: ServiceProcess, tasks: Transaction, stream: Transaction) -> None:
        self.txns = {"tasks": tasks, "stream": stream}
        self.staged: dict[str, list[dict[str, Any]]] = {"tasks": [], "stream": []}
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._stream, args=(svc.client(),)),
            threading.Thread(target=self._tasks, args=(svc.client(),)),
        ]
        for t in self._threads:
            t.start()

    def _stream(self, client: Any) -> None:
        def trickle() -> Iterator[pa.RecordBatch]:
            while not self._stop.wait(0.3):
                yield batch(100)

        self.staged["stream"].append(client.write_task(self.txns["stream"], trickle()))

    def _tasks(self, client: Any) -> None:
        while not self._stop.wait(0.5):
            self.staged["tasks"].append(client.write_task(self.txns["tasks"], [batch(100)]))

    def rows(self, which: str) -> int:
        return sum(int(s["rows"]) for s in self.staged[which])

    def stop(self, after: float) -> None:
        """Stop once the writes went on for ``after`` seconds (outliving the lifetime)."""
        time.sleep(max(0.0, self.started + after - time.monotonic()))
        self._stop.set()
        for t in self._threads:
            t.join(60)
            assert not t.is_alive()

    def commit(self, client: Any) -> int:
        """Commit both (through ``client``); the rows they committed."""
        total = 0
        for which, txn in self.txns.items():
            done = client.commit(txn, self.staged[which])
            assert done["rows"] == self.rows(which) > 0, which
            total += done["rows"]
        return total


def local_files(root: Path, dataset: str, txn: str) -> list[Path]:
    return [p for p in (root / dataset).rglob(f"part-{txn}-*") if p.is_file()]


def test_an_idle_transaction_expires_and_one_kept_writing_commits_across_two_services(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    a = start_service(root, args=FLAGS, log=tmp_path / "a.log")
    b = start_service(root, args=FLAGS, log=tmp_path / "b.log")
    try:
        ca, cb = a.client(), b.client()
        ca.create("life", SCHEMA)
        idle = ca.begin("life", SCHEMA)
        idle_staged = ca.write_task(idle, [batch()])
        assert local_files(root, "life", idle.txn)
        # kept alive through A, while B sweeps too
        live = KeepWriting(a, ca.begin("life", SCHEMA), ca.begin("life", SCHEMA))

        wait_until(
            "the idle transaction's files deleted", lambda: not local_files(root, "life", idle.txn)
        )
        assert not (root / DIR / f"{idle.txn}.life.live").exists()
        with pytest.raises(P.InvalidRequest) as refused:
            cb.commit(idle, [idle_staged])  # through the other process
        assert "expired" in str(refused.value) and "--txn-lifetime-hours" in str(refused.value)
        assert refused.value.details["reason"] == "transaction_expired"
        with pytest.raises(P.InvalidRequest, match="expired"):
            ca.write_task(idle, [batch()])
        assert not local_files(root, "life", idle.txn)  # that write staged nothing

        live.stop(after=1.5 * LIFETIME)
        rows = live.commit(cb)  # through the other process
        assert cb.describe("life").rows == rows
        status = ca.status()
        expired = status["expired_transactions"] + cb.status()["expired_transactions"]
        assert expired == 1 and status["txn_lifetime_s"] == pytest.approx(LIFETIME)
        logs = (tmp_path / "a.log").read_text() + (tmp_path / "b.log").read_text()
        assert f"transaction expired dataset=life txn={idle.txn}" in logs
    finally:
        a.stop()
        b.stop()


def test_an_idle_transaction_expires_on_an_object_store(seaweed: SeaweedS3) -> None:
    root = f"{seaweed.root}-life-{uuid.uuid4().hex[:8]}"
    svc = start_service(root, args=[*seaweed.serve_args(), *FLAGS])
    store = Store(root, seaweed.storage_options)

    def files(txn: str) -> list[str]:
        fs = store.filesystem("life")
        return [i.path for i in staging.staged_files(fs) if staging.staged_txn(i.path) == txn]

    try:
        c = svc.client()
        c.create("life", SCHEMA)
        idle = c.begin("life", SCHEMA)
        idle_staged = c.write_task(idle, [batch()])
        assert files(idle.txn)
        live = KeepWriting(svc, c.begin("life", SCHEMA), c.begin("life", SCHEMA))
        wait_until("the idle transaction's files deleted", lambda: not files(idle.txn))
        with pytest.raises(P.InvalidRequest, match="expired"):
            c.commit(idle, [idle_staged])
        live.stop(after=1.5 * LIFETIME)
        rows = live.commit(c)
        assert c.describe("life").rows == rows
    finally:
        svc.stop()


@pytest.mark.slow
@pytest.mark.fault
def test_a_crashed_services_transaction_expires_through_another_and_after_a_restart(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    a = start_service(root, args=FLAGS)
    b = start_service(root, args=FLAGS)
    try:
        ca = a.client()
        ca.create("crash", SCHEMA)
        left = ca.begin("crash", SCHEMA)
        ca.write_task(left, [batch()])
        a.kill()  # nothing of A's memory survives: B finds it on the store
        wait_until("B deletes what A left", lambda: not local_files(root, "crash", left.txn))
        cb = b.client()
        also = cb.begin("crash", SCHEMA)
        cb.write_task(also, [batch()])
        b.kill()
        time.sleep(LIFETIME)  # every process down while it outlives its lifetime
        c = start_service(root, args=FLAGS)
        try:
            wait_until(
                "a restarted service deletes it", lambda: not local_files(root, "crash", also.txn)
            )
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()


# -- the sweep's rules, without processes ----------------------------------------------------

CONFIG = StagingConfig(lifetime=dt.timedelta(seconds=60))


def stage(txns: Transactions, dataset: str, txn: str) -> list[P.StagedFile]:
    write = txns.stage(dataset, txn, "task", SCHEMA, [], ANYONE)
    write.write(batch())
    return write.close()


def age(root: Path, dataset: str, txn: str, kind: str, seconds: float) -> None:
    """Make a record look written ``seconds`` ago."""
    then = time.time() - seconds
    os.utime(root / Records.path(dataset, txn, kind), (then, then))


def test_what_a_process_that_is_gone_left_expires_from_the_store_alone(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("gone", SCHEMA)
    dead = Transactions(store, CONFIG, pool=None, per_token=False)
    staged = stage(dead, "gone", "t1")
    assert dead.ledger.total == staged[0].size
    age(tmp_path, "gone", "t1", LIVE, 30)
    fresh = Transactions(Store(tmp_path), CONFIG, pool=None, per_token=False)  # a new process
    fresh.sweep()
    assert local_files(tmp_path, "gone", "t1")  # half its lifetime: kept
    age(tmp_path, "gone", "t1", LIVE, 61)
    fresh.sweep()
    assert not local_files(tmp_path, "gone", "t1")
    assert fresh.expired == 1 and fresh.expired_bytes == staged[0].size
    assert not (tmp_path / DIR / "t1.gone.live").exists()
    assert (tmp_path / DIR / "t1.gone.expired").exists()
    with pytest.raises(P.InvalidRequest, match="expired"):
        fresh.before_commit("gone", staged)
    dead.sweep()  # the process that wrote it forgets its bytes: finished elsewhere
    assert dead.ledger.total == 0
    age(tmp_path, "gone", "t1", EXPIRED, 61)
    fresh.sweep()  # a lifetime later the tombstone goes too
    assert not (tmp_path / DIR / "t1.gone.expired").exists()


@pytest.mark.parametrize("when", ["before", "after", "across"])
def test_a_sweep_never_deletes_a_transaction_written_meanwhile(tmp_path: Path, when: str) -> None:
    """Process B writes the transaction while process A decides to expire it, its record
    write landing before A's tombstone, after it, or with its check for a tombstone before
    and its record after: B is refused (it saw the tombstone), or A backs off (it saw the
    record change), never neither; a write B was not refused keeps its files."""
    store = Store(tmp_path)
    store.create("race", SCHEMA)
    b = Transactions(store, CONFIG, pool=None, per_token=False)
    a = Transactions(Store(tmp_path), CONFIG, pool=None, per_token=False)
    staged = stage(b, "race", "t2")
    age(tmp_path, "race", "t2", LIVE, 61)
    outcome: list[str] = []
    bury = a.records.bury

    def activity_of_b() -> None:
        try:
            b.activity("race", "t2", None, force=True)
            outcome.append("alive")
        except P.InvalidRequest:
            outcome.append("refused")

    def b_then_read(*args: Any) -> dict[str, Any]:
        activity_of_b()  # before A's tombstone: A reads the record just before it buries
        return Records.read(a.records, *args)

    def bury_then_b(*args: Any) -> None:
        bury(*args)
        activity_of_b()  # after A's tombstone, before A looks at the record again

    def tombstone_midway(*args: Any) -> None:
        bury("race", "t2", {})  # A's tombstone lands between B's check and B's record
        Records._write(b.records, *args)

    if when == "before":
        a.records.read = b_then_read  # type: ignore[method-assign]
    elif when == "after":
        a.records.bury = bury_then_b  # type: ignore[method-assign]
    else:
        a.records.read = b_then_read  # type: ignore[method-assign]
        b.records._write = tombstone_midway  # type: ignore[method-assign]
    a.sweep()
    kept = bool(local_files(tmp_path, "race", "t2"))
    assert outcome == (["alive"] if when == "before" else ["refused"])
    assert kept or outcome == ["refused"]  # never deleted under a write that was told alive
    assert a.expired == (0 if kept else 1)
    assert (tmp_path / Records.path("race", "t2", EXPIRED)).exists() == (not kept)
    if when == "before":
        b.before_commit("race", staged)
        assert store.commit("race", "append", SCHEMA, [], staged).rows == 1000
    if when == "across":
        assert kept  # A saw B's record and backed off; B was refused all the same


def test_a_vacuum_keeps_the_files_of_a_transaction_active_within_its_retention(
    tmp_path: Path,
) -> None:
    """A long write's first files may be older than the retention; its transaction is not."""
    store = Store(tmp_path)
    store.create("vac", SCHEMA)
    txns = Transactions(store, CONFIG, pool=None, per_token=False)
    staged = stage(txns, "vac", "t3")
    then = time.time() - 7200
    os.utime(tmp_path / "vac" / staged[0].path, (then, then))  # staged two hours ago
    hour = dt.timedelta(hours=1)
    assert store.cleanup_orphans("vac", older_than=hour) == []  # active just now: kept
    age(tmp_path, "vac", "t3", LIVE, 5400)  # idle for an hour and a half
    assert store.cleanup_orphans("vac", older_than=hour) == [staged[0].path]
