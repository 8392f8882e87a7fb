"""The ``aqueduct`` command as a user runs it: real processes, real shell pipes, against a real
service (``--version``, ``--json``, ``-q``, a closed pipe, ``export``'s temporary file)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ServiceProcess

pytestmark = pytest.mark.quic

AQUEDUCT = f"{shlex.quote(sys.executable)} -m aqueduct_spark.cli"


def shell(script: str, svc: ServiceProcess | None = None, **kw: Any) -> Any:
    """Run ``script`` in bash (``aqueduct`` is this checkout's CLI), pointed at ``svc``."""
    env = {**os.environ, "AQUEDUCT_TOKEN": ""}
    if svc is not None:
        env.update(AQUEDUCT_URL=svc.url, AQUEDUCT_FINGERPRINT=svc.fingerprint)
    script = f'aqueduct() {{ {AQUEDUCT} "$@"; }}\n{script}'
    return subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, **kw
    )


def test_version() -> None:
    done = shell("aqueduct --version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("aqueduct 0.") and "Python 3." in done.stdout


def test_ls_json_goes_through_json_tool(service: ServiceProcess) -> None:
    service.client().overwrite("json_ls", pa.table({"id": [1, 2, 3]}))
    done = shell("aqueduct ls --json | python3 -m json.tool; echo status ${PIPESTATUS[*]}", service)
    assert done.stdout.rstrip().endswith("status 0 0"), done.stderr
    listed = json.loads(done.stdout.rsplit("status", 1)[0])
    (entry,) = [d for d in listed if d["name"] == "json_ls"]
    assert entry["rows"] == 3 and entry["schema"] == [
        {"name": "id", "type": "int64", "nullable": True}
    ]
    history = shell("aqueduct history json_ls --json", service)
    assert json.loads(history.stdout)[0]["version"] == 0


def test_cat_into_head_exits_cleanly(service: ServiceProcess) -> None:
    """``head`` closes the pipe after one line, long before ``cat`` is done."""
    n = 100_000  # as JSON lines, far more than a pipe holds: cat must meet the closed pipe
    service.client().overwrite("piped", pa.table({"id": pa.array(range(n), pa.int64())}))
    for fmt in ("table", "json"):  # the default, and the one scripts read line by line
        done = shell(
            f"aqueduct cat piped --format {fmt} | head -1; echo status ${{PIPESTATUS[*]}}",
            service,
        )
        first, status = done.stdout.splitlines()
        assert status == "status 0 0", (fmt, done.stderr)
        assert done.stderr == "", fmt  # no BrokenPipeError, no "Exception ignored"
        assert first.strip() == {"table": "id", "json": '{"id": 0}'}[fmt]


def test_cat_prints_rows_csv_into_a_pipe_and_a_table_on_a_terminal(
    service: ServiceProcess,
) -> None:
    """Was: ``pyarrow.Table`` and the schema, and for 5,000 rows ten of them around ``...``;
    ``aqueduct cat t | head -3`` showed only the schema."""
    import datetime as dt

    n = 5000
    service.client().overwrite(
        "cat_rows",
        pa.table(
            {
                "id": pa.array(range(n), pa.int64()),
                "city": [("Oslo", None, "Bergen, Vestland")[i % 3] for i in range(n)],
                "ts": pa.array(
                    [dt.datetime(2026, 1, 1) + dt.timedelta(hours=i) for i in range(n)],
                    pa.timestamp("us"),
                ),
            }
        ),
    )
    piped = shell("aqueduct cat cat_rows | head -3; aqueduct cat cat_rows | wc -l", service)
    assert piped.stdout.splitlines() == [
        '"id","city","ts"',
        '0,"Oslo",2026-01-01 00:00:00.000000',
        "1,,2026-01-01 01:00:00.000000",
        str(n + 1),  # one header line, then every row
    ], piped.stderr
    # A terminal: `script` runs the command on a pseudo-terminal, as a person's shell does.
    tty = shell(f"script -qec '{AQUEDUCT} cat cat_rows --columns id,city' /dev/null", service)
    lines = tty.stdout.replace("\r\n", "\n").splitlines()
    assert lines[:5] == [
        "  id | city",
        "-----+-----------------",
        "   0 | Oslo",
        "   1 | NULL",
        "   2 | Bergen, Vestland",
    ], tty.stdout[:500]
    assert lines[-1] == "(5,000 rows)" and len(lines) == n + 3


def test_a_misspelt_option_or_choice_names_the_closest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Was: ``aqueduct: unrecognized arguments: --colums`` and nothing else."""
    from aqueduct_spark import cli

    for argv, expected in [
        (
            ["cat", "trips", "--colums", "id"],
            "aqueduct cat: unrecognized arguments: --colums (did you mean --columns?) "
            "(see aqueduct cat --help)",
        ),
        (["lss"], "invalid choice: 'lss' (did you mean ls?)"),
        (["cat", "trips", "--format", "tabel"], "invalid choice: 'tabel' (did you mean table?)"),
        (["export", "t", "f.csv", "--forse"], "--forse (did you mean --force?)"),
    ]:
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2
        assert expected in capsys.readouterr().err


def test_the_command_line_imports_only_what_a_command_needs() -> None:
    """``--version``, ``--help`` and usage errors import neither the client (pyarrow, the
    engine, asyncio, tqdm) nor the service: they cost 2 s of imports on a loaded machine
    (``python -X importtime``), about 0.4 s now."""
    code = (
        "import sys\n"
        "from aqueduct_spark import cli\n"
        "for argv in (['--version'], ['--help'], ['serve', '--help'], ['cat']):\n"
        "    try:\n"
        "        cli.main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('pyarrow', 'numpy', 'asyncio', 'tqdm', 'deltalake', 'aqueduct_core.engine',\n"
        "         'aqueduct_spark.client', 'aqueduct_spark.service')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stderr.splitlines()[-1] == "[]", done.stderr[-2000:]


def test_serve_flag_defaults_are_the_engines() -> None:
    from aqueduct_core.engine import EngineConfig
    from aqueduct_spark.cli.arguments import ENGINE_DEFAULTS

    engine = EngineConfig()
    assert {k: getattr(engine, k) for k in ENGINE_DEFAULTS} == ENGINE_DEFAULTS
    # ...and the service's, copied there so that parsing needs no service import
    from aqueduct_spark.cli import arguments, staging
    from aqueduct_spark.service import admission, write_buffers

    assert arguments.REQUEST_WINDOW == admission.REQUEST_WINDOW
    assert staging.WRITE_BUFFER_BYTES == write_buffers.WRITE_BUFFER_BYTES


def test_workers_default_to_one_per_core_beyond_two_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aqueduct_spark.cli import arguments
    from aqueduct_spark.cli.config import load_config

    assert [arguments.auto_workers(n) for n in (1, 2, 3, 8)] == [1, 1, 3, 8]
    monkeypatch.setattr(arguments.os, "sched_getaffinity", lambda pid: set(range(6)))
    parser = arguments.build_parser()
    assert parser.parse_args(["serve"]).workers == 6  # the default is auto
    assert parser.parse_args(["serve", "--workers", "AUTO"]).workers == 6
    assert parser.parse_args(["serve", "--workers", "2"]).workers == 2
    config = tmp_path / "serve.toml"
    config.write_text('workers = "auto"\n')
    serve = next(a for a in parser._actions if a.dest == "command").choices["serve"]  # type: ignore[attr-defined]
    assert load_config(str(config), serve)["workers"] == 6
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--workers", "0"])


def test_quiet_shows_no_progress_bar(service: ServiceProcess, tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": list(range(10))}), tmp_path / "in.parquet")
    loud = shell(f"aqueduct import loud {tmp_path / 'in.parquet'}", service)
    assert loud.returncode == 0 and "rows" in loud.stderr  # the progress bar
    quiet = shell(f"aqueduct import quiet {tmp_path / 'in.parquet'} -q", service)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert "quiet: version 0, +10 rows" in quiet.stdout


def test_export_never_overwrites_unasked_and_leaves_no_partial_file(
    service: ServiceProcess, tmp_path: Path
) -> None:
    service.client().overwrite("exported", pa.table({"id": list(range(1000))}))
    out = tmp_path / "out.parquet"
    out.write_text("precious")
    refused = shell(f"aqueduct export exported {out}", service)
    assert refused.returncode == 2
    assert "exists: give --force to replace it" in refused.stderr
    assert out.read_text() == "precious"
    forced = shell(f"aqueduct export exported {out} --force -q", service)
    assert forced.returncode == 0, forced.stderr
    assert pq.read_table(out).num_rows == 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet"]


def test_an_interrupted_export_leaves_nothing(service: ServiceProcess, tmp_path: Path) -> None:
    n = 500_000
    service.client().overwrite("big", pa.table({"id": pa.array(range(n), pa.int64())}))
    out = tmp_path / "big.parquet"
    env = {**os.environ, "AQUEDUCT_URL": service.url, "AQUEDUCT_FINGERPRINT": service.fingerprint}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aqueduct_spark.cli", "export", "big", str(out), "-q"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not any(tmp_path.glob(".big.parquet.*.part")):  # the export is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert list(tmp_path.iterdir()) == []
