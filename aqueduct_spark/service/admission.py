"""What one connection may have in flight, and whose blocking work runs next.

One busy client must not slow the others down, and its work must end with its connection.
Three mechanisms, each answering one way a client could take more than its share:

- **Requests in flight** (:class:`Session`, ``max_requests`` per connection). The service
  reads a connection's next request only while fewer than ``max_requests`` of its requests
  are being served. Beyond that the requests wait unread, and the entrypoint's flow-control
  window (``request_window`` bytes, much less than other channels get) stops the client from
  sending more: a burst of requests is queued in the client, not refused, and the service
  holds (and has parsed) at most ``request_window`` bytes of it. Nothing of a queued request
  is decoded, logged or counted until it is read; a client killed mid-burst leaves at most
  ``max_requests`` running and that window queued.
- **Open scans** (``max_scans`` per connection). A scan holds buffers in the service until
  its reader takes the batches (``docs/operations.md``, memory bounds), so a client that
  opens scans and never reads them would pin memory without end. A scan beyond the limit is
  refused with ``UNAVAILABLE``, whose ``retry_after`` detail tells the client to wait and
  try again (the Python client does); refused, not queued, because a client that waits for
  a scan it cannot start while holding ones it does not read would hang without a word.
- **Worker threads** (:class:`FairPool`). Delta Lake and Parquet calls block, so they run in
  threads. ``asyncio.to_thread`` feeds one FIFO queue, where 20,000 requests of one client
  sit ahead of everybody else's. Here each connection waits in its own queue, a free
  thread goes to the connections in turn (round robin), and no connection runs more than
  a quarter of the threads (at least one) at once: another client's request finds a thread
  free, not behind the flood.

When a connection closes, everything it started is cancelled at once: calls still waiting
for a thread never run, and a call already running finishes its current step only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from aqueduct_core.engine import EngineConfig
from aqueduct_spark.protocol.buffers import POOL

T = TypeVar("T")

DEFAULT_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""Worker threads of the service (``ThreadPoolExecutor``'s own default)."""
REQUEST_WINDOW = 256 * 1024
"""Bytes of requests a connection may send ahead of those being served (``--request-window``):
about 60 small requests (each costs its size plus 4 KiB for the reply channel it carries,
profile §4), or 15-25 scans or writes with their schemas."""


def engine_config(engine: EngineConfig, request_window: int, max_batch_bytes: int) -> EngineConfig:
    """The engine settings of the service's connections: flow control required (the
    service's memory bounds rest on it), ``request_window`` of credit on the entrypoint,
    and data messages of ``max_batch_bytes`` accepted. A lower ``max_batch_bytes`` never
    lowers the engine's payload limit, which every message of the connection is held to
    (requests, replies, plans): the batch limit is checked per data message, by name."""
    engine = replace(
        engine,
        payload_buffers=engine.payload_buffers or POOL.for_channel,  # writes' batches
        require_flow_control=True,
        entry_window=request_window,
        entry_window_setting="aqueduct serve --request-window",
    )
    if engine.limits.max_payload_bytes < max_batch_bytes:
        limits = replace(engine.limits, max_payload_bytes=max_batch_bytes)
        engine = replace(engine, limits=limits)
    return engine


class FairPool:
    """Runs blocking calls in ``threads`` worker threads, taking turns between owners
    (connections) instead of first come, first served. One owner runs at most a quarter of
    the threads (at least one) at once, so another always finds one free rather than waiting
    for a call to end (and fewer threads of one client contend for the GIL with the event
    loop)."""

    def __init__(self, threads: int = DEFAULT_THREADS) -> None:
        if threads < 1:
            raise ValueError(f"a pool needs at least one thread, got {threads}")
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="aqueduct-service")
        self._free = threads
        self._per_owner = max(1, threads // 4)
        self._running: dict[object, int] = {}
        self._waiting: OrderedDict[object, deque[asyncio.Future[None]]] = OrderedDict()

    async def run(self, owner: object, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread, once it is ``owner``'s turn."""
        loop = asyncio.get_running_loop()
        if self._free > 0 and owner not in self._waiting and self._may_run(owner):
            self._take(owner)
        else:
            turn: asyncio.Future[None] = loop.create_future()
            self._waiting.setdefault(owner, deque()).append(turn)
            try:
                await turn  # _dispatch took the thread for us before waking us
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._release(owner)  # handed a thread as we were cancelled: pass it on
                raise
        job: Future[T] = self._executor.submit(fn, *args)
        # The thread is free when the call has ended, not when our await is cancelled.
        job.add_done_callback(lambda _: _call_soon(loop, self._release, owner))
        return await asyncio.wrap_future(job)

    def forget(self, owner: object) -> None:
        """Drop every call of ``owner`` still waiting for a thread (its connection closed;
        their tasks are being cancelled)."""
        for turn in self._waiting.pop(owner, ()):
            turn.cancel()

    def _may_run(self, owner: object) -> bool:
        return self._running.get(owner, 0) < self._per_owner

    def _take(self, owner: object) -> None:
        self._free -= 1
        self._running[owner] = self._running.get(owner, 0) + 1

    def _release(self, owner: object) -> None:
        self._free += 1
        left = self._running[owner] - 1
        if left:
            self._running[owner] = left
        else:
            del self._running[owner]
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free threads to waiting owners in turn (round robin), skipping owners at
        their share and calls that were cancelled while they waited."""
        while self._free > 0:
            owner = next((o for o in self._waiting if self._may_run(o)), None)
            if owner is None:
                return
            queue = self._waiting[owner]
            turn = queue.popleft()
            if queue:
                self._waiting.move_to_end(owner)
            else:
                del self._waiting[owner]
            if not turn.done():
                self._take(owner)
                turn.set_result(None)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop has closed: the service is gone
        loop.call_soon_threadsafe(callback, *args)


class Session:
    """The requests of one connection: how many are being served, how many scans are open,
    and the tasks serving them (cancelled together when the connection closes)."""

    def __init__(self, max_requests: int, max_scans: int) -> None:
        self.max_requests = max_requests
        self.max_scans = max_scans
        self.slots = asyncio.Semaphore(max_requests)
        self.tasks: set[asyncio.Task[None]] = set()
        self.scans = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self, coro: Any) -> None:
        """Serve one request (a slot was acquired for it)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.slots.release()
        if not self.tasks:
            self._idle.set()

    async def idle(self) -> None:
        """Wait until no request is being served."""
        await self._idle.wait()

    async def cancel(self) -> None:
        """Cancel every request still being served and wait until they have ended."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
