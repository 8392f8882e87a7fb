"""What checking a data message's declared size costs, per batch, beside decoding it.

Run it as ``python -m benchmarks.bench_batch_check`` (a script, not a test). Every batch a
service receives in a write, and every batch a client receives in a scan, is first read
without decoding (``protocol.arrow.read_data_message``: the IPC frame, and for a compressed
body the length each buffer declares) so that a compression bomb is refused before anything
is decompressed. This measures that check on a ~1 MB batch of four columns (int64, string,
float64, list<int64>) for each body compression, next to the decode it guards
(``DataMessage.decode``: pyarrow's ``read_record_batch`` and ``RecordBatch.validate``) and
to the decode as it was before the check (``read_record_batch`` on the payload), all in the
same run. *decode* is the basic check (``check="sizes"``); *offsets* adds the check of every
string and list offset (what a client does for each batch of a scan), *full* the UTF-8 of
every string too (what the service does for each batch of a write). Each figure is the best of ``--repeat`` samples of a loop of at least
``--min-time`` seconds; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import pyarrow as pa

from aqueduct_spark import protocol as P

ROWS = 21_000  # about 1 MB of Arrow buffers


def batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"i": i, "s": f"row{i:06d}", "d": 1.5, "l": [i, i + 1]} for i in range(ROWS)]
    )


def seconds_per_call(fn: Callable[[], object], repeat: int, min_time: float) -> float:
    best = float("inf")
    for _ in range(repeat):
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < min_time:
            fn()
            calls += 1
        best = min(best, elapsed / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.3)
    args = parser.parse_args()
    data = batch()
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}, batch {data.nbytes:,} B")
    print(
        f"{'body':5} {'wire B':>9} {'check us':>9} {'decode us':>10} {'offsets us':>11} "
        f"{'full us':>8} {'before us':>10} {'check/decode':>13}"
    )
    for codec in ("none", "lz4", "zstd"):
        print(row(data, codec, args.repeat, args.min_time))


def row(data: pa.RecordBatch, codec: str, repeat: int, min_time: float) -> str:
    payload = bytes(P.batch_to_payload(data, P.ipc_options(codec)))  # a Gather, joined
    message = P.read_data_message(payload)
    check = seconds_per_call(lambda: P.read_data_message(payload), repeat, min_time)
    decode = seconds_per_call(lambda: message.decode(data.schema, check="sizes"), repeat, min_time)
    offsets = seconds_per_call(lambda: message.decode(data.schema), repeat, min_time)
    full = seconds_per_call(lambda: message.decode(data.schema, check="full"), repeat, min_time)
    before = seconds_per_call(
        lambda: pa.ipc.read_record_batch(pa.py_buffer(payload), data.schema), repeat, min_time
    )
    return (
        f"{codec:5} {len(payload):9,} {check * 1e6:9.1f} {decode * 1e6:10.1f} "
        f"{offsets * 1e6:11.1f} {full * 1e6:8.1f} {before * 1e6:10.1f} {check / decode:13.3f}"
    )


if __name__ == "__main__":
    main()
