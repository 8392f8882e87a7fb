"""Receive buffers for data messages, reused while nothing refers to them.

A scan's batches arrive as Arrow IPC messages of a few MiB, each gathered into one buffer
and decoded in place (zero-copy): the record batch the caller gets *is* views of that buffer.
A fresh buffer per message cost the client more than receiving it (profiled: 11-14% of its
CPU in page faults of new memory, and unmapping it again when freed). Here a message is
gathered into a buffer from a pool, and the buffer goes back to the pool only when the last
Arrow object viewing it is gone:

* The payload handed out is a ``pyarrow.Buffer`` made with ``pa.foreign_buffer(address,
  size, base=lease)``: Arrow keeps ``lease`` (a Python object) alive as long as that buffer,
  any slice of it, any array or record batch decoded from it, or any memoryview of those,
  is alive. Only when the last of them goes does ``lease`` die, and its finalizer returns
  the memory to the pool. So a caller that keeps a batch keeps its memory; nothing can
  reuse a buffer while anything still sees it.
* The engine asks for a buffer only once the message's whole length is charged to the
  channel's flow-control window (``EngineConfig.payload_buffers``), so what is in use is
  bounded by what this side granted, never by what a peer announces; what the pool keeps
  idle is bounded by :attr:`BufferPool.max_idle` bytes.

Buffers come in size classes a quarter of an octave apart (a message gets the class above
its size, at most 19% more), so the messages of one scan, of nearly one size, reuse each
other's buffers.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aqueduct_core.api.codec import CODEC_HEADER

if TYPE_CHECKING:
    import pyarrow as pa

IDLE_BYTES = 64 * 1024 * 1024
"""Bytes of idle buffers a pool keeps for reuse (beyond that, returned buffers are freed)."""
_STEPS = 4
"""Size classes per doubling."""


def size_class(n: int) -> int:
    """The buffer size a payload of ``n`` bytes gets: the smallest 2**(k/4) at or above it,
    rounded up to 4 KiB (a page)."""
    k = math.ceil(math.log2(max(n, 1)) * _STEPS)
    size = math.ceil(2 ** (k / _STEPS))
    if size < n:  # floating point at a class boundary
        size = n
    return -(-size // 4096) * 4096


class _Lease:
    """Lives exactly as long as Arrow holds the payload made from one pooled buffer."""

    __slots__ = ("__weakref__",)


class BufferPool:
    """Buffers for incoming data messages (see the module's documentation). Thread-safe:
    payloads are released wherever their last batch is dropped (a Spark worker's thread, the
    event loop's)."""

    def __init__(self, max_idle: int = IDLE_BYTES) -> None:
        self.max_idle = max_idle
        self._idle: dict[int, list[bytearray]] = {}
        self._idle_bytes = 0
        self._lock = threading.RLock()  # a finalizer may run in a thread holding it
        self.made = 0
        """Buffers allocated fresh (not reused) so far."""
        self.reused = 0
        """Buffers handed out again after their payload was released."""
        self.in_use = 0
        """Bytes of buffers handed out and not yet released."""

    @property
    def idle_bytes(self) -> int:
        return self._idle_bytes

    def buffer(self, size: int) -> tuple[memoryview, pa.Buffer]:
        """A writable view of ``size`` bytes and the payload to hand out for it."""
        import pyarrow as pa  # here, not at import: the client's config imports this module

        cls = size_class(size)
        with self._lock:
            free = self._idle.get(cls)
            memory = free.pop() if free else None
            if memory is not None:
                self._idle_bytes -= cls
                self.reused += 1
            else:
                self.made += 1
            self.in_use += cls
        if memory is None:
            memory = bytearray(cls)
        lease = _Lease()
        weakref.finalize(lease, self._release, memory).atexit = False
        address = pa.py_buffer(memory).address  # stable: a pooled bytearray never resizes
        payload = pa.foreign_buffer(address, size, base=lease)
        return memoryview(memory)[:size], payload

    def _release(self, memory: bytearray) -> None:
        """The last Arrow object viewing ``memory`` is gone: keep it for reuse, within
        :attr:`max_idle`."""
        cls = len(memory)
        with self._lock:
            self.in_use -= cls
            if self._idle_bytes + cls > self.max_idle:
                return
            self._idle.setdefault(cls, []).append(memory)
            self._idle_bytes += cls

    def for_channel(self, size: int, headers: Sequence[tuple[bytes, bytes]]) -> Any:
        """``EngineConfig.payload_buffers``: buffers for data channels (the ``raw`` codec's
        Arrow messages) only; other messages (CBOR requests and replies) are small and
        decoded at once."""
        if (CODEC_HEADER, b"raw") not in headers:
            return None
        return self.buffer(size)


POOL = BufferPool()
"""The process's pool: the client's connections and the service's share it."""
