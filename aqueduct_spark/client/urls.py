"""Service addresses, read with the standard library's URL parser.

``quic://host:port``, ``aqueduct://host:port`` or a bare ``host:port`` name a service and let
the configured transport choose how to reach it (``auto``: QUIC, with TLS/TCP raced in);
``tcp://host:port`` always uses TLS/TCP. A missing port means :data:`DEFAULT_PORT`, the port
``aqueduct serve`` listens on by default. IPv6 literals go in brackets (``quic://[::1]:4433``;
a bare ``::1`` alone works too). Several addresses separated by commas are tried in order.
Anything else (another scheme, a path, credentials, a port out of range) is refused at once
with a message that says what is accepted.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from aqueduct_core.transport.config import Transport

DEFAULT_PORT = 4433
"""``aqueduct serve``'s default ``--port``, for an address that gives none."""

SCHEMES: dict[str, Transport | None] = {"quic": None, "aqueduct": None, "tcp": "tcp"}
"""Accepted schemes, and the transport each one forces (None: the configured choice)."""

ACCEPTED = (
    "use quic://host:port (or tcp://host:port for TLS/TCP only, aqueduct://host:port, or a bare "
    f"host:port; the port defaults to {DEFAULT_PORT}, an IPv6 address goes in brackets as in "
    "quic://[::1]:4433, and several addresses are separated by commas)"
)


@dataclass(frozen=True)
class Endpoint:
    """One address to try: ``transport`` is ``tcp`` for a ``tcp://`` address, else None
    (the client's configured transport decides)."""

    host: str
    port: int
    transport: Transport | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.transport or 'quic'}://{host}:{self.port}"


def parse_endpoints(url: str) -> list[Endpoint]:
    """The addresses in ``url``, in order. Raises ValueError naming what is wrong."""
    endpoints = [_endpoint(part.strip()) for part in url.split(",") if part.strip()]
    if not endpoints:
        raise ValueError(f"no service address given: {ACCEPTED}")
    return endpoints


def parse_url(url: str) -> list[tuple[str, int]]:
    """``quic://host:port`` (or ``tcp://``, ``aqueduct://``, or bare ``host:port``), several
    separated by commas: the ``(host, port)`` pairs to try, in order."""
    return [(e.host, e.port) for e in parse_endpoints(url)]


def _endpoint(part: str) -> Endpoint:
    def bad(problem: str) -> ValueError:
        return ValueError(f"cannot read the service address {part!r}: {problem}; {ACCEPTED}")

    if "://" not in part:
        if _is_ipv6(part):
            return Endpoint(part, DEFAULT_PORT)
        part_url = "//" + part
    else:
        part_url = part
    try:
        split = urlsplit(part_url)
    except ValueError as exc:  # unbalanced brackets
        raise bad(str(exc)) from None
    scheme = split.scheme or "quic"
    if scheme not in SCHEMES:
        hint = " (the service speaks Aqueduct, not HTTP)" if scheme.startswith("http") else ""
        raise bad(f"the scheme {scheme}:// is not one this client speaks{hint}")
    netloc = split.netloc
    if "@" in netloc:
        raise bad("credentials do not go in the address (give the token option instead)")
    if split.path not in ("", "/") or split.query or split.fragment:
        raise bad("a service address has no path, query or fragment")
    if netloc.count(":") > 1 and not netloc.startswith("["):
        raise bad("an IPv6 address goes in brackets")
    host = split.hostname
    if not host:
        raise bad("no host name")
    try:
        port = split.port
    except ValueError:
        raise bad(
            f"the port {netloc.rpartition(':')[2]!r} is not a number from 1 to 65535"
        ) from None
    if port == 0:
        raise bad("the port must be from 1 to 65535 (0 is only for aqueduct serve --port 0)")
    return Endpoint(host, DEFAULT_PORT if port is None else port, SCHEMES[scheme])


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False
