"""The TypeScript client (clients/typescript) under pytest: its own checks, and Debian's
headless Chromium driven by Playwright (``browser/run.mjs``) against a real service.

``make test`` installs the npm packages from the lock file and builds the console and the
harness page (``make ts``); run alone, :func:`built` does the same once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TS = Path(__file__).resolve().parents[2] / "clients" / "typescript"
RUNNER = TS / "browser" / "run.mjs"
CHROMIUM = shutil.which("chromium")


def built() -> Path:
    """clients/typescript with node_modules installed and dist/ built (as ``make ts``)."""
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed: the TypeScript client needs Node 20 with npm")
    if not (TS / "node_modules" / ".installed").exists():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=TS, check=True
        )
        (TS / "node_modules" / ".installed").touch()
    if not (TS / "dist" / ".built").exists():
        subprocess.run(["npm", "run", "--silent", "build"], cwd=TS, check=True)
        (TS / "dist" / ".built").touch()
    return TS


@pytest.fixture(scope="session")
def ts() -> Path:
    return built()


@pytest.fixture(scope="session")
def chromium() -> str:
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: make test installs it (apt-get install chromium)")
    return CHROMIUM


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
