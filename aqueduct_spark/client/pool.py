"""The process's event-loop thread (the "portal" blocking callers submit coroutines to), the
pool of connections every :class:`~aqueduct_spark.client.Client` shares, and closing that
pool cleanly when the process ends.

A connection that is dropped without a word costs the service an idle timeout (30 s by
default) before it frees what the connection held; a QUIC peer cannot even tell it is gone,
since UDP has no close. So at exit every pooled connection is closed with code 0: at
interpreter exit (``atexit``), and on SIGTERM or SIGHUP when they would kill the process
outright (their default action skips ``atexit``). Spark's Python workers end that way: the
worker daemon sends SIGHUP to its workers when the executor stops. Closing never waits for
an answer longer than :data:`EXIT_GRACE` in all, so a dead service does not hold up the exit.
A signal that reaches the main thread just before it blocks still ends the process
(:mod:`.exit_signals`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Iterator
from types import FrameType
from typing import Any, Generic, TypeVar

from aqueduct_spark.client import exit_signals
from aqueduct_spark.client.aio import AsyncClient
from aqueduct_spark.client.config import ClientConfig

T = TypeVar("T")

EXIT_GRACE = 2.0
"""Seconds an exiting process spends, at most, closing its pooled connections."""
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end the process without ``atexit`` when left to their default action."""


AHEAD = 1
"""Items a blocking iteration receives ahead of its caller (one batch while the caller works
on the previous one)."""


class Portal:
    """One event-loop thread per process; blocking callers submit coroutines to it."""

    _instance: Portal | None = None
    _guard = threading.Lock()

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = _new_loop()
        self.thread = threading.Thread(target=self._run, name="aqueduct-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    @classmethod
    def get(cls) -> Portal:
        with cls._guard:
            inst = cls._instance
            if inst is None or inst.pid != os.getpid():  # a fork has no loop thread
                inst = cls._instance = cls()
            return inst

    def run(self, coro: Awaitable[T]) -> T:
        if threading.current_thread() is self.thread:
            raise RuntimeError("blocking Client calls cannot run on the client's own loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def iterate(self, agen: AsyncIterator[T], ahead: int = AHEAD) -> Iterator[T]:
        """The items of ``agen`` (run on the loop thread) for a blocking caller.

        One task on the loop runs the generator and hands each item over as it comes, up to
        ``ahead`` items before the caller takes them: the next batch is received and decoded
        while the caller works on this one, and an item costs one hand-off (a lock and a
        wake-up only when the caller waits), not a coroutine submitted per item. The
        generator's error reaches the caller after the items before it; a caller that stops
        early closes the generator (its task is cancelled) before ``close()`` returns."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("blocking Client calls cannot run on the client's own loop thread")
        box: _Handoff[T] = _Handoff(self.loop, ahead)
        done = threading.Event()
        task = asyncio.run_coroutine_threadsafe(_pump(agen, box, done), self.loop)
        try:
            while True:
                item = box.take()
                if item is _END:
                    return
                yield item
        finally:
            if not done.is_set():
                task.cancel()
                # The generator closes on the loop: wait for it, unless this is the loop's
                # own thread (a generator collected there) or the loop stopped (at exit).
                if threading.current_thread() is not self.thread:
                    while not done.wait(0.5) and self.loop.is_running():
                        pass


_END: Any = object()


class _Handoff(Generic[T]):
    """Items from the loop thread to one blocking caller, at most ``ahead`` waiting."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ahead: int) -> None:
        self.loop = loop
        self.ahead = max(1, ahead)
        self.items: deque[Any] = deque()
        self.error: BaseException | None = None
        self.cond = threading.Condition(threading.Lock())
        self.room: asyncio.Future[None] | None = None
        """Set by the producer while the queue is full; the caller wakes it."""

    def put(self, item: Any) -> asyncio.Future[None] | None:
        """Loop thread: hand ``item`` over; a future to await when the queue is now full."""
        with self.cond:
            self.items.append(item)
            self.cond.notify()
            if len(self.items) < self.ahead:
                return None
            self.room = self.loop.create_future()
            return self.room

    def finish(self, error: BaseException | None) -> None:
        """Loop thread: no more items (``error``: the generator failed with it)."""
        with self.cond:
            self.error = error
            self.items.append(_END)
            self.cond.notify()

    def take(self) -> T:
        """Caller thread: the next item (``_END`` after the last), or the producer's error."""
        with self.cond:
            while not self.items:
                self.cond.wait()
            item = self.items.popleft()
            room, self.room = self.room, None
        if item is _END and self.error is not None:
            raise self.error
        if room is not None:
            self.loop.call_soon_threadsafe(_wake, room)
        return item  # type: ignore[no-any-return]


def _wake(room: asyncio.Future[None]) -> None:
    if not room.done():
        room.set_result(None)


async def _pump(agen: AsyncIterator[T], box: _Handoff[T], done: threading.Event) -> None:
    """Run ``agen`` into ``box`` until it ends, fails, or the caller stops (cancelled)."""
    try:
        try:
            async for item in agen:
                room = box.put(item)
                if room is not None:
                    await room
        except asyncio.CancelledError as exc:
            # The caller stopped (it waits for ``done``, not for an item), or something
            # cancelled the generator's work (the pool closing at exit): a caller waiting
            # for an item gets the cancellation, as a submitted coroutine's caller did.
            box.finish(exc)
            raise
        except BaseException as exc:
            box.finish(exc)
        else:
            box.finish(None)
        finally:
            with contextlib.suppress(Exception):
                await agen.aclose()  # type: ignore[attr-defined]
    finally:
        done.set()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


_pool: dict[ClientConfig, AsyncClient] = {}
_pool_pid = os.getpid()
_hooked_pid: int | None = None
_dying: int | None = None
"""The pid of a process whose exit-signal handler has started."""


def pooled(config: ClientConfig) -> AsyncClient:
    """The process's client for ``config`` (made on first use)."""
    global _pool_pid
    if _pool_pid != os.getpid():
        _pool.clear()
        _pool_pid = os.getpid()
    client = _pool.get(config)
    if client is None:
        client = _pool[config] = AsyncClient(config)
        _hook_exit()
    return client


def unpool(config: ClientConfig) -> AsyncClient | None:
    """Take ``config``'s client out of the pool (the caller closes it)."""
    return _pool.pop(config, None)


@atexit.register
def _close_pool() -> None:
    """Close every pooled connection of this process, within :data:`EXIT_GRACE`, and stop
    the loop thread. Only for the process's end: a forked child, which shares its parent's
    sockets, leaves them alone."""
    portal = Portal._instance
    if portal is None or portal.pid != os.getpid():
        return
    clients = list(_pool.values())
    _pool.clear()
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(_shutdown(clients), portal.loop).result(EXIT_GRACE + 1)
    # Stop the loop thread before the interpreter tears modules down under it (a daemon thread
    # still running native code at exit can crash the process).
    portal.loop.call_soon_threadsafe(portal.loop.stop)
    portal.thread.join(EXIT_GRACE)
    exit_signals.unwatch()


async def _shutdown(clients: list[AsyncClient]) -> None:
    # Subscriptions first: they would reconnect as soon as their connection closed.
    me = asyncio.current_task()
    running = [task for task in asyncio.all_tasks() if task is not me]
    for task in running:
        task.cancel()
    closing = [asyncio.ensure_future(client.close()) for client in clients]
    if running or closing:
        await asyncio.wait([*running, *closing], timeout=EXIT_GRACE)


def _hook_exit() -> None:
    """Make :func:`_close_pool` run first at exit, and on SIGTERM and SIGHUP.

    ``atexit`` runs the last registered first. ``weakref.finalize`` registers its own exit
    function on its first use, which ends every live channel handle (its GC backstop:
    a cancelled entrypoint, not a finished one), so make it register now and register ours
    after it. Signal handlers go only where the default action would skip ``atexit``, and
    only the main thread may set them (a process whose first client is made on another
    thread is hooked when the main thread makes one); the process then dies of the same
    signal as before. The loop thread makes sure the handler runs (:mod:`.exit_signals`)."""
    global _hooked_pid
    weakref.finalize(_close_pool, lambda: None).detach()
    atexit.unregister(_close_pool)
    atexit.register(_close_pool)
    if _hooked_pid == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    _hooked_pid = os.getpid()
    hooked = []
    for sig in EXIT_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _close_then_die)
                hooked.append(sig)
    if hooked:
        exit_signals.watch(Portal.get().loop, hooked, _handled)


def _handled(signum: int) -> bool:
    """Whether ``signum`` needs no more sending: our handler started, or is not its handler."""
    return _dying == os.getpid() or signal.getsignal(signum) is not _close_then_die


def _close_then_die(signum: int, frame: FrameType | None) -> None:
    global _dying
    if _dying == os.getpid():  # a repeat of the signal while the first one closes the pool
        return
    _dying = os.getpid()
    _close_pool()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
