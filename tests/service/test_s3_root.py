"""The service over an ``s3://`` root on a real S3-compatible store (SeaweedFS), and the
checks ``aqueduct serve`` makes before it starts: a root it cannot use, a port another
service has."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from aqueduct_core.transport import ClientTLS
from aqueduct_spark.cli.serve import dev_tls_dir
from aqueduct_spark.testing import (
    READER_KEY,
    SeaweedS3,
    ServiceProcess,
    s3_storage_options,
    start_service,
)

pytestmark = pytest.mark.quic


def serve_fails(*args: str, timeout: float = 60) -> tuple[int, str]:
    """Run ``aqueduct serve`` expecting it to refuse to start: (exit code, stderr)."""
    cmd = [sys.executable, "-m", "aqueduct_spark.cli", "serve", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stderr


def option_args(options: dict[str, str]) -> list[str]:
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]


@pytest.fixture
def s3_service(seaweed: SeaweedS3) -> Iterator[ServiceProcess]:
    root = f"s3://{seaweed.bucket}/{uuid.uuid4().hex[:8]}"
    svc = start_service(root, args=seaweed.serve_args())
    yield svc
    svc.stop()


def test_a_service_over_an_s3_root_writes_and_reads(s3_service: ServiceProcess) -> None:
    c = s3_service.client()
    c.create("events", pa.schema([("id", pa.int64())]))
    c.append("events", pa.table({"id": pa.array(range(100), pa.int64())}))
    c.append("events", pa.table({"id": pa.array(range(100, 150), pa.int64())}))
    assert sorted(c.read("events").column("id").to_pylist()) == list(range(150))
    assert c.describe("events").version == 2
    assert [d.name for d in c.list()] == ["events"]


def test_an_s3_roots_development_certificate_goes_to_the_users_state_directory(
    seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --cert, an s3:// root has no local directory for its certificate: serve
    keeps it under $XDG_STATE_HOME/aqueduct/tls/, never in the working directory, and a
    client trusts the service with the CA found there."""
    root = f"s3://{seaweed.bucket}/{uuid.uuid4().hex[:8]}"
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    env = {"XDG_STATE_HOME": str(state)}
    svc = start_service(root, args=option_args(seaweed.storage_options), env=env, cwd=work)
    try:
        assert list(work.iterdir()) == []
        monkeypatch.setenv("XDG_STATE_HOME", str(state))
        ca = dev_tls_dir(root) / "ca.pem"
        assert ca.is_file() and ca.parent.parent == state / "aqueduct" / "tls"
        c = svc.client(tls=ClientTLS(cafile=str(ca)))
        c.create("events", pa.schema([("id", pa.int64())]))
        assert [d.name for d in c.list()] == ["events"]
    finally:
        svc.stop()


def test_each_root_has_its_own_development_certificate_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert dev_tls_dir("s3://b/x").parent == Path.home() / ".local/state/aqueduct/tls"
    assert dev_tls_dir(str(tmp_path)) == tmp_path / ".aqueduct-tls"
    assert dev_tls_dir(f"file://{tmp_path}") == tmp_path / ".aqueduct-tls"
    one, same, other = (dev_tls_dir(r) for r in ("s3://b/one", "s3://b/one", "s3://b/One"))
    assert one == same and one != other  # stable across starts, distinct between roots
    assert one.name.startswith("s3_b_one-")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no bucket", "the bucket does not exist"),
        ("wrong secret", "the store refused the secret key"),
        ("unknown key", "the store does not know the access key"),
        ("read-only", "may not write"),
        ("no endpoint", "nothing answers at the store's endpoint"),
    ],
)
def test_serve_refuses_an_s3_root_it_cannot_use(
    seaweed: SeaweedS3, case: str, expected: str
) -> None:
    root, options = seaweed.root, seaweed.storage_options
    if case == "no bucket":
        root = "s3://no-such-bucket/aqueduct"
    elif case == "wrong secret":
        options = s3_storage_options(seaweed.endpoint, seaweed.access_key, "wrong")
    elif case == "unknown key":
        options = s3_storage_options(seaweed.endpoint, "nobody", seaweed.secret_key)
    elif case == "read-only":
        options = s3_storage_options(seaweed.endpoint, READER_KEY, seaweed.secret_key)
    elif case == "no endpoint":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            unused = s.getsockname()[1]
        options = s3_storage_options(f"http://127.0.0.1:{unused}", "k", "s")
    code, err = serve_fails("--root", root, "--port", "0", *option_args(options))
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and expected in lines[0] and root in lines[0], err


def test_serve_refuses_a_local_root_it_cannot_write(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, err = serve_fails("--root", str(blocker / "root"), "--port", "0")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "cannot write to the root" in err and "--root" in err


def _spawned_workers(lock: Path) -> bool:
    """Whether the process holding a flock on ``lock`` (found in /proc/locks: taking the lock
    to find out would race with it) has started child processes (its workers)."""
    try:
        inode = lock.stat().st_ino
    except FileNotFoundError:
        return False
    with open("/proc/locks") as locks:
        pids = [ln.split()[4] for ln in locks if "FLOCK" in ln and f":{inode} " in ln]
    for pid in pids:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                return True
    return False


def test_no_other_program_or_service_gets_the_port_of_several_workers(tmp_path: Path) -> None:
    """--workers 2 claims the port, then spawns workers that bind it seconds later (20 s and
    more under load). Another program asking for that port meanwhile (a connection's
    ephemeral port, a bind to 0) must not get it: the workers would then fail to bind (the
    flaky test_several_worker_processes_share_one_port, made deterministic). Once it runs,
    a second service with the same flags must not join it through SO_REUSEPORT."""
    import threading

    from aqueduct_spark.service.startup import _lock_path
    from aqueduct_spark.testing import closed_port

    port = closed_port()
    lock = Path(_lock_path("127.0.0.1", port))
    started: list[ServiceProcess] = []
    thread = threading.Thread(
        target=lambda: started.append(start_service(tmp_path / "one", port=port, workers=2))
    )
    thread.start()
    stolen: list[str] = []
    try:
        while thread.is_alive() and not stolen:
            time.sleep(0.005)  # not a spin: the service's 3 processes share the 2 cores
            if not _spawned_workers(lock):
                continue  # the window that matters: workers spawned, not yet listening
            for kind, proto in ((socket.SOCK_DGRAM, "UDP"), (socket.SOCK_STREAM, "TCP")):
                with socket.socket(socket.AF_INET, kind) as other:
                    try:
                        other.bind(("127.0.0.1", port))
                    except OSError:
                        continue
                    stolen.append(proto)
        thread.join(180)
        assert stolen == [], f"another program got the claimed port over {stolen}"
        (first,) = started
        # the same flags would set SO_REUSEPORT too, and the kernel would let it join
        code, err = serve_fails(
            "--root", str(tmp_path / "two"), "--port", str(port), "--workers", "2"
        )
        assert code == 2, err
        assert f"port {port}" in err and len(err.strip().splitlines()) == 1, err
        c = first.client()
        c.create("still-mine", pa.schema([("id", pa.int64())]))  # the first one serves on
    finally:
        thread.join(180)
        for svc in started:
            svc.stop()


def test_a_port_held_by_another_program_is_refused(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # would let us join
        other.bind(("127.0.0.1", 0))
        port = other.getsockname()[1]
        code, err = serve_fails("--root", str(tmp_path), "--port", str(port), "--workers", "2")
    assert code == 2 and f"port {port} (UDP)" in err and "in use" in err, err
    assert not os.path.exists(tmp_path / "_delta_log")
