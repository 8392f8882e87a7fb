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

Every class carries ``remedy``, what to do about it in a sentence, and ``str()`` of an error is
its message followed by ``Fix: <remedy>`` unless the message already says what to do
(:func:`says_what_to_do`). The remedy is added when the error is shown, never stored in the
message, so an error sent across the wire, pickled or wrapped shows it once.
"""

from __future__ import annotations

import enum
import re


class CloseCode(enum.IntEnum):
    """QUIC application close codes (profile G24; non-normative, ours)."""

    NO_ERROR = 0
    PROTOCOL_VIOLATION = 1
    UNSUPPORTED_VERSION = 2
    LIMIT_VIOLATION = 3
    HANDSHAKE_TIMEOUT = 4
    INTERNAL = 5


FIX = "Fix:"
"""What introduces the remedy in an error's text."""

_VERBS = (
    r"(?:use|pass|give|set|check|retry|run|start|drop|cast|rename|write|read|pick|choose|"
    r"look|do not|change|attach|await|find|ask|try|leave|partition by|scan|commit|vacuum|"
    r"install|stage|send|split|fill|filter|keep|compare|create|append|restart|upgrade|"
    r"connect|pin|name|correct|see|remove|raise|wait|stop|close|overwrite|delete|re-plan|pip)\b"
)
_DOING = re.compile(
    rf"(?:(?:^|[.;:?!]\s+|\()|(?:^|[.;:]\s+)if\b[^.;]*?,\s+){_VERBS}", re.IGNORECASE
)
"""A clause that starts with an instruction."""
_ASKS = re.compile(r"\?(?:\s|$)")
"""A question that suggests a fix (not a ``?`` inside a quoted value)."""


def says_what_to_do(message: str) -> bool:
    """Whether ``message`` tells the user what to do by itself: it has a ``Fix:`` part, asks a
    question (``Did you mean ...?``, ``is the service running?``), or has a clause that starts
    with an instruction (``...; write with mode 'append'``, ``...: use one of ...``)."""
    return FIX in message or _ASKS.search(message) is not None or _DOING.search(message) is not None


def with_remedy(message: str, remedy: str) -> str:
    """``message``, then ``Fix: remedy`` unless the message says what to do already."""
    text = message.rstrip()
    if not text or not remedy or says_what_to_do(text):
        return message
    if not text.endswith((".", "!", "?")):
        text += "."
    return f"{text} {FIX} {remedy}"


class AqueductError(Exception):
    """Base class of every error raised by Aqueduct.

    ``remedy`` says what to do about the error, for a message that does not say it itself;
    ``str()`` adds it (see the module's docstring)."""

    remedy = "look the error up in the troubleshooting guide (docs/troubleshooting.md)"

    def __str__(self) -> str:
        return with_remedy(super().__str__(), self.remedy)


class ProtocolError(AqueductError):
    """A connection-level protocol error. See the subclasses for whose fault it was."""

    code: CloseCode = CloseCode.PROTOCOL_VIOLATION


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids.

    ``code`` is the close code the connection is (or was) closed with. This is never caused
    by our own caller; decoding arbitrary bytes raises only this error.
    """

    remedy = (
        "use the same Aqueduct version on both ends of the connection; if they are, "
        "report the message as a bug"
    )

    def __init__(self, message: str, code: CloseCode = CloseCode.PROTOCOL_VIOLATION) -> None:
        super().__init__(message)
        self.code = code


class LocalProtocolError(ProtocolError):
    """Our own caller misused the API. The connection stays up; fix the calling code."""

    code = CloseCode.INTERNAL
    remedy = "change the calling code as the message says (the connection is still usable)"


class ChannelError(AqueductError):
    """Base class of the terminal states of a channel handle."""

    remedy = "see the channel errors in the troubleshooting guide (docs/troubleshooting.md)"


class ReceiverDropped(ChannelError):
    """Every receiver of this channel is gone (closed by the peer's application, or never
    taken). Not a network failure: the message was delivered to nobody because nobody
    listens any more."""

    remedy = (
        "stop sending on this channel; if that is unexpected, find out why the receiving "
        "side stopped listening"
    )


class ChannelCancelled(ChannelError):
    """The sender cancelled the channel. Messages still queued at the receiver were discarded.
    (Not ``asyncio.CancelledError``: nothing about your task was cancelled.)"""

    remedy = "look at why the sending side gave up (its log); the connection is still usable"


class LostInTransit(ChannelError):
    """The message that carried this channel (or one of its ancestors) was lost, so the other
    side can never hold this handle. Profile §2.9."""

    remedy = (
        "attach channels only to reliable messages, or be ready to lose them; the "
        "connection is still usable"
    )


class ConnectionLost(ChannelError):
    """The connection carrying this channel closed or died (peer gone, idle timeout,
    protocol violation, or ``close()``). The cause, if known, is in ``__cause__``."""

    remedy = (
        "check that the service still runs (aqueduct status URL) and that the network "
        "reaches it, then connect again"
    )


class ChannelClosed(ChannelError):
    """You already finished, cancelled or closed this handle yourself, so it cannot be used
    any more. Not caused by the peer or the network."""

    remedy = "do not use a handle after you finished, cancelled or closed it"


class EndOfChannel(AqueductError):
    """The sender finished the channel and every message has been received. Not a failure:
    ``async for`` stops on it."""

    remedy = ""  # not a failure: nothing to do


class DecodeError(AqueductError):
    """A message payload could not be decoded by its channel's codec (for example bytes that
    are not CBOR). That message was discarded and its attachments closed; the channel and the
    connection stay usable."""

    remedy = "use the same codec for the channel on both sides"


class WouldBlock(AqueductError):
    """A ``*_nowait`` call cannot complete right now: the queue is full (send) or empty
    (receive). Retry later or use the awaiting form."""

    remedy = "await send() or recv() instead of send_nowait() or recv_nowait(), or try later"


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
