"""Settings of Aqueduct for browsers: WebTransport on the UDP port, WebSocket on the TCP port
(profile §8 and §9). Kept apart from the transports so that :mod:`.config` imports no HTTP
code."""

from __future__ import annotations

from dataclasses import dataclass

WEB_PATH = "/aqueduct"
"""The path of the WebTransport CONNECT and of the WebSocket upgrade."""
WS_SUBPROTOCOL = "aqueduct-tcp"
"""The WebSocket subprotocol: the messages carry the frames of Aqueduct over TCP (§7)."""
H3_ALPN = "h3"
HTTP1_ALPN = "http/1.1"


@dataclass(frozen=True)
class WebSettings:
    """Aqueduct for browsers. Sizes in bytes."""

    webtransport: bool = False
    """``serve``: also accept WebTransport sessions (ALPN ``h3``) on the UDP port."""
    websocket: bool = False
    """``serve``: also accept WebSocket upgrades (ALPN ``http/1.1``) on the TCP port."""
    path: str = WEB_PATH
    """The request path of both."""
    max_http_bytes: int = 64 * 1024
    """WebTransport: bytes of HTTP/3 a connection may send over its life, everything but
    its session's streams and datagrams (control and QPACK streams, requests, capsules; a
    browser sends about 1 KiB); WebSocket: bytes of the upgrade request. Beyond it the
    connection is closed (H3_EXCESSIVE_LOAD; HTTP 431)."""
    origins: tuple[str, ...] | None = None
    """The ``Origin`` values a browser's request may carry (``https://host:port``); None:
    any. A request without Origin (not from a browser) is always allowed."""

    def __post_init__(self) -> None:
        if not self.path.startswith("/") or "?" in self.path:
            raise ValueError(f"the web path must start with / and hold no query: {self.path!r}")
        if self.max_http_bytes < 4096:
            raise ValueError("max_http_bytes must be at least 4096")
