"""Payloads without extra copies (issue 28, item 2), and what they must not change:

- a :class:`Gather` payload (an Arrow IPC message's metadata and the batch's own buffers)
  goes to the transport part by part, the parts themselves, and arrives byte for byte;
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from aqueduct_core.api import channel
from aqueduct_core.engine import WriteStream
from aqueduct_core.testing.memory import memory_pair
from aqueduct_core.wire import Gather
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
