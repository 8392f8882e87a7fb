"""The README's demo command: it runs end to end, and says clearly when Java is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


# Slow (4 min at load 12: its own Spark and service, a million rows). The fast suite runs each
# step against the suite's Spark session (tests/spark/test_batch.py: writes, a filtered read;
# tests/spark/test_streaming.py: a stream), the demo's service as the demo starts it, and the
# demo's no-Java check below; the quickstart notebook (same path, smaller) runs in make slow.
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
    # The narrative only: the service's access log and Spark's JVM (log4j, its warnings, its
    # Python workers) went to the files named at the end; nothing reached stderr.
    assert "aqueduct.access" not in out, out
    assert run.stderr == "", run.stderr[-3000:]
    log = Path(out.split("The service's log (a line per request): ", 1)[1].split("\n", 1)[0])
    spark_log = Path(out.split("Spark's log: ", 1)[1].split("\n", 1)[0])
    try:
        assert "aqueduct.access: request" in log.read_text()
        assert "log4j" in spark_log.read_text()  # "Using Spark's default log4j profile"
    finally:
        log.unlink()
        spark_log.unlink()


def test_the_demo_service_logs_to_its_file_not_the_terminal(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The demo's narrative stays readable: its service (started as the demo starts it)
    writes its access log, a line per request, to the file, and nothing to the terminal."""
    from aqueduct_spark.demo import service_log, start_demo_service

    log = service_log()
    try:
        svc = start_demo_service(tmp_path / "datasets", log)
        try:
            client = svc.client()
            for _ in range(3):
                client.list()
            client.close()
        finally:
            svc.stop()
        out, err = capfd.readouterr()
        assert "aqueduct.access" not in out + err, err
        assert log.read_text().count("op=list") >= 3
    finally:
        log.unlink()


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
