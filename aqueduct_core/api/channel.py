"""Channel handles: :func:`channel` and :func:`oneshot` pairs, local until attached.

A pair starts *local*: both halves live in this process and values pass through an in-memory
queue without being encoded. Attaching one half to a message sent on a networked sender
gives that half to the peer; the half we keep becomes *networked* on that connection (values
queued locally before are sent first, in order). "Local is the same as networked": the same
methods, the same errors, the same ends.

Ending a handle: a sender ``finish()``es (or ``cancel()``s, or leaves an ``async with`` block);
a receiver is ``close()``d, or ends by itself when it raised EndOfChannel or a terminal error.
A live handle that is garbage collected is cancelled/closed as a backstop, with a
ResourceWarning, because Python gives no deterministic drop.
"""

from __future__ import annotations

import asyncio
import enum
import warnings
import weakref
from collections import deque
from collections.abc import AsyncIterator, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from aqueduct_core.engine import Connection as Engine
from aqueduct_core.engine.events import Terminal
from aqueduct_core.engine.sender import Mode, QueuePolicy
from aqueduct_core.errors import (
    ChannelCancelled,
    ChannelClosed,
    ChannelError,
    EndOfChannel,
    LocalProtocolError,
    ReceiverDropped,
    WouldBlock,
)
from aqueduct_core.wire.primitives import Headers, check_headers

T = TypeVar("T")
DEFAULT_MAXSIZE = 16
"""Messages a sender queues (waiting for flow-control credit) before ``send`` waits."""


@dataclass(frozen=True, slots=True)
class Delivery(Generic[T]):
    """A received message: its decoded value and its message headers."""

    value: T
    headers: Headers


class _Pair:
    """State shared by the two halves of a channel while it is local."""

    __slots__ = (
        "cancelled",
        "codec",
        "finished",
        "headers",
        "maxsize",
        "oneshot",
        "policy",
        "queue",
        "receiver",
        "receiver_closed",
        "sender",
        "waiters",
    )

    def __init__(self, oneshot: bool, headers: Headers, codec: str | None) -> None:
        self.oneshot = oneshot
        self.headers = headers
        self.codec = codec
        self.queue: deque[tuple[Any, Headers]] = deque()
        self.maxsize: int | None = DEFAULT_MAXSIZE
        self.policy = QueuePolicy.BLOCK
        self.finished = False
        self.cancelled = False
        self.receiver_closed = False
        self.waiters: list[asyncio.Future[None]] = []
        self.sender: weakref.ref[_SendEnd] | None = None
        self.receiver: weakref.ref[Receiver[Any]] | None = None

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


class ChannelHost(Protocol):
    """What a networked handle uses of its connection. :class:`~.connection.Connection` is
    the one implementation; it imports this module, and this module never imports it back."""

    @property
    def _engine(self) -> Engine: ...
    @property
    def is_closed(self) -> bool: ...
    def _now(self) -> float: ...
    def _flush(self) -> None: ...
    def _register(self, chanid: int, handle: Handle) -> None: ...
    def _drop(self, chanid: int, sender: bool) -> None: ...
    def _send(self, handle: _SendEnd, value: Any, headers: Headers) -> None: ...
    def _recv(self, handle: Receiver[Any]) -> Delivery[Any]: ...
    async def _wait(self, chanid: int) -> None: ...
    async def _wait_room(self, chanid: int, first: bool) -> None: ...
    def _wake_room(self, chanid: int) -> None: ...
    async def _wait_terminal(self, chanid: int) -> Terminal | None: ...


class _State(enum.Enum):
    LOCAL = "local"
    NETWORKED = "networked"
    GIVEN = "given"
    """Sent to the peer: this object is no longer a usable end."""
    ENDED = "ended"


class Handle:
    """Common base of the four handle types."""

    _is_sender = False

    def __init__(self, pair: _Pair | None) -> None:
        self._pair = pair
        self._state = _State.LOCAL if pair is not None else _State.NETWORKED
        self._conn: ChannelHost | None = None
        self._chanid = -1
        self._mode = Mode.ORDERED
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._final: Exception | None = None
        """How the handle ended, raised again on every later use (terminal states stick)."""

    # -- state -------------------------------------------------------------------------

    @property
    def headers(self) -> Headers:
        """The channel headers (set by the channel's creator)."""
        if self._conn is not None:
            return self._conn._engine.channel_headers(self._chanid)
        return self._pair.headers if self._pair is not None else ()

    @property
    def is_networked(self) -> bool:
        return self._state is _State.NETWORKED

    @property
    def codec_name(self) -> str | None:
        """The channel's codec override (``raw`` for Arrow channels), or None: the
        connection's default."""
        if self._pair is not None:
            return self._pair.codec
        for key, value in self.headers:
            if key == b"aqueduct-codec-3e7a91":
                return value.decode("ascii", "replace")
        return None

    def _check_usable(self) -> None:
        if self._state is _State.GIVEN:
            raise LocalProtocolError(
                "this handle was sent to the peer inside a message; it is the peer's now"
            )

    def _bind(self, conn: ChannelHost, chanid: int) -> None:
        """Become the networked end of ``chanid`` on ``conn``."""
        self._conn = conn
        self._chanid = chanid
        self._state = _State.NETWORKED
        conn._register(chanid, self)
        self._finalizer = weakref.finalize(
            self, _backstop, weakref.ref(conn), chanid, self._is_sender, type(self).__name__
        )

    def _ended(self, final: Exception | None = None) -> None:
        """The application is done with this handle (engine informed already)."""
        if final is not None and self._final is None:
            self._final = final
        self._state = _State.ENDED
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def _raise_final(self, otherwise: str) -> None:
        if self._final is not None:
            raise type(self._final)(*self._final.args)
        raise ChannelClosed(otherwise)

    def __repr__(self) -> str:
        where = f"chanid {self._chanid}" if self._chanid >= 0 else "local"
        return f"<{type(self).__name__} {where} {self._state.value}>"


def _backstop(conn_ref: weakref.ref[ChannelHost], chanid: int, sender: bool, kind: str) -> None:
    conn = conn_ref()
    if conn is None or conn.is_closed:
        return
    if conn._engine.terminal(chanid) is not None:
        conn._drop(chanid, sender)  # the channel had ended already: nothing was leaked
        return
    warnings.warn(
        f"{kind} for channel {chanid} was garbage collected while live; it was "
        f"{'cancelled' if sender else 'closed'}. End handles explicitly (finish/cancel/close "
        "or 'async with').",
        ResourceWarning,
        stacklevel=2,
    )
    conn._drop(chanid, sender)


class _SendEnd(Handle):
    """What every sending end does: send now, finish, cancel, wait for the end."""

    _is_sender = True

    def __init__(self, pair: _Pair | None) -> None:
        super().__init__(pair)
        self._policy = QueuePolicy.BLOCK
        self._maxsize: int | None = DEFAULT_MAXSIZE

    def _bind(self, conn: ChannelHost, chanid: int) -> None:
        super()._bind(conn, chanid)
        if not isinstance(self, OneshotSender):
            # The queue bound lives in the engine once networked: give it ours (the
            # default bound too, so ``await send()`` waits for a slow consumer).
            conn._engine.configure_sender(chanid, self._mode, self._policy, self._maxsize or 0)

    def _send_now(self, value: Any, headers: Any) -> None:
        self._check_usable()
        if self._state is _State.ENDED:
            self._raise_final("this sender was already finished or cancelled")
        hdrs = check_headers(headers, "message headers")
        if self._conn is not None:
            try:
                self._conn._send(self, value, hdrs)
            except ChannelError as exc:
                if not isinstance(exc, ChannelClosed):
                    self._release(exc)
                raise
            return
        pair = self._pair
        assert pair is not None
        if pair.finished or pair.cancelled:
            raise ChannelClosed("this sender was already finished or cancelled")
        if pair.receiver_closed:
            raise ReceiverDropped("the receiver was closed")
        if pair.maxsize is not None and len(pair.queue) >= pair.maxsize:
            if pair.policy is QueuePolicy.DROP_OLDEST:
                pair.queue.popleft()
            else:
                raise WouldBlock("the channel's queue is full")
        pair.queue.append((value, hdrs))
        pair.wake()

    # -- ending ------------------------------------------------------------------------

    def finish(self) -> None:
        """No more messages: the receiver gets everything already sent, then
        EndOfChannel. Idempotent."""
        if self._state is _State.GIVEN:
            return
        if self._conn is not None:
            self._conn._engine.finish(self._chanid, now=self._conn._now())
            self._conn._flush()
        elif self._pair is not None and not self._pair.cancelled:
            self._pair.finished = True
            self._pair.wake()
        self._ended()

    def cancel(self) -> None:
        """Abandon the channel: unsent messages are dropped and the receiver gets
        ChannelCancelled. Idempotent."""
        if self._state is _State.GIVEN:
            return
        if self._conn is not None:
            self._conn._engine.cancel(self._chanid, now=self._conn._now())
            self._conn._flush()
        elif self._pair is not None and not self._pair.finished:
            self._pair.cancelled = True
            self._pair.queue.clear()
            self._pair.wake()
        self._ended()

    def _release(self, final: Exception | None = None) -> None:
        """The channel reached a terminal state: free it (like cancel, no wire effect)."""
        if self._conn is not None and self._state is _State.NETWORKED:
            self._conn._engine.cancel(self._chanid, now=self._conn._now())
            self._conn._flush()
            self._ended(final)

    async def wait_closed(self) -> None:
        """Wait until the channel ended: returns once the receiver got everything after a
        ``finish()``; raises the terminal error otherwise (ReceiverDropped, ...)."""
        if self._conn is None:
            return
        terminal = await self._conn._wait_terminal(self._chanid)
        err = None if terminal in (None, Terminal.FINISHED) else terminal.error()
        self._release(err or ChannelClosed("the channel finished"))  # it has ended: free it
        if err is not None and terminal is not Terminal.CANCELLED:
            raise err


class Sender(_SendEnd):
    """The sending end of a channel. Choose how it sends with :meth:`ordered` (the default),
    :meth:`unordered` or :meth:`unreliable` before the first send."""

    # -- configuration -------------------------------------------------------------------

    def ordered(self, maxsize: int | None = DEFAULT_MAXSIZE) -> Sender:
        """One stream; the receiver gets messages in order. ``maxsize`` messages may wait
        for credit before ``send`` waits; None: never wait (unbounded)."""
        return self._configure(Mode.ORDERED, maxsize, QueuePolicy.BLOCK)

    def unordered(self, maxsize: int | None = DEFAULT_MAXSIZE) -> Sender:
        """One stream per message: no head-of-line blocking, any arrival order."""
        return self._configure(Mode.UNORDERED, maxsize, QueuePolicy.BLOCK)

    def unreliable(self, maxsize: int | None = DEFAULT_MAXSIZE) -> Sender:
        """Datagrams: messages may be lost (never duplicated). When ``maxsize`` messages
        wait, the oldest is dropped instead of waiting; None: unbounded."""
        return self._configure(Mode.UNRELIABLE, maxsize, QueuePolicy.DROP_OLDEST)

    def _configure(self, mode: Mode, maxsize: int | None, policy: QueuePolicy) -> Sender:
        self._check_usable()
        if maxsize is not None and maxsize < 1:
            raise LocalProtocolError("maxsize must be >= 1, or None for an unbounded queue")
        if maxsize is None:
            policy = QueuePolicy.UNBOUNDED
        self._mode, self._policy, self._maxsize = mode, policy, maxsize
        if self._conn is not None:
            self._conn._engine.configure_sender(self._chanid, mode, policy, maxsize or 0)
        elif self._pair is not None:
            self._pair.maxsize, self._pair.policy = maxsize, policy
        return self

    # -- sending -----------------------------------------------------------------------

    def send_nowait(self, value: Any, *, headers: Any = ()) -> None:
        """Send without waiting. Raises WouldBlock when the bounded queue is full, or the
        channel's terminal error (ReceiverDropped, LostInTransit, ConnectionLost, ...)."""
        self._send_now(value, headers)

    async def send(self, value: Any, *, headers: Any = ()) -> None:
        """Send ``value``; waits while the bounded queue is full (back pressure). Tasks
        waiting to send on one channel take the freed room in turn, first come, first
        served: each freed slot wakes one of them, who hands the turn on once it sent."""
        turn = False
        try:
            while True:
                try:
                    self.send_nowait(value, headers=headers)
                    return
                except WouldBlock:
                    first, turn = turn, False  # full again: no room to hand on
                    await self._wait(first)
                    turn = self._conn is not None
        finally:
            if turn and self._conn is not None:
                # Woken for room: whether we sent, failed or were cancelled, the next one
                # in line tries now (if the queue is full again, it waits again, first).
                self._conn._wake_room(self._chanid)

    async def _wait(self, first: bool = False) -> None:
        if self._conn is not None:
            await self._conn._wait_room(self._chanid, first)
        elif self._pair is not None:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._pair.waiters.append(fut)
            await fut

    async def __aenter__(self) -> Sender:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None:
            self.finish()
        else:
            self.cancel()


class Receiver(Handle, Generic[T]):
    """The receiving end of a channel. ``async for value in receiver`` until the sender
    finishes."""

    def recv_nowait(self) -> T:
        """The next value, or WouldBlock if none is there yet. EndOfChannel after the
        sender finished and everything was received; otherwise the terminal error."""
        return self.recv_message_nowait().value

    def recv_message_nowait(self) -> Delivery[T]:
        self._check_usable()
        if self._state is _State.ENDED:
            self._raise_final("this receiver was already closed")
        pair = self._pair
        if pair is not None and pair.queue:
            value, headers = pair.queue.popleft()
            pair.wake()
            return Delivery(value, headers)
        if self._conn is not None:
            try:
                return self._conn._recv(self)
            except (EndOfChannel, ChannelError) as exc:
                self._release(exc)
                raise
        assert pair is not None
        if pair.cancelled:
            self._ended(ChannelCancelled("the sender cancelled the channel"))
            self._raise_final("")
        if pair.finished:
            self._ended(EndOfChannel("the sender finished and every message was received"))
            self._raise_final("")
        raise WouldBlock("no message yet")

    async def recv(self) -> T:
        """Wait for the next value (see :meth:`recv_nowait` for the ends)."""
        return (await self.recv_message()).value

    async def recv_message(self) -> Delivery[T]:
        """Like :meth:`recv`, with the message headers."""
        while True:
            try:
                return self.recv_message_nowait()
            except WouldBlock:
                if self._conn is not None:
                    await self._conn._wait(self._chanid)
                else:
                    assert self._pair is not None
                    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    self._pair.waiters.append(fut)
                    await fut

    def close(self) -> None:
        """Stop receiving: queued messages are discarded and the sender sees
        ReceiverDropped. Idempotent."""
        if self._state in (_State.GIVEN, _State.ENDED):
            return
        if self._pair is not None:
            self._pair.receiver_closed = True
            self._pair.queue.clear()
            self._pair.wake()
        if self._conn is not None:
            self._conn._engine.close_receiver(self._chanid, now=self._conn._now())
            self._conn._flush()
        self._ended()

    def _release(self, final: Exception | None = None) -> None:
        if self._conn is not None and self._state is _State.NETWORKED:
            self._conn._engine.close_receiver(self._chanid, now=self._conn._now())
            self._conn._flush()
        self._ended(final)

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.recv()
        except EndOfChannel:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Receiver[T]:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class OneshotSender(_SendEnd):
    """Sends exactly one value; :meth:`send` is synchronous and never blocks."""

    def send(self, value: Any, *, headers: Any = ()) -> None:
        """Send the one value. Raises the terminal error if the receiver is gone."""
        self._send_now(value, headers)
        if self._state is not _State.ENDED:
            self._ended()


class OneshotReceiver(Receiver[T]):
    """Receives exactly one value: ``value = await receiver``."""

    def __await__(self) -> Generator[Any, None, T]:
        return self._one().__await__()

    async def _one(self) -> T:
        try:
            value = await self.recv()
        except EndOfChannel:
            raise ChannelClosed("the oneshot sender finished without sending a value") from None
        self.close()
        return value


def channel(*, headers: Any = (), codec: str | None = None) -> tuple[Sender, Receiver[Any]]:
    """A new channel: ``(sender, receiver)``, local until one half is sent in a message.
    ``headers`` travel with the attachment; ``codec`` overrides the connection's default
    codec for this channel (``"raw"`` for bytes the application encodes itself)."""
    pair = _Pair(False, check_headers(headers, "channel headers"), codec)
    tx, rx = Sender(pair), Receiver[Any](pair)
    _link(tx, rx, pair)
    return tx, rx


def oneshot(
    *, headers: Any = (), codec: str | None = None
) -> tuple[OneshotSender, OneshotReceiver[Any]]:
    """A channel for exactly one value: ``(sender, receiver)``."""
    pair = _Pair(True, check_headers(headers, "channel headers"), codec)
    pair.maxsize = None
    pair.policy = QueuePolicy.UNBOUNDED
    tx, rx = OneshotSender(pair), OneshotReceiver[Any](pair)
    _link(tx, rx, pair)
    return tx, rx


def _link(tx: _SendEnd, rx: Receiver[Any], pair: _Pair) -> None:
    pair.sender = weakref.ref(tx)
    pair.receiver = weakref.ref(rx)

    # A local half that is dropped ends the channel for the other half.
    def receiver_gone(p: _Pair = pair) -> None:
        p.receiver_closed = True
        p.wake()

    weakref.finalize(rx, receiver_gone)
