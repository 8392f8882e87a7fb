"""Debian's headless Chromium driven by playwright-core (``clients/typescript/browser/
run.mjs``) for the TypeScript client's browser tests (tests/typescript) and the browser read
benchmark (``benchmarks/bench_browser.py``): the plan a run follows, the service's endpoints
as a page gives them to the client, and the certificate flag WebSocket needs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from aqueduct_spark.testing import ServiceProcess

TS = Path(__file__).resolve().parents[1] / "clients" / "typescript"
RUNNER = TS / "browser" / "run.mjs"
CHROMIUM = shutil.which("chromium")


def build() -> Path:
    """clients/typescript with node_modules installed and dist/ built, as ``make ts`` does
    (its stamps: a later ``make ts`` does not do it again)."""
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed: the TypeScript client needs Node 20 with npm")
    if not (TS / "node_modules" / ".installed").exists():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=TS, check=True
        )
        (TS / "node_modules" / ".installed").touch()
    if not (TS / "dist" / ".built").exists():
        subprocess.run(["npm", "run", "--silent", "build"], cwd=TS, check=True)
        (TS / "dist" / ".built").touch()
    return TS


class Browser:
    """One run of ``run.mjs``: Chromium starts once and runs the plan's steps in order;
    a step that waits for the test gets what :meth:`tell` sends."""

    def __init__(self, plan: dict[str, Any], plan_file: Path, prefix: list[str] | None = None):
        plan_file.write_text(json.dumps(plan), encoding="utf-8")
        self.proc = subprocess.Popen(
            [*(prefix or []), "node", str(RUNNER), str(plan_file)],
            cwd=TS,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.results: dict[str, dict[str, Any]] = {}

    def steps(self) -> Iterator[dict[str, Any]]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "step" in msg:
                self.results[msg["step"]] = msg
            yield msg

    def tell(self, value: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(value) + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60) -> dict[str, dict[str, Any]]:
        for _ in self.steps():
            pass
        assert self.proc.wait(timeout) == 0, self.results.get("fatal")
        return self.results

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def run_browser(
    plan: dict[str, Any],
    tmp_path: Path,
    on_wait: Callable[[str], dict[str, Any]] | None = None,
    prefix: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run ``plan`` in Chromium; ``on_wait(step)`` does what a waiting step waits for and
    returns what to tell it. Returns each step's result by name."""
    browser = Browser(plan, tmp_path / "plan.json", prefix)
    try:
        for msg in browser.steps():
            if "waiting" in msg:
                assert on_wait is not None, msg
                browser.tell(on_wait(msg["waiting"]))
        return browser.finish()
    finally:
        browser.stop()


def now_ms() -> int:
    return int(time.time() * 1000)


def spki_hash(service: ServiceProcess) -> str:
    """What Chromium's --ignore-certificate-errors-spki-list takes for the service's own
    (development) certificate: WebSocket runs over TLS with it, and a browser cannot pin it
    (profile §9, "Certificates"); WebTransport pins its own certificate by hash instead."""
    pem = (Path(str(service.root)) / ".aqueduct-tls" / "server.pem").read_bytes()
    cert = x509.load_pem_x509_certificate(pem)
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def endpoints(service: ServiceProcess) -> dict[str, Any]:
    return {
        "webtransport": {
            "url": f"https://127.0.0.1:{service.port}/aqueduct",
            "certificateHashes": service.webtransport_hashes,
        },
        "websocket": {"url": f"wss://127.0.0.1:{service.port}/aqueduct"},
    }


def sample(n: int, start: int = 0) -> pa.Table:
    ids = range(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": [f"r{i}" for i in ids],
            "x": pa.array([i / 4 for i in ids], pa.float64()),
        }
    )
