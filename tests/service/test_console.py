"""``aqueduct serve --console`` (issue 29): the console's web port and what the page needs
from the service, against a real ``aqueduct serve`` process.

The port serves the console's built files (or a placeholder page), ``/aqueduct.json`` (the
endpoints and the WebTransport hashes, profile §10) and Aqueduct over WebSocket on the
page's own origin; HTTPS to anyone, plain HTTP to this machine only. What the console shows
comes over Aqueduct: the ``status`` request now carries the service's activity, as far as
the asking token may see it.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.parse import urlsplit

import pyarrow as pa
import pytest
from conftest import ServiceProcess, start_service

from aqueduct_core.transport import ClientTLS, TransportConfig
from aqueduct_spark.client import Client

pytestmark = pytest.mark.quic
ADMIN, ANALYST = "admin-5e1d8c", "analyst-0b72f4"
TOKENS = f"""
[[tokens]]
name = "admin"
token = "{ADMIN}"
rights = "read-write"

[[tokens]]
name = "analyst"
token = "{ANALYST}"
rights = "read"
datasets = ["public_*"]
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A built console, as ``npm run build`` leaves one."""
    d = tmp_path_factory.mktemp("console-dist")
    (d / "index.html").write_text("<!doctype html><title>Aqueduct console</title>")
    (d / "assets").mkdir()
    (d / "assets" / "main.js").write_text("console.log('hi')")
    (d.parent / "secret.txt").write_text("not to be served")
    return d


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory, site: Path) -> Iterator[ServiceProcess]:
    root = tmp_path_factory.mktemp("console-root")
    (root / "tokens.toml").write_text(TOKENS)
    svc = start_service(
        root,
        args=[
            *("--console", "--console-dir", str(site), "--config", str(root / "tokens.toml")),
            *("--console-host", "0.0.0.0"),  # reachable from this machine's other address
            *("--web-origin", "https://app.example.com"),  # the service's own web ports
        ],
    )
    yield svc
    svc.stop()


def get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def port_of(svc: ServiceProcess) -> int:
    assert svc.console is not None
    return int(urlsplit(svc.console).port or 0)


def test_the_console_port_serves_the_page_and_where_the_service_is(
    console: ServiceProcess,
) -> None:
    port = port_of(console)
    assert console.console == f"https://127.0.0.1:{port}/"
    for base in (console.console, f"http://localhost:{port}/"):  # HTTPS, and plain from here
        status, headers, body = get(base)
        assert status == 200 and b"Aqueduct console" in body
        assert headers["Content-Type"].startswith("text/html")
        status, headers, body = get(base + "assets/main.js")
        assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    for escape in ("../secret.txt", "assets/../../secret.txt", "%2e%2e/secret.txt", "nothing"):
        assert get(base + escape)[0] == 404, escape  # the same files over either
    status, headers, body = get(f"https://127.0.0.1:{port}/aqueduct.json")
    found = json.loads(body)
    assert status == 200 and headers["Cache-Control"] == "no-store"
    assert found["token_required"] is True
    assert found["webtransport"] == {
        "url": f"https://127.0.0.1:{console.port}/aqueduct",
        "certificateHashes": console.webtransport_hashes,
    }
    assert found["websocket"] == {"url": f"wss://127.0.0.1:{port}/aqueduct"}
    plain = json.loads(get(f"http://localhost:{port}/aqueduct.json")[2])
    assert plain["websocket"] == {"url": f"ws://localhost:{port}/aqueduct"}
    # localhost may resolve to ::1 first: the UDP endpoint is named by the service's address
    assert plain["webtransport"]["url"] == f"https://127.0.0.1:{console.port}/aqueduct"
    assert raw(port, "/aqueduct.json", "<script>:1").startswith(b"HTTP/1.1 400 ")  # forged
    answer = raw(port, "/", f"localhost:{port}", method="POST")
    assert answer.startswith(b"HTTP/1.1 405 ") and b"Allow: GET" in answer


UPGRADE = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
UPGRADE += "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: aqueduct-tcp\r\n"


def raw(port: int, path: str, host: str, extra: str = "", method: str = "GET") -> bytes:
    """One plain HTTP request from this machine, as a browser would send it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode())
        return s.recv(4096)


def test_pages_elsewhere_cannot_use_the_console_port(console: ServiceProcess) -> None:
    """A web site the user visits may open ws://localhost:PORT (browsers allow it) or point
    its own name at 127.0.0.1 (DNS rebinding): the upgrade needs the port's own Origin, and
    plain HTTP a loopback name."""
    port = port_of(console)
    here = f"localhost:{port}"
    assert raw(port, "/aqueduct", here, UPGRADE).startswith(b"HTTP/1.1 101 ")  # a program
    own = UPGRADE + f"Origin: http://{here}\r\n"
    assert raw(port, "/aqueduct", here, own).startswith(b"HTTP/1.1 101 ")  # the console
    for origin in ("https://evil.example", f"http://localhost:{port + 1}", f"https://{here}"):
        answer = raw(port, "/aqueduct", here, UPGRADE + f"Origin: {origin}\r\n")
        assert answer.startswith(b"HTTP/1.1 403 ") and b"open the console" in answer, origin
    rebound = f"evil.example:{port}"
    for path, extra in (
        ("/aqueduct.json", ""),
        ("/aqueduct", UPGRADE + f"Origin: http://{rebound}\r\n"),
    ):
        answer = raw(port, path, rebound, extra)
        assert answer.startswith(b"HTTP/1.1 421 ") and b"localhost" in answer, path


def test_web_origin_limits_the_pages_that_reach_the_service(console: ServiceProcess) -> None:
    """--web-origin: on the service's own WebSocket port only the listed origins' pages get
    in (programs send no Origin); the console's port keeps to its own pages regardless (the
    test above: its own Origin is not in the list and still gets in)."""
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE

    def upgrade(origin: str | None) -> bytes:
        extra = UPGRADE + (f"Origin: {origin}\r\n" if origin else "")
        tcp = socket.create_connection(("127.0.0.1", console.port), timeout=10)
        with tls.wrap_socket(tcp) as s:  # no ALPN, as WebSocket libraries send
            s.sendall(f"GET /aqueduct HTTP/1.1\r\nHost: h\r\n{extra}\r\n".encode())
            return s.recv(4096)

    assert upgrade("https://app.example.com").startswith(b"HTTP/1.1 101 ")
    assert upgrade(None).startswith(b"HTTP/1.1 101 ")
    assert upgrade("https://evil.example").startswith(b"HTTP/1.1 403 ")


def test_plain_http_from_another_machine_is_refused(console: ServiceProcess) -> None:
    """Plain HTTP would carry the token in clear: only loopback peers get it."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect(("192.0.2.1", 9))  # sends nothing: the address the route would use
    address = probe.getsockname()[0]
    probe.close()
    if address.startswith("127."):
        pytest.skip("this machine has no address but loopback")
    port = port_of(console)
    with socket.create_connection((address, port), timeout=10) as s:
        s.sendall(f"GET / HTTP/1.1\r\nHost: {address}:{port}\r\n\r\n".encode())
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"https://" in answer
    assert get(f"https://{address}:{port}/")[0] == 200  # HTTPS is served to anyone


def test_the_page_reaches_the_dataset_service_over_websocket_on_its_own_origin(
    console: ServiceProcess,
) -> None:
    c = Client(
        f"quic://127.0.0.1:{port_of(console)}",
        token=ANALYST,
        tls=ClientTLS(fingerprint=console.fingerprint),
        transport=TransportConfig(transport="websocket"),
        retries=1,
    )
    assert all(d.name.startswith("public_") for d in c.list())  # the analyst's globs
    assert c.transport == "websocket"
    c.close()


def test_status_shows_the_activity_as_far_as_the_token_may_see(console: ServiceProcess) -> None:
    admin = console.client(token=ADMIN)
    admin.overwrite("public_rides", pa.table({"id": list(range(5))}))
    alive = threading.Event()
    sub = admin.subscribe("public_rides", lambda v: None, lambda ok: alive.set() if ok else None)
    analyst = console.client(token=ANALYST, transport="tcp")
    try:
        assert alive.wait(10)
        assert [d.name for d in analyst.list()] == ["public_rides"]  # connected, over TCP
        seen = admin.status()
        assert seen["connections"] >= 2 and seen["requests_in_flight"] >= 1
        assert set(seen["transports"]) <= {"quic", "tcp", "webtransport", "websocket"}
        rows = seen["connections_listed"]
        mine = [c for c in rows if c["yours"]]
        assert len(mine) == 1 and mine[0]["user"] == "admin"
        streams = [s for c in rows for s in c["streams"]]
        assert any(s["op"] == "subscribe" and s["dataset"] == "public_rides" for s in streams)
        assert all(k in mine[0] for k in ("transport", "peer", "age_s", "bytes_per_s"))
        restricted: dict[str, Any] = analyst.status()
        assert restricted["connections"] == seen["connections"]  # counts for everyone
        users = {c["user"] for c in restricted["connections_listed"]}
        assert users == {"analyst"}  # but nobody else's connections, peers or datasets
    finally:
        sub.cancel()
        admin.close()
        analyst.close()


@pytest.mark.parametrize(
    "args, says",
    [
        (["--console", "--workers", "2"], "--console-port"),
        (["--console-dir", "."], "need --console"),
        (["--console", "--console-dir", "/nonexistent"], "index.html"),
        (["--web", "--web-origin", "app.example.com"], "not an origin"),
        (["--web-origin", "https://app.example.com"], "needs --web"),
    ],
)
def test_console_settings_that_cannot_work_are_refused_with_the_fix(
    tmp_path: Path,
    args: list[str],
    says: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aqueduct_spark.cli import main
    from aqueduct_spark.service import startup

    monkeypatch.setenv("AQUEDUCT_TOKEN", "")
    assert (
        main(["serve", "--root", str(tmp_path), "--port", "0", *args]) == 2
    )  # refused before listening
    assert says in capsys.readouterr().err
    assert not startup._HELD  # --workers 2 had claimed a port: a refusal gives it back


def test_loopback_peers_are_told_on_dual_stack_sockets_too() -> None:
    """Who gets plain HTTP: 127.0.0.1 arrives as ::ffff:127.0.0.1 on a --host :: socket."""
    from aqueduct_core.transport.tcp_endpoints import is_loopback_peer

    for peer in [("127.0.0.1", 1), ("::1", 1, 0, 0), ("::ffff:127.0.0.1", 1, 0, 0)]:
        assert is_loopback_peer(peer), peer
    for other in [("10.0.0.1", 1), ("::ffff:10.0.0.1", 1, 0, 0), ("fe80::1%eth0", 1, 0, 0), None]:
        assert not is_loopback_peer(other), other
