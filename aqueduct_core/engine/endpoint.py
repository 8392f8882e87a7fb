"""The application-facing object of a channel (profile G18, G22, §2.8).

An :class:`Endpoint` is what an application handle stands for: the receive queue and the
terminal state. It is separate from the protocol state machine because it must outlive it: a
remote-created receiver may receive all its data and close before the message attaching it
arrives, and that data must still reach the application.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from aqueduct_core.engine.events import Terminal
from aqueduct_core.wire.frames import Message
from aqueduct_core.wire.primitives import Headers


@dataclass(slots=True)
class Queued:
    """A received message waiting for the application, with its flow-control cost."""

    message: Message
    cost: int


@dataclass(slots=True, eq=False)
class Endpoint:
    chanid: int
    is_sender: bool
    """True if our side holds the sender half."""
    attached: bool
    """False only for a remote-created channel whose attaching MESSAGE has not arrived."""
    held: bool = False
    """The application holds the handle (it dequeued the message that carried it, or made
    the channel itself)."""
    app_done: bool = False
    """The application is finished with the handle (finish/cancel/close, or it was discarded
    before the application could take it). The endpoint is freed once its SM is gone too."""
    headers: Headers = ()
    terminal: Terminal | None = None
    detail: str = ""
    queue: deque[Queued] = field(default_factory=deque)
    buffered: int = 0
    """Bytes in ``queue`` (costs)."""

    def set_terminal(self, terminal: Terminal, detail: str = "") -> bool:
        """Record the terminal state; the first one wins (profile §2.10)."""
        if self.terminal is not None:
            return False
        self.terminal = terminal
        self.detail = detail
        return True
