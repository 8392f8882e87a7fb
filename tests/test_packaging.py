"""What each install brings (issue 16, item 5): Spark's executors install
``aqueduct-spark[spark]``, the client side, which must not pull in Delta Lake; only the
``service`` extra does, and ``make`` installs it for the tests and the demo."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

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
