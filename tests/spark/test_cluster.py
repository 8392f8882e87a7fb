"""On a real Spark standalone cluster (a master and two workers started from the installed
pyspark), through a real ``aqueduct serve``: a batch write and read on the executors, and a
stream that survives an executor SIGKILLed and the service SIGKILLed and restarted, with
every row in the sink exactly once. Slow (six JVMs on this machine): ``make slow``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from stream_helpers import SCHEMA, Appender, ids_of, rows, wait_until

from aqueduct_core.transport import TransportConfig
from aqueduct_spark.testing import ServiceProcess, start_service

pytestmark = [pytest.mark.spark, pytest.mark.fault, pytest.mark.slow]

DRIVER = Path(__file__).with_name("cluster_driver.py")


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


class Daemon:
    """A Spark master or worker JVM, its output in a log file read for a line."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.log_path = log
        self.log: IO[str] = open(log, "w")  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen(
            [_spark_class(), *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.log_path.name} exited: {self.log_path.read_text()}")
            return re.search(pattern, self.log_path.read_text())

        return wait_until(found, timeout, f"{pattern!r} in {self.log_path.name}", step=0.3)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its executors die with the worker
            self.proc.wait()
        self.log.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``spark://`` URL of a master with two one-core workers; their work directory."""
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_NO_DAEMONIZE": "1",
    }
    work = tmp_path / "work"
    work.mkdir()
    daemons: list[Daemon] = []
    try:
        master = Daemon(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
            ],
            tmp_path / "master.log",
            env,
        )
        daemons.append(master)
        url = master.wait_for(r"Starting Spark master at (spark://\S+)").group(1)
        for n in range(2):
            worker = Daemon(
                [
                    *[
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        "1",
                    ],
                    *["--memory", "1500m", "--webui-port", "0", "--work-dir"],
                    str(work),
                    url,
                ],
                tmp_path / f"worker{n}.log",
                env,
            )
            daemons.append(worker)
        for worker in daemons[1:]:
            worker.wait_for("Successfully registered with master")
        yield url, work
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def executors(work: Path) -> list[int]:
    """Process ids of this cluster's executors (their working directory is under ``work``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if b"CoarseGrainedExecutorBackend" in cmdline and cwd.startswith(str(work)):
            found.append(int(proc.name))
    return found


@pytest.mark.timeout(1200)
def test_cluster_batch_and_stream_survive_executor_and_service_kills(
    cluster: tuple[str, Path], tmp_path: Path
) -> None:
    master, work = cluster
    services: list[ServiceProcess] = [start_service(tmp_path / "root")]
    svc = services[0]
    driver = None
    appender = None
    try:
        c = svc.client(transport=TransportConfig(idle_timeout=3.0), retries=3)
        src, dst = "cluster_src", "cluster_dst"
        c.create(src, SCHEMA)
        c.append(src, rows(0, 200))
        spec = {
            "master": master,
            "url": svc.url,
            "fingerprint": svc.fingerprint,
            "batch": "cluster_batch",
            "rows": 50_000,
            "source": src,
            "sink": dst,
            "checkpoint": str(tmp_path / "checkpoint"),
            "stop": str(tmp_path / "stop"),
        }
        log = tmp_path / "driver.log"
        with open(log, "w") as out:
            driver = subprocess.Popen(
                [sys.executable, str(DRIVER), json.dumps(spec)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                start_new_session=True,
            )

        def line(prefix: str) -> str | None:
            if driver is not None and driver.poll() is not None:
                raise AssertionError(f"the driver exited early:\n{log.read_text()[-4000:]}")
            for text in log.read_text().splitlines():
                if text.startswith(prefix):
                    return text
            return None

        batch = json.loads(wait_until(lambda: line("BATCH "), 400, "the batch job")[6:])
        assert batch == {"count": 50_000, "distinct": 50_000}, batch
        assert sorted(ids_of(c, "cluster_batch")) == list(range(50_000))
        wait_until(lambda: line("STARTED"), 120, "the stream to start")

        appender = Appender(c, src, 10_000)
        wait_until(lambda: len(ids_of(c, dst)) >= 300, 180, "the stream to run", step=0.5)

        victims = executors(work)
        assert victims, "no executor process found under the workers' directory"
        os.kill(victims[0], signal.SIGKILL)
        wait_until(
            lambda: len(set(executors(work)) - {victims[0]}) >= len(victims),
            120,
            "the worker to launch a new executor",
            step=0.5,
        )
        before = len(ids_of(c, dst))
        wait_until(lambda: len(ids_of(c, dst)) > before, 180, "the stream to go on", step=0.5)

        svc.kill()  # SIGKILL: no goodbye to anyone
        time.sleep(1.0)
        restarted = start_service(tmp_path / "root", port=svc.port)
        services.append(restarted)
        assert restarted.fingerprint == svc.fingerprint
        time.sleep(3.0)  # appends go on against the new process
        appender.stop()

        want = ids_of(c, src)

        def caught_up() -> bool:
            line("")  # fails at once if the driver died
            got = ids_of(c, dst)
            return got == want or len(got) > len(want)

        wait_until(caught_up, 300, "the sink to catch up", step=1.0)
        time.sleep(2.0)  # a duplicate written late would show now
        got = ids_of(c, dst)
        assert len(got) == len(set(got)), "duplicates in the sink"
        assert got == want
        Path(spec["stop"]).touch()
        assert driver.wait(120) == 0, log.read_text()[-4000:]
        failures = [t for t in log.read_text().splitlines() if t.startswith("FAILED")]
        print(f"cluster: {len(want)} rows exactly once; query restarts: {failures}")
    finally:
        if appender is not None:
            appender.stop()
        if driver is not None and driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        for s in services:
            s.stop()
