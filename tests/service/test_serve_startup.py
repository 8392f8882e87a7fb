"""``aqueduct serve`` started wrongly says so in one line and exits with status 2; started
rightly it prints the shell lines that reach it. Real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ServiceProcess, start_service

pytestmark = pytest.mark.quic

SERVE = [sys.executable, "-m", "aqueduct_spark.cli", "serve"]


def refused(*args: str, cwd: Path | None = None) -> str:
    """Run ``aqueduct serve ARGS``, which must refuse to start; its one line of stderr."""
    done = subprocess.run(
        [*SERVE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, "AQUEDUCT_TOKEN": ""},
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()  # one line, no traceback
    assert line.startswith("aqueduct serve: ")
    return line


def test_listening_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    line = refused("--root", str(tmp_path), "--host", "0.0.0.0", "--port", "0")
    assert "no token is set" in line
    assert "give --token" in line and "--allow-anonymous" in line
    config = tmp_path / "open.toml"
    config.write_text('host = "0.0.0.0"\nport = 0\n')
    assert "no token is set" in refused("--root", str(tmp_path), "--config", str(config))


def test_allow_anonymous_starts_with_a_warning(tmp_path: Path) -> None:
    log = tmp_path / "log"
    svc = start_service(tmp_path / "root", args=["--host", "0.0.0.0", "--allow-anonymous"], log=log)
    try:
        assert svc.client().list() == []
    finally:
        svc.stop()
    assert "WARNING" in log.read_text() and "no token (--allow-anonymous)" in log.read_text()


def test_a_root_that_cannot_hold_datasets(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    line = refused("--root", str(tmp_path / "a-file"))
    assert "is a file, not a directory" in line
    # /sys refuses new files even to root, so this holds whoever runs the tests
    assert "cannot write to the root /sys" in refused("--root", "/sys")


def test_a_port_in_use(service: ServiceProcess, tmp_path: Path) -> None:
    line = refused("--root", str(tmp_path), "--port", str(service.port))
    assert f"port {service.port} (UDP) on 127.0.0.1 is already in use" in line
    assert "choose another --port" in line
    line = refused("--root", str(tmp_path), "--port", str(service.port), "--workers", "2")
    assert "is already in use" in line


def test_bad_flag_values(tmp_path: Path) -> None:
    assert "expected a port from 0 to 65535" in refused("--port", "70000")
    assert "give both --cert and --key" in refused("--root", str(tmp_path), "--cert", "x")


def test_bad_config_files(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("max_scans = 0\n")
    assert f"{config}: max_scans: expected a whole number of at least 1" in refused(
        "--root", str(tmp_path), "--config", str(config)
    )
    config.write_text("prot = 4433\n")
    assert "unknown setting 'prot'; the settings are" in refused("--config", str(config))


def test_the_ready_banner_is_a_command_to_paste(service: ServiceProcess, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*SERVE, "--root", str(tmp_path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = []
        for line in proc.stdout:
            if line.startswith("AQUEDUCT_READY"):
                break
            banner.append(line)
        pasted = "".join(banner).split("from another shell:\n", 1)[1]
        assert "export AQUEDUCT_URL=quic://127.0.0.1:" in pasted
        cli = f"{sys.executable} -m aqueduct_spark.cli"
        script = pasted.replace("aqueduct ls", f"{cli} ls --json")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AQUEDUCT_")}
        done = subprocess.run(
            ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[]"
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]


def test_settings_from_a_config_file_and_flags_over_them(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(f'root = "{tmp_path / "from-file"}"\nport = 1\n')
    svc = start_service(tmp_path / "ignored", args=["--config", str(config)])
    try:  # --root and --port 0 given by start_service win over the file
        assert svc.port != 1
        svc.client().overwrite("here", __import__("pyarrow").table({"a": [1]}))
        assert (tmp_path / "ignored" / "here").is_dir()
    finally:
        svc.stop()


@pytest.mark.parametrize("case", ["not ready in time", "exits"])
def test_start_service_leaves_no_process_behind_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """The test helper's own failure: a service that is not ready in time is killed and
    reaped, one that exits is reaped, and the pipe to either is closed."""
    started: list[subprocess.Popen[str]] = []

    class Recorded(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            started.append(self)

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    if case == "exits":
        blocker = tmp_path / "a-file"
        blocker.write_text("not a directory")
        with pytest.raises(RuntimeError, match="exited with 2"):
            start_service(blocker / "root", log=tmp_path / "serve.log")
    else:
        with pytest.raises(RuntimeError, match=r"not become ready within 0\.01 s"):
            start_service(tmp_path / "root", timeout=0.01)
    (proc,) = started
    assert proc.returncode is not None  # reaped: no zombie, no ResourceWarning later
    assert proc.stdout is not None and proc.stdout.closed
