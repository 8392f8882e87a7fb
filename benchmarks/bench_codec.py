"""Throughput of the wire codec on MESSAGE frames with a 1 MiB payload.

Run it as ``python -m benchmarks.bench_codec`` (a script, not a test). Every operation is
reported in GB/s of payload (10**9 bytes per second) next to a plain copy of the same payload
measured in the same run, so the ratio says how close the codec gets to memcpy speed:

- encode, the way a transport does it: ``message_parts(m)`` and then the payload appended to
  one ``bytearray`` send buffer; and ``encode_frame(m)``, which returns a fresh ``bytes``;
- decode: a :class:`StreamParser` fed the stream (ROUTE_TO + MESSAGE) in 16 KiB and 64 KiB
  chunks, as QUIC delivers it, and ``decode_frame`` of the whole frame.

Each figure is the median of ``--repeat`` samples; a sample runs the operation in a loop for
at least ``--min-time`` seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

from aqueduct_core.wire import (
    Attachment,
    Message,
    RouteTo,
    StreamParser,
    decode_frame,
    encode_frame,
    encode_frames,
    message_parts,
)

MiB = 1024 * 1024
KiB = 1024


def seconds_per_call(fn: Callable[[], object], repeat: int, min_time: float) -> float:
    """Median time of one call of ``fn``, over ``repeat`` samples of at least ``min_time``."""
    loops = 1
    while True:
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        if time.perf_counter() - start >= min_time:
            break
        loops *= 2
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        samples.append((time.perf_counter() - start) / loops)
    return statistics.median(samples)


def chunked(data: bytes, size: int) -> list[bytes]:
    """The stream as QUIC hands it over: separate ``bytes`` objects of ``size`` bytes."""
    return [data[i : i + size] for i in range(0, len(data), size)]


def build_cases(payload: bytes) -> list[tuple[str, Callable[[], object]]]:
    message = Message(7, ((b"codec-1a2b3c", b"arrow"),), (Attachment(16),), payload)
    frame = encode_frame(message)
    stream = encode_frames(RouteTo(8), message)
    expected = [RouteTo(8), message]

    def feed_all(chunks: list[bytes]) -> list[object]:
        parser = StreamParser()
        frames: list[object] = []
        for chunk in chunks:
            frames += parser.feed(chunk)
        parser.finish()
        return frames

    chunks_16k = chunked(stream, 16 * KiB)
    chunks_64k = chunked(stream, 64 * KiB)
    # Check every decoder once, outside the timing, so the figures are for correct work.
    assert feed_all(chunks_16k) == expected
    assert feed_all(chunks_64k) == expected
    assert decode_frame(frame) == message

    def encode_into_send_buffer() -> bytearray:
        buf = bytearray()
        buf += message_parts(message)
        buf += message.payload
        return buf

    assert encode_into_send_buffer() == frame

    return [
        ("copy: bytearray(payload)  [reference]", lambda: bytearray(payload)),
        ("copy: bytes(bytearray(payload))", lambda: bytes(bytearray(payload))),
        ("encode: message_parts + payload into bytearray", encode_into_send_buffer),
        ("encode: encode_frame", lambda: encode_frame(message)),
        ("decode: StreamParser, 16 KiB chunks", lambda: feed_all(chunks_16k)),
        ("decode: StreamParser, 64 KiB chunks", lambda: feed_all(chunks_64k)),
        ("decode: decode_frame (whole frame)", lambda: decode_frame(frame)),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=MiB, help="payload bytes (default 1 MiB)")
    parser.add_argument("--repeat", type=int, default=7, help="samples per figure (default 7)")
    parser.add_argument(
        "--min-time", type=float, default=0.1, help="seconds per sample (default 0.1)"
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    payload = os.urandom(args.size)
    cases = build_cases(payload)
    results = [
        (name, args.size / seconds_per_call(fn, args.repeat, args.min_time) / 1e9)
        for name, fn in cases
    ]
    reference = results[0][1]

    print(
        f"Aqueduct wire codec, MESSAGE with a {args.size / MiB:g} MiB payload "
        f"(median of {args.repeat}; GB/s = 10**9 payload bytes/s)"
    )
    print(f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}")
    width = max(len(name) for name, _ in results)
    print(f"{'operation':<{width}}  {'GB/s':>7}  {'vs copy':>7}")
    print(f"{'-' * width}  {'-' * 7}  {'-' * 7}")
    for name, gbps in results:
        print(f"{name:<{width}}  {gbps:7.2f}  {gbps / reference:7.2f}")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(
                {
                    "payload_bytes": args.size,
                    "results": {n: {"GBps": g, "vs_copy": g / reference} for n, g in results},
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
