"""The fast paths added for transport throughput (benchmarks/bench_transport.py) keep the
behaviour of the slow paths:

- ``StreamParser.absorb`` takes only bytes that continue a MESSAGE payload without completing
  it, and parsing gives the same frames whatever mix of ``absorb`` and ``feed`` is used;
- ``Connection.stream_data`` says when a chunk was payload only (the adapter then skips
  draining the engine), and only then;
- over real QUIC, the adapter drains the engine once per batch of QUIC events, not once per
  packet, and never hands the library more than ``stream_high_water`` bytes of a stream
  beyond what it still holds (1 MiB messages used to go straight in, up to the send budget);
- the private library hook this relies on is checked with the others.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import pytest
from engine_case_helpers import server

from aqueduct_core.api import channel
from aqueduct_core.engine import EngineConfig, MessageArrived
from aqueduct_core.testing.quicpair import quic_pair
from aqueduct_core.transport import TransportConfig
from aqueduct_core.transport.backends import check
from aqueduct_core.wire import Message, RouteTo, StreamParser, encode_frames
from aqueduct_core.wire.chanid import ENTRYPOINT
from aqueduct_core.wire.frames import FinishSender, Version

MIB = 1 << 20


def stream_bytes(payloads: list[bytes]) -> tuple[bytes, list[object]]:
    frames = [RouteTo(8), *(Message(i, payload=p) for i, p in enumerate(payloads))]
    frames.append(FinishSender(len(payloads)))
    return encode_frames(*frames), frames


def test_absorb_takes_only_payload_that_does_not_complete_the_message() -> None:
    data, frames = stream_bytes([bytes(range(256)) * 40])  # 10240-byte payload
    parser = StreamParser()
    head_end = len(data) - 10240 - 1  # up to the payload, and 100 payload bytes
    assert not parser.absorb(data[:10])  # no MESSAGE being gathered yet
    assert parser.feed(data[: head_end + 100]) == [RouteTo(8)]
    assert parser.absorb(data[head_end + 100 : head_end + 5000])
    assert not parser.absorb(data[head_end + 5000 :])  # would complete it: feed must take it
    assert parser.feed(data[head_end + 5000 :]) == frames[1:]
    parser.finish()


@pytest.mark.parametrize("seed", range(20))
def test_any_split_through_absorb_or_feed_gives_the_same_frames(seed: int) -> None:
    rng = random.Random(seed)
    payloads = [rng.randbytes(rng.choice([0, 1, 100, 5000, 70000])) for _ in range(6)]
    data, frames = stream_bytes(payloads)
    parser = StreamParser()
    got: list[object] = []
    pos = 0
    while pos < len(data):
        size = rng.choice([1, 7, 1200, 16384, 65536])
        piece = data[pos : pos + size]
        piece = bytearray(piece) if rng.random() < 0.2 else piece  # mutable chunks too
        pos += size
        if not parser.absorb(piece):
            got += parser.feed(piece)
    parser.finish()
    assert got == frames
    # bytes when a payload came in one piece, else the one buffer it was gathered into
    assert all(type(f.payload) in (bytes, bytearray) for f in got if isinstance(f, Message))


def test_stream_data_reports_payload_only_chunks() -> None:
    peer = server()  # the engine under test is a server; we play the client
    payload = os.urandom(50_000)
    data = encode_frames(Version(), RouteTo(ENTRYPOINT), Message(0, payload=payload))
    sid = peer.open_stream()
    pieces = [data[i : i + 4000] for i in range(0, len(data), 4000)]
    results = [peer.conn.stream_data(sid, p, False, peer.now) for p in pieces]
    # The first piece holds frames; then payload only; the last completes the message.
    assert results[0] and results[-1]
    assert not any(results[1:-1])
    assert any(isinstance(e, MessageArrived) for e in peer.conn.events())
    message = peer.conn.recv(ENTRYPOINT, now=peer.now)
    assert message is not None and message.payload == payload
    assert peer.conn.stream_data(sid, b"", True, peer.now)  # FIN: not payload


def run(coro: Any, timeout: float = 60) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.mark.quic
@pytest.mark.parametrize("backend", ["aioquic", "qh3"])
def test_adapter_feeds_at_most_the_high_water_and_drains_once_per_batch(backend: str) -> None:
    """A message no larger than the high water used to be handed to the library whole even
    while it still held earlier ones; and the engine was drained after every packet."""

    async def main() -> None:
        high = 2 * MIB
        # Flow control off: the engine may hand the adapter up to the send budget at once.
        config = TransportConfig(stream_high_water=high, engine=EngineConfig(flow_window=None))
        async with quic_pair(backend, backend, transport=config) as pair:  # type: ignore[arg-type]
            tx, rx = channel(codec="raw")
            await pair.client.entrypoint.send({"in": rx})
            inbox = (await pair.entrypoint_receiver.recv())["in"]

            sender = pair.client._driver
            quic = sender._quic
            worst = 0
            send_stream_data = quic.send_stream_data

            def recording(sid: int, data: Any, end_stream: bool = False) -> None:
                nonlocal worst
                send_stream_data(sid, data, end_stream=end_stream)
                if len(data) > 4096:  # frame heads and control frames always go at once
                    worst = max(worst, sender._backlog(sid))

            quic.send_stream_data = recording

            receiver = pair.server._driver
            packets = flushes = 0
            received, flush = receiver.datagram_received, pair.server._flush
            received_many = receiver.datagrams_received

            def counting_datagram(*args: Any) -> None:
                nonlocal packets
                packets += 1
                received(*args)

            def counting_datagrams(datagrams: list[bytes], addr: Any) -> None:
                nonlocal packets  # a burst read with GRO (transport/udp.py)
                packets += len(datagrams)
                received_many(datagrams, addr)

            def counting_flush() -> None:
                nonlocal flushes
                flushes += 1
                flush()

            receiver.datagram_received = counting_datagram
            receiver.datagrams_received = counting_datagrams
            pair.server._flush = counting_flush  # type: ignore[method-assign]

            size = high  # 32 packets at qh3's 64 KiB, 128 at aioquic's 16 KiB
            body = os.urandom(size)

            async def produce() -> None:
                for i in range(16):
                    await tx.send(i.to_bytes(4, "big") + body[4:])
                tx.finish()

            producer = asyncio.create_task(produce())
            n = 0
            async for message in inbox:
                assert len(message) == size and int.from_bytes(message[:4], "big") == n
                n += 1
            assert n == 16
            await producer
            assert 0 < worst <= high, f"the library held {worst} bytes of one stream"
            # Per message: its completion, the application's recv, an ack...
            # but not one drain per packet.
            assert flushes < packets / 3, f"{flushes} drains for {packets} packets"

    run(main())


@pytest.mark.parametrize("backend", ["aioquic", "qh3"])
def test_private_hooks_match_the_installed_libraries(backend: str) -> None:
    """The adapter now also overrides ``QuicConnectionProtocol._process_events``;
    ``backends.check`` verifies it with the other private hooks."""
    check(backend)


@pytest.mark.parametrize("pacing", [True, False])
def test_aioquic_paces_in_bursts_of_one_gso_send_or_not_at_all(pacing: bool) -> None:
    """With pacing on, aioquic's pacer lets a GSO send's worth of packets (64) leave back to
    back, at the library's average rate; off, it never holds a packet back."""
    from aqueduct_core.transport.backends import PACING_BURST, apply_aioquic, load

    backend = load("aioquic")
    quic = backend.QuicConnection(configuration=backend.QuicConfiguration(is_client=True))
    apply_aioquic(quic, pacing)
    pacer, size = quic._loss._pacer, 1472
    pacer._max_datagram_size = size
    pacer.update_rate(congestion_window=1000 * size, smoothed_rtt=0.001)
    if not pacing:
        assert pacer.packet_time is None
        return
    assert pacer.packet_time == pytest.approx(0.001 / 1000)
    assert pacer.bucket_max == pytest.approx(PACING_BURST * pacer.packet_time)
    pacer.update_rate(congestion_window=32 * size, smoothed_rtt=0.001)  # a small window
    assert pacer.bucket_max == pytest.approx(8 * pacer.packet_time), "a quarter window"
