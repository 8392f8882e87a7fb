"""The copying data path as it was before issue 28's copy work, for the real-path benchmark's
``-copies`` variants: the same service and client, with three functions put back as they
were (commit cff53ce), so one run measures the old path against the new one.

* the sender joins each Arrow IPC message into one buffer: ``batch.serialize()`` uncompressed,
  compressed bodies collected through a Python file object and joined (new: a ``Gather`` of
  the batch's own buffers, sent part by part);
* the receiver gathers each payload into a fresh ``bytearray`` (new: a pooled buffer,
  ``aqueduct_spark.protocol.buffers``);
* a blocking read submits one coroutine to the loop thread per batch (new: one task hands
  batches over, one ahead).

``python -m benchmarks.realpath_oldpath serve ...`` runs ``aqueduct serve ...`` that way;
:func:`old_path` switches this process's client to it for the duration of a ``with``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any


class _Collect:
    """A write-only file for pyarrow that keeps what is written (as before: copied)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> int:
        self.chunks.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def old_batch_to_payload(batch: Any, options: Any) -> Any:
    import pyarrow as pa

    if options.compression is None:
        return batch.serialize()
    sink = _Collect()
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), batch.schema, options=options) as w:
        w.write_batch(batch.slice(0, 0))
        sink.chunks.clear()
        w.write_batch(batch)
        message = b"".join(sink.chunks)
    return message


def no_pooled_buffers(self: Any, size: int, headers: Any) -> None:
    return None


def old_iterate(self: Any, agen: AsyncIterator[Any], ahead: int = 1) -> Iterator[Any]:
    try:
        while True:
            try:
                yield self.run(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        with contextlib.suppress(Exception):
            self.run(agen.aclose())  # type: ignore[attr-defined]


def _targets() -> list[tuple[Any, str, Any]]:
    from aqueduct_spark import protocol
    from aqueduct_spark.client.pool import Portal
    from aqueduct_spark.protocol import arrow
    from aqueduct_spark.protocol.buffers import BufferPool

    return [
        (arrow, "batch_to_payload", old_batch_to_payload),
        (protocol, "batch_to_payload", old_batch_to_payload),
        (BufferPool, "for_channel", no_pooled_buffers),
        (Portal, "iterate", old_iterate),
    ]


@contextlib.contextmanager
def old_path() -> Iterator[None]:
    """This process sends, receives and hands over batches the old way meanwhile (connections
    made meanwhile keep the old receive path: their engine configuration holds it)."""
    saved = []
    for owner, name, old in _targets():
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, old)
    try:
        yield
    finally:
        for owner, name, new in saved:
            setattr(owner, name, new)


def main(argv: list[str]) -> int:
    for owner, name, old in _targets():
        setattr(owner, name, old)
    from aqueduct_spark.cli import main as cli

    return cli(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
