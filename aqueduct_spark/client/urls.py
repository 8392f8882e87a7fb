"""Service addresses: ``quic://host:port``, several separated by commas."""

from __future__ import annotations

DEFAULT_PORT = 4433


def parse_url(url: str) -> list[tuple[str, int]]:
    """``quic://host:port`` (or ``aqueduct://``, or bare ``host:port``), several separated
    by commas: the endpoints to try, in order."""
    endpoints = []
    for part in url.split(","):
        part = part.strip()
        for prefix in ("quic://", "aqueduct://"):
            if part.startswith(prefix):
                part = part[len(prefix) :]
        part = part.rstrip("/")
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep:
            host, port = part, str(DEFAULT_PORT)
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"cannot read the service address {url!r}: use quic://host:port "
                f"(several separated by commas)"
            )
        endpoints.append((host, int(port)))
    if not endpoints:
        raise ValueError("no service address given: use quic://host:port")
    return endpoints
