"""What each install brings (issue 16, item 5): Spark's executors install
``aqueduct-spark[spark]``, the client side, which must not pull in Delta Lake; only the
``service`` extra does, and ``make`` installs it for the tests and the demo."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_delta_lake_is_in_the_service_extra_only() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    executor_side = _names(project["dependencies"]) | _names(extras["spark"])
    assert "deltalake" not in executor_side
    assert {"pyarrow", "cbor2", "aioquic"} <= executor_side
    assert "deltalake" in _names(extras["service"])


def test_make_installs_what_the_tests_need() -> None:
    install = re.search(r"pip install .*-e '\.\[([\w,]+)\]'", (ROOT / "Makefile").read_text())
    assert install is not None
    assert {"dev", "spark", "service"} <= set(install.group(1).split(","))


def test_serve_without_the_service_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import importlib.util

    from aqueduct_spark import cli
    from aqueduct_spark.cli import serve  # lazily imported by cli.main: not an attribute yet

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "deltalake" else find_spec(name)
    )

    def serve_anyway(main: object) -> None:
        raise AssertionError("serve started without Delta Lake")

    monkeypatch.setattr(serve, "_run", serve_anyway)
    for command in (["serve", "--root", str(tmp_path)], ["vacuum", "d", "--root", str(tmp_path)]):
        assert cli.main(command) == 1
        err = capsys.readouterr().err
        assert "pip install 'aqueduct-spark[service]'" in err, err


# Programs from Debian that tests or benchmarks may call, and their packages (iproute2's `ip`
# and `tc` come with the machine).
DEBIAN_PROGRAMS = {
    "nft": "nftables",
    "iptables": "iptables",
    "chromium": "chromium",
    "chromedriver": "chromium-driver",
}


def test_make_test_installs_the_debian_packages_the_tests_call() -> None:
    """A fresh machine has none of them: ``make test`` (as root) must install each package
    whose program a test or benchmark runs, or those tests fail there (it happened with
    nftables, installed by hand on the machines where the suite passed)."""
    import subprocess

    plan = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    installs = " ".join(re.findall(r"apt-get install ([^;|&}]*)", plan)).split()
    sources = [
        path.read_text()
        for top in ("tests", "benchmarks")
        for path in (ROOT / top).rglob("*.py")
        if path.name != "test_packaging.py"
    ]
    called = {
        program
        for program in DEBIAN_PROGRAMS
        if any(re.search(rf"[\"'`]{program}[\"' ]", text) for text in sources)
    }
    assert "nft" in called  # the real-path tests drop packets with it
    missing = {DEBIAN_PROGRAMS[p] for p in called} - set(installs)
    assert not missing, f"make test never installs {missing}: add them to DEBS in the Makefile"
