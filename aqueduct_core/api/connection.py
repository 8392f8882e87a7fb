"""The asyncio face of one Aqueduct connection.

A :class:`Connection` owns a sans-IO engine and a *driver* (the transport: QUIC, or the
in-memory pair of :mod:`aqueduct_core.testing.memory`). Every call into the engine is
followed by :meth:`Connection._flush`, which hands the engine's commands to the driver,
wakes the handles its events concern, and re-arms the engine timer on the event loop. The
driver feeds transport events into ``conn.engine`` and calls ``_flush`` too.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, cast

from aqueduct_core.api.channel import (
    Delivery,
    Handle,
    OneshotReceiver,
    OneshotSender,
    Receiver,
    Sender,
    _SendEnd,
    _State,
)
from aqueduct_core.api.codec import CODEC_HEADER, CborCodec, Codec, RawCodec
from aqueduct_core.api.path import PathSample
from aqueduct_core.engine import (
    ChannelTerminated,
    Command,
    ConnectionTerminated,
    FlowStalls,
    HeadersReceived,
    MessageArrived,
    NewChannel,
    SenderReady,
    Terminal,
)
from aqueduct_core.engine import Connection as Engine
from aqueduct_core.engine.connection import MemoryReport
from aqueduct_core.engine.sender import QueuePolicy
from aqueduct_core.errors import (
    ConnectionLost,
    DecodeError,
    LocalProtocolError,
    RemoteProtocolError,
    WouldBlock,
)
from aqueduct_core.wire.chanid import ENTRYPOINT, Side, is_oneshot, sender_of
from aqueduct_core.wire.frames import Payload
from aqueduct_core.wire.primitives import Headers

log = logging.getLogger("aqueduct")


class Driver(Protocol):
    """What a transport provides to a :class:`Connection`."""

    def execute(self, commands: list[Command]) -> None:
        """Carry out engine commands (writes, resets, datagrams, close) and transmit."""

    def abort(self) -> None:
        """Tear the transport down without waiting (the engine already closed)."""

    # Optionally ``released``: a future done once the transport let go of its socket, for
    # a transport whose socket outlives abort() (TLS over TCP closes with a round trip);
    # and ``path_sample()``: what it measures of the network path now (a PathSample), or
    # None.


def builtin_codecs() -> dict[str, Codec]:
    return {"cbor": CborCodec((Handle,)), "raw": RawCodec()}


class Connection:
    """One Aqueduct connection, client or server side.

    ``entrypoint`` is the client's sender on channel 0 (the server receives it in its
    handler). ``peer_headers`` are the connection headers the peer sent.
    """

    def __init__(self, engine: Engine, codecs: dict[str, Codec] | None = None) -> None:
        self._engine = engine
        self._loop = asyncio.get_running_loop()
        self._driver: Driver | None = None
        self._codecs = codecs or builtin_codecs()
        self._codec: Codec = self._codecs["cbor"]
        self._handles: weakref.WeakValueDictionary[int, Handle] = weakref.WeakValueDictionary()
        self._terminals: dict[int, Terminal] = {}
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._room: dict[int, deque[asyncio.Future[None]]] = {}
        """Per channel, the tasks waiting for room to send, in order (see ``_wake_room``)."""
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._confirmed: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self._close_error: BaseException | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._entrypoint: Sender | None = None
        self.on_ready: Callable[[Connection], None] | None = None
        self.transport = "quic"
        """What carries this connection: ``quic``, ``tcp`` or ``memory``."""
        self.peer: tuple[Any, ...] | None = None
        """The peer's address as the transport saw it first (host, port, ...); None when
        the transport has none (the in-memory pair)."""
        self.unreachable_at: float | None = None
        """When (``time.monotonic()``) the peer's host last said, after the handshake, that
        nothing listens there any more (an ICMP destination unreachable, heard by a QUIC
        client's connected socket: the service process died, its host is up). A hint, not a
        verdict: QUIC ignores such errors once connected (anyone on the path can forge one),
        and so does this connection; a client already waiting on it in silence may act."""

    # -- public ------------------------------------------------------------------------

    @property
    def side(self) -> Side:
        return self._engine.side

    @property
    def peer_headers(self) -> Headers:
        """The peer's connection headers (empty until the handshake completed)."""
        return self._engine.peer_headers or ()

    def peer_header(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        """The first value of connection header ``key`` the peer sent."""
        k = key.encode() if isinstance(key, str) else key
        for hk, hv in self.peer_headers:
            if hk == k:
                return hv
        return default

    @property
    def entrypoint(self) -> Sender:
        """The client's sender on the entrypoint channel (chanid 0)."""
        if self._engine.side is not Side.CLIENT:
            raise LocalProtocolError("only the client holds the entrypoint sender")
        if self._entrypoint is None:
            tx = Sender(None)
            tx._bind(self, ENTRYPOINT)
            self._entrypoint = tx
        return self._entrypoint

    @property
    def codec(self) -> str:
        """The default codec agreed for this connection."""
        return self._codec.name

    @property
    def is_closed(self) -> bool:
        return self._closed.done()

    def memory(self) -> MemoryReport:
        """Bytes buffered by this connection, per channel and in total."""
        return self._engine.memory()

    def path(self) -> PathSample | None:
        """What the transport measures of the network path now (cumulative counters: two
        samples make a :class:`~aqueduct_core.api.path.PathReading`); None when it measures
        nothing (the in-memory pair, a platform without ``TCP_INFO``)."""
        sample = getattr(self._driver, "path_sample", None)
        return sample() if sample is not None and not self.is_closed else None

    def flow_stalls(self) -> FlowStalls:
        """How often this side's senders waited for the peer's credit or for the transport."""
        return self._engine.flow_stalls()

    async def close(self, code: int = 0, reason: str = "") -> None:
        """Close the connection (code 0: no error). Every live handle sees ConnectionLost."""
        if not self.is_closed:
            self._engine.close(self._now(), code, reason)
            self._flush()
        await self.wait_closed()

    async def wait_closed(self) -> None:
        """Wait until the connection has ended, for whatever reason, and its transport has
        closed its socket (so an event loop closed next leaks none)."""
        await asyncio.shield(self._closed)
        released = getattr(self._driver, "released", None)
        if released is not None:
            await asyncio.shield(released)

    async def wait_ended(self) -> None:
        """Wait until the connection has ended, for whatever reason: unlike
        :meth:`wait_closed`, not also for the transport to let go of its socket (closing
        TLS over TCP takes the peer's answer, or a grace period when it never comes)."""
        await asyncio.shield(self._closed)

    async def wait_ready(self) -> None:
        """Wait until the peer's connection headers arrived (the handshake completed)."""
        await asyncio.shield(self._ready)

    @property
    def handshake_confirmed(self) -> bool:
        """The QUIC handshake completed. Before that, a server may already be reading
        requests a client sent in 0-RTT, which an attacker can replay (profile §2.11)."""
        return self._engine.handshake_confirmed

    async def wait_confirmed(self) -> None:
        """Wait until the QUIC handshake completed, so that what the peer sent is not a
        replay of its 0-RTT data: a server awaits this before acting on any request that is
        not safe to repeat (writes, commits). Returns at once without 0-RTT; raises
        ConnectionLost if the connection ends first (a replayed handshake never completes).
        """
        if self._engine.handshake_confirmed:
            return
        if self.is_closed:
            raise self._close_error or ConnectionLost("the connection is closed")
        if self._confirmed is None:
            self._confirmed = self._loop.create_future()
        await asyncio.shield(self._confirmed)

    # -- driver side -------------------------------------------------------------------

    def attach_driver(self, driver: Driver) -> None:
        self._driver = driver

    @property
    def engine(self) -> Engine:
        return self._engine

    def _now(self) -> float:
        return self._loop.time()

    def _flush(self) -> None:
        """Hand engine commands to the driver, dispatch engine events, re-arm the timer."""
        engine = self._engine
        commands = engine.commands()
        if commands and self._driver is not None:
            self._driver.execute(commands)
        for event in engine.events():
            kind = type(event)
            if kind is MessageArrived:
                self._wake(event.chanid)  # type: ignore[union-attr]
            elif kind is SenderReady:
                self._wake_room(event.chanid)  # type: ignore[union-attr]
            elif kind is ChannelTerminated:
                chanid = event.chanid  # type: ignore[union-attr]
                if chanid in self._handles:
                    self._terminals[chanid] = event.terminal  # type: ignore[union-attr]
                self._wake(chanid)
                self._wake_room(chanid, every=True)
            elif kind is HeadersReceived:
                self._on_headers()
            elif kind is ConnectionTerminated:
                self._on_terminated(event)  # type: ignore[arg-type]
        if self._confirmed is not None and engine.handshake_confirmed:
            self._confirmed.set_result(None)
            self._confirmed = None
        when = engine.next_timer()
        if when != self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = None if when is None else self._loop.call_at(when, self._on_timer)
            self._timer_at = when

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._engine.handle_timer(self._now())
        self._flush()

    def _on_headers(self) -> None:
        # The client takes the codec the server answered; the server, the one it chose.
        headers = self.peer_headers if self.side is Side.CLIENT else self._engine.own_headers
        chosen = next((v for k, v in headers if k == CODEC_HEADER), None)
        if chosen is not None:
            codec = self._codecs.get(chosen.decode("ascii", "replace"))
            if codec is not None:
                self._codec = codec
        if not self._ready.done():
            self._ready.set_result(None)
        if self.on_ready is not None:
            self.on_ready(self)

    def _on_terminated(self, event: ConnectionTerminated) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        error = ConnectionLost(
            f"connection closed (code {event.code}{': ' + event.reason if event.reason else ''})"
        )
        if event.error is not None:
            error.__cause__ = event.error
        self._close_error = error
        if not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # mark retrieved: nobody may be waiting
        if self._confirmed is not None:
            self._confirmed.set_exception(error)
            self._confirmed.exception()
            self._confirmed = None
        if not self._closed.done():
            self._closed.set_result(None)
        for chanid in list(self._waiters):
            self._wake(chanid)
        for chanid in list(self._room):
            self._wake_room(chanid, every=True)
        if self._driver is not None:
            self._driver.abort()

    # -- used by handles ---------------------------------------------------------------

    def _register(self, chanid: int, handle: Handle) -> None:
        self._handles[chanid] = handle

    def _wake(self, chanid: int) -> None:
        waiters = self._waiters.pop(chanid, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def _wait(self, chanid: int) -> None:
        if self.is_closed and self._engine.terminal(chanid) is None:
            raise self._close_error or ConnectionLost("the connection is closed")
        fut: asyncio.Future[None] = self._loop.create_future()
        self._waiters.setdefault(chanid, []).append(fut)
        await fut

    def _wake_room(self, chanid: int, every: bool = False) -> None:
        """Room to send on ``chanid``: wake the first task waiting for it (``every``: all,
        as the channel ended). One at a time, because waking all of them made each freed
        slot cost a retry by every blocked task: a client with 20,000 requests waiting on
        its entrypoint spent its time in those retries."""
        queue = self._room.get(chanid)
        while queue:
            fut = queue.popleft()
            if not fut.done():
                fut.set_result(None)
                if not every:
                    break
        if queue is not None and not queue:
            del self._room[chanid]

    async def _wait_room(self, chanid: int, first: bool) -> None:
        """Wait for room to send on ``chanid`` (``first``: at the head of the line, for a
        task that was woken and found the queue full again)."""
        if self.is_closed and self._engine.terminal(chanid) is None:
            raise self._close_error or ConnectionLost("the connection is closed")
        fut: asyncio.Future[None] = self._loop.create_future()
        queue = self._room.setdefault(chanid, deque())
        if first:
            queue.appendleft(fut)
        else:
            queue.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._wake_room(chanid)  # woken, then cancelled: the turn goes on
            raise

    async def _wait_terminal(self, chanid: int) -> Terminal | None:
        while True:
            terminal = self._terminals.get(chanid) or self._engine.terminal(chanid)
            if terminal is not None:
                return terminal
            if self.is_closed or chanid not in self._engine.endpoints:
                return Terminal.CONNECTION_LOST if self.is_closed else None
            await self._wait(chanid)

    def _drop(self, chanid: int, sender: bool) -> None:
        if sender:
            self._engine.cancel(chanid, now=self._now())
        else:
            self._engine.close_receiver(chanid, now=self._now())
        self._flush()

    def _codec_for(self, handle: Handle) -> Codec:
        name = handle.codec_name
        if name is None:
            return self._codec
        codec = self._codecs.get(name)
        if codec is None:
            raise LocalProtocolError(f"channel codec {name!r} is not available here")
        return codec

    def _send(self, handle: _SendEnd, value: Any, headers: Headers) -> None:
        attached: list[Handle] = []

        def attach(h: Any) -> int:
            if not isinstance(h, Handle):
                raise LocalProtocolError(f"not a channel handle: {h!r}")
            _check_attachable(h, attached)
            attached.append(h)
            return len(attached) - 1

        payload = self._codec_for(handle).encode(value, attach)
        specs = [_spec_for(h) for h in attached]
        try:
            children = self._engine.send(
                handle._chanid, payload, headers=headers, attachments=specs, now=self._now()
            )
        finally:
            self._flush()
        for h, chanid in zip(attached, children, strict=True):
            self._hand_over(h, chanid)

    def _hand_over(self, given: Handle, chanid: int) -> None:
        """``given`` went to the peer as ``chanid``; its partner becomes networked here."""
        pair = given._pair
        assert pair is not None
        given._state = _State.GIVEN
        given._pair = None
        ref = pair.receiver if isinstance(given, _SendEnd) else pair.sender
        partner = ref() if ref is not None else None
        if partner is None:
            # The kept half was already dropped: end the channel at once.
            self._drop(chanid, not isinstance(given, _SendEnd))
            return
        partner._bind(self, chanid)
        if isinstance(partner, _SendEnd):
            partner._pair = None
            self._replay(partner, pair)
        # A kept receiver keeps its pair: it drains what was queued locally first.

    def _replay(self, sender: _SendEnd, pair: Any) -> None:
        """Send what the local sender queued before its receiver went to the peer."""
        engine = self._engine
        chanid = sender._chanid
        if not pair.oneshot:
            engine.configure_sender(chanid, sender._mode, QueuePolicy.UNBOUNDED, 0)
        for value, headers in pair.queue:
            self._send(sender, value, headers)
        pair.queue.clear()
        if not pair.oneshot and sender._policy is not QueuePolicy.UNBOUNDED:
            engine.configure_sender(chanid, sender._mode, sender._policy, sender._maxsize or 0)
        if pair.cancelled:
            engine.cancel(chanid, now=self._now())
            sender._ended()
        elif pair.finished:
            engine.finish(chanid, now=self._now())
            sender._ended()
        self._flush()

    def _recv(self, handle: Receiver[Any]) -> Delivery[Any]:
        engine = self._engine
        try:
            msg = engine.recv(handle._chanid, now=self._now())
        finally:
            self._flush()
        if msg is None:
            if self.is_closed and self._engine.terminal(handle._chanid) is None:
                raise self._close_error or ConnectionLost("the connection is closed")
            raise WouldBlock("no message yet")
        taken: dict[int, Handle] = {}

        def detach(index: Any) -> Handle:
            if not isinstance(index, int) or not 0 <= index < len(msg.attachments):
                raise RemoteProtocolError(f"message refers to attachment {index!r}, not sent")
            if index in taken:
                raise RemoteProtocolError(f"message uses attachment {index} twice")
            h = taken[index] = self._adopt(msg.attachments[index].chanid)
            return h

        try:
            # Received: bytes, or the buffer EngineConfig.payload_buffers gave (never a Gather).
            value = self._codec_for(handle).decode(cast(Payload, msg.payload), detach)
        except RemoteProtocolError as exc:
            for h in taken.values():
                _end(h)
            self._close_unclaimed(msg.attachments, taken)
            raise DecodeError(
                f"could not decode a message on channel {handle._chanid}: {exc}"
            ) from exc
        self._close_unclaimed(msg.attachments, taken)
        return Delivery(value, msg.headers)

    def _close_unclaimed(self, attachments: Any, taken: dict[int, Handle]) -> None:
        for index, att in enumerate(attachments):
            if index not in taken:
                self._drop(att.chanid, sender_of(att.chanid) is self.side)

    def _adopt(self, chanid: int) -> Handle:
        we_send = sender_of(chanid) is self.side
        h: Handle
        if is_oneshot(chanid):
            h = OneshotSender(None) if we_send else OneshotReceiver[Any](None)
        else:
            h = Sender(None) if we_send else Receiver[Any](None)
        h._bind(self, chanid)
        terminal = self._engine.terminal(chanid)
        if terminal is not None:
            self._terminals[chanid] = terminal
        return h


def _check_attachable(h: Handle, already: list[Handle]) -> None:
    if h._state is not _State.LOCAL or h._pair is None:
        raise LocalProtocolError(
            "only a fresh local handle can be attached; a handle that is networked (received "
            "from a peer, or whose other half was sent) cannot be sent again"
        )
    pair = h._pair
    other = pair.receiver if isinstance(h, _SendEnd) else pair.sender
    if any(o is (other() if other else None) for o in already):
        raise LocalProtocolError("both halves of one channel cannot be sent in one message")
    if isinstance(h, _SendEnd) and (pair.finished or pair.cancelled):
        raise LocalProtocolError("a finished or cancelled sender cannot be attached")
    if not isinstance(h, _SendEnd) and pair.receiver_closed:
        raise LocalProtocolError("a closed receiver cannot be attached")


def _spec_for(h: Handle) -> NewChannel:
    pair = h._pair
    assert pair is not None
    headers = pair.headers
    if pair.codec is not None:
        headers = (*headers, (CODEC_HEADER, pair.codec.encode()))
    # Giving away a receiver means we keep the sender, and the reverse.
    return NewChannel(
        keep_sender=not isinstance(h, _SendEnd), oneshot=pair.oneshot, headers=headers
    )


def _end(h: Handle) -> None:
    if isinstance(h, _SendEnd):
        h.cancel()
    elif isinstance(h, Receiver):
        h.close()
