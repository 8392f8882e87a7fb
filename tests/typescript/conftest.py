"""The TypeScript client (clients/typescript) under pytest: its unit tests, and Debian's
headless Chromium driven by Playwright (``benchmarks/browser_driver.py``) against a real
service.

``make test`` installs the npm packages from the lock file and builds the console and the
harness page (``make ts``); run alone, the ``ts`` fixture does the same once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.browser_driver import CHROMIUM, build


@pytest.fixture(scope="session")
def ts() -> Path:
    try:
        return build()
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def chromium() -> str:
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: make test installs it (apt-get install chromium)")
    return CHROMIUM
