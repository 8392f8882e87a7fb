"""Serialization middleware: message values <-> payload bytes and attachments.

A codec turns an application value into payload bytes and, while doing so, may *attach*
channel handles found inside it: ``attach(handle)`` returns the handle's index in the
message's attachment list, which the codec stores in the payload. Decoding reverses it with
``detach(index)``. Attachments the decoded value never takes are closed by the caller, so an
unexpected handle cannot leak a channel (`000` warns about exactly this).

Codecs are named; the default one is agreed per connection through the connection header
:data:`CODEC_HEADER` (the client lists what it accepts, the server answers with its choice),
and a channel may override it with the same key in its channel headers (the Arrow data
channels of the dataset protocol use ``raw``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import cbor2

from aqueduct_core.errors import LocalProtocolError, RemoteProtocolError
from aqueduct_core.wire.frames import Gather, OutPayload

CODEC_HEADER = b"aqueduct-codec-3e7a91"
HANDLE_TAG = 44045
"""CBOR tag (unassigned in the IANA registry) whose value is an attachment index."""

Attach = Callable[[Any], int]
Detach = Callable[[int], Any]


class Codec(Protocol):
    """Encodes values into payloads and back. ``name`` is what goes in the headers."""

    name: str

    def encode(self, value: Any, attach: Attach) -> OutPayload: ...

    def decode(self, payload: bytes | bytearray | memoryview, detach: Detach) -> Any: ...


class CborCodec:
    """The default codec: CBOR (RFC 8949) through cbor2. Sender, Receiver and oneshot handles
    anywhere inside a value travel as attachments (a CBOR tag holding the index), so
    ``await entry.send({"reply": tx, "n": 3})`` just works."""

    name = "cbor"

    def __init__(self, handle_types: tuple[type, ...] = ()) -> None:
        self.handle_types = handle_types

    def encode(self, value: Any, attach: Attach) -> bytes:
        def default(encoder: Any, obj: Any) -> None:
            if isinstance(obj, self.handle_types):
                encoder.encode(cbor2.CBORTag(HANDLE_TAG, attach(obj)))
            else:
                raise LocalProtocolError(
                    f"cannot encode {type(obj).__name__} with the CBOR codec; send plain data "
                    "(dict, list, str, bytes, numbers, bool, None) or channel handles"
                )

        try:
            return cbor2.dumps(value, default=default)
        except cbor2.CBOREncodeError as exc:
            if isinstance(exc.__cause__, LocalProtocolError):
                raise exc.__cause__ from None
            raise LocalProtocolError(f"cannot encode message value: {exc}") from exc

    def decode(self, payload: bytes | bytearray | memoryview, detach: Detach) -> Any:
        def tag_hook(*args: Any) -> Any:
            # cbor2 6 calls tag_hook(tag, immutable); cbor2 5 calls tag_hook(decoder, tag).
            tag = next(a for a in args if isinstance(a, cbor2.CBORTag))
            if tag.tag == HANDLE_TAG and isinstance(tag.value, int):
                return detach(tag.value)
            return tag

        try:
            return cbor2.loads(payload, tag_hook=tag_hook)
        except cbor2.CBORDecodeError as exc:
            cause = exc.__cause__
            if isinstance(cause, RemoteProtocolError):
                raise cause from None
            raise RemoteProtocolError(f"message payload is not valid CBOR: {exc}") from exc


class RawCodec:
    """Payloads are bytes the application already encoded (Arrow IPC messages): passed
    through without a copy, a :class:`~aqueduct_core.wire.frames.Gather` of parts too (sent
    part by part). Cannot carry channel handles."""

    name = "raw"

    def encode(self, value: Any, attach: Attach) -> OutPayload:
        if isinstance(value, bytes | bytearray | Gather):
            return value
        try:
            return memoryview(value).cast("B")  # any buffer: pyarrow Buffers, numpy arrays
        except TypeError:
            raise LocalProtocolError(
                f"a raw channel sends bytes-like values, got {type(value).__name__}"
            ) from None

    def decode(self, payload: bytes | bytearray | memoryview, detach: Detach) -> Any:
        return payload


def negotiate(offered: bytes, supported: dict[str, Codec]) -> Codec | None:
    """Server side: the first codec in the client's comma-separated list that we support."""
    for name in offered.decode("ascii", "replace").split(","):
        codec = supported.get(name.strip())
        if codec is not None:
            return codec
    return None
