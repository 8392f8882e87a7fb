"""The TypeScript client and the console in a real browser (issue 29): Debian's headless
Chromium, driven by Playwright (``clients/typescript/browser/run.mjs``), against a real
``aqueduct serve``.

The client reads a dataset over WebTransport and over WebSocket with every value checked,
writes, and is pushed the version it wrote; the console lists the datasets, previews 1,000
rows, and shows a version the Python client appends within 1 s; with UDP dropped by
nftables (a firewall, as users meet it), the console falls back to WebSocket. A screenshot
of the console is kept (``AQUEDUCT_ARTIFACTS``, default ``<tmp>/artifacts``).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from aqueduct_spark.testing import ServiceProcess, start_service
from benchmarks.browser_driver import endpoints, now_ms, run_browser, sample, spki_hash

# In make slow: each test starts Chromium (about 5 s of CPU) and a service. The fast suite
# covers the client's codec and engine without a browser (test_typescript.py: vitest on
# the shared vectors) and the service's side of both transports (tests/core).
pytestmark = [pytest.mark.browser, pytest.mark.slow]
HERE = Path(__file__).parent
ROWS = 10_000
ARTIFACTS = Path(os.environ.get("AQUEDUCT_ARTIFACTS") or Path(tempfile.gettempdir()) / "artifacts")


@pytest.fixture(scope="module")
def web_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("browser-root"), args=["--console"])
    client = svc.client()
    client.write("rides", sample(ROWS))
    for over in ("webtransport", "websocket"):
        client.create(f"from_{over}", pa.schema([("id", pa.int64()), ("name", pa.string())]))
    client.close()
    yield svc
    svc.stop()


def test_the_client_reads_writes_and_is_pushed_over_both_transports(
    web_service: ServiceProcess, chromium: str, ts: Path, tmp_path: Path
) -> None:
    body = (HERE / "interop.js").read_text(encoding="utf-8")
    plan = {
        "chromium": chromium,
        "args": [f"--ignore-certificate-errors-spki-list={spki_hash(web_service)}"],
        "harnessDir": str(ts / "dist" / "harness"),
        "steps": [
            {"name": "harness", "kind": "harness"},
            *(
                {
                    "name": over,
                    "kind": "eval",
                    "body": body,
                    "timeoutMs": 60_000,
                    "args": {
                        "transport": over,
                        "endpoints": endpoints(web_service),
                        "dataset": "rides",
                        "target": f"from_{over}",
                    },
                }
                for over in ("webtransport", "websocket")
            ),
        ],
    }
    results = run_browser(plan, tmp_path)
    client = web_service.client()
    for over in ("webtransport", "websocket"):
        assert "error" not in results[over], results[over]
        got = results[over]["value"]
        assert got["transport"] == over
        assert got["names"] == ["from_webtransport", "from_websocket", "rides"] or set(
            got["names"]
        ) >= {"rides", f"from_{over}"}
        assert (got["rows"], got["bad"]) == (ROWS, 0)
        assert got["first"]["version"] == 0
        assert got["written"]["version"] == 1 and got["written"]["rows"] == 2
        assert got["pushed"]["version"] == 1  # pushed by subscribe as it was committed
        assert got["history"] == [[0, "create", 0], [1, "append", 2]]
        assert got["refused"] == ["DatasetNotFound", "NOT_FOUND"]
        # What the browser wrote, read back by the Python client.
        table = client.read(f"from_{over}")
        assert sorted(table.column("name").to_pylist()) == sorted([over, "written in a browser"])
    client.close()


@contextmanager
def udp_blocked(port: int) -> Iterator[None]:
    """UDP to the service's port dropped, as a firewall that lets only TCP through does: a
    table of this process's own (nftables), deleted on the way out."""
    table = f"aqueduct_ts_{os.getpid()}"
    rules = (
        f"table inet {table} {{\n chain out {{\n  type filter hook output priority 0;\n"
        f"  ip daddr 127.0.0.1 udp dport {port} drop\n }}\n}}\n"
    )
    done = subprocess.run(["nft", "-f", "-"], input=rules, text=True, capture_output=True)
    if done.returncode:
        pytest.fail(
            f"nft could not drop UDP (run as root; make test installs nftables): {done.stderr}"
        )
    try:
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], check=True)


def test_the_console_lists_previews_follows_versions_and_falls_back_to_websocket(
    web_service: ServiceProcess, chromium: str, ts: Path, tmp_path: Path
) -> None:
    """aqueduct serve --console, as issue 29 asks of it in a real browser."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "console.png"
    # The console as a user on the service's machine opens it: the console's port over
    # plain HTTP as localhost (a secure context: no certificate to accept), its files built
    # here (make ts), aqueduct.json from the service.
    assert web_service.console is not None
    port = int(web_service.console.rstrip("/").rsplit(":", 1)[1])
    plan = {
        "chromium": chromium,
        "consoleUrl": f"http://localhost:{port}/",
        "steps": [
            {"name": "open", "kind": "console-open"},
            {"name": "preview", "kind": "console-preview", "dataset": "rides", "rows": 1000},
            {"name": "version", "kind": "console-version", "dataset": "rides", "timeoutMs": 5000},
            {"name": "service", "kind": "console-service"},
            {"name": "screenshot", "kind": "screenshot", "path": str(shot)},
            {"name": "block", "kind": "wait"},
            {"name": "fallback", "kind": "console-open", "timeoutMs": 15_000},
        ],
    }
    client = web_service.client()
    blocked = ExitStack()

    def on_wait(step: str) -> dict[str, Any]:
        if step == "version":  # the Python client appends; the page should show it at once
            before = client.describe("rides").version
            client.append("rides", sample(5, ROWS))
            return {"version": before + 1, "committedAt": now_ms()}
        blocked.enter_context(udp_blocked(web_service.port))
        return {}

    try:
        with blocked:
            results = run_browser(plan, tmp_path, on_wait)
    finally:
        client.close()
    for step in plan["steps"]:
        assert "error" not in results[step["name"]], results[step["name"]]
    opened = results["open"]
    assert opened["transport"] == "webtransport", opened
    assert {r["name"] for r in opened["rows"]} == {"rides", "from_webtransport", "from_websocket"}
    preview = results["preview"]
    assert preview["count"] == 1000
    assert preview["header"] == ["id", "name", "x"]
    assert preview["first"] == ["0", "r0", "0"] and preview["last"] == ["999", "r999", "249.75"]
    assert [row[0] for row in preview["schema"]] == ["id", "name", "x"]
    # Pushed by subscribe, not polled (the page lists again only every 10 s).
    assert results["version"]["afterCommitMs"] < 1000, results["version"]
    service = results["service"]
    ours = [c for c in service["connections"] if c["yours"]]
    assert [c["transport"] for c in ours] == ["webtransport"], service
    assert "webtransport 1" in service["service"]["service-connections"], service
    # its running requests: the subscriptions the page holds, one per dataset
    assert sum(s[1].startswith("subscribe") for s in service["streams"]) >= 3, service
    assert shot.stat().st_size > 10_000
    fallback = results["fallback"]
    assert fallback["transport"] == "websocket", fallback
    assert "rides" in {r["name"] for r in fallback["rows"]}
    assert "websocket" in fallback["status"], fallback
