"""The sans-IO Aqueduct connection: its inputs, its application API, and how it ends.

The transport feeds it QUIC events (``stream_data``, ``stream_reset``, ``datagram_received``,
``handshake_done``, ``connection_lost``) and time; the application calls ``send``, ``recv``,
``finish``, ``cancel``, ``close_receiver``. Both get their answers by draining
``commands()`` (for the transport) and ``events()`` (for the application). See
``aqueduct_core/engine/__init__.py`` for the theory of operation.

:class:`Connection` is built in layers, one module each, every layer using only those below:

- :mod:`.output`: commands, events, timers, stream writes, the transport's backlog;
- :mod:`.channels`: the channel tables (state machines, endpoints, tombstones, lineage);
- :mod:`.handshake`: VERSION, ACK_VERSION, CONNECTION_HEADERS, flow-control negotiation;
- :mod:`.dispatch`: frames in: parsing, routing, charging unfinished messages;
- this module: the remaining transport inputs and the application's commands.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aqueduct_core.engine.channels import NewChannel
from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.engine.dispatch import Dispatch
from aqueduct_core.engine.endpoint import Endpoint
from aqueduct_core.engine.events import CloseConnection, Terminal
from aqueduct_core.engine.handshake import HeaderPairs, ServerHeaders
from aqueduct_core.engine.sender import Mode, Outgoing, QueuePolicy, SendState
from aqueduct_core.errors import (
    ChannelClosed,
    CloseCode,
    ConnectionLost,
    EndOfChannel,
    LocalProtocolError,
    RemoteProtocolError,
)
from aqueduct_core.wire.chanid import Side
from aqueduct_core.wire.frames import Attachment, Message, OutPayload
from aqueduct_core.wire.primitives import Headers

__all__ = ["Connection", "MemoryReport", "NewChannel"]


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """Bytes buffered by one connection (issue 5): received messages waiting for the
    application, and sent messages waiting for credit, per channel and in total."""

    received: dict[int, int]
    queued_to_send: dict[int, int]
    in_transport: int = 0
    """Bytes handed to the transport and not yet sent (with aioquic: not yet acknowledged),
    as the adapter reports them."""

    @property
    def total(self) -> int:
        return sum(self.received.values()) + sum(self.queued_to_send.values()) + self.in_transport


class Connection(Dispatch):
    """One endpoint of an Aqueduct connection. See the module docstring."""

    def __init__(
        self,
        side: Side,
        config: EngineConfig | None = None,
        *,
        headers: HeaderPairs = (),
        server_headers: ServerHeaders | None = None,
    ) -> None:
        super().__init__(side, config, headers, server_headers)

    # == transport inputs ==================================================================

    def connection_lost(self, now: float, code: int | None = None, reason: str = "") -> None:
        """The QUIC connection closed (by the peer, an idle timeout or the network)."""
        if self.closed:
            return
        self.now = now
        self._terminate(code if code is not None else CloseCode.INTERNAL, reason, True, None)

    def handle_timer(self, now: float) -> None:
        if self.closed:
            return
        self.now = now
        try:
            self._run_timers(now)
            self._after_input()
        except RemoteProtocolError as exc:
            self._fail(exc)

    def update_rtt(self, rtt: float) -> None:
        """The transport's smoothed RTT, for the unreliable receipt deadline."""
        self.rtt = rtt

    def set_transport_backlog(self, nbytes: int, budget: int | None) -> bool:
        """The transport holds ``nbytes`` not yet sent; senders pause above ``budget``.
        Returns True if paused senders resumed (there may be new commands)."""
        self.tx_backlog = nbytes
        self.tx_budget = budget
        if not self._blocked or not self.transport_ready():
            return False
        blocked, self._blocked = self._blocked, {}
        for sm in blocked.values():
            if sm.alive:
                sm.pump()
        return True

    # == application API ===================================================================

    def send(
        self,
        chanid: int,
        payload: OutPayload,
        *,
        headers: Headers = (),
        attachments: Iterable[NewChannel] = (),
        now: float,
    ) -> list[int]:
        """Queue a message on sender ``chanid``; returns the chanids minted for
        ``attachments`` (in order). Raises the handle's terminal error, WouldBlock when a
        bounded queue is full, or LocalProtocolError for misuse."""
        self.now = now
        ep = self._app_endpoint(chanid, sender=True)
        sm = self.senders.get(chanid)
        if ep.terminal is not None:
            raise self._terminal_error(ep)
        if sm is None or sm.state is not SendState.OPEN or sm.finish_requested:
            raise ChannelClosed("this sender already finished")
        sm.check_can_send()
        atts: list[Attachment] = []
        children: list[int] = []
        for spec in attachments:
            child = self._mint(spec)
            atts.append(Attachment(child, spec.headers))
            children.append(child)
        sm.send(Outgoing(headers, payload, tuple(atts), children))
        return children

    def configure_sender(
        self,
        chanid: int,
        mode: Mode,
        policy: QueuePolicy = QueuePolicy.UNBOUNDED,
        maxsize: int = 0,
    ) -> None:
        self._app_endpoint(chanid, sender=True)
        sm = self.senders.get(chanid)
        if sm is not None:
            sm.configure(mode, policy, maxsize)

    def finish(self, chanid: int, now: float) -> None:
        """Finish sender ``chanid`` after everything queued. Idempotent."""
        self.now = now
        ep = self._app_endpoint(chanid, sender=True, allow_done=True)
        ep.app_done = True
        sm = self.senders.get(chanid)
        if sm is not None and sm.state is SendState.OPEN and not sm.finish_requested:
            sm.finish()
        self._maybe_free(ep)

    def cancel(self, chanid: int, now: float) -> None:
        """Cancel sender ``chanid``: unsent messages are dropped. Idempotent."""
        self.now = now
        ep = self._app_endpoint(chanid, sender=True, allow_done=True)
        ep.app_done = True
        self._cancel_sender(ep)
        self._maybe_free(ep)

    def recv(self, chanid: int, now: float) -> Message | None:
        """The next message of receiver ``chanid``, or None if none is queued yet. Raises
        EndOfChannel after a clean finish, or the terminal error."""
        self.now = now
        ep = self._app_endpoint(chanid, sender=False)
        if ep.queue:
            item = ep.queue.popleft()
            ep.buffered -= item.cost
            for att in item.message.attachments:
                child = self.endpoints.get(att.chanid)
                if child is not None:
                    child.held = True
            rm = self.receivers.get(chanid)
            if rm is not None:
                rm.dequeued(item.cost)
            return item.message
        if ep.terminal is None:
            return None
        if ep.terminal is Terminal.FINISHED:
            raise EndOfChannel("the sender finished and every message was received")
        raise self._terminal_error(ep)

    def close_receiver(self, chanid: int, now: float) -> None:
        """The application is done with receiver ``chanid``. Idempotent."""
        self.now = now
        ep = self._app_endpoint(chanid, sender=False, allow_done=True)
        ep.app_done = True
        rm = self.receivers.get(chanid)
        if rm is not None:
            rm.close()
        else:
            self._discard_queue(ep)
        self._maybe_free(ep)

    def terminal(self, chanid: int) -> Terminal | None:
        ep = self.endpoints.get(chanid)
        return None if ep is None else ep.terminal

    def channel_headers(self, chanid: int) -> Headers:
        ep = self.endpoints.get(chanid)
        return () if ep is None else ep.headers

    def close(self, now: float, code: int = CloseCode.NO_ERROR, reason: str = "") -> None:
        """Close the connection (code 0 = no error). Every live handle -> ConnectionLost."""
        if self.closed:
            return
        self.now = now
        self._commands.append(CloseConnection(int(code), reason))
        self._terminate(int(code), reason, False, None)

    def memory(self) -> MemoryReport:
        received = {c: ep.buffered for c, ep in self.endpoints.items() if ep.buffered}
        queued = {}
        for chanid, sm in self.senders.items():
            n = sum(len(o.payload) for o in sm.queue)
            if n:
                queued[chanid] = n
        # Only a transport that reports its backlog (and sets a budget) keeps it current.
        in_transport = self.tx_backlog if self.tx_budget is not None else 0
        return MemoryReport(received, queued, in_transport)

    def pending_channels(self) -> tuple[int, int]:
        """(remote-created channels not attached yet, bytes buffered in them)."""
        return self._unattached, self._unattached_bytes

    # == helpers ===========================================================================

    def _app_endpoint(self, chanid: int, sender: bool, allow_done: bool = False) -> Endpoint:
        ep = self.endpoints.get(chanid)
        if ep is None:
            if self.closed:
                raise ConnectionLost("the connection is closed")
            raise LocalProtocolError(f"no channel handle {chanid} on this connection")
        if ep.is_sender is not sender:
            kind = "sender" if sender else "receiver"
            raise LocalProtocolError(f"channel {chanid} is not a {kind} on this side")
        if ep.app_done and not allow_done:
            raise ChannelClosed("this handle was already finished, cancelled or closed")
        return ep

    def _terminal_error(self, ep: Endpoint) -> Exception:
        assert ep.terminal is not None
        return ep.terminal.error(ep.detail) or ChannelClosed("finished")
