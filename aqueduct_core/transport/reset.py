"""Stateless reset (RFC 9000 §10.3): a restarted service tells a client at once that the
connection it is speaking on is gone, instead of the client waiting out its idle timeout.

A server gives each connection ID it issues a reset token, and a peer that later receives a
short packet ending in that token knows the connection is dead. The libraries draw tokens at
random, so a restarted process could never produce the old ones; here a server's tokens are
an HMAC of the connection ID under a key derived from its TLS private key. Every process
holding that key (a restart, the workers of ``--workers``) answers a packet for a connection
it does not know with a reset the client recognises.

What each backend does itself: qh3 recognises a reset it receives; aioquic does not, so the
client adapter checks incoming packets against the peer's tokens (:func:`is_reset`). Neither
sends resets: :class:`Responder` does, for the server endpoint, rate-limited, each reset
shorter than the packet that caused it (so two servers cannot bounce resets forever).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TOKEN_SIZE = 16
MIN_RESET = 21
"""A reset is at least 5 unpredictable bytes and the token (RFC 9000 §10.3)."""
RESETS_PER_SECOND = 100
"""Resets a server sends at most per second (a burst of the same size is allowed)."""


def key_from_private_key(keyfile: str | Path) -> bytes:
    """The reset key of a server: a hash of its TLS private key (secret, and the same in every
    process serving with that certificate)."""
    return hashlib.sha256(b"aqueduct stateless reset v1\0" + Path(keyfile).read_bytes()).digest()


def token(key: bytes, cid: bytes) -> bytes:
    return hmac.new(key, cid, hashlib.sha256).digest()[:TOKEN_SIZE]


def install_tokens(quic: Any, key: bytes, backend: str) -> None:
    """Make a new server-side connection advertise ``token(key, cid)`` for its first
    connection ID (the one clients use unless they migrate). Call before its handshake."""
    if backend == "aioquic":
        for cid in quic._host_cids:
            cid.stateless_reset_token = token(key, cid.cid)
        return
    from qh3.tls import ExtensionType

    QUIC_TRANSPORT_PARAMETERS = ExtensionType.QUIC_TRANSPORT_PARAMETERS
    create_tls = quic._create_tls

    def create_tls_with_token(*args: Any, **kwargs: Any) -> Any:
        bridge = create_tls(*args, **kwargs)
        bridge.stateless_reset_token = token(key, quic.host_cid)
        # The bridge serialized its transport parameters when it was made: again, with ours.
        kind = QUIC_TRANSPORT_PARAMETERS
        bridge.tls.handshake_extensions = [
            (k, bridge.serialize_transport_parameters() if k == kind else v)
            for k, v in bridge.tls.handshake_extensions
        ]
        return bridge

    quic._create_tls = create_tls_with_token


def peer_tokens(quic: Any) -> list[bytes]:
    """aioquic: the reset tokens the peer gave for the connection IDs we may use."""
    cids = [quic._peer_cid, *quic._peer_cid_available]
    return [c.stateless_reset_token for c in cids if c.stateless_reset_token]


def is_reset(data: bytes, tokens: Iterable[bytes]) -> bool:
    """Whether ``data`` is a stateless reset carrying one of ``tokens``."""
    if len(data) < MIN_RESET or data[0] & 0x80:  # resets look like short-header packets
        return False
    tail = data[-TOKEN_SIZE:]
    return any(hmac.compare_digest(tail, t) for t in tokens)


class Responder:
    """Builds the reset a server sends for a short-header packet of an unknown connection."""

    def __init__(self, key: bytes, cid_length: int, rate: float = RESETS_PER_SECOND) -> None:
        self.key = key
        self.cid_length = cid_length
        self.rate = rate
        self._allowance = rate
        self._last: float | None = None
        self.sent = 0

    def reset_for(self, data: bytes, now: float) -> bytes | None:
        """The reset to send back for ``data``, or None (not a short-header packet of the
        right shape, too small to answer with a smaller packet, or over the rate)."""
        if len(data) <= MIN_RESET or data[0] & 0x80 or not data[0] & 0x40:
            return None
        if len(data) < 1 + self.cid_length + MIN_RESET - 1:
            return None
        if self._last is not None:
            self._allowance = min(self.rate, self._allowance + (now - self._last) * self.rate)
        self._last = now
        if self._allowance < 1:
            return None
        self._allowance -= 1
        cid = data[1 : 1 + self.cid_length]
        size = min(len(data) - 1, 43)  # shorter than the trigger, like an ordinary packet
        first = 0x40 | (os.urandom(1)[0] & 0x3F)
        self.sent += 1
        return bytes([first]) + os.urandom(size - 1 - TOKEN_SIZE) + token(self.key, cid)


def resetting_server(base: type) -> type:
    """``base`` (a backend's QuicServer) answering packets of unknown connections with a
    stateless reset when its ``responder`` is set."""

    class ResettingServer(base):  # type: ignore[misc]
        responder: Responder | None = None

        def datagram_received(self, data: bytes, addr: Any) -> None:
            responder = self.responder
            if (
                responder is not None
                and data
                and not data[0] & 0x80
                and data[1 : 1 + responder.cid_length] not in self._protocols
            ):
                reset = responder.reset_for(data, self._loop.time())
                if reset is not None:
                    self._transport.sendto(reset, addr)
                return
            super().datagram_received(data, addr)

    ResettingServer.__name__ = f"Resetting{base.__name__}"
    return ResettingServer
