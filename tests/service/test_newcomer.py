"""The first hour of a new user (issue 27's walk-through), as a test: ``aqueduct serve`` with a
configuration file of tokens, then the commands the README, quickstart and cli.md show, each
output checked as the user reads it.

The service is a real ``aqueduct serve`` process. The commands run in-process
(``cli.main``, as the other CLI tests run them): the same parser, code and output as the
``aqueduct`` program, without a Python start-up per command (2-3 s each on a loaded machine;
tests/service/test_cli.py runs the program itself, through a shell and pipes).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aqueduct_spark import cli
from aqueduct_spark.testing import ServiceProcess, start_service

pytestmark = pytest.mark.quic

ADMIN, READER = "newcomer-admin-7f3a", "newcomer-reader-51c9"
CONFIG = f"""
[[tokens]]
name = "etl"
token = "{ADMIN}"
rights = "read-write"

[[tokens]]
name = "reader"
token = "{READER}"
rights = "read"
datasets = ["trips_*", "cities"]
"""
START = dt.datetime(2026, 1, 1)


def trips_csv(path: Path, n: int, first: int = 0, bad: dict[int, str] | None = None) -> Path:
    """``trip_id,city,distance_km,ts``: a trip an hour from 2026-01-01 00:00."""
    lines = ["trip_id,city,distance_km,ts"]
    for i in range(first, first + n):
        distance = (bad or {}).get(i, f"{i % 40 + 0.5}")
        ts = START + dt.timedelta(hours=i)
        lines.append(f"{i},{('Oslo', 'Bergen', 'Tromsø')[i % 3]},{distance},{ts:%Y-%m-%d %H:%M:%S}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    here = tmp_path_factory.mktemp("newcomer")
    config = here / "aqueduct.toml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    svc = start_service(here / "aqueduct-data", args=["--config", str(config)])
    yield svc
    svc.stop()


Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def aqueduct(
    served: ServiceProcess, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Run:
    """``aqueduct(*argv, token=...)``: (status, stdout, stderr), with the two variables the
    serve banner tells a user to export."""
    monkeypatch.setenv("AQUEDUCT_URL", served.url)
    monkeypatch.setenv("AQUEDUCT_FINGERPRINT", served.fingerprint)

    def run(*argv: str, token: str = ADMIN) -> tuple[int, str, str]:
        monkeypatch.setenv("AQUEDUCT_TOKEN", token)
        capsys.readouterr()
        status = cli.main([*argv, "-q"])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def test_the_first_hour(aqueduct: Run, tmp_path: Path) -> None:
    # import: a CSV with a timestamp column; types from the whole file
    trips = trips_csv(tmp_path / "trips.csv", 500)
    assert aqueduct("import", "trips_2026", str(trips))[:2] == (
        0,
        "trips_2026: version 0, +500 rows\n",
    )
    status, out, _ = aqueduct("describe", "trips_2026")
    assert status == 0
    assert out.splitlines()[-4:] == [
        "  trip_id: int64",
        "  city: string",
        "  distance_km: double",
        "  ts: timestamp[us]",
    ]

    # a messy file: refused with its place, nothing written
    messy = trips_csv(tmp_path / "more.csv", 100, first=500, bad={542: "3.2km"})
    status, _, err = aqueduct("import", "trips_2026", str(messy))
    assert status == 2
    assert f"{messy} line 44, column 'distance_km': '3.2km' is not a number (double)" in err
    # ... corrected, appended
    trips_csv(messy, 100, first=500)
    assert aqueduct("import", "trips_2026", str(messy))[:2] == (
        0,
        "trips_2026: version 1, +100 rows\n",
    )

    # a filter by time: the typed literal, a table of the matching rows
    status, out, err = aqueduct(
        "head", "trips_2026", "--where", "ts >= '2026-01-25 20:00'", "-n", "3"
    )
    assert status == 0, err
    assert out.splitlines() == [
        "trip_id | city   | distance_km | ts",
        "--------+--------+-------------+--------------------",
        "    596 | Tromsø |        36.5 | 2026-01-25 20:00:00",
        "    597 | Oslo   |        37.5 | 2026-01-25 21:00:00",
        "    598 | Bergen |        38.5 | 2026-01-25 22:00:00",
        "(3 rows)",
    ]

    # cat: every row; into a pipe (not a terminal), CSV with one header
    status, out, _ = aqueduct("cat", "trips_2026", "--where", "city = 'Oslo'")
    assert status == 0
    rows = sorted(csv.DictReader(io.StringIO(out)), key=lambda r: int(r["trip_id"]))
    assert len(rows) == 200 and {r["city"] for r in rows} == {"Oslo"}
    assert rows[0] == {
        "trip_id": "0",
        "city": "Oslo",
        "distance_km": "0.5",
        "ts": "2026-01-01 00:00:00.000000",
    }

    # history: what each version did, as users name it
    status, out, _ = aqueduct("history", "trips_2026")
    lines = out.splitlines()
    assert status == 0 and len(lines) == 2, out
    assert lines[0].startswith("v0 ") and " append " in lines[0] and "+500 rows" in lines[0]
    assert lines[1].startswith("v1 ") and " append " in lines[1] and "+100 rows" in lines[1]

    # a token limited to globs reads a dataset of several files, and nothing outside them
    for i in range(3):
        path = tmp_path / f"cities-{i}.csv"
        path.write_text(f"city,country\nCity{i},NO\n")
        assert aqueduct("import", "cities", str(path))[0] == 0
    assert aqueduct("import", "secrets", str(trips))[0] == 0
    status, out, err = aqueduct("cat", "cities", "--format", "csv", token=READER)
    assert status == 0, err
    header, *cities = out.splitlines()
    assert header == '"city","country"' and sorted(cities) == [
        '"City0","NO"',
        '"City1","NO"',
        '"City2","NO"',
    ]
    status, out, err = aqueduct(
        "head", "trips_2026", "-n", "1", "--where", "trip_id = 7", token=READER
    )
    assert status == 0 and "      7 | Bergen" in out, err
    status, out, _ = aqueduct("ls", token=READER)
    assert [line.split()[0] for line in out.splitlines()] == ["cities", "trips_2026"]
    status, _, err = aqueduct("head", "secrets", token=READER)
    assert status == 1
    assert err.startswith("aqueduct head: reader has no rights on dataset 'secrets'"), err
    status, _, err = aqueduct("import", "cities", str(tmp_path / "cities-0.csv"), token=READER)
    assert status == 1 and "may only read" in err, err
