"""Helpers for testing code that uses the dataset service: a real ``aqueduct serve`` process.

svc = start_service(tmp_path / "root")     # waits until it is ready
client = svc.client()                       # a blocking Client that trusts it
...
svc.stop()                                  # (svc.kill() for SIGKILL)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aqueduct_core.transport import ClientTLS


@dataclass
class ServiceProcess:
    proc: subprocess.Popen[str]
    root: Path
    url: str
    fingerprint: str
    token: str | None
    port: int

    @property
    def options(self) -> dict[str, str]:
        """Spark data source options that reach this service."""
        opts = {"url": self.url, "fingerprint": self.fingerprint}
        if self.token:
            opts["token"] = self.token
        return opts

    def client(self, **options: Any) -> Any:
        """A blocking :class:`aqueduct_spark.client.Client` that trusts this service."""
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


def start_service(
    root: Path,
    *,
    token: str | None = None,
    port: int = 0,
    workers: int = 1,
    backend: str = "auto",
    args: Sequence[str] = (),
) -> ServiceProcess:
    """Run ``aqueduct serve`` on loopback and wait for its ready line. ``args`` are more
    ``serve`` flags (``["--max-scans", "2"]``)."""
    cmd = [sys.executable, "-m", "aqueduct_spark.cli", "serve", "--root", str(root)]
    cmd += ["--port", str(port), "--workers", str(workers), "--backend", backend, *args]
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
