"""Staging quotas (issue 32): a write past the staged, uncommitted bytes one transaction or one
token may have is refused through a real ``aqueduct serve``, before it writes; the store never
holds more than the quota; what the refused write staged is deleted; committed data is
untouched; and the counts show in ``/metrics``, the access log and ``aqueduct status``."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from test_observability import log_lines, metrics_urls, scrape, value, wait_for_line

from aqueduct_spark import cli
from aqueduct_spark import protocol as P
from aqueduct_spark.cli.arguments import build_parser
from aqueduct_spark.cli.staging import staging_config
from aqueduct_spark.service import staging
from aqueduct_spark.service.quota import Ledger
from aqueduct_spark.service.transactions import StagingConfig
from aqueduct_spark.testing import ServiceProcess, start_service

MiB = 1 << 20
TXN_QUOTA, TOKEN_QUOTA = 3 * MiB, 5 * MiB
TOKEN = "quota-tok-5d1f"
SCHEMA = pa.schema([("p", pa.int64()), ("v", pa.int64())])
"""Partitioned by ``p``: the files hold ``v`` alone."""
rng = np.random.default_rng(32)


def rows(n: int, parts: int = 1) -> pa.Table:
    """``n`` rows of random (incompressible) int64 values over ``parts`` partitions: about
    8 bytes a row on disk, whatever the codec."""
    return pa.table(
        {"p": pa.array(np.arange(n) % parts), "v": pa.array(rng.integers(0, 1 << 62, n))},
        schema=SCHEMA,
    )


def staged_bytes(root: Path, dataset: str, txn: str) -> int:
    """The bytes of the transaction's staged files on disk now."""
    total = 0
    for where, _, names in os.walk(root / dataset):  # (directories may go as it walks)
        for name in names:
            if name.startswith(f"part-{txn}-"):
                with contextlib.suppress(FileNotFoundError):  # deleted as it was listed
                    total += os.stat(os.path.join(where, name)).st_size
    return total


@pytest.fixture(scope="module")
def quota(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, str, Path]]:
    root = tmp_path_factory.mktemp("quota")
    log = root.parent / "quota-service.log"
    flags = ["--max-staged-bytes-per-txn", str(TXN_QUOTA)]
    flags += ["--max-staged-bytes-per-token", str(TOKEN_QUOTA)]
    flags += ["--metrics-port", "0", "--log-format", "json"]
    svc = start_service(root, token=TOKEN, args=flags, log=log)
    (url,) = metrics_urls(log)
    yield svc, url, log
    svc.stop()


def test_a_write_past_the_transaction_quota_is_refused_and_the_store_stays_within_it(
    quota: tuple[ServiceProcess, str, Path],
) -> None:
    svc, metrics, log = quota
    root = Path(svc.root)
    c = svc.client()
    c.create("quota_txn", SCHEMA, partition_by=["p"])
    c.append("quota_txn", rows(1000, parts=2))  # committed before: must stay as it is
    txn = c.begin("quota_txn", SCHEMA)
    first = c.write_task(txn, rows(60_000).to_batches(), task="first")  # about 0.5 MiB
    assert 0 < first["bytes"] < TXN_QUOTA

    # A task over eight partitions, about 3.2 MiB: its files are written one partition
    # after the other, until the next would take the transaction past the quota.
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], staged_bytes(root, "quota_txn", txn.txn))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(P.InvalidRequest) as refused:
            c.write_task(txn, rows(420_000, parts=8).to_batches(max_chunksize=20_000), task="big")
    finally:
        stop.set()
        watcher.join()
    message = str(refused.value)
    assert "--max-staged-bytes-per-txn" in message and "max_staged_bytes_per_txn" in message
    assert f"{TXN_QUOTA:,} bytes" in message and txn.txn in message
    assert refused.value.details["limit"] == "max_staged_bytes_per_txn"
    assert refused.value.details["staged"] > first["bytes"]  # some partitions were written
    assert 0 < peak[0] <= TXN_QUOTA  # and never past the quota
    assert not list((root / "quota_txn").rglob(f"part-{txn.txn}-big-*"))  # its files deleted
    assert staged_bytes(root, "quota_txn", txn.txn) == first["bytes"]

    done = c.commit(txn, [first])  # the transaction's earlier write is intact
    assert done["rows"] == 60_000
    assert c.read("quota_txn").num_rows == 61_000

    line = wait_for_line(log, op="write", outcome="invalid_request")
    assert "--max-staged-bytes-per-txn" in line["error"]
    ok = [
        x for x in log_lines(log, "aqueduct.access") if x["op"] == "write" and "staged_bytes" in x
    ]
    assert first["bytes"] in [x["staged_bytes"] for x in ok]
    samples = scrape(metrics)
    assert value(samples, "aqueduct_staging_refused_total", limit="transaction") >= 1


def test_a_tokens_connections_share_one_quota(
    quota: tuple[ServiceProcess, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Spark's executors each open a connection: the token's bound holds across them."""
    svc, metrics, _ = quota
    one, two = svc.client(), svc.client()
    one.create("quota_token", SCHEMA, partition_by=["p"])
    held = one.status()["yours"]
    a = one.begin("quota_token", SCHEMA)
    staged_a = one.write_task(a, rows(200_000).to_batches())  # about 1.6 MB
    b = two.begin("quota_token", SCHEMA)
    staged_b = two.write_task(b, rows(200_000).to_batches())  # through another connection
    status = two.status()
    assert status["yours"] == held + staged_a["bytes"] + staged_b["bytes"]
    assert status["limit_per"] == "token" and status["max_staged_bytes_per_token"] == TOKEN_QUOTA
    samples = scrape(metrics)
    assert value(samples, "aqueduct_staged_bytes") == status["staged_bytes"]
    assert value(samples, "aqueduct_staged_transactions") == status["staged_transactions"]

    third = svc.client()  # a third connection, a third transaction: the token's bound holds
    c = third.begin("quota_token", SCHEMA)
    with pytest.raises(P.InvalidRequest) as refused:
        third.write_task(c, rows(200_000).to_batches())
    assert "the --token token" in str(refused.value)
    assert "--max-staged-bytes-per-token" in str(refused.value)
    assert refused.value.details["limit"] == "max_staged_bytes_per_token"
    assert value(scrape(metrics), "aqueduct_staging_refused_total", limit="token") >= 1

    one.abort(a, [staged_a])  # an abort gives its bytes back
    assert third.status()["yours"] == held + staged_b["bytes"]
    third.commit(c, [third.write_task(c, rows(200_000).to_batches())])
    two.commit(b, [staged_b])
    assert third.describe("quota_token").rows == 400_000

    trust = ["--url", svc.url, "--fingerprint", svc.fingerprint, "--token", TOKEN]
    assert cli.main(["status", *trust]) == 0
    out = capsys.readouterr().out
    assert "uncommitted in" in out and "this token's" in out
    assert "expired   0 transactions" in out


def test_the_store_never_holds_more_than_the_meter_was_told() -> None:
    """The bound charged before each row group and footer is never less than what lands."""
    table = pa.table(
        {
            "s": pa.array([f"{i:x}" * (i % 7) for i in range(50_000)]),
            "l": pa.array([list(range(i % 5)) for i in range(50_000)]),
            "d": pa.array(rng.integers(0, 3, 50_000)),  # dictionary-friendly
            "r": pa.array(rng.random(50_000)),
        }
    )
    fs = pafs.LocalFileSystem()
    charged, worst = [0], [0]

    def meter(n: int) -> None:
        charged[0] += n

    with tempfile.TemporaryDirectory() as d:
        writer = staging.StageWriter(
            dataset="m",
            filesystem=pafs.SubTreeFileSystem(d, fs),
            schema=table.schema,
            partition_by=[],
            txn="t1",
            task="k",
            target_file_bytes=1 << 40,
            row_group_bytes=256 << 10,
        )
        writer.meter = meter
        for batch in table.to_batches(max_chunksize=5000):
            writer.write(batch)
            on_disk = sum(p.stat().st_size for p in Path(d).iterdir())
            worst[0] = max(worst[0], on_disk - charged[0])
        files = writer.close()
        on_disk = sum(p.stat().st_size for p in Path(d).iterdir())
    assert worst[0] <= 0 and len(files) == 1
    assert charged[0] == on_disk == files[0].size  # the truth once written


def test_without_tokens_each_connection_has_its_own_count() -> None:
    ledger = Ledger(10, 20, per_token=False)
    conn1, conn2 = object(), object()
    a = ledger.charge(("d", "t1"), conn1, "this connection")
    a.add(8)
    b = ledger.charge(("d", "t2"), conn2, "this connection")
    b.add(8)  # another connection: its own count
    c = ledger.charge(("d", "t3"), conn1, "this connection")
    c.add(8)
    d = ledger.charge(("d", "t4"), conn1, "this connection")
    with pytest.raises(P.InvalidRequest, match="per connection"):
        d.add(5)  # conn1 would hold 21 > 20
    with pytest.raises(P.InvalidRequest, match="max-staged-bytes-per-txn"):
        a.add(3)  # t1 would hold 11 > 10
    assert ledger.total == 24 and ledger.owner_bytes(conn1) == 16
    assert ledger.settle(("d", "t1")) == 8
    assert ledger.owner_bytes(conn1) == 8 and ledger.total == 16
    ledger.forget(conn2)  # its connection closed
    b.release()  # its write then failed: counted out of the transaction only
    assert ledger.total == 8 and ledger.owner_bytes(conn2) == 0


def test_serve_flags_and_config_keys_default_to_the_config(tmp_path: Path) -> None:
    assert staging_config(build_parser().parse_args(["serve"])) == StagingConfig()
    config = tmp_path / "serve.toml"
    config.write_text(
        "max_staged_bytes_per_txn = 1000\nmax_staged_bytes_per_token = 2000\n"
        "txn_lifetime_hours = 0.5\ntxn_sweep_seconds = 30\n"
    )
    from aqueduct_spark.cli import _subcommand
    from aqueduct_spark.cli.config import load_config

    parser = build_parser()
    serve = _subcommand(parser, "serve")
    serve.set_defaults(**load_config(str(config), serve))
    got = staging_config(parser.parse_args(["serve"]))
    assert (got.max_txn_bytes, got.max_token_bytes) == (1000, 2000)
    assert got.lifetime.total_seconds() == 1800 and got.sweep_interval.total_seconds() == 30
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--txn-lifetime-hours", "0"])
