"""An exit signal's Python handler runs even when the main thread sits in a blocking call.

CPython runs a Python signal handler on the main thread, between two bytecodes. Its C
handler only notes the signal, and a blocking system call that the signal interrupts
(``EINTR``) makes the main thread check those notes. A signal that comes after the main
thread's last check and before it enters the call (``print("ready")`` then
``sys.stdin.readline()``: microseconds, or longer when the thread is descheduled there on a
busy machine) interrupts nothing, so the call then waits as if no signal had come and the
handler runs only when it returns, which for a process waiting on input that never comes is
never. Measured with a bare ``signal.signal`` handler: 4 of 1,000 children sent SIGHUP 0-0.5
ms after their ready line did not die (the pool's SIGHUP test hung so once in CI).

So the loop thread watches CPython's wakeup file descriptor (``signal.set_wakeup_fd``: the C
handler writes each signal's number into it at once, whichever thread it runs on). For an
exit signal whose handler has not started :data:`REPOKE` seconds later, it sends the same
signal again, to the main thread alone: that interrupts the blocking call, and CPython runs
the handler. Only while nobody else uses the wakeup fd: an event loop in the main thread that
installs its own (asyncio's ``add_signal_handler``, uvloop) is woken by it already.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
from collections.abc import Callable, Collection

REPOKE = 0.1
"""Seconds after an exit signal before it is sent again to a main thread that has not
started its handler (a handler normally starts within microseconds)."""

_watch: tuple[int, socket.socket, socket.socket] | None = None
"""(pid, reader, writer) of this process's wakeup socket pair, once watched."""


def watch(
    loop: asyncio.AbstractEventLoop, signals: Collection[int], settled: Callable[[int], bool]
) -> None:
    """From the main thread: have ``loop`` (running in another thread) re-send any of
    ``signals`` to the main thread until ``settled(signum)`` says its handler has started
    (or is no longer the one to wait for)."""
    global _watch
    if _watch is not None and _watch[0] == os.getpid():
        return
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        previous = None
    if previous != -1:  # another thread than ours, or someone else's wakeup fd: leave it
        if previous is not None:
            signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()
        return
    _watch = (os.getpid(), reader, writer)
    wanted = frozenset(signals)
    loop.call_soon_threadsafe(loop.add_reader, reader.fileno(), _heard, loop, wanted, settled)


def _heard(
    loop: asyncio.AbstractEventLoop, wanted: frozenset[int], settled: Callable[[int], bool]
) -> None:
    if _watch is None:
        return
    try:
        data = _watch[1].recv(4096)
    except (BlockingIOError, InterruptedError):
        return
    for signum in wanted.intersection(data):
        loop.call_later(REPOKE, _repoke, signum, settled)


def _repoke(signum: int, settled: Callable[[int], bool]) -> None:
    main = threading.main_thread()
    if settled(signum) or not main.is_alive() or main.ident is None:
        return
    signal.pthread_kill(main.ident, signum)  # its C handler writes to the wakeup fd again


def unwatch() -> None:
    """Stop watching and close the socket pair (at exit, with the loop stopped)."""
    if _watch is not None and _watch[0] == os.getpid():
        _forget()


def _forget_in_child() -> None:
    """A forked child shares the socket pair: a signal the child got would wake the parent's
    loop thread, which would then signal the parent. The child stops using it."""
    if _watch is not None:
        _forget()


def _forget() -> None:
    global _watch
    assert _watch is not None
    _, reader, writer = _watch
    _watch = None
    try:
        previous = signal.set_wakeup_fd(-1)
        if previous not in (-1, writer.fileno()):
            signal.set_wakeup_fd(previous)  # someone else's: theirs again
    except ValueError:
        pass
    reader.close()
    writer.close()


os.register_at_fork(after_in_child=_forget_in_child)
