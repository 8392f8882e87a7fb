"""Which stored benchmark run the report may call the project's figures: the most recent run
on a quiet machine.

Every result (``docs/benchmarks/results/NAME.json``) says when it ran and the machine's load
at its start and end (``run``; older results carry their load elsewhere, read below). A run is
*quiet* when the 1-minute load average was at most :data:`QUIET_LOAD` when it started: other
work then had the cores to itself or left them idle (``run_all`` waits a while for the load of
the benchmark before to settle). The load at the end is shown beside it but not judged: it is
mostly the benchmark's own processes (eight writers and a store make 8 on their own).

The latest quiet run of each benchmark is kept beside its latest run (``NAME.quiet.json``), so a
loaded run afterwards never replaces the figures the summary shows; it goes to the report's
section of loaded runs instead.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

QUIET_LOAD = 3.0
"""The highest 1-minute load average at the start of a quiet run (2 cores)."""

STARTED = (time.time(), os.getloadavg()[0])
"""When this process started (a benchmark script imports this module first thing), and the
load then."""


def stamp(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its ``run`` record (start, end, load at both), unless it has one. A load
    the script recorded itself around its measurements is taken over."""
    if "run" not in data:
        own_start = _first(data.get("load_before", data.get("load_start")))
        own_end = _first(data.get("load_after", data.get("load_end")))
        data["run"] = {
            "started": data.get("started") or utc(STARTED[0]),
            "finished": utc(time.time()),
            "load_start": round(STARTED[1] if own_start is None else own_start, 2),
            "load_end": round(os.getloadavg()[0] if own_end is None else own_end, 2),
        }
    return data


def utc(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when))


def loads(data: dict[str, Any]) -> tuple[float | None, float | None]:
    """The 1-minute load average at the start and the end of the run that made ``data``."""
    run = data.get("run") or {}
    if "load_start" in run:
        return run["load_start"], run.get("load_end")
    machine = data.get("machine") or {}
    for start, end in (
        (data.get("load_before"), data.get("load_after")),  # bench_realpath before `run`
        (data.get("load_start"), data.get("load_end")),  # bench_versions before `run`
        (machine.get("loadavg"), machine.get("loadavg_end")),
    ):
        if start is not None:
            return _first(start), _first(end)
    return None, None


def _first(load: Any) -> float | None:
    if load is None:
        return None
    return float(load[0] if isinstance(load, list | tuple) else load)


def is_quiet(data: dict[str, Any]) -> bool:
    if data.get("quick"):
        return False  # a smoke run at small sizes
    start, _ = loads(data)
    return start is not None and start <= QUIET_LOAD


def label(data: dict[str, Any]) -> str:
    """When the run was and its load: ``2026-11-25 19:05 UTC, load 1.8-2.2``."""
    run = data.get("run") or {}
    when = run.get("started") or data.get("started") or "date not recorded"
    start, end = loads(data)
    if start is None:
        return f"{when}, load not recorded"
    load = (
        f"{start:.1f}"
        if end is None or f"{end:.1f}" == f"{start:.1f}"
        else f"{start:.1f}-{end:.1f}"
    )
    return f"{when}, load {load}"


def store(results: Path, name: str, data: dict[str, Any]) -> None:
    """Keep a finished run: the latest as ``NAME.json``, a quiet one also as ``NAME.quiet.json``."""
    path = results / f"{name}.json"
    path.write_text(json.dumps(stamp(data), indent=2, default=str))
    if is_quiet(data):
        shutil.copyfile(path, results / f"{name}.quiet.json")


def stored(results: Path, names: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The latest quiet run of each benchmark, and each benchmark's latest run where that is
    not the quiet one (a loaded run, or one whose load was not recorded)."""
    quiet: dict[str, Any] = {}
    other: dict[str, Any] = {}
    for name in names:
        latest = _read(results / f"{name}.json")
        calm = _read(results / f"{name}.quiet.json")
        if latest is not None and is_quiet(latest):
            calm = latest
        if calm is not None:
            quiet[name] = calm
        if latest is not None and latest is not calm and latest != calm:
            other[name] = latest
    return quiet, other


def _read(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def settle(most: float = 120.0) -> float:
    """Wait up to ``most`` seconds for the 1-minute load average to fall to
    :data:`QUIET_LOAD` (the benchmark before still weighs on it); the load then."""
    deadline = time.monotonic() + most
    while os.getloadavg()[0] > QUIET_LOAD and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]
