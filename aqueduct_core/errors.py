"""The error tree of Aqueduct.

Every error a user of ``aqueduct_core`` can see derives from :class:`AqueductError`:

- :class:`ProtocolError` is connection-level. :class:`RemoteProtocolError` means the *peer*
  broke the protocol; it carries the QUIC application close code of profile G24 and the
  connection is closed with it. :class:`LocalProtocolError` means *our own caller* misused
  the API (sending on a finished sender, a header that is not bytes, ...); it never closes a
  connection and is raised immediately.
- :class:`ChannelError` is the terminal state of one channel handle:
  :class:`ReceiverDropped`, :class:`ChannelCancelled`, :class:`LostInTransit`,
  :class:`ConnectionLost`, and :class:`ChannelClosed` for a handle you ended yourself. The first terminal state recorded wins (profile §2.10).
- :class:`EndOfChannel` is the clean end of a receiver; :class:`WouldBlock` is not a failure: a ``*_nowait`` call could not complete right now.
"""

from __future__ import annotations

import enum


class CloseCode(enum.IntEnum):
    """QUIC application close codes (profile G24; non-normative, ours)."""

    NO_ERROR = 0
    PROTOCOL_VIOLATION = 1
    UNSUPPORTED_VERSION = 2
    LIMIT_VIOLATION = 3
    HANDSHAKE_TIMEOUT = 4
    INTERNAL = 5


class AqueductError(Exception):
    """Base class of every error raised by Aqueduct."""


class ProtocolError(AqueductError):
    """A connection-level protocol error. See the subclasses for whose fault it was."""

    code: CloseCode = CloseCode.PROTOCOL_VIOLATION


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids.

    ``code`` is the close code the connection is (or was) closed with. This is never caused
    by our own caller; decoding arbitrary bytes raises only this error.
    """

    def __init__(self, message: str, code: CloseCode = CloseCode.PROTOCOL_VIOLATION) -> None:
        super().__init__(message)
        self.code = code


class LocalProtocolError(ProtocolError):
    """Our own caller misused the API. The connection stays up; fix the calling code."""

    code = CloseCode.INTERNAL


class ChannelError(AqueductError):
    """Base class of the terminal states of a channel handle."""


class ReceiverDropped(ChannelError):
    """Every receiver of this channel is gone (closed by the peer's application, or never
    taken). Not a network failure: the message was delivered to nobody because nobody
    listens any more."""


class ChannelCancelled(ChannelError):
    """The sender cancelled the channel. Messages still queued at the receiver were discarded.
    (Not ``asyncio.CancelledError``: nothing about your task was cancelled.)"""


class LostInTransit(ChannelError):
    """The message that carried this channel (or one of its ancestors) was lost, so the other
    side can never hold this handle. Profile §2.9."""


class ConnectionLost(ChannelError):
    """The connection carrying this channel closed or died (peer gone, idle timeout,
    protocol violation, or ``close()``). The cause, if known, is in ``__cause__``."""


class ChannelClosed(ChannelError):
    """You already finished, cancelled or closed this handle yourself, so it cannot be used
    any more. Not caused by the peer or the network."""


class EndOfChannel(AqueductError):
    """The sender finished the channel and every message has been received. Not a failure:
    ``async for`` stops on it."""


class DecodeError(AqueductError):
    """A message payload could not be decoded by its channel's codec (for example bytes that
    are not CBOR). That message was discarded and its attachments closed; the channel and the
    connection stay usable."""


class WouldBlock(AqueductError):
    """A ``*_nowait`` call cannot complete right now: the queue is full (send) or empty
    (receive). Retry later or use the awaiting form."""


__all__ = [
    "AqueductError",
    "ChannelCancelled",
    "ChannelClosed",
    "ChannelError",
    "CloseCode",
    "ConnectionLost",
    "DecodeError",
    "EndOfChannel",
    "LocalProtocolError",
    "LostInTransit",
    "ProtocolError",
    "ReceiverDropped",
    "RemoteProtocolError",
    "WouldBlock",
]
