"""Conformance cases 23-35 (grammar and context rules), profile §6 and §1.4.

Every violation must close the connection with code 1 (G24) from inside the engine: the
injecting call returns normally, a CloseConnection command carries the code, and the
application sees ConnectionTerminated. Each scenario runs on a fresh connection.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from engine_case_helpers import (
    C_ONESHOT_0,
    C_SENDS_1,
    SERVER,
    arrived,
    assert_open,
    assert_violation,
    client,
    server,
)

from aqueduct_core.engine import EngineConfig, Mode, NewChannel
from aqueduct_core.errors import ChannelClosed, LocalProtocolError
from aqueduct_core.testing.scripted import ScriptedPeer
from aqueduct_core.wire import (
    ENTRYPOINT,
    AckNackUnreliable,
    AckReliable,
    AckVersion,
    Attachment,
    CancelSender,
    CloseReceiver,
    ConnectionHeaders,
    Dequeued,
    FinishSender,
    ForgetChannel,
    Message,
    RouteTo,
    SentUnreliable,
    Version,
    encode_frames,
    make_chanid,
)
from aqueduct_core.wire.primitives import MAX_U64

Scenario = Callable[[ScriptedPeer], object]


def check_violations(make: Callable[[], ScriptedPeer], scenarios: dict[str, Scenario]) -> None:
    for name, inject in scenarios.items():
        peer = make()
        inject(peer)
        try:
            assert_violation(peer)
        except AssertionError as exc:
            raise AssertionError(f"scenario {name!r}: {exc}") from exc


def test_case_23_unrouted_frame_and_second_route_to_are_errors() -> None:
    """case 23: A routed frame with no ROUTE_TO in front → protocol error. A second ROUTE_TO
    in one sequence → protocol error."""
    check_violations(
        server,
        {
            "unrouted MESSAGE": lambda p: p.stream([Message(0, payload=b"x")]),
            "unrouted FINISH": lambda p: p.stream([Version(), FinishSender(0)]),
            "unrouted SENT_UNRELIABLE": lambda p: p.stream([SentUnreliable(1)]),
            "unrouted CANCEL": lambda p: p.stream([CancelSender()]),
            "unrouted datagram": lambda p: p.datagram([Message(0)]),
            "second ROUTE_TO": lambda p: p.routed(ENTRYPOINT, Message(0), RouteTo(C_SENDS_1)),
            "second ROUTE_TO in a datagram": lambda p: p.datagram(
                [RouteTo(ENTRYPOINT), RouteTo(ENTRYPOINT), Message(0)]
            ),
        },
    )
    # The second ROUTE_TO is caught even when it arrives in a later chunk of the stream.
    peer = server()
    sid = peer.routed(ENTRYPOINT, Message(0, payload=b"first"), fin=False)
    assert_open(peer)
    peer.stream([RouteTo(ENTRYPOINT)], stream_id=sid)
    assert_violation(peer)


def test_case_24_prelude_after_route_to_and_stream_frames_in_datagrams() -> None:
    """case 24: A prelude frame after ROUTE_TO → error. Any frame other than VERSION,
    ROUTE_TO or MESSAGE in a datagram → error."""
    check_violations(
        server,
        {
            "VERSION after ROUTE_TO": lambda p: p.routed(ENTRYPOINT, Version()),
            "ACK_VERSION after ROUTE_TO": lambda p: p.routed(ENTRYPOINT, AckVersion()),
            "HEADERS after ROUTE_TO": lambda p: p.routed(ENTRYPOINT, ConnectionHeaders()),
            "dgram ACK_VERSION": lambda p: p.datagram([Version(), AckVersion()]),
            "dgram HEADERS": lambda p: p.datagram([Version(), ConnectionHeaders()]),
            "dgram SENT_UNRELIABLE": lambda p: p.routed_datagram(ENTRYPOINT, SentUnreliable(1)),
            "dgram FINISH": lambda p: p.routed_datagram(ENTRYPOINT, FinishSender(0)),
            "dgram CANCEL": lambda p: p.routed_datagram(ENTRYPOINT, CancelSender()),
            "dgram FORGET": lambda p: p.routed_datagram(ENTRYPOINT, ForgetChannel()),
        },
    )
    check_violations(
        client,
        {
            "dgram ACK_RELIABLE": lambda p: p.routed_datagram(ENTRYPOINT, AckReliable((0, 1))),
            "dgram ACK_NACK": lambda p: p.routed_datagram(ENTRYPOINT, AckNackUnreliable((1,))),
            "dgram CLOSE": lambda p: p.routed_datagram(ENTRYPOINT, CloseReceiver()),
        },
    )


def test_case_25_sender_frames_to_a_channel_we_send_on() -> None:
    """case 25: MESSAGE, SENT_UNRELIABLE, FINISH or CANCEL routed to a channel whose SENDER
    is the receiving side → error."""
    # The client engine holds the entrypoint's sender; the scripted server sends as if it did.
    check_violations(
        client,
        {
            "MESSAGE": lambda p: p.routed(ENTRYPOINT, Message(0)),
            "MESSAGE in a datagram": lambda p: p.routed_datagram(ENTRYPOINT, Message(0)),
            "SENT_UNRELIABLE": lambda p: p.routed(ENTRYPOINT, SentUnreliable(1)),
            "FINISH": lambda p: p.routed(ENTRYPOINT, FinishSender(0)),
            "CANCEL": lambda p: p.routed(ENTRYPOINT, CancelSender()),
        },
    )
    # The same for a channel the peer created whose sender is ours (server-sends, chanid 2).
    server_sends = make_chanid(SERVER.peer, SERVER, False, 0)
    check_violations(server, {"MESSAGE": lambda p: p.routed(server_sends, Message(0))})
    # The local mirror: our application sending on a receiver is misuse, raised at once.
    peer = server()
    with pytest.raises(LocalProtocolError):
        peer.conn.send(ENTRYPOINT, b"wrong way", now=peer.now)
    with pytest.raises(LocalProtocolError):
        peer.conn.finish(ENTRYPOINT, now=peer.now)
    assert not peer.wire.sent(route=ENTRYPOINT)
    assert_open(peer)


def test_case_26_receiver_frames_from_the_sender_side() -> None:
    """case 26: ACK_RELIABLE, ACK_NACK, CLOSE_RECEIVER or DEQUEUED sent from the sender side
    → error."""
    # The server engine receives on the entrypoint; the scripted client, its sender, acks.
    check_violations(
        lambda: server(flow_window=1024),  # DEQUEUED is legal on this connection
        {
            "ACK_RELIABLE": lambda p: p.routed(ENTRYPOINT, AckReliable((0, 1))),
            "ACK_NACK": lambda p: p.routed(ENTRYPOINT, AckNackUnreliable((1,))),
            "CLOSE_RECEIVER": lambda p: p.routed(ENTRYPOINT, CloseReceiver()),
            "DEQUEUED": lambda p: p.routed(ENTRYPOINT, Dequeued(10)),
        },
    )
    # Without negotiation DEQUEUED is not even a frame (tag 12 unknown): also code 1.
    check_violations(server, {"DEQUEUED": lambda p: p.routed(ENTRYPOINT, Dequeued(10))})
    # The local mirror: receiving on (or closing) a sender is misuse, raised at once.
    peer = client()
    with pytest.raises(LocalProtocolError):
        peer.conn.recv(ENTRYPOINT, now=peer.now)
    with pytest.raises(LocalProtocolError):
        peer.conn.close_receiver(ENTRYPOINT, now=peer.now)
    assert not peer.wire.sent(route=ENTRYPOINT)
    assert_open(peer)


def test_case_27_forget_for_a_channel_we_created() -> None:
    """case 27: FORGET_CHANNEL for a channel whose CREATOR is the receiving side → error."""
    check_violations(
        client,  # the client created the entrypoint; only the client may FORGET it
        {"FORGET entrypoint": lambda p: p.routed(ENTRYPOINT, ForgetChannel())},
    )

    def forget_own_channel(peer: ScriptedPeer) -> None:
        (child,) = peer.conn.send(ENTRYPOINT, b"", attachments=[NewChannel(True)], now=peer.now)
        peer.routed(child, ForgetChannel())

    check_violations(client, {"FORGET child": forget_own_channel})


def test_case_28_attachment_creator_and_duplicate_attachments() -> None:
    """case 28: An attachment whose CREATOR is not the frame's sender → error. The same
    chanid attached twice (within one message or across messages) → error."""
    server_created = make_chanid(SERVER, SERVER, False, 0)
    check_violations(
        server,
        {
            "server-created attachment": lambda p: p.routed(
                ENTRYPOINT, Message(0, attachments=(Attachment(server_created),))
            ),
            "twice in one message": lambda p: p.routed(
                ENTRYPOINT, Message(0, attachments=(Attachment(8), Attachment(8)))
            ),
            "twice across messages": lambda p: p.routed(
                ENTRYPOINT,
                Message(0, attachments=(Attachment(8),)),
                Message(1, attachments=(Attachment(8),)),
            ),
            "twice across streams and datagrams": lambda p: (
                p.routed_datagram(ENTRYPOINT, Message(0, attachments=(Attachment(16),))),
                p.routed(ENTRYPOINT, Message(0, attachments=(Attachment(16),))),
            ),
        },
    )


def test_case_29_route_to_never_allocated_local_index() -> None:
    """case 29: ROUTE_TO naming a local-created index that was never allocated → protocol
    error."""
    server_sends_0 = make_chanid(SERVER, SERVER, False, 0)
    check_violations(
        server,
        {
            "server-created index 0": lambda p: p.routed(server_sends_0, AckReliable((0, 1))),
            "in a datagram": lambda p: p.routed_datagram(
                make_chanid(SERVER, SERVER.peer, False, 0), Message(0)
            ),
            "bare ROUTE_TO": lambda p: p.routed(make_chanid(SERVER, SERVER, True, 7)),
        },
    )

    def beyond_allocated(peer: ScriptedPeer) -> None:
        # The client engine allocated index 1 (the entrypoint is 0) in its own space: 2 is not.
        peer.conn.send(ENTRYPOINT, b"", attachments=[NewChannel(True)], now=peer.now)
        peer.routed(make_chanid(SERVER.peer, SERVER.peer, False, 2), CloseReceiver())

    check_violations(client, {"index 2 of 1": beyond_allocated})


def test_case_30_reliable_number_rules() -> None:
    """case 30: A duplicate reliable MESSAGE_NUM, a number ≥ the FINISH count, or the number
    2^64-1 → error."""
    check_violations(
        server,
        {
            "duplicate, two streams": lambda p: (
                p.routed(ENTRYPOINT, Message(0)),
                p.routed(ENTRYPOINT, Message(0)),
            ),
            "duplicate after acked": lambda p: (
                p.routed(ENTRYPOINT, Message(0), Message(1)),
                p.advance(1.0),
                p.routed(ENTRYPOINT, Message(1)),
            ),
            "beyond FINISH": lambda p: p.routed(ENTRYPOINT, FinishSender(1), Message(1)),
            "FINISH below received": lambda p: p.routed(ENTRYPOINT, Message(3), FinishSender(2)),
            "2^64-1": lambda p: p.routed(ENTRYPOINT, Message(MAX_U64)),
        },
    )


def test_case_31_unreliable_number_rules() -> None:
    """case 31: A duplicate pending unreliable number, or one ≥ the declared total after
    FINISH → error."""
    check_violations(
        server,
        {
            "duplicate pending": lambda p: (
                p.routed_datagram(ENTRYPOINT, Message(0)),
                p.routed_datagram(ENTRYPOINT, Message(0)),
            ),
            "duplicate in one datagram": lambda p: p.routed_datagram(
                ENTRYPOINT, Message(4), Message(4)
            ),
            "beyond declared": lambda p: (
                p.routed(ENTRYPOINT, SentUnreliable(2), FinishSender(0)),
                p.routed_datagram(ENTRYPOINT, Message(2)),
            ),
            "FINISH below received": lambda p: (
                p.routed_datagram(ENTRYPOINT, Message(5)),
                p.routed(ENTRYPOINT, SentUnreliable(3), FinishSender(0)),
            ),
        },
    )
    # An honest sender over a network that duplicates datagrams (which QUIC never does) is a
    # faulty peer to the receiver: engine decision 3.
    from aqueduct_core.testing.simnet import SimNetwork

    net = SimNetwork(seed=31, duplicate=1.0)
    net.handshake()
    net.client.configure_sender(ENTRYPOINT, Mode.UNRELIABLE)
    net.client.send(ENTRYPOINT, b"twice", now=net.now)
    net.run()
    closes = [e for e in net.server_events if type(e).__name__ == "ConnectionTerminated"]
    assert closes and closes[0].code == 1 and not closes[0].by_peer


def test_case_32_lifecycle_frame_rules() -> None:
    """case 32: SENT_UNRELIABLE after FINISH, or a total that overflows → error. A duplicate
    FINISH, a duplicate CANCEL, or FINISH + CANCEL → error."""
    check_violations(
        server,
        {
            # FINISH(1) waits for message 0, so the receiver is still there to check.
            "SENT_UNRELIABLE after FINISH": lambda p: p.routed(
                ENTRYPOINT, FinishSender(1), SentUnreliable(1)
            ),
            "duplicate FINISH": lambda p: p.routed(ENTRYPOINT, FinishSender(1), FinishSender(1)),
            "FINISH on two streams": lambda p: (
                p.routed(ENTRYPOINT, FinishSender(1)),
                p.routed(ENTRYPOINT, FinishSender(1)),
            ),
            "FINISH + CANCEL": lambda p: p.routed(ENTRYPOINT, FinishSender(1), CancelSender()),
        },
    )
    # A total that overflows: with the default G31 gap the first frame is already a limit
    # violation (code 3), so the overflow rule is checked with the gap lifted.
    check_violations(
        lambda: server(EngineConfig(max_message_gap=1 << 65)),
        {
            "total overflows": lambda p: p.routed(
                ENTRYPOINT, SentUnreliable(MAX_U64), SentUnreliable(1)
            ),
        },
    )
    # CANCEL ends the receiver at once (CLOSE_RECEIVER goes out) and tombstones the channel,
    # and the tombstone rule overrides every other rule (§2.8): a second CANCEL, or a FINISH
    # after it, can only reach the tombstone and is ignored.
    peer = server()
    peer.routed(ENTRYPOINT, CancelSender())
    assert peer.wire.of_type(CloseReceiver, route=ENTRYPOINT)
    peer.routed(ENTRYPOINT, CancelSender())
    peer.routed(ENTRYPOINT, FinishSender(0), SentUnreliable(1))
    assert_open(peer)


def test_case_33_ack_rules_at_the_sender() -> None:
    """case 33: An ACK_RELIABLE acking an unsent number, or re-acking one → error. ACK_NACK
    runs extending past the unreliable count sent → error."""

    def sent(n: int, mode: Mode = Mode.ORDERED) -> Callable[[ScriptedPeer], None]:
        def setup(peer: ScriptedPeer) -> None:
            peer.conn.configure_sender(ENTRYPOINT, mode)
            for i in range(n):
                peer.conn.send(ENTRYPOINT, b"%d" % i, now=peer.now)

        return setup

    check_violations(
        client,
        {
            "ack unsent": lambda p: (sent(1)(p), p.routed(ENTRYPOINT, AckReliable((0, 2)))),
            "ack nothing sent": lambda p: p.routed(ENTRYPOINT, AckReliable((0, 1))),
            "re-ack": lambda p: (
                sent(3)(p),
                p.routed(ENTRYPOINT, AckReliable((1, 1)), AckReliable((1, 1))),
            ),
            "re-ack on two streams": lambda p: (
                sent(3)(p),
                p.routed(ENTRYPOINT, AckReliable((1, 1))),
                p.routed(ENTRYPOINT, AckReliable((1, 1))),
            ),
            "ack-nack past sent": lambda p: (
                sent(2, Mode.UNRELIABLE)(p),
                p.routed(ENTRYPOINT, AckNackUnreliable((1, 2))),
            ),
            "ack-nack past sent later": lambda p: (
                sent(2, Mode.UNRELIABLE)(p),
                p.routed(ENTRYPOINT, AckNackUnreliable((2,)), AckNackUnreliable((0, 1))),
            ),
        },
    )
    # Acks within what was sent are fine.
    peer = client()
    sent(3, Mode.UNRELIABLE)(peer)
    peer.routed(ENTRYPOINT, AckNackUnreliable((1, 1)), AckNackUnreliable((1,)))
    assert_open(peer)


def test_case_34_oneshot_rules() -> None:
    """case 34: Oneshot: a second message, a number other than 0, a datagram message,
    SENT_UNRELIABLE, or FINISH > 1 → error."""
    oneshot = C_ONESHOT_0
    check_violations(
        server,
        {
            "number 1": lambda p: p.routed(oneshot, Message(1)),
            "datagram": lambda p: p.routed_datagram(oneshot, Message(0)),
            "SENT_UNRELIABLE": lambda p: p.routed(oneshot, SentUnreliable(1)),
            "FINISH 2": lambda p: p.routed(oneshot, FinishSender(2)),
            "FINISH 1 then number 1": lambda p: p.routed(oneshot, FinishSender(1), Message(1)),
        },
    )
    # Message 0 completes a oneshot receiver at once (§2.7: acked, CLOSE_RECEIVER sent), which
    # tombstones it; a second message can only reach the tombstone, which overrides every
    # other rule (§2.8), so it is ignored and never delivered.
    peer = server()
    att = Message(0, attachments=(Attachment(oneshot),))
    peer.routed(ENTRYPOINT, att)
    peer.routed(oneshot, Message(0, payload=b"one"))
    peer.routed(oneshot, Message(0, payload=b"two"), Message(1))
    assert_open(peer)
    assert peer.wire.of_type(CloseReceiver, route=oneshot) == [CloseReceiver()]
    peer.conn.recv(ENTRYPOINT, now=peer.now)
    msg = peer.conn.recv(oneshot, now=peer.now)
    assert msg is not None and msg.payload == b"one"
    assert arrived(peer.new_events()).count(oneshot) == 0  # it was not held on arrival

    # Local misuse of a oneshot sender raises at once and sends nothing.
    cpeer = client()
    (tx,) = cpeer.conn.send(ENTRYPOINT, b"", attachments=[NewChannel(True, True)], now=0.0)
    with pytest.raises(LocalProtocolError):
        cpeer.conn.configure_sender(tx, Mode.UNRELIABLE)
    cpeer.conn.send(tx, b"only", now=cpeer.now)
    with pytest.raises(ChannelClosed):  # sending a oneshot finished it
        cpeer.conn.send(tx, b"second", now=cpeer.now)
    cpeer.collect()
    assert [m.payload for m in cpeer.wire.of_type(Message, route=tx)] == [b"only"]
    assert_open(cpeer)


def test_case_35_stream_end_mid_frame_reset_and_empty_streams() -> None:
    """case 35: A stream that ends mid-frame → error. A reset mid-frame → the partial frame is
    dropped and the earlier frames still count. An empty stream is ignored."""
    whole = encode_frames(RouteTo(ENTRYPOINT), Message(0, payload=b"kept"))
    partial = encode_frames(Message(1, payload=b"partial"))[:5]
    check_violations(
        server,
        {
            "fin mid-frame": lambda p: p.stream(whole + partial),
            "fin mid-frame, separate fin": lambda p: (
                p.stream(whole + partial, stream_id=99, fin=False),
                p.stream(b"", stream_id=99),
            ),
            "fin mid-varint": lambda p: p.stream(encode_frames(RouteTo(ENTRYPOINT))[:1]),
            "datagram cut short": lambda p: p.datagram(whole + partial),
        },
    )

    peer = server()
    sid = peer.stream(whole + partial, fin=False, chunk=3)
    peer.reset(sid)
    peer.stream(b"")  # an empty stream
    peer.datagram(b"")  # an empty datagram
    peer.routed(ENTRYPOINT, Message(1, payload=b"after"))  # number 1 was never received
    peer.advance(1.0)
    assert_open(peer)
    got = [peer.conn.recv(ENTRYPOINT, now=peer.now) for _ in range(3)]
    assert [m.payload for m in got if m is not None] == [b"kept", b"after"]
    assert peer.wire.of_type(AckReliable) == [AckReliable((0, 2))]

    # An empty stream is fine even before anything else, when VERSION would be required.
    fresh = ScriptedPeer(SERVER)
    fresh.start()
    fresh.stream(b"")
    fresh.datagram(b"")
    assert_open(fresh)
    assert not fresh.wire.log
