"""Real processes killed with SIGKILL in the middle of a write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import ServiceProcess, start_service
from deltalake import DeltaTable

from aqueduct_core.errors import ConnectionLost
from aqueduct_core.transport import TransportConfig
from aqueduct_spark.cli import main as cli

pytestmark = [pytest.mark.fault, pytest.mark.quic]


def batches(n: int, rows: int = 50_000, pause: float = 0.0):  # type: ignore[no-untyped-def]
    for i in range(n):
        if pause:
            time.sleep(pause)
        yield pa.record_batch({"id": pa.array(range(i * rows, (i + 1) * rows), pa.int64())})


def parquet_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet")}


def vacuum(root: Path, dataset: str) -> None:
    assert cli(["vacuum", dataset, "--root", str(root), "--retention-hours", "0"]) == 0


def test_service_killed_mid_write_leaves_the_previous_version(tmp_path: Path) -> None:
    svc = start_service(tmp_path / "root")
    try:
        # A short idle timeout: the client learns the service is gone within seconds.
        c = svc.client(transport=TransportConfig(idle_timeout=3.0))
        c.overwrite("victim", batches(1).__next__())
        committed = parquet_files(svc.root / "victim")
        txn = c.begin("victim", pa.schema([("id", pa.int64())]))
        errors: list[BaseException] = []
        killed = threading.Event()

        def until_staged_then_killed():  # type: ignore[no-untyped-def]
            """Batches until the service has staged part of the write (its first row group,
            32 MiB, is on disk), then none until the service is killed: the kill always
            lands mid-write, however slowly the machine stages."""
            for i, batch in enumerate(batches(200)):
                yield batch
                if len(parquet_files(svc.root / "victim")) > len(committed):
                    break
                assert i < 199, "200 batches (80 MB) sent and nothing staged"
            assert killed.wait(60)
            yield batch  # to a dead service

        def write() -> None:
            try:
                c.write_task(txn, until_staged_then_killed())
            except BaseException as exc:
                errors.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.monotonic() + 60
        while len(parquet_files(svc.root / "victim")) == len(committed) and writer.is_alive():
            assert time.monotonic() < deadline, "nothing staged within 60 s"
            time.sleep(0.02)
        svc.kill()
        killed.set()
        writer.join(60)
        assert errors and isinstance(errors[0], ConnectionLost), errors
        table = DeltaTable(str(svc.root / "victim"))
        assert table.version() == 0 and table.to_pyarrow_table().num_rows == 50_000
        assert parquet_files(svc.root / "victim") > committed  # orphaned staged files exist
    finally:
        svc.stop()
    restarted = start_service(tmp_path / "root")
    try:
        c = restarted.client()
        c.append("victim", batches(1).__next__())
        assert c.describe("victim").rows == 100_000
        vacuum(restarted.root, "victim")
        live = {a for a in DeltaTable(str(restarted.root / "victim")).file_uris()}
        assert len(parquet_files(restarted.root / "victim")) == len(live) == 2
    finally:
        restarted.stop()


CLIENT = textwrap.dedent(
    """
    import sys, time
    import pyarrow as pa
    from aqueduct_core.transport import ClientTLS
    from aqueduct_spark.client import Client
    url, fingerprint = sys.argv[1], sys.argv[2]
    c = Client(url, tls=ClientTLS(fingerprint=fingerprint))
    txn = c.begin("client_victim", pa.schema([("id", pa.int64())]))
    def gen():
        for i in range(10_000):
            if i == 3:
                print("STREAMING", flush=True)
            time.sleep(0.02)
            yield pa.record_batch({"id": pa.array(range(i * 1000, (i + 1) * 1000), pa.int64())})
    c.write_task(txn, gen())
    """
)


def test_client_killed_mid_write_leaves_nothing_visible(
    service: ServiceProcess, tmp_path: Path
) -> None:
    c = service.client()
    c.overwrite("client_victim", batches(1).__next__())
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    with subprocess.Popen(
        [sys.executable, str(script), service.url, service.fingerprint],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "STREAMING"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(0.5)
    info = c.describe("client_victim")
    assert info.version == 0 and info.rows == 50_000
    assert c.read("client_victim").num_rows == 50_000
    c.append("client_victim", batches(1).__next__())  # the service is fine
    assert c.describe("client_victim").rows == 100_000
