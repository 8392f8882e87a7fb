"""Flow-control negotiation (profile §3.4 item 1, and the entrypoint's window, §4 item 9).

Each side may advertise its per-channel receive window W (bytes) in a reserved connection
header, named in the spec's ``name-6hex`` style, whose value is a varint. The extension is
on only when both sides advertise; otherwise the sender has unlimited credit and DEQUEUED
(tag 12) is never sent. The base wire format is untouched.

A server may grant the entrypoint a smaller window than W in a second header: the client's
requests beyond it then wait in the client, not in the server, whatever the client claims
or sends (a server reads a request only when it can serve it).
"""

from __future__ import annotations

from aqueduct_core.errors import RemoteProtocolError
from aqueduct_core.wire.primitives import Headers, Truncated, encode_varint, pull_varint

FLOW_HEADER = b"aqueduct-flow-9d04b2"
"""Renamed from ``aqueduct-flow-5c1e07`` when attachments began to count in a message's cost:
peers that count differently must not both think the extension is on."""
ENTRY_WINDOW_HEADER = b"aqueduct-entry-window-19ea45"
"""The server's receive window on the entrypoint channel (a varint, bytes), when it is
smaller than the per-channel window of :data:`FLOW_HEADER`."""


def encode_window(window: int) -> bytes:
    return encode_varint(window)


def parse_window(headers: Headers, key: bytes = FLOW_HEADER) -> int | None:
    """The window the peer advertised under ``key``, or None if it does not take part."""
    for k, value in headers:
        if k == key:
            try:
                window, end = pull_varint(memoryview(value), 0)
            except Truncated:
                window, end = 0, -1
            if end != len(value) or window < 1:
                name = "entrypoint window" if key == ENTRY_WINDOW_HEADER else "flow-control window"
                raise RemoteProtocolError(f"malformed {name} header {value!r}")
            return window
    return None
