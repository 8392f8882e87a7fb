"""What issue 28's copy work saves at each stage, in CPU seconds per GB of Arrow data, against
the code of before it (``benchmarks/realpath_oldpath.py``) in the same run.

    python -m benchmarks.bench_copies [--rows N] [--repeat K]

The end-to-end figures come from ``bench_realpath --copies`` (two namespaces, TCP and QUIC,
CPU s/GB at each end); this script isolates the stages the work changed, in one process,
so that they can be read under load (CPU time of this process, best of ``--repeat``, new
and old taking turns):

* send: encoding a scan's batch as the message the transport is handed (new: a ``Gather`` of
  the batch's buffers; old: ``serialize()`` or the joined compressed message), none and lz4;
* receive: gathering a message that arrives in 64 KiB pieces (as TLS records are read) and
  decoding it, then dropping the batch (new: a pooled buffer; old: a fresh ``bytearray``);
* hand-off: a blocking caller taking batches from the client's loop thread (new: one task
  hands them over, one ahead; old: one coroutine submitted per batch).

Batches are the taxi table's (``benchmarks/taxi.py``), 65,536 rows each as the service
scans them.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pyarrow as pa

from aqueduct_core.wire import Gather, Message, RouteTo, StreamParser, encode_frames
from aqueduct_spark import protocol as P
from aqueduct_spark.client.pool import Portal
from aqueduct_spark.protocol.buffers import BufferPool
from benchmarks.realpath_oldpath import old_batch_to_payload, old_iterate
from benchmarks.taxi import taxi_table

PIECE = 64 * 1024


def cpu_per_gb(fns: list[Callable[[], None]], nbytes: int, repeat: int) -> list[float]:
    """Each of ``fns``' best CPU seconds per GB, run in turn ``repeat`` times (interleaved,
    so that a change in load hits them alike)."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            gc.collect()
            start = time.process_time()
            fn()
            best[i] = min(best[i], time.process_time() - start)
    return [b / (nbytes / 1e9) for b in best]


def send(
    batches: list[pa.RecordBatch], codec: str, encode: Callable[..., Any]
) -> Callable[[], None]:
    options = P.ipc_options(codec)

    def run() -> None:
        for batch in batches:
            payload = encode(batch, options)
            # what the engine's sender then touches: the parts (new) or the one buffer (old)
            parts = payload.parts if isinstance(payload, Gather) else (memoryview(payload),)
            for part in parts:
                len(part)

    return run


def receive(batches: list[pa.RecordBatch], pool: BufferPool | None) -> Callable[[], None]:
    schema = batches[0].schema
    streams = []
    for batch in batches:
        message = bytes(P.batch_to_payload(batch, P.ipc_options("none")))
        data = encode_frames(RouteTo(8), Message(0, payload=message))
        streams.append([data[i : i + PIECE] for i in range(0, len(data), PIECE)])

    def run() -> None:
        for pieces in streams:
            parser = StreamParser()
            frames: list[Any] = parser.feed(pieces[0])
            if pool is not None and parser.head is not None:
                parser.gather_into(*pool.buffer(parser.head.payload_len))
            for piece in pieces[1:]:
                if not parser.absorb(piece):
                    frames += parser.feed(piece)
            payload = frames[-1].payload
            batch = P.read_data_message(payload).decode(schema)
            del batch, payload, frames

    return run


def handoff(batches: list[pa.RecordBatch], iterate: Callable[..., Any]) -> Callable[[], None]:
    portal = Portal.get()

    async def items() -> AsyncIterator[pa.RecordBatch]:
        for batch in batches:
            yield batch

    def run() -> None:
        for _ in iterate(portal, items()):
            pass

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    batches = taxi_table(args.rows).combine_chunks().to_batches(max_chunksize=65536)
    nbytes = sum(b.nbytes for b in batches)
    print(
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {len(batches)} batches, "
        f"{nbytes / 1e6:.0f} MB of Arrow (taxi), CPU s/GB, best of {args.repeat}"
    )
    print(f"{'stage':24} {'new':>7} {'old':>7} {'saved':>7}")
    rows = [
        (
            f"send, {codec}",
            send(batches, codec, P.batch_to_payload),
            send(batches, codec, old_batch_to_payload),
        )
        for codec in ("none", "lz4")
    ]
    rows.append(("receive + decode", receive(batches, BufferPool()), receive(batches, None)))
    rows.append(
        ("hand-off to the caller", handoff(batches, Portal.iterate), handoff(batches, old_iterate))
    )
    for name, new, old in rows:
        a, b = cpu_per_gb([new, old], nbytes, args.repeat)
        print(f"{name:24} {a:7.3f} {b:7.3f} {b - a:7.3f}", flush=True)


if __name__ == "__main__":
    main()
