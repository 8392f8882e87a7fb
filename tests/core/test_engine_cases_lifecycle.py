"""Conformance cases 44-52 (channel lifecycle: close, cancel, finish, tombstones, FORGET,
ghosts, data before its attaching message), profile §6, §2.5, §2.6 and §2.8."""

from __future__ import annotations

from itertools import pairwise

import pytest
from engine_case_helpers import (
    C_SENDS_1,
    C_SENDS_2,
    CLIENT,
    S_SENDS_0,
    SERVER,
    arrived,
    assert_open,
    client,
    drain,
    server,
    terminals,
)

from aqueduct_core.engine import (
    ChannelTerminated,
    MessageArrived,
    Mode,
    NewChannel,
    QueuePolicy,
    Terminal,
)
from aqueduct_core.errors import (
    ChannelCancelled,
    ChannelClosed,
    EndOfChannel,
    LocalProtocolError,
    LostInTransit,
    ReceiverDropped,
)
from aqueduct_core.testing.scripted import NetworkLog
from aqueduct_core.testing.simnet import SimNetwork
from aqueduct_core.wire import (
    ENTRYPOINT,
    AckReliable,
    Attachment,
    CancelSender,
    CloseReceiver,
    FinishSender,
    ForgetChannel,
    Message,
    RouteTo,
    encode_frames,
    make_chanid,
)


def test_case_44_app_close_acks_first_then_close_sender_sees_receiver_dropped() -> None:
    """case 44: An app-closed receiver: final acks, then CLOSE_RECEIVER. The sender's next
    send raises ReceiverDropped. Buffered messages are dropped."""
    net = SimNetwork(seed=44)
    log = NetworkLog.watch(net)
    net.handshake()
    c, s = net.client, net.server
    c.send(ENTRYPOINT, b"first", now=net.now)
    (child,) = c.send(ENTRYPOINT, b"carrier", attachments=[NewChannel(True)], now=net.now)
    c.send(ENTRYPOINT, b"third", now=net.now)
    net.advance(0.02)  # all delivered (delay <= 10 ms), before the 50 ms ack delay
    assert not log.server.of_type(AckReliable)
    msg = s.recv(ENTRYPOINT, now=net.now)
    assert msg is not None and msg.payload == b"first"
    s.close_receiver(ENTRYPOINT, now=net.now)
    net.flush()
    (ctrl,) = log.server.streams_to(ENTRYPOINT)
    assert ctrl.routed == [AckReliable((0, 3)), CloseReceiver()] and ctrl.fin
    with pytest.raises(LocalProtocolError):  # our own handle is closed; the rest is gone
        s.recv(ENTRYPOINT, now=net.now)
    assert s.memory().received == {}
    net.run()

    with pytest.raises(ReceiverDropped):
        c.send(ENTRYPOINT, b"after", now=net.now)
    # The undelivered carrier was acked, so its attachment is not lost: the server closed it
    # normally and the client's sender sees ReceiverDropped.
    with pytest.raises(ReceiverDropped):
        c.send(child, b"to nobody", now=net.now)
    assert terminals(net.client_events) == {
        ENTRYPOINT: [Terminal.RECEIVER_DROPPED],
        child: [Terminal.RECEIVER_DROPPED],
    }
    assert terminals(net.server_events) == {
        ENTRYPOINT: [Terminal.CLOSED],
        child: [Terminal.CLOSED],  # the server never took it: closed with the queue
    }


def test_case_45_cancel_resets_message_streams_cancel_on_another_stream() -> None:
    """case 45: CANCEL: the receiver discards its queue and the app sees ChannelCancelled. The
    sender resets its message streams, and CANCEL travels on a stream that was not reset."""
    peer = client()
    conn = peer.conn
    conn.configure_sender(ENTRYPOINT, Mode.UNORDERED)
    (ordered,) = conn.send(ENTRYPOINT, b"m0", attachments=[NewChannel(True)], now=peer.now)
    conn.send(ENTRYPOINT, b"m1", now=peer.now)
    conn.send(ENTRYPOINT, b"m2", now=peer.now)
    conn.send(ordered, b"o0", now=peer.now)
    conn.send(ordered, b"o1", now=peer.now)
    message_streams = {s.stream_id for s in peer.wire.sent(Message, ENTRYPOINT)}
    (ordered_stream,) = {s.stream_id for s in peer.wire.sent(Message, ordered)}
    peer.routed(ENTRYPOINT, AckReliable((1, 1)))  # message 1 arrived: its stream is done
    acked_stream = peer.wire.sent(Message, ENTRYPOINT)[1].stream_id

    conn.cancel(ENTRYPOINT, now=peer.now)
    conn.cancel(ordered, now=peer.now)
    peer.collect()
    assert set(peer.wire.resets) == (message_streams - {acked_stream}) | {ordered_stream}
    for chanid in (ENTRYPOINT, ordered):
        (cancel,) = peer.wire.sent(CancelSender, chanid)
        assert cancel.stream_id not in peer.wire.resets
        record = peer.wire.streams[cancel.stream_id]
        assert record.frames == [RouteTo(chanid), CancelSender()] and record.fin
    assert terminals(peer.events) == {
        ENTRYPOINT: [Terminal.CANCELLED],
        ordered: [Terminal.CANCELLED],
    }
    with pytest.raises(ChannelClosed):
        conn.send(ENTRYPOINT, b"more", now=peer.now)

    # The receiving side: queued messages are discarded, the application sees the cancel,
    # the channels they carried are closed normally, and the acks precede CLOSE.
    peer = server()
    peer.routed(ENTRYPOINT, Message(0), Message(1, attachments=(Attachment(C_SENDS_1),)))
    peer.routed(ENTRYPOINT, CancelSender())
    with pytest.raises(ChannelCancelled):
        peer.conn.recv(ENTRYPOINT, now=peer.now)
    assert ChannelTerminated(ENTRYPOINT, Terminal.CANCELLED) in peer.events
    (ctrl,) = peer.wire.streams_to(ENTRYPOINT)
    assert ctrl.routed == [AckReliable((0, 2)), CloseReceiver()] and ctrl.fin
    assert peer.wire.of_type(CloseReceiver, route=C_SENDS_1) == [CloseReceiver()]
    assert_open(peer)


def test_case_46_close_after_finish_still_drains_then_finished() -> None:
    """case 46: CLOSE after a completed FINISH: the app still drains every buffered message
    and then sees Finished."""
    peer = server()
    peer.routed(
        ENTRYPOINT,
        Message(0, payload=b"a"),
        Message(1, payload=b"b"),
        Message(2, payload=b"c"),
        FinishSender(3),
    )
    (ctrl,) = peer.wire.streams_to(ENTRYPOINT)
    assert ctrl.routed == [AckReliable((0, 3)), CloseReceiver()] and ctrl.fin  # at once
    assert peer.new_events() == [
        MessageArrived(ENTRYPOINT),
        MessageArrived(ENTRYPOINT),
        MessageArrived(ENTRYPOINT),
        ChannelTerminated(ENTRYPOINT, Terminal.FINISHED),
    ]
    peer.advance(10.0)
    assert drain(peer.conn, ENTRYPOINT, peer.now) == ([b"a", b"b", b"c"], True)
    with pytest.raises(EndOfChannel):  # and it stays finished
        peer.conn.recv(ENTRYPOINT, now=peer.now)


def test_case_47_late_frames_for_destroyed_remote_created_channel_ignored() -> None:
    """case 47: Late frames for a destroyed remote-created channel are ignored, and no state
    is re-created (the tombstone is permanent)."""
    peer = server()
    conn = peer.conn
    attach = (Attachment(C_SENDS_1), Attachment(S_SENDS_0))
    peer.routed(ENTRYPOINT, Message(0, attachments=attach), fin=False)
    conn.recv(ENTRYPOINT, now=peer.now)
    # Channel 8: the client sends, finishes; we drain it and close it.
    peer.routed(C_SENDS_1, Message(0, payload=b"x"), FinishSender(1))
    assert drain(conn, C_SENDS_1, peer.now) == ([b"x"], True)
    conn.close_receiver(C_SENDS_1, now=peer.now)
    # Channel 2: we send; the client's receiver acks and closes.
    conn.send(S_SENDS_0, b"y", now=peer.now)
    peer.routed(S_SENDS_0, AckReliable((0, 1)), CloseReceiver())
    conn.finish(S_SENDS_0, now=peer.now)
    peer.advance(30.0)
    mark, events = len(peer.wire.log), len(peer.events)

    # Late frames, each of which would be a violation if the state still existed.
    peer.routed(C_SENDS_1, Message(0, payload=b"dup"))
    peer.routed(C_SENDS_1, Message(1), FinishSender(2))
    peer.routed_datagram(C_SENDS_1, Message(0))
    peer.routed(C_SENDS_1, CancelSender())
    peer.routed(S_SENDS_0, AckReliable((0, 1)), CloseReceiver())
    peer.advance(60.0)
    peer.routed(C_SENDS_1, Message(0))  # still, a minute later
    peer.advance(60.0)
    assert_open(peer)
    assert peer.wire.log[mark:] == []  # no send-back ROUTE_TO (no new state), no FORGET
    assert peer.events[events:] == []


def test_case_48_late_route_to_for_destroyed_local_channel_forget_rate_limited() -> None:
    """case 48: A late ROUTE_TO for a destroyed local-created channel → FORGET. A burst of 100
    late datagrams yields at most one FORGET per second."""
    peer = client()
    conn = peer.conn
    (rx,) = conn.send(ENTRYPOINT, b"", attachments=[NewChannel(False)], now=peer.now)
    conn.close_receiver(rx, now=peer.now)  # destroyed here; the server may not know yet
    peer.routed(rx, Message(0))  # a late stream from the server's sender
    (forget,) = peer.wire.sent(ForgetChannel)
    record = peer.wire.streams[forget.stream_id]
    assert record.frames == [RouteTo(rx), ForgetChannel()] and record.fin

    peer.advance(2.0)
    for i in range(100):  # a burst of late datagrams within half a second
        peer.routed_datagram(rx, Message(i))
        peer.advance(0.005)
    assert len(peer.wire.sent(ForgetChannel)) == 2
    for i in range(100):  # and 100 more, spread over three seconds
        peer.routed_datagram(rx, Message(100 + i))
        peer.advance(0.03)
    times = [s.time for s in peer.wire.sent(ForgetChannel)]
    assert 4 <= len(times) <= 5
    assert all(b - a >= 1.0 for a, b in pairwise(times))
    assert_open(peer)


def test_case_49_send_back_route_to_and_ghost_removal() -> None:
    """case 49: A ROUTE_TO that creates remote-created state → a send-back ROUTE_TO as the
    first frame of the control stream. If the creator has no state, it answers FORGET and the
    ghost is gone within about one RTT."""
    peer = server()
    peer.routed(C_SENDS_1, Message(0, payload=b"early"), fin=False)
    (back,) = peer.wire.streams_to(C_SENDS_1)
    assert back.frames == [RouteTo(C_SENDS_1)] and not back.fin  # opens our control stream
    peer.advance(0.1)
    assert back.frames == [RouteTo(C_SENDS_1), AckReliable((0, 1))]  # later frames follow it
    # Engine decision 2: a ROUTE_TO creating a non-creator *sender* sends nothing back.
    peer.routed(make_chanid(CLIENT, SERVER, False, 1))
    assert not peer.wire.streams_to(make_chanid(CLIENT, SERVER, False, 1))
    assert_open(peer)

    # Two engines: the client allocated channel 8 but never put it on the wire (its message
    # was evicted before numbering), then a stale frame for 8 reaches the server.
    net = SimNetwork(seed=49)
    log = NetworkLog.watch(net)
    net.handshake()
    c, s = net.client, net.server
    c.configure_sender(ENTRYPOINT, Mode.UNRELIABLE, QueuePolicy.DROP_OLDEST, 1)
    c.set_transport_backlog(1, 0)  # the transport is full: sends wait in the queue
    (ghost,) = c.send(ENTRYPOINT, b"evicted", attachments=[NewChannel(True)], now=net.now)
    c.send(ENTRYPOINT, b"kept", now=net.now)
    c.set_transport_backlog(0, None)
    net.run()
    t0 = net.now
    s.stream_data(1002, encode_frames(RouteTo(ghost), Message(0, payload=b"boo")), True, t0)
    assert s.pending_channels()[0] == 1  # the ghost exists
    rtt = 2 * net.delay[1]
    net.run(until=t0 + rtt + 1e-9)
    assert s.pending_channels() == (0, 0)  # gone within one (worst-case) RTT
    assert log.server.streams_to(ghost)[0].first == RouteTo(ghost)  # the send-back
    assert log.client.of_type(ForgetChannel, route=ghost) == [ForgetChannel()]
    assert ghost not in arrived(net.server_events)
    net.run()
    assert len(log.client.of_type(ForgetChannel)) == 1


def test_case_50_forget_aborts_sends_resets_streams_overrides_close() -> None:
    """case 50: FORGET aborts pending sends and resets the channel's streams. It overrides a
    pending CLOSE."""
    peer = server()
    conn = peer.conn
    # A receiver made by ROUTE_TO, FINISH pending (it owes an ack and a CLOSE_RECEIVER).
    peer.routed(C_SENDS_1, Message(1, payload=b"x"), FinishSender(3))
    (back,) = peer.wire.streams_to(C_SENDS_1)
    peer.routed(C_SENDS_1, ForgetChannel())
    assert back.stream_id in peer.wire.resets and not back.fin
    # Retained data of a finished, closed channel not attached yet is discarded too.
    peer.routed(C_SENDS_2, Message(0, payload=b"retained"), FinishSender(1))
    assert peer.wire.of_type(CloseReceiver, route=C_SENDS_2)
    peer.routed(C_SENDS_2, ForgetChannel())
    # A sender attached in a message the application has not taken yet.
    peer.routed(ENTRYPOINT, Message(0, attachments=(Attachment(S_SENDS_0),)), fin=False)
    peer.routed(S_SENDS_0, ForgetChannel())
    peer.advance(5.0)
    assert not peer.wire.of_type(AckReliable, route=C_SENDS_1)  # the pending ack: aborted
    assert not peer.wire.of_type(CloseReceiver, route=C_SENDS_1)  # the CLOSE: overridden

    # The attaching messages arrive after all: the handles are lost, the data never shows.
    late = (Attachment(C_SENDS_1), Attachment(C_SENDS_2))
    peer.routed(ENTRYPOINT, Message(1, attachments=late))
    assert conn.recv(ENTRYPOINT, now=peer.now) is not None
    assert conn.recv(ENTRYPOINT, now=peer.now) is not None
    for chanid in (C_SENDS_1, C_SENDS_2):
        with pytest.raises(LostInTransit):
            conn.recv(chanid, now=peer.now)
    with pytest.raises(LostInTransit):
        conn.send(S_SENDS_0, b"never", now=peer.now)
    assert not peer.wire.sent(route=S_SENDS_0)  # nothing ever went out for it
    assert_open(peer)

    # A held sender (engine decision 1): FORGET stops it and aborts what still waits in its
    # queue (a channel attached there is lost locally); the nacks wait for the CLOSE.
    held = make_chanid(CLIENT, SERVER, False, 1)
    peer.routed(ENTRYPOINT, Message(2, attachments=(Attachment(held),)))
    conn.recv(ENTRYPOINT, now=peer.now)
    conn.send(held, b"sent", now=peer.now)
    conn.set_transport_backlog(1, 0)
    (child,) = conn.send(held, b"queued", attachments=[NewChannel(True)], now=peer.now)
    peer.routed(held, ForgetChannel())
    conn.set_transport_backlog(0, None)
    peer.collect()
    assert [m.payload for m in peer.wire.of_type(Message, route=held)] == [b"sent"]
    assert terminals(peer.events)[held] == [Terminal.RECEIVER_DROPPED]
    assert terminals(peer.events)[child] == [Terminal.LOST_IN_TRANSIT]
    assert not peer.wire.sent(route=child)


def test_case_51_data_before_attach_buffered_then_channel_headers() -> None:
    """case 51: Data that arrives before its attaching message is buffered. Once attached it
    is decoded with the channel headers from the attachment."""
    peer = server()
    conn = peer.conn
    peer.routed(C_SENDS_1, Message(0, payload=b"early"), fin=False)
    assert conn.pending_channels() == (1, len(b"early"))
    assert arrived(peer.new_events()) == []  # nobody holds it yet
    codec = ((b"codec-abcdef", b"cbor"),)
    peer.routed(ENTRYPOINT, Message(0, attachments=(Attachment(C_SENDS_1, codec),)))
    assert conn.pending_channels() == (0, 0)
    msg = conn.recv(ENTRYPOINT, now=peer.now)
    assert msg is not None and msg.attachments == (Attachment(C_SENDS_1, codec),)
    assert conn.channel_headers(C_SENDS_1) == codec
    early = conn.recv(C_SENDS_1, now=peer.now)
    assert early is not None and early.payload == b"early"
    peer.routed(C_SENDS_1, Message(1, payload=b"later"))
    assert arrived(peer.new_events()) == [ENTRYPOINT, C_SENDS_1]
    assert drain(conn, C_SENDS_1, peer.now) == ([b"later"], False)


def test_case_52_finished_and_closed_before_attach_data_retained() -> None:
    """case 52: A channel that finished and closed before its attaching message arrived: the
    data is retained and delivered after the attach."""
    peer = server()
    conn = peer.conn
    peer.routed(C_SENDS_1, Message(0, payload=b"a"), Message(1, payload=b"b"), FinishSender(2))
    (ctrl,) = peer.wire.streams_to(C_SENDS_1)
    assert ctrl.frames == [RouteTo(C_SENDS_1), AckReliable((0, 2)), CloseReceiver()] and ctrl.fin
    peer.advance(10.0)
    peer.routed(ENTRYPOINT, Message(0, attachments=(Attachment(C_SENDS_1),)))
    conn.recv(ENTRYPOINT, now=peer.now)
    assert drain(conn, C_SENDS_1, peer.now) == ([b"a", b"b"], True)
    assert ChannelTerminated(C_SENDS_1, Terminal.FINISHED) in peer.events
    assert conn.pending_channels() == (0, 0)
    assert_open(peer)
    assert SERVER is peer.side


def test_forget_before_the_app_takes_a_queued_handle_reports_lost_in_transit() -> None:
    """Regression (found by case 50): FORGET for a channel whose attaching message is already
    queued but not yet dequeued must leave a handle that reports LostInTransit (§2.5 FORGET
    step 2, §2.6, §2.10), not a handle the engine no longer knows."""
    for chanid in (S_SENDS_0, C_SENDS_1):  # we hold the sender half / the receiver half
        peer = server()
        peer.routed(ENTRYPOINT, Message(0, attachments=(Attachment(chanid),)), fin=False)
        peer.routed(chanid, ForgetChannel())
        msg = peer.conn.recv(ENTRYPOINT, now=peer.now)
        assert msg is not None and msg.attachments == (Attachment(chanid),)
        with pytest.raises(LostInTransit):
            if chanid == S_SENDS_0:
                peer.conn.send(chanid, b"x", now=peer.now)
            else:
                peer.conn.recv(chanid, now=peer.now)
        assert terminals(peer.events) == {chanid: [Terminal.LOST_IN_TRANSIT]}
        assert_open(peer)
