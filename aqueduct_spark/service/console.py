"""The console's web port (``aqueduct serve --console``): the console's static files, the
``/aqueduct.json`` that tells the page where the service is (profile §10), and Aqueduct over
WebSocket at ``/aqueduct`` on the same origin.

The page is built by the TypeScript package (``clients/typescript``, ``npm run build``
writes ``dist/console``); until it is, a placeholder page says how to build it. Everything
the console shows (datasets, versions, schema, rows, history, activity) it asks over
Aqueduct itself, with the token the user types into it; this port serves no data of its
own and never sees a token in a URL.

HTTPS with the service's certificate to every peer; plain HTTP as well to this machine
(``http://localhost:PORT/`` is a secure context, so WebTransport works from it, and nothing
crosses a network in clear). Pages from elsewhere are kept out (:class:`ConsoleFiles`). Files are read from the directory on each request (it may be
rebuilt while the service runs), only below it, only ``GET``.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from websockets.http11 import Request, Response

from aqueduct_core.transport import Server, ServerTLS
from aqueduct_core.transport.dial import serve_web
from aqueduct_core.transport.tcp_endpoints import TcpListener
from aqueduct_core.transport.web_config import WEB_PATH, WebSettings
from aqueduct_core.transport.websocket import http_response
from aqueduct_spark.protocol import PROTOCOL_VERSION

log = logging.getLogger("aqueduct.service")

REPO_CONSOLE = Path(__file__).resolve().parents[2] / "clients" / "typescript" / "dist" / "console"
"""Where the TypeScript package builds the console, in a checkout of the repository."""
MAX_FILE = 32 * 1024 * 1024
"""Largest file served (the console's scripts are a few MiB)."""
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?$")

PLACEHOLDER = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Aqueduct console</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:44rem;margin:3rem auto;padding:0 1rem}
code{background:#f2f2f2;padding:0 .25rem}</style></head>
<body><h1>Aqueduct console</h1>
<p>This service runs with <code>--console</code>, but the console's page is not built here.
Build it from a checkout of the repository:</p>
<pre><code>cd clients/typescript &amp;&amp; npm ci &amp;&amp; npm run build</code></pre>
<p>then restart the service (or give <code>--console-dir</code> the directory that holds the
built <code>index.html</code>). <a href="aqueduct.json">aqueduct.json</a> already says how a
page reaches this service.</p></body></html>
"""


def console_dir(given: str | None) -> Path | None:
    """The directory served: ``given``, else the repository's build if there is one; None
    means the placeholder page."""
    if given:
        return Path(given)
    return REPO_CONSOLE if (REPO_CONSOLE / "index.html").is_file() else None


class ConsoleFiles:
    """Sees every request on the console port first (``websocket.Responder``): answers
    those for files and ``/aqueduct.json``, refuses what a page elsewhere could send, lets
    the WebSocket upgrade at ``web_path`` through.

    Browsers let any page open a WebSocket anywhere, and ``ws://localhost`` is allowed even
    from an ``https://`` page: without these checks any web site its user visits could read
    a token-less service through the console port. So an upgrade whose ``Origin`` is not
    this port's own (scheme, host and port of the request) is refused (403), and plain HTTP
    is answered only under a loopback name (``localhost``, ``127.0.0.1``, ``[::1]``; 421
    otherwise), which keeps out a DNS-rebinding page (one whose own name was made to point
    at 127.0.0.1: its requests carry that name)."""

    def __init__(
        self,
        directory: Path | None,
        endpoints: Callable[[str, bool], dict[str, Any]],
        web_path: str = WEB_PATH,
    ):
        self.directory = directory.resolve() if directory is not None else None
        self.endpoints = endpoints
        """``endpoints(host, secure)``: the body of ``/aqueduct.json`` for a page that reached
        this port as ``host`` (its ``Host`` header), over HTTPS or not."""
        self.web_path = web_path

    def __call__(self, request: Request, secure: bool) -> Response | None:
        path = request.path.split("?", 1)[0]
        host = request.headers.get("Host", "")
        if not _HOST.match(host):
            return http_response(400, b"a Host header naming this service is required\n")
        if request.method != "GET":  # nothing here changes anything
            return http_response(405, b"only GET is served here\n", headers={"Allow": "GET"})
        if not secure and split_host(host).lower() not in LOOPBACK_NAMES:
            return http_response(
                421,
                b"plain HTTP is served as http://localhost:PORT/ only (another name could be "
                b"a DNS-rebinding page's): use that address, or https://\n",
            )
        if path == self.web_path:
            origin = request.headers.get("Origin")
            if origin is not None and not same_origin(origin, host, secure):
                return http_response(
                    403,
                    f"a page from {origin} may not use this console's WebSocket: open the "
                    "console from this port (or connect from a program, which sends no "
                    "Origin)\n".encode(),
                )
            return None  # the upgrade (or 426 for a request that is none)
        if path == "/aqueduct.json":
            body = json.dumps(self.endpoints(host, secure), indent=1).encode()
            return http_response(200, body, "application/json")
        return self._file(path)

    def _file(self, path: str) -> Response:
        if self.directory is None:
            if path in ("/", "/index.html"):
                return http_response(200, PLACEHOLDER, "text/html; charset=utf-8")
            return http_response(404, b"not found\n")
        target = (self.directory / path.lstrip("/")).resolve()
        if not target.is_relative_to(self.directory):
            return http_response(404, b"not found\n")
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file() or target.stat().st_size > MAX_FILE:
            return http_response(404, b"not found\n")
        kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind in ("application/javascript", "application/json"):
            kind += "; charset=utf-8"
        return http_response(200, target.read_bytes(), kind)


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})


def same_origin(origin: str, host: str, secure: bool) -> bool:
    """Whether a request's ``Origin`` is the page origin of the port it reached as ``host``
    (its ``Host`` header), over TLS or not: scheme, host and port, default ports implied."""
    scheme = "https" if secure else "http"
    default = 443 if secure else 80
    try:
        seen = urlsplit(origin)
        mine = urlsplit(f"{scheme}://{host}")
        return (
            seen.scheme == scheme
            and (seen.hostname or "") == (mine.hostname or "")
            and (seen.port or default) == (mine.port or default)
            and seen.path in ("", "/")
        )
    except ValueError:  # a malformed port
        return False


def split_host(host: str) -> str:
    """``host`` of a ``Host`` header without its port (``[::1]:8443`` -> ``[::1]``)."""
    if host.startswith("["):
        return host[: host.index("]") + 1]
    return host.rsplit(":", 1)[0] if ":" in host else host


def endpoints_for(
    server: Server, console_port: int, web: WebSettings, token_required: bool
) -> Callable[[str, bool], dict[str, Any]]:
    """The body of ``/aqueduct.json`` (profile §10) for a page that reached the console as
    ``host``: URLs with that host, the service's UDP port for WebTransport and the console's
    own port for WebSocket (the page's own origin: ``ws://`` for a page this machine loaded
    over plain HTTP, ``wss://`` otherwise)."""

    def body(host: str, secure: bool) -> dict[str, Any]:
        name = split_host(host)
        wt = None
        if web.webtransport:
            # localhost may resolve to ::1 first, where a service on 127.0.0.1 is not: over
            # UDP nothing would fall back, so a loopback service is named by its address.
            bound = server.host if server.host in ("127.0.0.1", "::1") else None
            udp_name = (
                (f"[{bound}]" if ":" in bound else bound) if bound and name == "localhost" else name
            )
            wt = {
                "url": f"https://{udp_name}:{server.port}{web.path}",
                "certificateHashes": server.webtransport_fingerprints,
            }
        return {
            "protocol": PROTOCOL_VERSION,
            "token_required": token_required,
            "webtransport": wt,
            "websocket": {"url": f"{'wss' if secure else 'ws'}://{name}:{console_port}{web.path}"},
            "service": {"host": name, "port": server.port, "fingerprint": server.fingerprint},
        }

    return body


async def start_console(
    service: Any,
    server: Server,
    host: str,
    port: int,
    *,
    directory: Path | None,
    tls: ServerTLS | None,
    reuse_port: bool = False,
) -> TcpListener:
    """Serve the console beside the dataset service's ``server`` on ``host:port``."""
    transport = service.transport
    web = transport.web
    holder: dict[str, Any] = {}

    def endpoints(host_header: str, secure: bool) -> dict[str, Any]:
        return holder["body"](host_header, secure)  # type: ignore[no-any-return]

    listener = await serve_web(
        server,
        service.handle,
        host,
        port,
        responder=ConsoleFiles(directory, endpoints, web.path),
        tls=tls,
        headers=service.server_headers,
        # The console port keeps its own pages' Origin only (ConsoleFiles), whatever
        # --web-origin allows on the service's ports.
        config=replace(transport, web=replace(web, origins=None)),
        codecs=service.codecs(),
        reuse_port=reuse_port,
    )
    bound = listener.server.sockets[0].getsockname()[1]
    holder["body"] = endpoints_for(server, bound, web, service.access.requires_token)
    log.info("console on port %d (%s)", bound, directory or "placeholder page")
    return listener
