"""Conformance cases 15-22 (handshake) and 70 (0-RTT), profile §6, driven through the engine.

Each test plays the peer by hand with :class:`ScriptedPeer` (or joins two honest engines with
``SimNetwork`` where that suffices) and checks only what the peer or the application would
notice: frames on the wire, close codes, events, what ``send``/``recv`` return or raise.
"""

from __future__ import annotations

import pytest
from engine_case_helpers import CLIENT, SERVER, arrived, assert_open, assert_violation, server

from aqueduct_core.engine import (
    ChannelTerminated,
    ConnectionTerminated,
    EngineConfig,
    HeadersReceived,
    MessageArrived,
    Mode,
    NewChannel,
    Terminal,
)
from aqueduct_core.errors import CloseCode, ConnectionLost, EndOfChannel
from aqueduct_core.testing.scripted import NetworkLog, ScriptedPeer
from aqueduct_core.testing.simnet import SimNetwork
from aqueduct_core.wire import (
    ENTRYPOINT,
    AckReliable,
    AckVersion,
    ConnectionHeaders,
    FinishSender,
    Message,
    RouteTo,
    SentUnreliable,
    Version,
    make_chanid,
)

NO_FLOW = EngineConfig(flow_window=None)  # no flow-control header: headers are exactly ours
CODEC = (b"codec-1a2b3c", b"json")


def test_case_15_client_opens_with_version_and_headers_server_answers() -> None:
    """case 15: The client's first stream is VERSION + CONNECTION_HEADERS. The server answers
    with VERSION, ACK_VERSION and CONNECTION_HEADERS."""
    client = ScriptedPeer(CLIENT, NO_FLOW, headers=[CODEC])
    client.start()
    (first,) = client.wire.streams.values()
    assert first.stream_id == 2  # the client's first unidirectional stream
    assert first.frames == [Version(), ConnectionHeaders((CODEC,))]
    assert first.fin

    srv = ScriptedPeer(SERVER, NO_FLOW, headers=[(b"server-abcdef", b"1")])
    srv.start()
    assert not srv.wire.log  # the server speaks only after the client's headers
    srv.stream(first.frames)
    (answer,) = srv.wire.streams.values()
    assert answer.stream_id == 3  # the server's first unidirectional stream
    assert answer.frames == [
        Version(),
        AckVersion(),
        ConnectionHeaders(((b"server-abcdef", b"1"),)),
    ]
    assert answer.fin
    assert srv.new_events() == [HeadersReceived((CODEC,))]

    # The client takes the server's answer, learns its headers and acks its VERSION once.
    client.stream(answer.frames)
    assert client.new_events() == [HeadersReceived(((b"server-abcdef", b"1"),))]
    assert [rec.frames for rec in client.wire.streams.values()][1:] == [[AckVersion()]]
    assert client.conn.handshake_complete and srv.conn.handshake_complete


def test_case_16_every_sequence_starts_with_version_until_acked() -> None:
    """case 16: Every sequence, on streams and in datagrams, starts with VERSION until
    ACK_VERSION has been received, and none does afterwards."""
    peer = ScriptedPeer(CLIENT)
    peer.start()
    conn = peer.conn
    conn.configure_sender(ENTRYPOINT, Mode.UNORDERED)
    (child,) = conn.send(ENTRYPOINT, b"m0", attachments=[NewChannel(True)], now=peer.now)
    conn.configure_sender(child, Mode.UNRELIABLE)
    conn.send(child, b"d0", now=peer.now)
    peer.advance(0.06)  # SENT_UNRELIABLE opens the child's control stream, still unacked
    streams_before = len(peer.wire.streams)
    datagrams_before = len(peer.wire.datagrams)
    assert streams_before == 3 and datagrams_before == 1

    peer.stream([Version(), AckVersion(), ConnectionHeaders()])
    conn.send(ENTRYPOINT, b"m1", now=peer.now)
    conn.send(child, b"d1", now=peer.now)
    conn.cancel(child, now=peer.now)  # a control frame on the already-open control stream
    conn.finish(ENTRYPOINT, now=peer.now)  # FINISH on a fresh control stream
    peer.advance(1.0)

    records = list(peer.wire.streams.values())
    assert len(records) > streams_before + 2
    for rec in records[:streams_before]:
        assert rec.first == Version(), rec
    for rec in records[streams_before:]:
        assert not isinstance(rec.first, Version), rec
    for dgram in peer.wire.datagrams[:datagrams_before]:
        assert dgram.frames[0] == Version()
    later = peer.wire.datagrams[datagrams_before:]
    assert later and all(isinstance(d.frames[0], RouteTo) for d in later)

    # The server engine too: until the client's ACK_VERSION arrives, its sequences (here the
    # entrypoint's ack stream) start with VERSION; afterwards (a send-back) they do not.
    srv = ScriptedPeer(SERVER)
    srv.start()
    srv.stream([Version(), ConnectionHeaders()])
    srv.routed(ENTRYPOINT, Message(0), version=True)
    srv.advance(0.1)
    (acks,) = srv.wire.streams_to(ENTRYPOINT)
    assert acks.first == Version()
    srv.stream([AckVersion()])
    srv.routed(make_chanid(CLIENT, CLIENT, False, 1), Message(0))
    (back,) = srv.wire.streams_to(make_chanid(CLIENT, CLIENT, False, 1))
    assert back.first == RouteTo(make_chanid(CLIENT, CLIENT, False, 1))


def test_case_17_versionless_sequence_before_our_ack_closes() -> None:
    """case 17: A sequence without VERSION arriving before we sent ACK_VERSION → connection
    closed, with nothing processed."""
    scenarios = {
        "routed stream": lambda p: p.routed(ENTRYPOINT, Message(0, payload=b"x"), version=False),
        "headers stream": lambda p: p.stream([ConnectionHeaders()]),
        "datagram": lambda p: p.routed_datagram(ENTRYPOINT, Message(0), version=False),
    }
    for name, inject in scenarios.items():
        peer = ScriptedPeer(SERVER)
        peer.start()
        inject(peer)
        assert_violation(peer)
        # Nothing was processed: no ACK_VERSION, no headers, no message reached anyone.
        assert not peer.wire.log, name
        assert [type(e) for e in peer.events] == [ConnectionTerminated], name
        # A VERSION-led sequence arriving later changes nothing: the connection is gone.
        peer.stream([Version(), ConnectionHeaders()])
        assert not peer.wire.log and len(peer.wire.closes) == 1


def test_case_18_versionless_and_version_led_sequences_after_our_ack() -> None:
    """case 18: A VERSION-less sequence arriving after we sent ACK_VERSION is accepted. A
    VERSION-led sequence after the ack is also accepted."""
    peer = server()
    assert peer.wire.of_type(AckVersion)  # we (the engine) acked the peer's VERSION
    peer.routed(ENTRYPOINT, Message(0, payload=b"a"), version=False)
    peer.routed(ENTRYPOINT, Message(1, payload=b"b"), version=True)
    peer.routed_datagram(ENTRYPOINT, Message(0, payload=b"c"), version=True)
    peer.routed_datagram(ENTRYPOINT, Message(1, payload=b"d"), version=False)
    assert_open(peer)
    got = [peer.conn.recv(ENTRYPOINT, now=peer.now) for _ in range(4)]
    assert [bytes(m.payload) for m in got if m is not None] == [b"a", b"b", b"c", b"d"]


def test_case_19_ack_version_sent_once_duplicates_ignored() -> None:
    """case 19: Each side sends ACK_VERSION exactly once. A duplicate received is ignored."""
    peer = ScriptedPeer(SERVER)
    peer.start()
    peer.stream([Version(), ConnectionHeaders()])
    for n in range(3):  # more VERSION-led sequences in flight before our ACK_VERSION
        peer.routed(ENTRYPOINT, Message(n, payload=b"%d" % n), version=True)
    # The peer acks our VERSION twice, once with VERSION in front.
    peer.stream([AckVersion()])
    peer.stream([Version(), AckVersion()])
    peer.routed(ENTRYPOINT, Message(3, payload=b"3"))
    peer.advance(1.0)
    assert_open(peer)
    assert len(peer.wire.of_type(AckVersion)) == 1
    assert arrived(peer.events) == [ENTRYPOINT] * 4
    assert peer.wire.of_type(AckReliable)  # the connection kept working

    # Two honest engines: each writes ACK_VERSION exactly once, however much traffic follows.
    net = SimNetwork(seed=19, max_chunk=3)
    log = NetworkLog.watch(net)
    net.handshake()
    for i in range(5):
        net.client.send(ENTRYPOINT, b"x", attachments=[NewChannel(False)], now=net.now)
        net.run()
        msg = net.server.recv(ENTRYPOINT, now=net.now)
        assert msg is not None
        net.server.send(msg.attachments[0].chanid, b"reply %d" % i, now=net.now)
        net.run()
    assert len(log.client.of_type(AckVersion)) == 1
    assert len(log.server.of_type(AckVersion)) == 1


def test_case_20_routed_data_before_client_headers_is_buffered_in_order() -> None:
    """case 20: A client MESSAGE stream that arrives before the client's headers is buffered,
    then processed in order once the headers arrive."""
    peer = ScriptedPeer(SERVER)
    peer.start()
    headers_stream = peer.open_stream()  # the client's first stream, delayed in the network
    peer.routed(ENTRYPOINT, Message(0, payload=b"a"), Message(1, payload=b"b"), version=True)
    peer.routed_datagram(ENTRYPOINT, Message(0, payload=b"c"), version=True)
    peer.routed(ENTRYPOINT, Message(2, payload=b"d"), version=True)
    peer.advance(1.0)
    assert_open(peer)
    assert not peer.new_events()  # nothing reached the application
    assert not peer.wire.of_type(ConnectionHeaders)  # the server still waits for the client's
    assert not peer.wire.of_type(AckReliable)  # nothing was acted on
    assert not peer.conn.handshake_complete

    peer.stream([Version(), ConnectionHeaders((CODEC,))], stream_id=headers_stream)
    events = peer.new_events()
    assert isinstance(events[0], HeadersReceived)
    assert all(isinstance(e, MessageArrived) for e in events[1:]) and len(events) == 5
    got = [peer.conn.recv(ENTRYPOINT, now=peer.now) for _ in range(4)]
    assert [bytes(m.payload) for m in got if m is not None] == [b"a", b"b", b"c", b"d"]
    assert len(peer.wire.of_type(ConnectionHeaders)) == 1
    peer.advance(0.1)
    assert peer.wire.of_type(AckReliable) == [AckReliable((0, 3))]


def test_case_21_second_headers_is_an_error_server_headers_from_callback() -> None:
    """case 21: A second CONNECTION_HEADERS → protocol error. The server's headers may depend
    on the client's (callback test)."""
    seen = []

    def derive(client_headers: tuple[tuple[bytes, bytes], ...]) -> list[tuple[bytes, bytes]]:
        seen.append(client_headers)
        return [(key, b"ok:" + value) for key, value in client_headers if key.startswith(b"codec-")]

    peer = ScriptedPeer(SERVER, NO_FLOW, server_headers=derive)
    peer.handshake([CODEC, (b"other-123456", b"x")])
    assert seen == [(CODEC, (b"other-123456", b"x"))]
    assert peer.wire.of_type(ConnectionHeaders) == [ConnectionHeaders(((CODEC[0], b"ok:json"),))]
    assert_open(peer)
    peer.stream([ConnectionHeaders()])
    assert_violation(peer)
    assert len(seen) == 1

    # The same on the client: the server's headers may arrive only once.
    cpeer = ScriptedPeer(CLIENT)
    cpeer.handshake()
    cpeer.stream([ConnectionHeaders((CODEC,))])
    assert_violation(cpeer)


def test_case_22_datagrams_required_and_handshake_timeout() -> None:
    """case 22: A peer without RFC 9221 datagram support is refused. A missing
    CONNECTION_HEADERS triggers the handshake timeout."""
    for side in (CLIENT, SERVER):
        peer = ScriptedPeer(side)
        peer.start(datagrams=False)
        assert_violation(peer, CloseCode.PROTOCOL_VIOLATION)
        assert not peer.wire.streams  # not even the client's VERSION went out
    client = ScriptedPeer(CLIENT)
    client.start(datagrams=False)
    with pytest.raises(ConnectionLost):
        client.conn.send(ENTRYPOINT, b"x", now=client.now)

    # The client engine: the server acks our VERSION but never sends its headers.
    config = EngineConfig(handshake_timeout=2.0)
    peer = ScriptedPeer(CLIENT, config)
    peer.start()
    peer.stream([Version(), AckVersion()])
    peer.conn.send(ENTRYPOINT, b"early", now=peer.now)  # allowed, and waits
    peer.advance(1.99)
    assert_open(peer)
    peer.advance(0.01)
    assert_violation(peer, CloseCode.HANDSHAKE_TIMEOUT)
    assert ChannelTerminated(ENTRYPOINT, Terminal.CONNECTION_LOST) in peer.events
    with pytest.raises(ConnectionLost):
        peer.conn.send(ENTRYPOINT, b"late", now=peer.now)

    # The server engine: the client sends VERSION but never its headers (default 10 s).
    peer = ScriptedPeer(SERVER)
    peer.start()
    peer.stream([Version()])
    peer.advance(9.9)
    assert_open(peer)
    peer.advance(0.1)
    assert_violation(peer, CloseCode.HANDSHAKE_TIMEOUT)

    # Headers in time: the timer does nothing.
    peer = server()
    peer.advance(60.0)
    assert_open(peer)


def test_case_70_nothing_acted_on_before_the_quic_handshake_completes() -> None:
    """case 70: The server does not act on 0-RTT data before the handshake completes (unless
    single-use tickets are configured)."""
    peer = ScriptedPeer(SERVER)
    # 0-RTT: the client's first stream, an entrypoint message and a datagram, all before the
    # QUIC handshake completed.
    peer.stream([Version(), ConnectionHeaders()])
    peer.routed(ENTRYPOINT, Message(0, payload=b"early"), Message(1), version=True)
    peer.routed_datagram(ENTRYPOINT, Message(0, payload=b"dgram"), version=True)
    peer.routed(ENTRYPOINT, Message(2), version=False, fin=False)
    peer.advance(30.0)
    assert not peer.wire.log and not peer.events  # nothing acted on, no timer ran out
    peer.start()  # the handshake completes: now, and only now, the data counts
    assert_open(peer)
    assert isinstance(peer.events[0], HeadersReceived)
    assert peer.wire.of_type(AckVersion) and peer.wire.of_type(ConnectionHeaders)
    got = [peer.conn.recv(ENTRYPOINT, now=peer.now) for _ in range(4)]
    assert [bytes(m.payload) for m in got if m is not None] == [b"early", b"", b"dgram", b""]
    peer.routed(ENTRYPOINT, SentUnreliable(1), FinishSender(3))
    peer.advance(1.0)
    with pytest.raises(EndOfChannel):
        peer.conn.recv(ENTRYPOINT, now=peer.now)
