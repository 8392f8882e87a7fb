"""Payloads without extra copies (issue 28, item 2), and what they must not change:

- a :class:`Gather` payload (an Arrow IPC message's metadata and the batch's own buffers)
  goes to the transport part by part, the parts themselves, and arrives byte for byte;
- ``EngineConfig.payload_buffers`` gathers a large incoming MESSAGE into the buffer it gives,
  but only once the message's whole cost lies within what this side granted, never for a
  message the progress rule lets past the window, never for a small one; a stream reset
  mid-message lets go of the buffer.
"""

from __future__ import annotations

import asyncio
import gc
import os
import weakref
from typing import Any

import pytest

from aqueduct_core.api import channel
from aqueduct_core.engine import EngineConfig, WriteStream
from aqueduct_core.testing.memory import memory_pair
from aqueduct_core.wire import Gather, Message, RouteTo, StreamParser, encode_frames
from aqueduct_core.wire.frames import joined

KIB = 1024


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_gather_is_its_parts_joined_and_nothing_is_copied_to_make_it() -> None:
    body = bytearray(os.urandom(100 * KIB))
    g = Gather([b"head", memoryview(body), b"", b"tail"])
    assert len(g) == 4 + len(body) + 4 and len(g.parts) == 3  # empty parts dropped
    assert bytes(g) == b"head" + body + b"tail" and g == bytes(g)
    assert joined(g) == bytes(g) and joined(b"x") == b"x"
    assert all(p.readonly for p in g.parts)  # the transport may not write into a batch
    body[0] ^= 0xFF  # a view, not a copy: the part sees the batch's memory
    assert g.parts[1][0] == body[0]


@pytest.mark.parametrize(
    "sizes",
    [
        [10, 20],  # small: joined with the frame head into one write
        [200, 300 * KIB, 4, 50 * KIB, 6],  # metadata, buffers, padding
        [40 * KIB, 200 * KIB],  # a first part too large to ride with the head
    ],
)
def test_a_gather_crosses_byte_for_byte_as_its_own_parts(sizes: list[int]) -> None:
    parts = [os.urandom(n) for n in sizes]
    whole = b"".join(parts)

    async def main() -> None:
        async with memory_pair() as pair:
            writes: list[Any] = []
            driver = pair.client._driver
            execute = driver.execute

            def recording(commands: list[Any]) -> None:
                writes.extend(c for c in commands if isinstance(c, WriteStream))
                execute(commands)

            driver.execute = recording  # type: ignore[method-assign]
            tx, rx = channel(codec="raw")
            await pair.client.entrypoint.send({"in": rx})
            inbox = (await pair.entrypoint_receiver.recv())["in"]
            await tx.send(Gather(parts))
            tx.finish()
            got = [bytes(m) async for m in inbox]
            assert got == [whole]
            if len(whole) > 16 * KIB:
                # every large part went out as itself (a view of the sender's object)
                large = [p for p in parts if len(p) > 16 * KIB]
                sent = [w.data for w in writes if len(w.data) > 16 * KIB]
                assert [bytes(s) for s in sent] == large
                assert all(isinstance(s, memoryview) and s.obj in large for s in sent)

    run(main())


class Buffers:
    """A ``payload_buffers`` that records its calls and hands out bytearrays."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.owners: list[weakref.ref[Any]] = []

    def __call__(self, size: int, headers: Any) -> tuple[memoryview, Any]:
        self.calls.append(size)
        owner = Owner(size)
        self.owners.append(weakref.ref(owner))
        return memoryview(owner), owner


class Owner(bytearray):
    """A payload object that is not the engine's own type (as a pooled pyarrow Buffer)."""


def test_large_messages_within_the_window_land_in_the_given_buffers() -> None:
    buffers = Buffers()
    big, small = os.urandom(300 * KIB), os.urandom(10 * KIB)
    config = EngineConfig(payload_buffers=buffers, flow_window=1024 * KIB)

    async def main() -> None:
        async with memory_pair(config=config) as pair:
            tx, rx = channel(codec="raw")
            await pair.client.entrypoint.send({"in": rx})
            inbox = (await pair.entrypoint_receiver.recv())["in"]
            await tx.send(big)
            await tx.send(small)
            tx.finish()
            got = [m async for m in inbox]
            assert type(got[0]) is Owner and bytes(got[0]) == big
            assert type(got[1]) is not Owner and bytes(got[1]) == small

    run(main())
    assert buffers.calls == [len(big)]


def test_a_message_beyond_the_window_is_not_given_a_buffer_of_its_claimed_size() -> None:
    """The progress rule lets one message larger than the window through alone; memory for
    it then grows with what arrives, not with what its head claims."""
    buffers = Buffers()
    config = EngineConfig(payload_buffers=buffers, flow_window=128 * KIB)
    big = os.urandom(400 * KIB)

    async def main() -> None:
        async with memory_pair(config=config) as pair:
            tx, rx = channel(codec="raw")
            await pair.client.entrypoint.send({"in": rx})
            inbox = (await pair.entrypoint_receiver.recv())["in"]
            await tx.send(big)
            tx.finish()
            assert [bytes(m) async for m in inbox] == [big]

    run(main())
    assert buffers.calls == []


def test_a_reset_mid_message_lets_go_of_the_buffer() -> None:
    payload = os.urandom(200 * KIB)
    data = encode_frames(RouteTo(8), Message(0, payload=payload))
    parser = StreamParser()
    assert parser.feed(data[:1000]) == [RouteTo(8)]
    buffers = Buffers()
    parser.gather_into(*buffers(len(payload), ()))
    assert parser.absorb(data[1000:5000])
    parser.reset()
    gc.collect()
    assert buffers.owners[0]() is None
    with pytest.raises(ValueError):  # nothing is being gathered now
        parser.gather_into(memoryview(bytearray(10)), object())


def test_bytes_before_the_buffer_was_given_are_kept() -> None:
    payload = os.urandom(200 * KIB)
    data = encode_frames(RouteTo(8), Message(3, payload=payload))
    parser = StreamParser()
    parser.feed(data[:70_000])  # the head and some payload
    buffers = Buffers()
    parser.gather_into(*buffers(len(payload), ()))
    frames = parser.feed(data[70_000:])
    assert len(frames) == 1 and isinstance(frames[0], Message)
    assert type(frames[0].payload) is Owner and bytes(frames[0].payload) == payload
