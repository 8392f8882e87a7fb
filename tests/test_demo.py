"""The README's demo command: it runs end to end, and says clearly when Java is missing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


# Slow (4 min at load 12: its own Spark and service, a million rows). The fast suite runs the
# same path, smaller: the quickstart notebook (tests/test_notebooks.py: start_service, Spark
# writes, a filtered read, a stream), and the demo's no-Java check below.
@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(600)
def test_demo_runs_end_to_end() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "aqueduct_spark.demo"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    for n in range(1, 7):
        assert f"[{n}/6]" in out, f"step {n} missing:\n{out}"
    assert "dataset 'trips': version 0, 1,000,000 rows" in out
    assert out.count("long trips") == 4, out  # one line per mode, from the filtered read
    assert "'events_copy' holds 10,000 rows: every event exactly once" in out
    assert "All done in" in out


def test_demo_without_java_says_what_to_install(tmp_path: os.PathLike[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)  # no java anywhere on it
    run = subprocess.run(
        [sys.executable, "-m", "aqueduct_spark.demo"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 1
    assert "Java is missing" in run.stderr and "JAVA_HOME" in run.stderr, run.stderr
    assert "[1/6]" not in run.stdout, "nothing should start without Java"
