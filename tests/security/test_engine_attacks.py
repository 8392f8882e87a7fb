"""Protocol-level attacks on a real ``aqueduct serve`` over real QUIC (issue 13).

Each test connects an honest client (the victim), measures the service idle, then lets a raw
QUIC client without the service's token send crafted Aqueduct frames, and checks what a user
would notice: the server's memory (its peak RSS stays within 50 MB of idle, plus what flow
control legitimately grants), the victim's ``ls`` (answered within ten times its unloaded
latency), and the server process still alive. Where the fix cuts the attacker off, the test
checks that too: the server closes it with a protocol or limit error, not a timeout.

The server runs with its address space capped at idle + 2 GiB, so a regression fails here
(MemoryError in the server, a slow or failed ``ls``) rather than taking the machine down.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import (
    BUDGET,
    MEMORY_SLACK,
    MIB,
    REQUEST,
    Attacker,
    Target,
    assert_cut_off,
    attacked,
    run,
    unfinished_messages_attack,
)

from aqueduct_core.engine import EngineConfig
from aqueduct_core.wire import Message, RouteTo, Version, encode_frames

pytestmark = [pytest.mark.quic, pytest.mark.timeout(120)]

HUGE = 1 << 40
"""A message number far beyond anything sent: the receiver's cursor is 0."""


# -- (a) one MESSAGE numbered 2**40 ------------------------------------------------------


def test_one_datagram_with_a_huge_message_number_before_the_headers(target: Target) -> None:
    """Issue 13's critical finding: right after the QUIC handshake, one datagram with
    ROUTE_TO 0 and MESSAGE 2**40 (then the headers, without a token) drove the server to
    11-20 GB: its acks were built as a list of every number from 0 to 2**40."""

    async def huge_number_in_a_datagram(attacker: Attacker) -> None:
        attacker.datagram(encode_frames(Version(), RouteTo(0), Message(HUGE, payload=REQUEST)))
        attacker.hello()

    assert_cut_off(run(attacked(target, huge_number_in_a_datagram, cut_off=True)))


def test_one_datagram_with_a_huge_message_number_after_the_headers(target: Target) -> None:
    async def huge_number_after_headers(attacker: Attacker) -> None:
        attacker.hello()
        await attacker.wait_server_headers()
        attacker.datagram(encode_frames(RouteTo(0), Message(HUGE, payload=REQUEST)))

    assert_cut_off(run(attacked(target, huge_number_after_headers, cut_off=True)))


def test_a_huge_reliable_message_number_on_a_stream(target: Target) -> None:
    async def huge_number_on_a_stream(attacker: Attacker) -> None:
        attacker.stream(
            encode_frames(Version(), RouteTo(0), Message(HUGE, payload=REQUEST)), end=True
        )
        attacker.hello()

    assert_cut_off(run(attacked(target, huge_number_on_a_stream, cut_off=True)))


# -- (b) a message that never finishes -----------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "announced", "flow_window"),
    [
        pytest.param(1, 1 << 30, None, id="one-1GiB-message"),
        pytest.param(1, 1 << 30, 16 * MIB, id="one-1GiB-message-flow-control"),
        pytest.param(16, 64 * MIB, 16 * MIB, id="1GiB-over-16-messages-of-64MiB-flow-control"),
    ],
)
def test_messages_that_never_finish_hold_no_more_than_the_grant(
    target: Target, messages: int, announced: int, flow_window: int | None
) -> None:
    """Issue 13's high finding: bytes of an unfinished message were charged to nothing, so a
    peer that announced a large MESSAGE and never finished it grew the receiver without
    bound. Now they are charged when the head arrives; the most one channel may hold is
    one message of the largest payload (the progress rule), 64 MiB. (The same without flow
    control: ``test_engine_unbounded.py``.)"""
    closed = run(unfinished_messages_attack(target, messages, announced, flow_window))
    assert_cut_off(closed)


# -- (c) data before the connection headers -------------------------------------------------


def test_data_before_the_connection_headers_is_capped(target: Target) -> None:
    """Issue 13: frames that arrive before the peer's CONNECTION_HEADERS wait for them, and
    nothing capped how many. A peer that never sends its headers is now cut off after
    ``max_early_bytes`` (16 MiB), long before the 10 s handshake timeout."""
    allowance = EngineConfig().max_early_bytes
    payload = b"\x5a" * (1 * MIB - 64)

    async def no_headers_ever(attacker: Attacker) -> None:
        idle = target.memory.rss
        num = 0
        while attacker.sent < BUDGET and not attacker.gone:
            frames = [Version(), RouteTo(0)]
            frames += [Message(num + i, payload=payload) for i in range(4)]
            num += 4
            attacker.stream(encode_frames(*frames), end=True)
            if not await attacker.flush(4 * MIB, stall=3.0):
                return
            if target.memory.rss - idle > MEMORY_SLACK + allowance:
                return

    closed = run(attacked(target, no_headers_ever, allowance=allowance, cut_off=True))
    assert_cut_off(closed)


def test_datagrams_before_the_connection_headers_count_against_the_cap(target: Target) -> None:
    """The same cap for datagrams: each is held (its frames parsed) until the headers."""
    allowance = EngineConfig().max_early_bytes
    payload = b"\x5a" * 8000

    async def datagrams_without_headers(attacker: Attacker) -> None:
        idle = target.memory.rss
        num = 0
        while attacker.sent < 4 * allowance and not attacker.gone:
            for _ in range(64):
                attacker.datagram(
                    encode_frames(Version(), RouteTo(0), Message(num, payload=payload))
                )
                num += 1
            await asyncio.sleep(0.001)  # let the connection send and take its events
            if target.memory.rss - idle > MEMORY_SLACK + allowance:
                return

    closed = run(
        attacked(
            target, datagrams_without_headers, allowance=allowance, packet_size=9000, cut_off=True
        )
    )
    assert_cut_off(closed)
