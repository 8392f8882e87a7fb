"""A real ``aqueduct serve`` process on loopback, over real Delta tables in a temp root."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aqueduct_core.transport import ClientTLS


@dataclass
class ServiceProcess:
    proc: subprocess.Popen[str]
    root: Path
    url: str
    fingerprint: str
    token: str | None
    port: int

    def client(self, **options: object):  # type: ignore[no-untyped-def]
        from aqueduct_spark.client import Client

        options.setdefault("tls", ClientTLS(fingerprint=self.fingerprint))
        options.setdefault("token", self.token)
        options.setdefault("retries", 1)
        return Client(self.url, **options)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_service(root: Path, *, token: str | None = None, port: int = 0) -> ServiceProcess:
    """Run ``aqueduct serve`` and wait for its ready line."""
    cmd = [
        sys.executable,
        "-m",
        "aqueduct_spark.service.cli",
        "serve",
        "--root",
        str(root),
        "--port",
        str(port),
    ]
    if token:
        cmd += ["--token", token]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "AQUEDUCT_TOKEN": ""}
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"aqueduct serve exited with {proc.wait()}")
        if line.startswith("AQUEDUCT_READY "):
            info = json.loads(line.split(" ", 1)[1])
            port = int(info["url"].rsplit(":", 1)[1])
            return ServiceProcess(proc, root, info["url"], info["fingerprint"], token, port)
    proc.kill()
    raise RuntimeError("aqueduct serve did not become ready within 60 s")


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("service-root"))
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def secured_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("secured-root"), token="s3cret-token")
    yield svc
    svc.stop()
