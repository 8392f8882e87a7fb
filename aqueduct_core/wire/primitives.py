"""Primitives of profile §1.1: varint (9-byte form, G1), varbytes, header data.

Decoders take a ``memoryview`` and a position and return ``(value, new_position)``. They raise
:class:`Truncated` when the data ends early (the stream parser then waits for more bytes; at
the end of a datagram or stream it becomes a protocol error) and
:class:`~aqueduct_core.errors.RemoteProtocolError` for anything malformed.
"""

from __future__ import annotations

from dataclasses import dataclass

from aqueduct_core.errors import CloseCode, LocalProtocolError, RemoteProtocolError

MAX_U64 = (1 << 64) - 1

Headers = tuple[tuple[bytes, bytes], ...]
"""Header data: a multimap of byte keys to byte values, order and duplicates kept."""


class Truncated(Exception):
    """Internal signal: the input ended in the middle of an item. Never escapes the parsers."""


@dataclass(frozen=True, slots=True)
class WireLimits:
    """Size limits enforced while decoding (profile §2.12). Exceeding one is close code 3."""

    max_header_bytes: int = 64 * 1024
    """Largest header data block (connection, channel or message headers)."""
    max_payload_bytes: int = 64 * 1024 * 1024
    """Largest MESSAGE payload."""
    max_list_bytes: int = 64 * 1024
    """Largest attachment list or ack range list."""


DEFAULT_LIMITS = WireLimits()


def varint_size(value: int) -> int:
    """Number of bytes :func:`encode_varint` produces for ``value``."""
    if value < 0x80:
        return 1
    n = (value.bit_length() + 6) // 7
    return 9 if n > 8 else n


def encode_varint(value: int) -> bytes:
    """Encode an unsigned 64-bit integer in the minimal 1-9 byte form (G1)."""
    if value < 0x80:
        if value < 0:
            raise LocalProtocolError(f"varint must be >= 0, got {value}")
        return bytes((value,))
    if value > MAX_U64:
        raise LocalProtocolError(f"varint must be < 2**64, got {value}")
    out = bytearray()
    for _ in range(8):
        if value < 0x80:
            out.append(value)
            return bytes(out)
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)  # 9th byte: the top 8 bits, no continuation flag
    return bytes(out)


def push_varint(buf: bytearray, value: int) -> None:
    """Append the encoding of ``value`` to ``buf``."""
    if 0 <= value < 0x80:
        buf.append(value)
    else:
        buf += encode_varint(value)


def pull_varint(data: memoryview, pos: int) -> tuple[int, int]:
    """Decode a varint at ``pos``. Overlong forms are rejected (G1)."""
    end = len(data)
    if pos >= end:
        raise Truncated
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value = byte & 0x7F
    shift = 7
    i = pos + 1
    while True:
        if i >= end:
            raise Truncated
        byte = data[i]
        i += 1
        if shift == 56:
            # The 9th byte carries 8 data bits and never continues.
            if byte == 0:
                raise RemoteProtocolError("overlong varint (9th byte is zero)")
            return value | (byte << 56), i
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            if byte == 0:
                raise RemoteProtocolError("overlong varint (last byte is zero)")
            return value, i


def push_varbytes(buf: bytearray, value: bytes | bytearray | memoryview) -> None:
    push_varint(buf, len(value))
    buf += value


def pull_length(data: memoryview, pos: int, limit: int, what: str) -> tuple[int, int]:
    """Decode a varbytes length and check it against ``limit`` (close code 3)."""
    n, pos = pull_varint(data, pos)
    if n > limit:
        raise RemoteProtocolError(
            f"{what} of {n} bytes exceeds the limit of {limit} bytes", CloseCode.LIMIT_VIOLATION
        )
    return n, pos


def pull_varbytes(data: memoryview, pos: int, limit: int, what: str) -> tuple[bytes, int]:
    n, pos = pull_length(data, pos, limit, what)
    end = pos + n
    if end > len(data):
        raise Truncated
    return bytes(data[pos:end]), end


def encode_headers(headers: Headers) -> bytes:
    """Encode header data: a varbytes holding an even run of inner varbytes."""
    inner = bytearray()
    for key, value in headers:
        push_varbytes(inner, key)
        push_varbytes(inner, value)
    out = bytearray()
    push_varbytes(out, inner)
    return bytes(out)


def push_headers(buf: bytearray, headers: Headers) -> None:
    if not headers:
        buf.append(0)
    else:
        buf += encode_headers(headers)


def pull_headers(data: memoryview, pos: int, limits: WireLimits) -> tuple[Headers, int]:
    n, pos = pull_length(data, pos, limits.max_header_bytes, "header block")
    end = pos + n
    if end > len(data):
        raise Truncated
    inner = data[pos:end]
    items: list[bytes] = []
    ipos = 0
    try:
        while ipos < n:
            # The block length (already checked against the limit) bounds every item; an item
            # running past it is malformed (close code 1), not a limit violation (code 3).
            item, ipos = pull_varbytes(inner, ipos, MAX_U64, "header item")
            items.append(item)
    except Truncated:
        raise RemoteProtocolError("header item overruns its header block") from None
    if len(items) % 2:
        raise RemoteProtocolError("header block holds an odd number of items")
    return tuple(zip(items[::2], items[1::2], strict=True)), end


def check_headers(headers: object, what: str = "headers") -> Headers:
    """Normalise caller-supplied headers to :data:`Headers` (local misuse raises)."""
    if isinstance(headers, dict):
        headers = tuple(headers.items())
    out = []
    try:
        pairs = list(headers)  # type: ignore[call-overload]
    except TypeError:
        raise LocalProtocolError(f"{what} must be pairs of bytes, got {headers!r}") from None
    for pair in pairs:
        try:
            key, value = pair
        except (TypeError, ValueError):
            raise LocalProtocolError(f"{what} must be (key, value) pairs, got {pair!r}") from None
        if isinstance(key, str):
            key = key.encode()
        if isinstance(value, str):
            value = value.encode()
        if not isinstance(key, bytes | bytearray) or not isinstance(value, bytes | bytearray):
            raise LocalProtocolError(f"{what} keys and values must be bytes or str, got {pair!r}")
        out.append((bytes(key), bytes(value)))
    return tuple(out)
