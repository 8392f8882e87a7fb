"""Conformance cases 36-43 (delivery modes, acks and their timing), profile §6.

Timing is virtual: ``ScriptedPeer.advance`` and ``SimNetwork.advance`` fire the engine's
timers at exactly the configured delays (EngineConfig), so "within the delay" is checked to
the microsecond without sleeping.
"""

from __future__ import annotations

import pytest
from engine_case_helpers import arrived, assert_open, client, drain, server, terminals

from aqueduct_core.engine import ChannelTerminated, EngineConfig, MessageArrived, Mode, Terminal
from aqueduct_core.testing.scripted import NetworkLog
from aqueduct_core.testing.simnet import SimNetwork
from aqueduct_core.wire import (
    ENTRYPOINT,
    AckNackUnreliable,
    AckReliable,
    CloseReceiver,
    FinishSender,
    Message,
    RouteTo,
    SentUnreliable,
)


def test_case_36_ordered_one_stream_in_order_then_finished() -> None:
    """case 36: ORDERED: one stream carries every message in order. Receiving FINISH delivers
    Finished after the last message."""
    net = SimNetwork(seed=36, max_chunk=5, stream_loss=0.3)
    log = NetworkLog.watch(net)
    net.handshake()
    sent = [b"m%d" % i for i in range(20)]
    for payload in sent:
        net.client.send(ENTRYPOINT, payload, now=net.now)  # ORDERED is the default mode
        net.advance(0.002)
    net.client.finish(ENTRYPOINT, now=net.now)
    net.run()

    (stream,) = log.client.streams_to(ENTRYPOINT)
    msgs = [f for f in stream.routed if isinstance(f, Message)]
    assert [m.num for m in msgs] == list(range(20))
    assert stream.routed[-1] == FinishSender(20) and stream.fin  # G15: at the tail
    assert not log.client.datagrams_to(ENTRYPOINT)

    # The application sees every message, in order, and only then the clean end.
    events = [e for e in net.server_events if getattr(e, "chanid", None) == ENTRYPOINT]
    assert events[-1] == ChannelTerminated(ENTRYPOINT, Terminal.FINISHED)
    assert all(isinstance(e, MessageArrived) for e in events[:-1]) and len(events) == 21
    assert drain(net.server, ENTRYPOINT, net.now) == (sent, True)
    assert terminals(net.client_events) == {ENTRYPOINT: [Terminal.FINISHED]}


def test_case_37_unordered_stream_per_message_and_early_finish_waits() -> None:
    """case 37: UNORDERED: one stream per message, delivered out of order. A FINISH that
    arrives early waits for the full count."""
    net = SimNetwork(seed=37, delay=(0.001, 0.05))
    log = NetworkLog.watch(net)
    net.handshake()
    net.client.configure_sender(ENTRYPOINT, Mode.UNORDERED)
    for i in range(10):
        net.client.send(ENTRYPOINT, b"m%d" % i, now=net.now)
    net.client.finish(ENTRYPOINT, now=net.now)
    net.run()
    streams = log.client.streams_to(ENTRYPOINT)
    per_stream = [[f for f in s.routed if isinstance(f, Message)] for s in streams]
    assert sorted(m.num for ms in per_stream if ms for m in ms) == list(range(10))
    assert sum(1 for ms in per_stream if ms) == 10 and all(len(ms) <= 1 for ms in per_stream)
    assert all(s.fin and s.first == RouteTo(ENTRYPOINT) for s in streams)
    got, finished = drain(net.server, ENTRYPOINT, net.now)
    assert finished and sorted(got) == sorted(b"m%d" % i for i in range(10))
    assert got != sorted(got)  # the network reordered the streams; no head-of-line blocking

    # Deterministically: messages are delivered in arrival order, and FINISH(3), arriving
    # before two of them, completes only once all three are in.
    peer = server()
    peer.routed(ENTRYPOINT, Message(2, payload=b"two"))
    peer.routed(ENTRYPOINT, FinishSender(3))
    peer.advance(5.0)
    assert drain(peer.conn, ENTRYPOINT, peer.now) == ([b"two"], False)
    assert not peer.wire.of_type(CloseReceiver)
    peer.routed(ENTRYPOINT, Message(0, payload=b"zero"))
    assert drain(peer.conn, ENTRYPOINT, peer.now) == ([b"zero"], False)
    peer.routed(ENTRYPOINT, Message(1, payload=b"one"))
    assert peer.wire.of_type(CloseReceiver, route=ENTRYPOINT) == [CloseReceiver()]
    assert drain(peer.conn, ENTRYPOINT, peer.now) == ([b"one"], True)
    assert_open(peer)


def test_case_38_unreliable_datagrams_oversized_on_reliable_stream() -> None:
    """case 38: UNRELIABLE: messages go in datagrams. An oversized one goes on a stream **in
    the reliable number space**, and FINISH counts it."""
    net = SimNetwork(seed=38, max_datagram=1200)
    log = NetworkLog.watch(net)
    net.handshake()
    big = b"B" * 3000
    net.client.configure_sender(ENTRYPOINT, Mode.UNRELIABLE)
    for payload in (b"a", big, b"c"):
        net.client.send(ENTRYPOINT, payload, now=net.now)
    net.client.finish(ENTRYPOINT, now=net.now)
    net.run()

    dgram_msgs = [f for d in log.client.datagrams_to(ENTRYPOINT) for f in d.frames]
    dgram_msgs = [m for m in dgram_msgs if isinstance(m, Message)]
    assert [(m.num, m.payload) for m in dgram_msgs] == [(0, b"a"), (1, b"c")]
    on_streams = [s.frame for s in log.client.sent(Message, ENTRYPOINT) if s.stream_id]
    assert [(m.num, len(m.payload)) for m in on_streams] == [(0, 3000)]  # reliable number 0
    assert log.client.of_type(SentUnreliable) == [SentUnreliable(2)]
    assert log.client.of_type(FinishSender) == [FinishSender(1)]  # counts the big one
    got, finished = drain(net.server, ENTRYPOINT, net.now)
    assert finished and sorted(got) == sorted([b"a", big, b"c"])


def test_case_39_sent_unreliable_within_flush_delay_one_stream_before_finish() -> None:
    """case 39: SENT_UNRELIABLE is sent within the flush delay, all on one stream, and before
    FINISH."""
    peer = client(EngineConfig(sent_unreliable_delay=0.03))
    conn = peer.conn
    conn.configure_sender(ENTRYPOINT, Mode.UNRELIABLE)
    for _ in range(3):
        conn.send(ENTRYPOINT, b"x", now=peer.now)
    peer.advance_to(0.0299)
    assert not peer.wire.of_type(SentUnreliable)
    peer.advance_to(0.03)
    peer.advance_to(0.5)
    for _ in range(2):
        conn.send(ENTRYPOINT, b"y", now=peer.now)
    peer.advance_to(0.6)
    conn.send(ENTRYPOINT, b"z", now=peer.now)
    conn.finish(ENTRYPOINT, now=peer.now)  # flushes the undeclared count first
    peer.collect()

    declared = peer.wire.sent(SentUnreliable)
    assert [(round(s.time, 6), s.frame) for s in declared] == [
        (0.03, SentUnreliable(3)),
        (0.53, SentUnreliable(2)),
        (0.6, SentUnreliable(1)),
    ]
    assert len(peer.wire.datagrams_to(ENTRYPOINT)) == 6
    (ctrl,) = {s.stream_id for s in declared}
    record = peer.wire.streams[ctrl]
    assert record.routed == [*(s.frame for s in declared), FinishSender(0)] and record.fin


def test_case_40_acks_within_delay_on_one_control_stream() -> None:
    """case 40: Reliable acks come within the ack delay, and all ack/close frames for a
    channel share one stream that starts with ROUTE_TO."""
    peer = server(EngineConfig(ack_delay=0.2))
    data = peer.routed(ENTRYPOINT, Message(0), fin=False)
    peer.advance_to(0.1999)
    assert not peer.wire.of_type(AckReliable)
    peer.advance_to(0.2)
    assert [(s.time, s.frame) for s in peer.wire.sent(AckReliable)] == [(0.2, AckReliable((0, 1)))]
    peer.advance_to(0.5)
    peer.stream([Message(1), Message(2)], stream_id=data, fin=False)
    peer.advance(0.2)
    peer.routed_datagram(ENTRYPOINT, Message(0))
    peer.routed(ENTRYPOINT, SentUnreliable(2), FinishSender(3))
    peer.advance(2.0)
    assert_open(peer)

    control = [
        s
        for s in peer.wire.log
        if isinstance(s.frame, AckReliable | AckNackUnreliable | CloseReceiver)
    ]
    (sid,) = {s.stream_id for s in control}
    record = peer.wire.streams[sid]
    assert record.frames == [
        RouteTo(ENTRYPOINT),  # the engine got our ACK_VERSION: no VERSION in front
        AckReliable((0, 1)),
        AckReliable((0, 2)),  # base 1 (G8): gap 0, run 2
        AckNackUnreliable((1, 1)),  # ack 0, nack 1 at the receipt deadline
        CloseReceiver(),
    ]
    assert record.fin
    assert [s.time for s in peer.wire.sent(AckReliable)] == [0.2, pytest.approx(0.7)]


def test_case_41_missing_datagram_nacked_at_deadline_late_one_dropped() -> None:
    """case 41: A missing datagram is nacked after the deadline. If it arrives after the nack,
    it is never delivered."""
    peer = server(EngineConfig(unreliable_deadline_min=0.25))
    peer.routed_datagram(ENTRYPOINT, Message(1, payload=b"one"))
    peer.advance_to(0.2499)
    assert not peer.wire.of_type(AckNackUnreliable)
    peer.advance_to(0.25)
    assert peer.wire.of_type(AckNackUnreliable) == [AckNackUnreliable((0, 1, 1))]  # nack 0
    peer.routed_datagram(ENTRYPOINT, Message(0, payload=b"late"))
    peer.advance(5.0)
    assert_open(peer)
    assert arrived(peer.events) == [ENTRYPOINT]
    assert drain(peer.conn, ENTRYPOINT, peer.now) == ([b"one"], False)
    assert len(peer.wire.of_type(AckNackUnreliable)) == 1


def test_case_42_receipt_of_n_declares_earlier_numbers() -> None:
    """case 42: Receiving unreliable n lets earlier missing numbers be nacked without any
    SENT_UNRELIABLE."""
    peer = server()
    peer.routed_datagram(ENTRYPOINT, Message(3, payload=b"three"))
    peer.advance(1.0)
    assert peer.wire.of_type(AckNackUnreliable) == [AckNackUnreliable((0, 3, 1))]
    assert drain(peer.conn, ENTRYPOINT, peer.now) == ([b"three"], False)

    # The sender side of the same rule: the client engine accepts that nack, and nothing
    # more, without having declared anything yet.
    cpeer = client()
    cpeer.conn.configure_sender(ENTRYPOINT, Mode.UNRELIABLE)
    for _ in range(4):
        cpeer.conn.send(ENTRYPOINT, b"", now=cpeer.now)
    cpeer.routed(ENTRYPOINT, AckNackUnreliable((0, 3, 1)))
    assert_open(cpeer)


def test_case_43_finish_does_not_nack_in_flight_datagrams_early() -> None:
    """case 43: FINISH with datagrams in flight does not nack before the deadline runs out."""
    peer = server()
    peer.conn.update_rtt(0.2)  # receipt deadline clamp(2 * RTT, 0.1, 1.0) = 0.4 s
    peer.routed(ENTRYPOINT, SentUnreliable(2), FinishSender(0))
    peer.advance_to(0.39)
    assert not peer.wire.of_type(AckNackUnreliable) and not peer.wire.of_type(CloseReceiver)
    peer.routed_datagram(ENTRYPOINT, Message(1, payload=b"just in time"))
    peer.advance_to(0.3999)
    assert not peer.wire.of_type(AckNackUnreliable) and not peer.wire.of_type(CloseReceiver)
    assert drain(peer.conn, ENTRYPOINT, peer.now) == ([b"just in time"], False)
    peer.advance_to(0.4)
    (record,) = peer.wire.streams_to(ENTRYPOINT)
    assert record.routed == [AckNackUnreliable((0, 1, 1)), CloseReceiver()] and record.fin
    assert drain(peer.conn, ENTRYPOINT, peer.now) == ([], True)


def test_finish_completes_as_soon_as_every_declared_datagram_arrived() -> None:
    """A FINISH whose unreliable messages have all arrived completes at once: nothing is
    left to decide, so the receiver does not wait for the receipt deadline."""
    peer = server()
    peer.conn.update_rtt(0.2)  # deadline 0.4 s: completion must not wait for it
    peer.routed_datagram(ENTRYPOINT, Message(0, payload=b"a"))
    peer.routed_datagram(ENTRYPOINT, Message(1, payload=b"b"))
    peer.routed(ENTRYPOINT, SentUnreliable(2), FinishSender(0))
    assert peer.now < 0.4
    (record,) = peer.wire.streams_to(ENTRYPOINT)
    assert record.routed == [AckNackUnreliable((2,)), CloseReceiver()] and record.fin
    assert drain(peer.conn, ENTRYPOINT, peer.now) == ([b"a", b"b"], True)
