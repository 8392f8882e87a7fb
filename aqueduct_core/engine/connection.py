"""The sans-IO Aqueduct connection: handshake, routing, channel tables, timers.

The transport feeds it QUIC events (``stream_data``, ``stream_reset``, ``datagram_received``,
``handshake_done``, ``connection_lost``) and time; the application calls ``send``, ``recv``,
``finish``, ``cancel``, ``close_receiver``. Both get their answers by draining
``commands()`` (for the transport) and ``events()`` (for the application). See
``aqueduct_core/engine/__init__.py`` for the theory of operation.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.engine.endpoint import Endpoint, Queued
from aqueduct_core.engine.events import (
    ChannelTerminated,
    CloseConnection,
    Command,
    ConnectionTerminated,
    Event,
    HeadersReceived,
    MessageArrived,
    ResetStream,
    SendDatagram,
    SenderReady,
    Terminal,
    WriteStream,
)
from aqueduct_core.engine.flow import FLOW_HEADER, encode_window, parse_window
from aqueduct_core.engine.lineage import Lineage, Node
from aqueduct_core.engine.rangeset import RangeSet
from aqueduct_core.engine.receiver import ReceiverSM
from aqueduct_core.engine.sender import Mode, Outgoing, QueuePolicy, SenderSM, SendState
from aqueduct_core.errors import (
    ChannelClosed,
    CloseCode,
    ConnectionLost,
    EndOfChannel,
    LocalProtocolError,
    RemoteProtocolError,
)
from aqueduct_core.wire.chanid import ENTRYPOINT, Side
from aqueduct_core.wire.frames import (
    AckNackUnreliable,
    AckReliable,
    AckVersion,
    Attachment,
    CancelSender,
    CloseReceiver,
    ConnectionHeaders,
    Dequeued,
    FinishSender,
    ForgetChannel,
    Frame,
    Message,
    MessageHead,
    Payload,
    RouteTo,
    SentUnreliable,
    Version,
    cost_of,
    encode_frame,
    message_cost,
    push_frame,
)
from aqueduct_core.wire.parser import StreamParser, parse_datagram
from aqueduct_core.wire.primitives import Headers, check_headers

_SENDER_FRAMES = (Message, SentUnreliable, FinishSender, CancelSender)
_RECEIVER_FRAMES = (AckReliable, AckNackUnreliable, CloseReceiver, Dequeued)


@dataclass(frozen=True, slots=True)
class NewChannel:
    """A channel to create and attach to an outgoing message. ``keep_sender``: our side keeps
    the sender half (the peer receives); otherwise the peer gets the sender."""

    keep_sender: bool
    oneshot: bool = False
    headers: Headers = ()


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


class _Seq:
    """One incoming frame sequence (a stream or a datagram) and its routing state."""

    __slots__ = (
        "checked",
        "datagram",
        "fragment",
        "ignore",
        "parser",
        "pending",
        "reserved",
        "reserved_head",
        "route",
    )

    def __init__(self, parser: StreamParser | None) -> None:
        self.parser = parser
        self.datagram = parser is None
        self.route = -1
        self.ignore = False
        self.checked = False
        self.pending: list[Frame] = []
        self.fragment = 0
        """Bytes of an incomplete frame head this stream's parser holds, as last counted."""
        self.reserved_head: MessageHead | None = None
        """The unfinished MESSAGE whose bytes are charged (see ``Connection._charge``)."""
        self.reserved: tuple[ReceiverSM | None, int, bool] | None = None
        """(receiver charged, bytes, also counted as loose bytes) for ``reserved_head``."""


class Connection:
    """One endpoint of an Aqueduct connection. See the module docstring."""

    def __init__(
        self,
        side: Side,
        config: EngineConfig | None = None,
        *,
        headers: Iterable[tuple[bytes, bytes]] = (),
        server_headers: Callable[[Headers], Iterable[tuple[bytes, bytes]]] | None = None,
    ) -> None:
        self.side = side
        self.config = config = config or EngineConfig()
        self.now = 0.0
        self._own_headers = check_headers(headers, "connection headers")
        self._server_headers = server_headers
        self._commands: list[Command] = []
        self._events: deque[Event] = deque()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._handshake_complete = False
        self._early_ok = False
        self._early: list[Callable[[], object]] = []
        self._early_bytes = 0
        self._loose_partial = 0
        self.closed = False
        self.got_ack_version = False
        self.sent_ack_version = False
        self._need_ack_version = False
        self._sent_headers = False
        self.peer_headers: Headers | None = None
        self._waiting: list[_Seq] = []
        self._in: dict[int, _Seq] = {}
        self._next_stream = 2 if side is Side.CLIENT else 3
        self.open_streams: set[int] = set()
        self._next_index = [0] * 8
        self._tombstones = [RangeSet() for _ in range(8)]
        self._attached_ever = [RangeSet() for _ in range(8)]
        self._forget_log: dict[int, float] = {}
        self.senders: dict[int, SenderSM] = {}
        self.receivers: dict[int, ReceiverSM] = {}
        self.endpoints: dict[int, Endpoint] = {}
        self.lineage = Lineage(self._on_lost)
        self._unattached = 0
        self._unattached_bytes = 0
        self.max_datagram = config.max_datagram_size
        self.rtt: float | None = None
        self._flow_known = False
        self.peer_window: int | None = None if config.flow_window is None else 1
        self.own_window: int | None = None
        self.tx_backlog = 0
        self.tx_budget: int | None = None
        self._blocked: dict[int, SenderSM] = {}
        self._version_bytes = encode_frame(Version(config.version))
        self._route_cache: dict[int, bytes] = {}
        if side is Side.CLIENT:
            self.senders[ENTRYPOINT] = SenderSM(self, ENTRYPOINT, False)
            self.endpoints[ENTRYPOINT] = Endpoint(ENTRYPOINT, True, True, held=True)
            self.lineage.add(ENTRYPOINT, kept_sender=True, accessible=True)
            self._next_index[0] = 1

    # == outputs ===========================================================================

    def commands(self) -> list[Command]:
        """Take the transport commands produced so far, in order."""
        out, self._commands = self._commands, []
        return out

    def events(self) -> list[Event]:
        """Take the application events produced so far, in order."""
        if not self._events:
            return []
        out = list(self._events)
        self._events.clear()
        return out

    def next_timer(self) -> float | None:
        """When ``handle_timer`` should next be called, or None."""
        return self._timers[0][0] if self._timers else None

    # == transport inputs ==================================================================

    def handshake_done(
        self, now: float, *, datagrams: bool = True, max_datagram: int | None = None
    ) -> None:
        """The QUIC handshake completed. ``max_datagram`` is the largest DATAGRAM payload."""
        if self.closed or self._handshake_complete:
            return
        self.now = now
        self._handshake_complete = True
        if max_datagram is not None:
            self.max_datagram = max_datagram
        if not datagrams:
            self._fail(RemoteProtocolError("the peer does not support QUIC datagrams (RFC 9221)"))
            return
        self._start()

    def early_data(self, now: float) -> None:
        """0-RTT keys are in place before the handshake completes (profile §2.11).

        Client: VERSION and CONNECTION_HEADERS go out now and the application may send, as
        after :meth:`handshake_done`. Server: stream and datagram input is processed at once
        instead of being held until :meth:`handshake_done`; the application decides what is
        safe to act on before :attr:`handshake_confirmed`. Rejected 0-RTT is the transport's
        to repair (it resends the stream data on new streams); the engine does not see it."""
        if self.closed or self._handshake_complete or self._early_ok:
            return
        self.now = now
        self._start()

    @property
    def handshake_confirmed(self) -> bool:
        """The QUIC handshake completed: input is no 0-RTT replay (§2.11)."""
        return self._handshake_complete

    def _start(self) -> None:
        """Begin the Aqueduct handshake, once: at 0-RTT or at QUIC handshake completion."""
        if self._early_ok:
            self._pump_all()
            return
        self._early_ok = True
        self.schedule(self.config.handshake_timeout, self._handshake_timer)
        if self.side is Side.CLIENT:
            headers = self._with_flow(self._own_headers)
            self.write(
                self.open_stream(),
                self._version_bytes + encode_frame(ConnectionHeaders(headers)),
                True,
            )
            self._sent_headers = True
        early, self._early = self._early, []
        for replay in early:
            replay()
        self._pump_all()

    def _count_early(self, nbytes: int) -> bool:
        """Bytes received before the peer's CONNECTION_HEADERS are capped (G26): they are
        held (or parsed) before we know the peer is one we serve. False once over the cap."""
        if self.peer_headers is not None:
            return True
        self._early_bytes += nbytes
        if self._early_bytes <= self.config.max_early_bytes:
            return True
        self._fail(
            RemoteProtocolError(
                f"more than {self.config.max_early_bytes} bytes arrived before the peer's "
                "CONNECTION_HEADERS",
                CloseCode.LIMIT_VIOLATION,
            )
        )
        return False

    def stream_data(self, stream_id: int, data: Payload, fin: bool, now: float) -> bool:
        """Bytes of a stream arrived. Returns False when they only extended the payload of a
        MESSAGE still incomplete (no output, no timer changed: the caller may skip draining
        the outputs), True otherwise."""
        if self.closed:
            return False
        if self.peer_headers is None and not self._count_early(len(data)):
            return True
        if not self._early_ok:
            # §2.11: act on nothing before the handshake completes, unless 0-RTT is on.
            self._early.append(lambda: self._stream_data(stream_id, data, fin, self.now))
            return True
        return self._stream_data(stream_id, data, fin, now)

    def _stream_data(self, stream_id: int, data: Payload, fin: bool, now: float) -> bool:
        if self.closed:
            return False
        self.now = now
        seq = self._in.get(stream_id)
        if (
            seq is not None
            and not fin
            and seq.parser is not None
            and seq.parser.head is seq.reserved_head
            and seq.parser.absorb(data)
        ):
            return False  # more payload of a large MESSAGE, already charged: no frame yet
        try:
            if seq is None:
                seq = self._in[stream_id] = _Seq(
                    StreamParser(self.config.limits, self.config.flow_window is not None)
                )
            assert seq.parser is not None
            if data:
                self._process(seq, seq.parser.feed(data))
                if seq.parser.head is not seq.reserved_head:
                    self._charge(seq)
                if seq.parser.fragment_bytes != seq.fragment:
                    self._count_fragment(seq, seq.parser.fragment_bytes)
            if fin:
                del self._in[stream_id]
                seq.parser.finish()
            self._after_input()
        except RemoteProtocolError as exc:
            self._fail(exc)
        return True

    def stream_reset(self, stream_id: int, now: float) -> None:
        """The peer reset a stream: a partial frame is dropped, earlier frames stand."""
        if self.closed:
            return
        if not self._early_ok:
            self._early.append(lambda: self.stream_reset(stream_id, self.now))
            return
        self.now = now
        seq = self._in.pop(stream_id, None)
        if seq is not None:
            self._uncharge(seq)

    def datagram_received(self, data: bytes, now: float) -> None:
        if self.closed:
            return
        if self.peer_headers is None and not self._count_early(len(data)):
            return
        if not self._early_ok:
            self._early.append(lambda: self._datagram_received(data, self.now))
            return
        self._datagram_received(data, now)

    def _datagram_received(self, data: bytes, now: float) -> None:
        if self.closed:
            return
        self.now = now
        try:
            frames, _ = parse_datagram(
                data, self.config.limits, self.config.flow_window is not None
            )
            if frames:
                self._process(_Seq(None), frames)
                self._after_input()
        except RemoteProtocolError as exc:
            self._fail(exc)

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
            timers = self._timers
            while timers and timers[0][0] <= now and not self.closed:
                heapq.heappop(timers)[2]()
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

    @property
    def handshake_complete(self) -> bool:
        return self.peer_headers is not None

    def send(
        self,
        chanid: int,
        payload: Payload,
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
            self.receiver_closed(rm, Terminal.CLOSED)
        else:
            self._discard_queue(ep)
        self._maybe_free(ep)

    def terminal(self, chanid: int) -> Terminal | None:
        ep = self.endpoints.get(chanid)
        return None if ep is None else ep.terminal

    @property
    def own_headers(self) -> Headers:
        """Our connection headers (for a server: once the client's headers were answered)."""
        return self._own_headers

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

    # == used by the state machines ========================================================

    @property
    def can_send_data(self) -> bool:
        return self._early_ok and not self.closed

    def transport_ready(self) -> bool:
        return self.tx_budget is None or self.tx_backlog < self.tx_budget

    def block_sender(self, sm: SenderSM) -> None:
        self._blocked[sm.chanid] = sm

    def open_stream(self) -> int:
        sid = self._next_stream
        self._next_stream += 4
        self.open_streams.add(sid)
        return sid

    def write(self, stream_id: int, data: Payload, fin: bool = False) -> None:
        self._commands.append(WriteStream(stream_id, data, fin))
        self.tx_backlog += len(data)
        if fin:
            self.open_streams.discard(stream_id)

    def reset(self, stream_id: int) -> None:
        self._commands.append(ResetStream(stream_id))
        self.open_streams.discard(stream_id)

    def send_datagram(self, data: bytes) -> None:
        self._commands.append(SendDatagram(data))
        self.tx_backlog += len(data)

    def seq_prefix(self, chanid: int) -> bytes:
        """What starts a frame sequence routed to ``chanid``: [VERSION] ROUTE_TO (§2.2)."""
        route = self._route_cache.get(chanid)
        if route is None:
            route = encode_frame(RouteTo(chanid))
            if len(self._route_cache) < 4096:
                self._route_cache[chanid] = route
        return route if self.got_ack_version else self._version_bytes + route

    def route_sent(self, chanid: int) -> None:
        node = self.lineage.nodes.get(chanid)
        if node is not None:
            node.route_to_sent = True

    def ctrl_write(self, sm: SenderSM | ReceiverSM, data: bytes, fin: bool = False) -> None:
        """Write on the channel's control stream, opening it with ROUTE_TO first (G21)."""
        if sm.ctrl_stream is None:
            sm.ctrl_stream = self.open_stream()
            data = self.seq_prefix(sm.chanid) + data
            self.route_sent(sm.chanid)
        self.write(sm.ctrl_stream, data, fin)
        if fin:
            sm.ctrl_stream = None

    def schedule(self, delay: float, callback: Callable[[], None]) -> None:
        self.schedule_at(self.now + delay, callback)

    def schedule_at(self, when: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), callback))

    def unreliable_deadline(self) -> float:
        cfg = self.config
        rtt = self.rtt if self.rtt is not None else 0.0
        return min(max(2 * rtt, cfg.unreliable_deadline_min), cfg.unreliable_deadline_max)

    def sender_ready(self, chanid: int) -> None:
        self._events.append(SenderReady(chanid))

    def message_arrived(self, rm: ReceiverSM, frame: Message) -> int:
        """A receiver accepted ``frame``: create its attachments and queue it."""
        ep = self.endpoints[rm.chanid]
        for att in frame.attachments:
            self._attach(att)
        cost = message_cost(frame) if self.own_window is not None else len(frame.payload)
        ep.queue.append(Queued(frame, cost))
        ep.buffered += cost
        if not ep.attached:
            self._unattached_bytes += cost
            if self._unattached_bytes > self.config.max_pending_bytes:
                raise RemoteProtocolError(
                    "too many bytes buffered in channels that are not attached yet",
                    CloseCode.LIMIT_VIOLATION,
                )
        if ep.held:
            self._events.append(MessageArrived(rm.chanid))
        return cost

    def receiver_closed(self, rm: ReceiverSM, terminal: Terminal) -> None:
        """Send final acks and CLOSE_RECEIVER, destroy the SM (finish, cancel, app close)."""
        self.ctrl_write(rm, rm.final_acks(), fin=True)
        rm.alive = False
        del self.receivers[rm.chanid]
        ep = self.endpoints[rm.chanid]
        self._set_terminal(ep, terminal)
        if terminal is not Terminal.FINISHED:
            self._discard_queue(ep)
        self._sm_destroyed(rm.chanid)

    # == handshake =========================================================================

    def _with_flow(self, headers: Headers) -> Headers:
        window = self.config.flow_window
        if window is None:
            return headers
        return (*headers, (FLOW_HEADER, encode_window(window)))

    def _on_version(self, frame: Version) -> None:
        if frame.version != self.config.version:
            raise RemoteProtocolError(
                f"unsupported Aqueduct version {frame.version!r} (we speak {self.config.version!r})",
                CloseCode.UNSUPPORTED_VERSION,
            )
        if not self.sent_ack_version:
            self.sent_ack_version = True
            self._need_ack_version = True

    def _on_headers(self, frame: ConnectionHeaders) -> None:
        if self.peer_headers is not None:
            raise RemoteProtocolError("a second CONNECTION_HEADERS")
        self.peer_headers = frame.headers
        peer_window = parse_window(frame.headers)
        if peer_window is None and self.config.require_flow_control:
            raise RemoteProtocolError(
                "the peer does not take part in flow control (no aqueduct-flow header); "
                "this endpoint requires it: upgrade the peer's Aqueduct library",
                CloseCode.LIMIT_VIOLATION,
            )
        if peer_window is not None and self.config.flow_window is not None:
            self.peer_window = peer_window
            self.own_window = self.config.flow_window
        else:
            self.peer_window = None
        self._flow_known = True
        if self.side is Side.SERVER:
            own = self._own_headers
            if self._server_headers is not None:
                try:
                    own = check_headers(self._server_headers(frame.headers), "server headers")
                except Exception as exc:  # the application refused this client
                    raise RemoteProtocolError(
                        f"connection refused by the server: {exc}", CloseCode.INTERNAL
                    ) from exc
            self._own_headers = self._with_flow(own)
            self.receivers[ENTRYPOINT] = ReceiverSM(self, ENTRYPOINT, False)
            self.endpoints[ENTRYPOINT] = Endpoint(ENTRYPOINT, False, True, held=True)
        self._events.append(HeadersReceived(frame.headers))
        waiting, self._waiting = self._waiting, []
        for seq in waiting:
            frames, seq.pending = seq.pending, []
            for f in frames:
                self._routed(seq, f)
        self._pump_all()

    def _handshake_timer(self) -> None:
        if self.peer_headers is None:
            raise RemoteProtocolError(
                f"no CONNECTION_HEADERS within {self.config.handshake_timeout} s",
                CloseCode.HANDSHAKE_TIMEOUT,
            )

    def _after_input(self) -> None:
        """Send ACK_VERSION and (server) CONNECTION_HEADERS, merged into one stream."""
        if not self._need_ack_version and (self._sent_headers or self.side is Side.CLIENT):
            return  # the handshake's answers went out already
        buf = bytearray()
        if self._need_ack_version:
            self._need_ack_version = False
            buf += _ACK_VERSION_BYTES
        if self.side is Side.SERVER and self.peer_headers is not None and not self._sent_headers:
            self._sent_headers = True
            push_frame(buf, ConnectionHeaders(self._own_headers))
        if buf:
            prefix = b"" if self.got_ack_version else self._version_bytes
            self.write(self.open_stream(), prefix + buf, True)

    # == routing ===========================================================================

    def _process(self, seq: _Seq, frames: list[Frame]) -> None:
        for frame in frames:
            if not seq.checked:
                seq.checked = True
                if type(frame) is not Version and not self.sent_ack_version:
                    raise RemoteProtocolError(
                        "a frame sequence without VERSION arrived before we sent ACK_VERSION"
                    )
            kind = type(frame)
            if kind is Version:
                self._on_version(frame)  # type: ignore[arg-type]
            elif kind is AckVersion:
                self.got_ack_version = True
            elif kind is ConnectionHeaders:
                self._on_headers(frame)  # type: ignore[arg-type]
            elif self.peer_headers is None:
                if not seq.pending:
                    self._waiting.append(seq)
                seq.pending.append(frame)
            else:
                self._routed(seq, frame)

    def _routed(self, seq: _Seq, frame: Frame) -> None:
        kind = type(frame)
        reserved = 0
        if seq.reserved is not None and kind is Message:
            # The unfinished MESSAGE charged by _charge is complete: this is it.
            charged, reserved, loose = seq.reserved
            seq.reserved = None
            if loose:
                self._loose_partial -= reserved
            if charged is None or charged is not self.receivers.get(seq.route):
                if charged is not None:
                    charged.release(reserved)
                reserved = 0
        if kind is RouteTo:
            seq.route = frame.chanid  # type: ignore[union-attr]
            self._resolve(seq, seq.route)
            return
        chanid = seq.route
        we_send = (chanid >> 1) & 1 == self.side
        if kind is ForgetChannel:
            if chanid & 1 == self.side:
                raise RemoteProtocolError("FORGET_CHANNEL for a channel the peer did not create")
        elif kind in _SENDER_FRAMES:
            if we_send:
                raise RemoteProtocolError(f"{kind.__name__} routed to a channel we send on")
        elif we_send is False:
            raise RemoteProtocolError(f"{kind.__name__} routed to a channel we receive on")
        elif kind is Dequeued and self.own_window is None:
            raise RemoteProtocolError("DEQUEUED (tag 12) without negotiated flow control")
        if kind is ForgetChannel:
            # The creator declares the channel gone. This reaches a retained application
            # object even when the tombstone hides the state machine (§2.8).
            sm = self.senders.get(chanid) if we_send else None
            if sm is not None:
                self._sender_forgotten(sm)
            else:
                self._forgotten(chanid)
            return
        if seq.ignore:
            return
        if we_send:
            sm = self.senders.get(chanid)
            if sm is None:
                self._missing(seq, chanid)
            elif kind is AckReliable:
                sm.on_ack_reliable(frame.ranges)  # type: ignore[union-attr]
            elif kind is AckNackUnreliable:
                sm.on_ack_nack(frame.ranges)  # type: ignore[union-attr]
            elif kind is Dequeued:
                sm.on_dequeued(frame.num_bytes)  # type: ignore[union-attr]
            else:
                self._sender_closed(sm)
            return
        rm = self.receivers.get(chanid)
        if rm is None:
            self._missing(seq, chanid)
        elif kind is Message:
            rm.on_message(frame, seq.datagram, reserved)  # type: ignore[arg-type]
        elif kind is SentUnreliable:
            rm.on_sent_unreliable(frame.count)  # type: ignore[union-attr]
        elif kind is FinishSender:
            rm.on_finish(frame.sent_reliable)  # type: ignore[union-attr]
        else:
            rm.on_cancel()

    def _charge(self, seq: _Seq) -> None:
        """A MESSAGE head arrived whose payload is still coming: charge its bytes now, to the
        channel's window and, where no attached channel's window covers them, to the
        connection's cap for unattached bytes. Memory then grows only with what we granted,
        never with a payload length a peer merely announces."""
        parser = seq.parser
        assert parser is not None
        head = parser.head
        if head is None:
            seq.reserved_head = None
            return
        if self.peer_headers is None:
            return  # routes are not resolved yet; the bytes count in _count_early
        seq.reserved_head = head
        cost = cost_of(head.payload_len, len(head.attachments))  # the head's bytes aside
        rm = None if seq.ignore else self.receivers.get(seq.route)
        loose = rm is None or not self.endpoints[rm.chanid].attached
        seq.reserved = (rm, cost, loose)
        if rm is not None:
            rm.reserve(cost)
        if loose:
            self._loose_partial += cost
            if self._unattached_bytes + self._loose_partial > self.config.max_pending_bytes:
                raise RemoteProtocolError(
                    "too many bytes of unfinished messages for channels that are not attached",
                    CloseCode.LIMIT_VIOLATION,
                )

    def _count_fragment(self, seq: _Seq, nbytes: int) -> None:
        """Incomplete frame heads (up to the header and list limits each) are held per
        stream; across thousands of streams they count against ``max_pending_bytes``."""
        grew = nbytes > seq.fragment
        self._loose_partial += nbytes - seq.fragment
        seq.fragment = nbytes
        if grew and self._unattached_bytes + self._loose_partial > self.config.max_pending_bytes:
            raise RemoteProtocolError(
                "too many bytes of unfinished frames across streams", CloseCode.LIMIT_VIOLATION
            )

    def _uncharge(self, seq: _Seq) -> None:
        """A stream was reset: release what its unfinished frame was charged."""
        self._loose_partial -= seq.fragment
        seq.fragment = 0
        if seq.reserved is None:
            return
        charged, cost, loose = seq.reserved
        seq.reserved = None
        if charged is not None:
            charged.release(cost)
        if loose:
            self._loose_partial -= cost

    def _resolve(self, seq: _Seq, chanid: int) -> None:
        """ROUTE_TO: find (or, for remote-created channels, create) the channel state."""
        space = chanid & 7
        we_send = (chanid >> 1) & 1 == self.side
        table: dict[int, SenderSM] | dict[int, ReceiverSM] = (
            self.senders if we_send else self.receivers
        )
        if chanid & 1 == self.side:
            if chanid >> 3 >= self._next_index[space]:
                raise RemoteProtocolError(f"ROUTE_TO names chanid {chanid}, never allocated")
            if chanid not in table:
                self._missing(seq, chanid)
        elif chanid >> 3 in self._tombstones[space]:
            seq.ignore = True  # late frames for a destroyed channel (G19, case 47)
        elif chanid not in table:
            self._create_remote(chanid, attached=False)

    def _missing(self, seq: _Seq, chanid: int) -> None:
        """No state for the routed channel: FORGET if we created it, else ignore (§2.8)."""
        seq.ignore = True
        if chanid & 1 == self.side:
            self._forget(chanid)

    def _forget(self, chanid: int) -> None:
        """FORGET_CHANNEL on a fresh stream, at most once per channel per interval (G20)."""
        last = self._forget_log.get(chanid)
        if last is not None and self.now - last < self.config.forget_interval:
            return
        if not self._forget_log:
            self.schedule(self.config.forget_interval, self._prune_forget_log)
        self._forget_log[chanid] = self.now
        self.write(self.open_stream(), self.seq_prefix(chanid) + _FORGET_BYTES, True)

    def _prune_forget_log(self) -> None:
        horizon = self.now - self.config.forget_interval
        self._forget_log = {c: t for c, t in self._forget_log.items() if t > horizon}
        if self._forget_log:
            self.schedule(self.config.forget_interval, self._prune_forget_log)

    # == channel state =====================================================================

    def _mint(self, spec: NewChannel) -> int:
        sender_bit = self.side if spec.keep_sender else 1 - self.side
        space = int(self.side) | (sender_bit << 1) | (int(spec.oneshot) << 2)
        index = self._next_index[space]
        self._next_index[space] = index + 1
        chanid = space | (index << 3)
        if spec.keep_sender:
            self.senders[chanid] = SenderSM(self, chanid, spec.oneshot)
        else:
            self.receivers[chanid] = ReceiverSM(self, chanid, spec.oneshot)
        self.endpoints[chanid] = Endpoint(
            chanid, spec.keep_sender, True, held=True, headers=check_headers(spec.headers)
        )
        self.lineage.add(chanid, kept_sender=spec.keep_sender, accessible=False)
        return chanid

    def _create_remote(self, chanid: int, attached: bool) -> Endpoint:
        """State for a channel the peer created, from ROUTE_TO or from an attachment."""
        if len(self.senders) + len(self.receivers) >= self.config.max_channels:
            raise RemoteProtocolError(
                f"more than {self.config.max_channels} live channels on one connection "
                "(channels stay until the peer closes its end)",
                CloseCode.LIMIT_VIOLATION,
            )
        if not attached and self._unattached >= self.config.max_pending_channels:
            raise RemoteProtocolError(
                "too many channels that are not attached yet", CloseCode.LIMIT_VIOLATION
            )
        oneshot = bool(chanid & 4)
        we_send = (chanid >> 1) & 1 == self.side
        sm: SenderSM | ReceiverSM
        if we_send:
            sm = self.senders[chanid] = SenderSM(self, chanid, oneshot)
            # The peer kept the receiver: its application already holds it, so what we
            # attach to our messages on this channel needs no ancestry (§2.9).
            self.lineage.add(chanid, kept_sender=True, accessible=True)
        else:
            sm = self.receivers[chanid] = ReceiverSM(self, chanid, oneshot)
        ep = self.endpoints[chanid] = Endpoint(chanid, we_send, attached)
        if not attached:
            self._unattached += 1
            if not we_send:
                # Send-back ROUTE_TO as the first frame of our receiver control stream (§2.8,
                # G21), so a creator that no longer knows the channel answers FORGET. Not for
                # a sender: the creator's receiver routed to us on the stream that will carry
                # its CLOSE (or it lost the channel and sends FORGET), so a send-back could
                # only overtake that CLOSE and draw a spurious FORGET.
                self.ctrl_write(sm, b"")
        return ep

    def _attach(self, att: Attachment) -> None:
        chanid = att.chanid
        if chanid & 1 == self.side:
            raise RemoteProtocolError(
                f"attachment {chanid} was not created by the message's sender"
            )
        space, index = chanid & 7, chanid >> 3
        if index in self._attached_ever[space]:
            raise RemoteProtocolError(f"chanid {chanid} attached twice")
        self._attached_ever[space].add(index)
        ep = self.endpoints.get(chanid)
        if ep is None:
            if index in self._tombstones[space]:
                # Destroyed and forgotten before its message arrived: it can only be lost.
                ep = Endpoint(chanid, (chanid >> 1) & 1 == self.side, True)
                ep.set_terminal(Terminal.LOST_IN_TRANSIT)
                self.endpoints[chanid] = ep
            else:
                ep = self._create_remote(chanid, attached=True)
        elif not ep.attached:
            ep.attached = True
            self._unattached -= 1
            self._unattached_bytes -= ep.buffered
        ep.headers = att.headers

    def _sm_destroyed(self, chanid: int) -> None:
        if chanid & 1 != self.side:
            self._tombstones[chanid & 7].add(chanid >> 3)
        self.lineage.sm_gone(chanid)
        ep = self.endpoints.get(chanid)
        if ep is not None:
            self._maybe_free(ep)

    def _maybe_free(self, ep: Endpoint) -> None:
        chanid = ep.chanid
        if not ep.app_done or chanid in self.senders or chanid in self.receivers:
            return
        if self.endpoints.pop(chanid, None) is not None and not ep.attached:
            self._unattached -= 1
            self._unattached_bytes -= ep.buffered

    def _set_terminal(self, ep: Endpoint, terminal: Terminal) -> None:
        if ep.set_terminal(terminal):
            self._events.append(ChannelTerminated(ep.chanid, terminal))

    def _sender_forgotten(self, sm: SenderSM) -> None:
        """FORGET_CHANNEL from the creator to our sender (G28, refined).

        If the application holds the handle the channel is provably accessible, so FORGET is
        the creator's answer to a late frame of ours: its receiver already closed and the
        CLOSE_RECEIVER with its final acks is still in flight on another stream. Treating
        FORGET as that CLOSE would nack messages whose acks are on the way and falsely lose
        their attachments, so the sender only stops (the application sees ReceiverDropped,
        case 61) and the nacks wait for the CLOSE. Otherwise the channel is lost."""
        ep = self.endpoints[sm.chanid]
        if not ep.held:
            self._forgotten(sm.chanid)
        elif sm.state is SendState.OPEN:
            sm.receiver_gone()
            self._set_terminal(ep, Terminal.RECEIVER_DROPPED)

    def _sender_closed(self, sm: SenderSM) -> None:
        """CLOSE_RECEIVER: every number not yet acked is nacked (§2.5)."""
        sm.nack_everything()
        ep = self.endpoints[sm.chanid]
        if sm.state is SendState.FINISHING:
            self._set_terminal(ep, Terminal.FINISHED)
        else:
            self._set_terminal(ep, Terminal.RECEIVER_DROPPED)
        del self.senders[sm.chanid]
        self._blocked.pop(sm.chanid, None)
        lost = sm.teardown(reset_ctrl=False)
        self._sm_destroyed(sm.chanid)
        if lost:
            self.lineage.lose_all(lost)

    def _forgotten(self, chanid: int) -> None:
        """FORGET from the creator of a channel we did not create (§2.6, §2.8). A handle the
        application holds is provably accessible, so FORGET is then a late no-op; otherwise
        the channel is lost: its state and any retained data go, silently."""
        ep = self.endpoints.get(chanid)
        if ep is None or ep.held:
            return
        self._set_terminal(ep, Terminal.LOST_IN_TRANSIT)
        self._destroy_silently(chanid)

    def _destroy_silently(self, chanid: int) -> None:
        """Destroy a remote-created channel, and those in its queue, without CLOSE or
        CANCEL: the creator already counts them lost."""
        root = chanid
        work = [chanid]
        while work:
            chanid = work.pop()
            ep = self.endpoints.get(chanid)
            sm: SenderSM | ReceiverSM | None = self.senders.pop(chanid, None)
            if sm is None:
                sm = self.receivers.pop(chanid, None)
            if sm is not None:
                if isinstance(sm, SenderSM):
                    sm.teardown(reset_ctrl=True)
                else:
                    sm.alive = False
                    if sm.ctrl_stream is not None:
                        self.reset(sm.ctrl_stream)
            if ep is not None:
                self._set_terminal(ep, Terminal.LOST_IN_TRANSIT)
                for item in ep.queue:
                    work.extend(a.chanid for a in item.message.attachments)
                ep.queue.clear()
                if chanid == root and ep.attached:
                    # Its attaching message waits in a live queue: the application may
                    # still take the handle, which must then say LostInTransit (§2.10). It
                    # is freed when the application ends it or that message is discarded.
                    ep.buffered = 0
                else:
                    ep.app_done = True
            if sm is not None:
                self._sm_destroyed(chanid)
            elif ep is not None:
                self._maybe_free(ep)

    def _cancel_sender(self, ep: Endpoint) -> None:
        sm = self.senders.get(ep.chanid)
        if sm is not None and sm.state is SendState.OPEN:
            sm.cancel()
            self._set_terminal(ep, Terminal.CANCELLED)

    def _discard_queue(self, ep: Endpoint) -> None:
        """Messages the application will never take: close their attachments normally
        (remote senders see ReceiverDropped, remote receivers Cancelled; §2.6)."""
        work = [ep]
        while work:
            current = work.pop()
            items = list(current.queue)
            current.queue.clear()
            if not current.attached:
                self._unattached_bytes -= current.buffered
            current.buffered = 0
            for item in items:
                for att in item.message.attachments:
                    child = self.endpoints.get(att.chanid)
                    if child is None or child.app_done:
                        continue
                    child.app_done = True
                    if child.is_sender:
                        self._cancel_sender(child)
                    else:
                        rm = self.receivers.get(child.chanid)
                        if rm is not None:
                            self.receiver_closed(rm, Terminal.CLOSED)
                        work.append(child)
                    self._maybe_free(child)

    def _on_lost(self, chanid: int, node: Node) -> list[int]:
        """lose(X) of §2.9 for a channel we created: its local effects."""
        lost: list[int] = []
        sm = self.senders.pop(chanid, None)
        if sm is not None:
            self._blocked.pop(chanid, None)
            lost = sm.teardown(reset_ctrl=True)
        else:
            rm = self.receivers.pop(chanid, None)
            if rm is not None:
                rm.alive = False
                if rm.ctrl_stream is not None:
                    self.reset(rm.ctrl_stream)
        ep = self.endpoints.get(chanid)
        if ep is not None:
            self._set_terminal(ep, Terminal.LOST_IN_TRANSIT)
            self._discard_queue(ep)
            self._maybe_free(ep)
        if node.route_to_sent:
            self._forget(chanid)
        return lost

    def _pump_all(self) -> None:
        for sm in list(self.senders.values()):
            if sm.alive and sm.queue:
                sm.pump()

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

    def _fail(self, error: RemoteProtocolError) -> None:
        """A violation by the peer (or a timeout): close with its code, never raise."""
        if self.closed:
            return
        self._commands.append(CloseConnection(int(error.code), str(error)))
        self._terminate(int(error.code), str(error), False, error)

    def _terminate(self, code: int, reason: str, by_peer: bool, error: Exception | None) -> None:
        self.closed = True
        for ep in list(self.endpoints.values()):
            if ep.terminal is not Terminal.FINISHED:
                ep.queue.clear()
                ep.buffered = 0
            self._set_terminal(ep, Terminal.CONNECTION_LOST)
            ep.detail = ep.detail or f"{reason or 'closed'} (close code {code})"
            if ep.app_done or not ep.held:
                del self.endpoints[ep.chanid]
        for sm in self.senders.values():
            sm.alive = False
        for rm in self.receivers.values():
            rm.alive = False
        self.senders.clear()
        self.receivers.clear()
        self.lineage.nodes.clear()
        self._blocked.clear()
        self._timers.clear()
        self._in.clear()
        self._waiting.clear()
        self._early.clear()
        self._forget_log.clear()
        self.open_streams.clear()
        self._unattached = self._unattached_bytes = 0
        self._events.append(ConnectionTerminated(code, reason, by_peer, error))


_ACK_VERSION_BYTES = encode_frame(AckVersion())
_FORGET_BYTES = encode_frame(ForgetChannel())
