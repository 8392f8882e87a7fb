"""The service's optional HTTP port (``aqueduct serve --metrics-port``): ``/metrics`` in
Prometheus' text format and ``/health`` as JSON.

It is a few lines of HTTP/1.1 on the service's own event loop, not a thread: a ``/health``
that answers proves the loop that serves clients is turning, and a scrape sees the counters
as the loop left them. Each request is read with a size and time limit and answered with
``Connection: close``; only ``GET`` and ``HEAD`` are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from aqueduct_spark.protocol import PROTOCOL_VERSION
from aqueduct_spark.service.observability import Observer

log = logging.getLogger("aqueduct.service")

READ_TIMEOUT = 10.0
"""Seconds a client of the HTTP port has to send its request head."""
MAX_HEAD = 16 * 1024
"""Bytes a request head may take (request line and headers)."""


def http_url(host: str, port: int, path: str = "") -> str:
    return f"http://[{host}]:{port}{path}" if ":" in host else f"http://{host}:{port}{path}"


@dataclass
class HttpEndpoint:
    """The listening HTTP port; :meth:`close` stops it."""

    server: asyncio.Server
    host: str
    port: int

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)

    async def close(self) -> None:
        self.server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 5)


def health(observer: Observer, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body of ``/health``: ``status`` is ``ok`` whenever it is answered at all."""
    return {
        "status": "ok",
        "protocol": PROTOCOL_VERSION,
        "uptime_s": round(time.monotonic() - observer.started, 1),
        "connections": observer.connections_open,
        **(extra or {}),
    }


async def start_http(
    observer: Observer, host: str, port: int, extra: dict[str, Any] | None = None
) -> HttpEndpoint:
    """Listen on ``host:port`` (TCP; 0: any free port) for ``/metrics`` and ``/health``.
    ``extra`` goes into every ``/health`` answer (the worker's number, for example)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head_only = False
        try:
            status, ctype, body, head_only = await _respond(observer, reader, extra)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            status, ctype, body = 400, "text/plain", b"bad request\n"
        except ConnectionError:
            writer.close()
            return
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
        )
        try:
            writer.write(head.encode("latin-1") + (b"" if head_only else body))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    if host == "::":  # every address, IPv4 too, as the service's own socket does
        server = await asyncio.start_server(answer, sock=_dual_stack(port), limit=MAX_HEAD)
    else:
        server = await asyncio.start_server(answer, host, port, limit=MAX_HEAD)
    bound = server.sockets[0].getsockname()
    endpoint = HttpEndpoint(server, str(bound[0]), int(bound[1]))
    log.info(
        "metrics and health endpoint listening",
        extra={"fields": {"url": endpoint.url, "paths": "/metrics /health"}},
    )
    return endpoint


def _dual_stack(port: int) -> socket.socket:
    """A TCP socket on ``[::]:port`` that takes IPv4 too (asyncio would make it IPv6 only)."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", port))
    except OSError:
        sock.close()
        raise
    return sock


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


async def _respond(
    observer: Observer, reader: asyncio.StreamReader, extra: dict[str, Any] | None
) -> tuple[int, str, bytes, bool]:
    """(status, content type, body, whether to leave the body out: HEAD)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return 400, "text/plain", b"bad request\n", False
    method, target = parts[0], parts[1]
    if method not in ("GET", "HEAD"):
        return 405, "text/plain", b"only GET and HEAD are served\n", False
    path = urlsplit(target).path.rstrip("/") or "/"
    if path == "/metrics":
        body = generate_latest(observer.metrics.registry)
        status, ctype = 200, CONTENT_TYPE_LATEST
    elif path in ("/health", "/healthz"):
        body = (json.dumps(health(observer, extra)) + "\n").encode()
        status, ctype = 200, "application/json"
    else:
        body = b"not found: try /metrics or /health\n"
        status, ctype = 404, "text/plain"
    return status, ctype, body, method == "HEAD"
