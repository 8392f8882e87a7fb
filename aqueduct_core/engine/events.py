"""What the engine produces: transport commands and application events.

Commands are instructions for the transport adapter (write to a unidirectional stream, reset
one, send a datagram, close the connection). Events tell the application layer that something
it may be waiting for has changed; the application then calls the engine's methods (``recv``,
``send``) to act. Both are plain frozen dataclasses, past tense for events.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from aqueduct_core.errors import (
    ChannelCancelled,
    ChannelClosed,
    ChannelError,
    ConnectionLost,
    LostInTransit,
    ReceiverDropped,
)
from aqueduct_core.wire.frames import Payload
from aqueduct_core.wire.primitives import Headers

# -- commands ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteStream:
    """Write ``data`` to unidirectional stream ``stream_id`` (opening it on first use), then
    finish it if ``fin``. Stream ids follow QUIC numbering: 2, 6, 10... for a client and 3, 7,
    11... for a server."""

    stream_id: int
    data: Payload
    fin: bool = False


@dataclass(frozen=True, slots=True)
class ResetStream:
    """Abandon stream ``stream_id`` (RESET_STREAM with code 0; G24: no meaning)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class SendDatagram:
    data: bytes


@dataclass(frozen=True, slots=True)
class CloseConnection:
    code: int
    reason: str


Command = WriteStream | ResetStream | SendDatagram | CloseConnection

# -- terminal states --------------------------------------------------------------------


class Terminal(enum.Enum):
    """The one terminal state each channel handle reaches (profile §2.10)."""

    FINISHED = "finished"
    """Sender: finished and the receiver closed after receiving all. Receiver: the sender
    finished and everything arrived (the queue still drains)."""
    RECEIVER_DROPPED = "receiver dropped"
    CANCELLED = "cancelled"
    """Receiver: the sender cancelled. Sender: we cancelled it."""
    CLOSED = "closed"
    """Receiver: our own application closed it."""
    LOST_IN_TRANSIT = "lost in transit"
    CONNECTION_LOST = "connection lost"

    def error(self, detail: str = "") -> ChannelError | None:
        cls = _ERRORS.get(self)
        if cls is None:
            return None
        return cls(f"{self.value}{': ' + detail if detail else ''}")


_ERRORS: dict[Terminal, type[ChannelError]] = {
    Terminal.RECEIVER_DROPPED: ReceiverDropped,
    Terminal.CANCELLED: ChannelCancelled,
    Terminal.CLOSED: ChannelClosed,
    Terminal.LOST_IN_TRANSIT: LostInTransit,
    Terminal.CONNECTION_LOST: ConnectionLost,
}

# -- events -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeadersReceived:
    """The peer's CONNECTION_HEADERS arrived; the connection is usable both ways."""

    headers: Headers


@dataclass(frozen=True, slots=True)
class MessageArrived:
    """Receiver ``chanid`` has a new message to ``recv``."""

    chanid: int


@dataclass(frozen=True, slots=True)
class SenderReady:
    """Sender ``chanid`` has room in its queue again (a bounded ``send`` may retry)."""

    chanid: int


@dataclass(frozen=True, slots=True)
class ChannelTerminated:
    """Handle ``chanid`` reached its terminal state."""

    chanid: int
    terminal: Terminal


@dataclass(frozen=True, slots=True)
class ConnectionTerminated:
    """The connection ended. ``error`` is set when a protocol violation (ours to report or
    the peer's) caused it."""

    code: int
    reason: str
    by_peer: bool
    error: Exception | None = None


Event = HeadersReceived | MessageArrived | SenderReady | ChannelTerminated | ConnectionTerminated
