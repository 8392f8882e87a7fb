"""Shared pieces of the benchmark scripts: test data, a minimal Arrow Flight server over a
Delta table (the baseline), timing and reporting helpers."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from benchmarks import report_runs


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import importlib.metadata as md

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "-"

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": os.getloadavg(),
        **{
            pkg: version(pkg)
            for pkg in (
                "aioquic",
                "qh3",
                "pyarrow",
                "deltalake",
                "pyspark",
                "uvloop",
                "cryptography",
            )
        },
    }


def sample_table(rows: int, start: int = 0) -> pa.Table:
    """int64, double, string, timestamp: the columns the issues benchmark with."""
    ids = (
        pa.array(range(start, start + rows), pa.int64())
        if rows < 1000
        else pa.array(__import__("numpy").arange(start, start + rows, dtype="int64"))
    )
    return pa.table(
        {
            "id": ids,
            "x": pc.multiply(ids.cast(pa.float64()), 0.5),
            "s": pc.binary_join_element_wise("row-", pc.cast(ids, pa.string()), ""),
            "ts": pc.cast(pc.add(ids, 1_700_000_000_000_000), pa.timestamp("us", tz="UTC")),
        }
    )


def median_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def write_json(path: str | None, data: dict[str, Any]) -> None:
    """Write a run's results, with when it ran and the load (``report_runs.stamp``)."""
    if path:
        Path(path).write_text(json.dumps(report_runs.stamp(data), indent=2, default=str))


def spawn(
    args: list[str], ready: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Start a helper process and wait for its line starting with ``ready``."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    return proc, wait_ready(proc, ready, 120, str(args))


def wait_ready(proc: subprocess.Popen[str], ready: str, timeout: float, what: str) -> str:
    """The rest of ``proc``'s first stdout line starting with ``ready``; RuntimeError naming
    ``what`` if it exits first or is not ready within ``timeout`` seconds (then killed)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{what} exited with {proc.wait()}")
        if line.startswith(ready):
            return line[len(ready) :].strip()
    proc.kill()
    raise RuntimeError(f"{what} not ready in time")


def spawn_service(root: Path | str, backend: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Start ``aqueduct serve`` on a free port with ``backend``; returns the process and the
    url and fingerprint that reach it."""
    from aqueduct_spark.testing import start_service

    svc = start_service(Path(root), backend=backend)
    return svc.proc, {"url": svc.url, "fingerprint": svc.fingerprint}


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
