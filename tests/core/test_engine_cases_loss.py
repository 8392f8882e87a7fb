"""Conformance cases 53-62 (lost-in-transit detection and cascades), profile §6 and §2.9.

The engine under test is the *creator* of the channels (the client), and the scripted server
decides the fate of each carrying message exactly: ACK_RELIABLE, ACK_NACK_UNRELIABLE,
CLOSE_RECEIVER. What is checked is what the application and the peer see: terminal states
and the errors ``send``/``recv`` raise, FORGET_CHANNEL frames, stream resets.
"""

from __future__ import annotations

import pytest
from engine_case_helpers import (
    C_SENDS_1,
    CLIENT,
    S_SENDS_0,
    SERVER,
    assert_open,
    client,
    server,
    terminals,
)

from aqueduct_core.engine import (
    ChannelTerminated,
    ConnectionTerminated,
    Mode,
    NewChannel,
    QueuePolicy,
    Terminal,
)
from aqueduct_core.errors import ConnectionLost, EndOfChannel, LostInTransit, ReceiverDropped
from aqueduct_core.testing.scripted import NetworkLog, ScriptedPeer
from aqueduct_core.testing.simnet import SimNetwork
from aqueduct_core.wire import (
    ENTRYPOINT,
    AckNackUnreliable,
    AckReliable,
    Attachment,
    CancelSender,
    CloseReceiver,
    FinishSender,
    ForgetChannel,
    Message,
    make_chanid,
)

LOST = [Terminal.LOST_IN_TRANSIT]


def forgotten(peer: ScriptedPeer) -> list[int | None]:
    """The chanids the engine sent FORGET_CHANNEL for, in order."""
    return [s.route for s in peer.wire.sent(ForgetChannel)]


def unreliable_client() -> ScriptedPeer:
    peer = client()
    peer.conn.configure_sender(ENTRYPOINT, Mode.UNRELIABLE)
    return peer


def test_case_53_nacked_message_carrying_receiver_loses_local_sender() -> None:
    """case 53: An unreliable message carrying receiver R is nacked → the local sender for R
    raises LostInTransit. FORGET is sent only if a ROUTE_TO for R had been sent."""
    peer = unreliable_client()
    conn = peer.conn
    (r1,) = conn.send(ENTRYPOINT, b"m0", attachments=[NewChannel(True)], now=peer.now)
    (r2,) = conn.send(ENTRYPOINT, b"m1", attachments=[NewChannel(True)], now=peer.now)
    conn.send(r1, b"routed", now=peer.now)  # ROUTE_TO r1 is on the wire; nothing for r2
    (r1_stream,) = peer.wire.streams_to(r1)
    peer.routed(ENTRYPOINT, AckNackUnreliable((0, 2)))  # both nacked
    for r in (r1, r2):
        with pytest.raises(LostInTransit):
            conn.send(r, b"x", now=peer.now)
    assert terminals(peer.events) == {r1: LOST, r2: LOST}
    assert forgotten(peer) == [r1]
    assert r1_stream.stream_id in peer.wire.resets
    conn.send(ENTRYPOINT, b"the parent itself is fine", now=peer.now)
    assert_open(peer)


def test_case_54_nacked_message_carrying_sender_loses_local_receiver() -> None:
    """case 54: A nacked message carrying sender S → the local receiver for S raises
    LostInTransit."""
    peer = unreliable_client()
    conn = peer.conn
    (s,) = conn.send(ENTRYPOINT, b"m0", attachments=[NewChannel(False)], now=peer.now)
    (kept,) = conn.send(ENTRYPOINT, b"m1", attachments=[NewChannel(False)], now=peer.now)
    assert conn.recv(s, now=peer.now) is None  # open, nothing yet
    peer.routed(ENTRYPOINT, AckNackUnreliable((0, 1, 1)))  # nack m0, ack m1
    with pytest.raises(LostInTransit):
        conn.recv(s, now=peer.now)
    assert terminals(peer.events) == {s: LOST}
    assert conn.recv(kept, now=peer.now) is None
    assert forgotten(peer) == []  # we never routed to s: the peer cannot know it


def test_case_55_three_level_cascade() -> None:
    """case 55: Three-level cascade: A lost → B (attached on A, whether its message was acked
    or not) lost → C (attached on B) lost. FORGETs for each as needed."""
    peer = unreliable_client()
    conn = peer.conn
    now = peer.now
    (a,) = conn.send(ENTRYPOINT, b"carries A", attachments=[NewChannel(True)], now=now)
    (b1,) = conn.send(a, b"carries B1", attachments=[NewChannel(True)], now=now)
    (b2,) = conn.send(a, b"carries B2", attachments=[NewChannel(True)], now=now)
    (c1,) = conn.send(b1, b"carries C1", attachments=[NewChannel(False)], now=now)
    (c2,) = conn.send(b2, b"carries C2", attachments=[NewChannel(True)], now=now)
    peer.routed(a, AckReliable((0, 1)))  # B1's message acked (A still pending), B2's not
    peer.routed(b1, AckReliable((0, 1)))  # C1's message acked too
    assert terminals(peer.events) == {}
    peer.routed(ENTRYPOINT, AckNackUnreliable((0, 1)))  # A's message is nacked
    assert terminals(peer.events) == {a: LOST, b1: LOST, b2: LOST, c1: LOST, c2: LOST}
    for sender in (a, b1, b2, c2):
        with pytest.raises(LostInTransit):
            conn.send(sender, b"x", now=peer.now)
    with pytest.raises(LostInTransit):
        conn.recv(c1, now=peer.now)
    # FORGET for every channel we had routed to (sent on), none for C1 and C2.
    assert sorted(c for c in forgotten(peer) if c is not None) == sorted([a, b1, b2])
    assert len(forgotten(peer)) == 3
    assert_open(peer)


def test_case_56_ack_while_parent_pending_is_deferred_then_propagates() -> None:
    """case 56: Accessible propagation: an ack while the parent is pending is deferred. Once
    the parent becomes accessible the children follow, and no FORGET is ever sent for them."""

    def setup() -> tuple[ScriptedPeer, int, int, int]:
        peer = client()
        conn = peer.conn
        (a,) = conn.send(ENTRYPOINT, b"carries A", attachments=[NewChannel(True)], now=0.0)
        (b,) = conn.send(a, b"carries B", attachments=[NewChannel(True)], now=0.0)
        (d,) = conn.send(a, b"carries D", attachments=[NewChannel(True)], now=0.0)
        conn.send(b, b"on B", now=0.0)
        peer.routed(a, AckReliable((0, 1)))  # B's message acked while A is pending
        return peer, a, b, d

    # The parent turns out lost: the deferred ack did not make B accessible.
    peer, a, b, d = setup()
    peer.routed(ENTRYPOINT, CloseReceiver())  # nacks A's message
    assert terminals(peer.events) == {
        ENTRYPOINT: [Terminal.RECEIVER_DROPPED],
        a: LOST,
        b: LOST,
        d: LOST,
    }

    # The parent becomes accessible: B follows; D (its message never acked) does not.
    peer, a, b, d = setup()
    peer.routed(ENTRYPOINT, AckReliable((0, 1)))
    peer.routed(a, CloseReceiver())  # nacks D's message only
    assert terminals(peer.events) == {a: [Terminal.RECEIVER_DROPPED], d: LOST}
    peer.conn.send(b, b"B still works", now=peer.now)
    assert [m.payload for m in peer.wire.of_type(Message, route=b)][-1] == b"B still works"
    peer.routed(b, AckReliable((0, 2)), CloseReceiver())
    peer.routed(ENTRYPOINT, CloseReceiver())
    peer.advance(10.0)
    assert terminals(peer.events)[b] == [Terminal.RECEIVER_DROPPED]
    assert b not in forgotten(peer) and forgotten(peer) == []  # D was never routed to
    assert_open(peer)


def test_case_57_close_receiver_nacks_unacked_only() -> None:
    """case 57: CLOSE_RECEIVER nacks the un-acked messages, so their attachments are lost.
    Attachments of acked messages are not."""
    peer = client()
    conn = peer.conn
    (x,) = conn.send(ENTRYPOINT, b"m0", attachments=[NewChannel(True)], now=peer.now)
    (y,) = conn.send(ENTRYPOINT, b"m1", attachments=[NewChannel(True)], now=peer.now)
    (z,) = conn.send(ENTRYPOINT, b"m2", attachments=[NewChannel(False)], now=peer.now)
    conn.send(x, b"x0", now=peer.now)
    conn.send(y, b"y0", now=peer.now)
    peer.routed(ENTRYPOINT, AckReliable((0, 1)), CloseReceiver())
    assert terminals(peer.events) == {
        ENTRYPOINT: [Terminal.RECEIVER_DROPPED],
        y: LOST,
        z: LOST,
    }
    with pytest.raises(ReceiverDropped):
        conn.send(ENTRYPOINT, b"after", now=peer.now)
    with pytest.raises(LostInTransit):
        conn.send(y, b"y1", now=peer.now)
    conn.send(x, b"x1", now=peer.now)  # accessible: still usable
    assert forgotten(peer) == [y]


def test_case_58_lineage_outlives_finished_sender() -> None:
    """case 58: A lineage node outlives a finished sender: a pending channel found lost later
    still cascades to the children of its acked messages."""
    peer = unreliable_client()
    conn = peer.conn
    (a,) = conn.send(ENTRYPOINT, b"carries A", attachments=[NewChannel(True)], now=peer.now)
    (b,) = conn.send(a, b"carries B", attachments=[NewChannel(True)], now=peer.now)
    conn.send(b, b"on B", now=peer.now)
    conn.finish(a, now=peer.now)
    assert peer.wire.of_type(FinishSender, route=a) == [FinishSender(1)]
    peer.routed(a, AckReliable((0, 1)), CloseReceiver())  # A finished; its SM is gone
    assert terminals(peer.events) == {a: [Terminal.FINISHED]}
    peer.routed(ENTRYPOINT, AckNackUnreliable((0, 1)))  # A's own message: lost after all
    assert terminals(peer.events) == {a: [Terminal.FINISHED], b: LOST}  # the first one wins
    with pytest.raises(LostInTransit):
        conn.send(b, b"x", now=peer.now)
    assert sorted(c for c in forgotten(peer) if c is not None) == sorted([a, b])


def test_case_59_receiver_close_flushes_acks_so_dequeued_attachment_survives() -> None:
    """case 59: A receiver close flushes acks first, so a dequeued message's attachment is
    never declared lost."""
    net = SimNetwork(seed=59)
    log = NetworkLog.watch(net)
    net.handshake()
    c, s = net.client, net.server
    (rx,) = c.send(ENTRYPOINT, b"carries S", attachments=[NewChannel(False)], now=net.now)
    net.advance(0.02)  # delivered; the ack delay (50 ms) has not run out
    msg = s.recv(ENTRYPOINT, now=net.now)
    assert msg is not None and msg.attachments[0].chanid == rx
    s.close_receiver(ENTRYPOINT, now=net.now)  # at once, before any ack went out
    net.flush()
    (ctrl,) = log.server.streams_to(ENTRYPOINT)
    assert ctrl.routed == [AckReliable((0, 1)), CloseReceiver()]
    s.send(rx, b"through S", now=net.now)
    s.finish(rx, now=net.now)
    net.run()
    assert c.recv(rx, now=net.now) == Message(0, payload=b"through S")
    with pytest.raises(EndOfChannel):
        c.recv(rx, now=net.now)
    every = terminals(net.client_events) | terminals(net.server_events)
    assert all(Terminal.LOST_IN_TRANSIT not in t for t in every.values())
    assert not log.client.of_type(ForgetChannel) and not log.server.of_type(ForgetChannel)


def test_case_60_dropped_before_numbering_lost_locally_without_traffic() -> None:
    """case 60: A message dropped before numbering (cancel, or drop-oldest eviction) → its
    attachments raise LostInTransit locally, with no wire traffic."""
    peer = client()
    conn = peer.conn
    conn.set_transport_backlog(1, 0)  # the transport is full: messages wait in the queue
    (x,) = conn.send(ENTRYPOINT, b"queued", attachments=[NewChannel(True)], now=peer.now)
    (y,) = conn.send(ENTRYPOINT, b"queued too", attachments=[NewChannel(False)], now=peer.now)
    conn.send(x, b"x0", now=peer.now)
    conn.cancel(ENTRYPOINT, now=peer.now)
    conn.set_transport_backlog(0, None)
    assert terminals(peer.events) == {ENTRYPOINT: [Terminal.CANCELLED], x: LOST, y: LOST}
    with pytest.raises(LostInTransit):
        conn.send(x, b"x1", now=peer.now)
    with pytest.raises(LostInTransit):
        conn.recv(y, now=peer.now)
    peer.advance(5.0)
    assert not peer.wire.of_type(Message)  # nothing was numbered
    assert peer.wire.of_type(CancelSender) == [CancelSender()]
    assert not peer.wire.sent(route=x) and not peer.wire.sent(route=y)  # and no FORGET

    peer = client()
    conn = peer.conn
    conn.configure_sender(ENTRYPOINT, Mode.UNRELIABLE, QueuePolicy.DROP_OLDEST, 1)
    conn.set_transport_backlog(1, 0)
    (z,) = conn.send(ENTRYPOINT, b"evicted", attachments=[NewChannel(True)], now=peer.now)
    assert terminals(peer.events) == {}
    conn.send(ENTRYPOINT, b"newest", now=peer.now)
    assert terminals(peer.events) == {z: LOST}
    conn.set_transport_backlog(0, None)
    conn.send(ENTRYPOINT, b"", now=peer.now)  # the transport has room again
    peer.advance(5.0)
    sent = [f for d in peer.wire.datagrams for f in d.frames if isinstance(f, Message)]
    assert [(m.num, m.payload, m.attachments) for m in sent] == [(0, b"newest", ()), (1, b"", ())]
    assert not peer.wire.sent(route=z)


def test_case_61_forget_for_held_handle_is_receiver_dropped_first_wins() -> None:
    """case 61: FORGET for a handle the app already holds: a sender sees ReceiverDropped, not
    LostInTransit. The first terminal state wins."""
    peer = server()
    conn = peer.conn
    cancelled = make_chanid(CLIENT, SERVER, False, 1)
    atts = (Attachment(S_SENDS_0), Attachment(cancelled), Attachment(C_SENDS_1))
    peer.routed(ENTRYPOINT, Message(0, attachments=atts), fin=False)
    conn.recv(ENTRYPOINT, now=peer.now)  # the application now holds all three
    (child,) = conn.send(S_SENDS_0, b"carries", attachments=[NewChannel(True)], now=peer.now)
    assert child == make_chanid(SERVER, SERVER, False, 0)
    peer.new_events()

    peer.routed(S_SENDS_0, ForgetChannel())
    assert peer.new_events() == [ChannelTerminated(S_SENDS_0, Terminal.RECEIVER_DROPPED)]
    with pytest.raises(ReceiverDropped):
        conn.send(S_SENDS_0, b"x", now=peer.now)
    # Engine decision 1: nothing is nacked by FORGET; the CLOSE that follows does it.
    peer.routed(S_SENDS_0, CloseReceiver())
    assert peer.new_events() == [ChannelTerminated(child, Terminal.LOST_IN_TRANSIT)]

    conn.cancel(cancelled, now=peer.now)
    peer.routed(cancelled, ForgetChannel())
    peer.routed(cancelled, CloseReceiver())
    # A held receiver: FORGET is a no-op; the finished channel still drains.
    peer.routed(C_SENDS_1, Message(0, payload=b"kept"), FinishSender(1))
    peer.routed(C_SENDS_1, ForgetChannel())
    assert conn.recv(C_SENDS_1, now=peer.now) == Message(0, payload=b"kept")
    with pytest.raises(EndOfChannel):
        conn.recv(C_SENDS_1, now=peer.now)
    assert terminals(peer.events) == {
        S_SENDS_0: [Terminal.RECEIVER_DROPPED],
        child: LOST,
        cancelled: [Terminal.CANCELLED],
        C_SENDS_1: [Terminal.FINISHED],
    }
    assert_open(peer)


def test_case_62_connection_loss_is_connection_lost_never_lost_in_transit() -> None:
    """case 62: Connection loss → every live handle raises ConnectionLost. No LostInTransit
    is reported."""
    net = SimNetwork(seed=62, loss=0.4)
    net.handshake()
    c, s = net.client, net.server
    c.configure_sender(ENTRYPOINT, Mode.UNRELIABLE)
    mine: list[int] = []
    for i in range(8):
        mine += c.send(ENTRYPOINT, b"m%d" % i, attachments=[NewChannel(i % 2 == 0)], now=net.now)
    net.advance(0.02)  # some arrived, some were lost; nothing is acked or nacked yet
    assert 0 < net.links[CLIENT].datagrams_lost < 8
    theirs = []
    while (msg := s.recv(ENTRYPOINT, now=net.now)) is not None:
        theirs += [a.chanid for a in msg.attachments]
    assert theirs and len(theirs) < len(mine)
    c.close(net.now)
    net.run()

    for conn, handles, events in (
        (c, [ENTRYPOINT, *mine], net.client_events),
        (s, [ENTRYPOINT, *theirs], net.server_events),
    ):
        assert terminals(events) == {h: [Terminal.CONNECTION_LOST] for h in handles}
        for h in handles:
            with pytest.raises(ConnectionLost):
                if (h >> 1) & 1 == conn.side:
                    conn.send(h, b"x", now=net.now)
                else:
                    conn.recv(h, now=net.now)
    (end,) = [e for e in net.server_events if isinstance(e, ConnectionTerminated)]
    assert end.by_peer and end.code == 0
    assert SERVER is s.side
