"""Flow-control negotiation (profile §3.4 item 1).

Each side may advertise its per-channel receive window W (bytes) in a reserved connection
header, named in the spec's ``name-6hex`` style, whose value is a varint. The extension is
on only when both sides advertise; otherwise the sender has unlimited credit and DEQUEUED
(tag 12) is never sent. The base wire format is untouched.
"""

from __future__ import annotations

from aqueduct_core.errors import RemoteProtocolError
from aqueduct_core.wire.primitives import Headers, Truncated, encode_varint, pull_varint

FLOW_HEADER = b"aqueduct-flow-9d04b2"
"""Renamed from ``aqueduct-flow-5c1e07`` when attachments began to count in a message's cost:
peers that count differently must not both think the extension is on."""


def encode_window(window: int) -> bytes:
    return encode_varint(window)


def parse_window(headers: Headers) -> int | None:
    """The window the peer advertised, or None if it does not take part."""
    for key, value in headers:
        if key == FLOW_HEADER:
            try:
                window, end = pull_varint(memoryview(value), 0)
            except Truncated:
                window, end = 0, -1
            if end != len(value) or window < 1:
                raise RemoteProtocolError(f"malformed flow-control window header {value!r}")
            return window
    return None
