"""Flow control (issue 5): conformance cases 63-69 of profile §6, driven through the engine.

The design is profile §3.4: per-channel byte credit granted by the receiver, negotiated by a
connection header, cost(m) = the encoded MESSAGE frame, DEQUEUED (tag 12) on the receiver's
control stream, the progress rule, nacked datagrams releasing their cost, enforcement with
close code 3, and no connection-wide blocking window. A ScriptedPeer plays the other side
exactly where a case needs byte-exact credit (or a cheating sender); two engines over the
simulated network show the end-to-end behaviour. The same cases over real QUIC are in
``test_flow_control_quic.py``. The last section runs the engine soak with tiny windows.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import test_engine_soak as soak
from engine_case_helpers import (
    C_SENDS_1,
    C_SENDS_2,
    assert_open,
    assert_violation,
    client,
    drain,
    server,
)

from aqueduct_core.engine import (
    ChannelTerminated,
    Command,
    Connection,
    EngineConfig,
    Mode,
    NewChannel,
    QueuePolicy,
    Terminal,
)
from aqueduct_core.errors import CloseCode
from aqueduct_core.testing.scripted import NetworkLog, ScriptedPeer
from aqueduct_core.testing.simnet import SimNetwork
from aqueduct_core.wire import (
    ENTRYPOINT,
    AckNackUnreliable,
    AckReliable,
    Attachment,
    CancelSender,
    CloseReceiver,
    Dequeued,
    FinishSender,
    Message,
    message_cost,
)
from aqueduct_core.wire.chanid import Side
from aqueduct_core.wire.frames import MESSAGE_OVERHEAD
from aqueduct_core.wire.ranges import encode_ack_nack

OVH = MESSAGE_OVERHEAD
W = 100 + 2 * OVH
"""Two 30-byte messages fit, a third does not; a 59-byte and a 31-byte one fill it exactly."""
"""A window small enough to count by hand (costs below are for payloads < 128 bytes)."""


def cost(payload: bytes, num: int = 0) -> int:
    return message_cost(Message(num, payload=payload))


def on_wire(peer: ScriptedPeer, chanid: int = ENTRYPOINT) -> list[bytes]:
    """The payloads of every MESSAGE the engine wrote to ``chanid`` (streams and datagrams),
    in the order written."""
    return [bytes(m.payload) for m in peer.wire.of_type(Message, route=chanid)]


def dequeued_frames(peer: ScriptedPeer, chanid: int = ENTRYPOINT) -> list[Dequeued]:
    return peer.wire.of_type(Dequeued, route=chanid)


def watch_buffered(conn: Connection, chanid: int) -> Callable[[], int]:
    """Sample the bytes ``conn`` buffers for ``chanid`` after every stream chunk and datagram
    it receives; returns a function giving the peak so far."""
    peak = 0

    def sample() -> None:
        nonlocal peak
        peak = max(peak, conn.memory().received.get(chanid, 0))

    def wrap(method: Callable[..., None]) -> Callable[..., None]:
        def wrapped(*args: object, **kwargs: object) -> None:
            method(*args, **kwargs)
            sample()

        return wrapped

    conn.stream_data = wrap(conn.stream_data)  # type: ignore[method-assign]
    conn.datagram_received = wrap(conn.datagram_received)  # type: ignore[method-assign]
    return lambda: peak


# -- case 63 ------------------------------------------------------------------------------


def test_case_63_sender_stops_at_the_window_and_resumes_on_dequeued() -> None:
    """case 63: The sender stops at the window W and resumes on DEQUEUED."""
    peer = client(flow_window=W)
    conn = peer.conn
    payloads = [bytes([65 + i]) * 30 for i in range(6)]
    c = cost(payloads[0])
    assert 2 * c <= W < 3 * c
    for p in payloads:
        conn.send(ENTRYPOINT, p, now=peer.now)
    assert on_wire(peer) == payloads[:2]
    assert conn.memory().queued_to_send == {ENTRYPOINT: 4 * 30}
    peer.advance(5.0)  # time alone never returns credit (acks do not either)
    peer.routed(ENTRYPOINT, AckReliable((0, 2)))
    assert on_wire(peer) == payloads[:2]

    peer.routed(ENTRYPOINT, Dequeued(c))
    assert on_wire(peer) == payloads[:3]  # exactly one more fits
    peer.routed(ENTRYPOINT, Dequeued(2 * c))
    assert on_wire(peer) == payloads[:5]
    peer.routed(ENTRYPOINT, Dequeued(2 * c))
    assert on_wire(peer) == payloads
    assert conn.memory().queued_to_send == {}
    assert_open(peer)


def test_dequeued_for_more_than_was_outstanding_is_a_violation() -> None:
    """Enforcement the other way round: a receiver that reports more dequeued bytes than
    were outstanding is cheating, and the sender closes the connection with code 3."""
    peer = client(flow_window=W)
    peer.conn.send(ENTRYPOINT, b"x" * 30, now=peer.now)
    peer.routed(ENTRYPOINT, Dequeued(cost(b"x" * 30) + 1))
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)


def test_window_bounds_a_stalled_consumer_between_two_engines() -> None:
    """Two honest engines: while the receiving application reads nothing, it buffers at most
    W bytes of the channel and the rest waits in the sender's queue; reading resumes the
    flow and every message arrives, in order."""
    window = 1024
    config = EngineConfig(flow_window=window)
    net = SimNetwork(seed=63, max_chunk=300, client_config=config, server_config=config)
    net.handshake()
    peak = watch_buffered(net.server, ENTRYPOINT)
    sent = [b"%04d" % i + b"." * 196 for i in range(50)]
    per_window = window // cost(sent[0])
    for payload in sent:
        net.client.send(ENTRYPOINT, payload, now=net.now)
    net.run()
    assert net.server.memory().received == {ENTRYPOINT: per_window * cost(sent[0])}
    assert net.client.memory().queued_to_send == {ENTRYPOINT: (50 - per_window) * 200}

    got: list[bytes] = []
    for _ in range(200):
        more, _ = drain(net.server, ENTRYPOINT, net.now)
        got += more
        net.run()
        if len(got) == len(sent):
            break
    assert got == sent
    assert peak() <= window
    assert net.client.memory().total == 0 and net.server.memory().total == 0


# -- case 64 ------------------------------------------------------------------------------


def test_case_64_a_message_bigger_than_the_window_goes_when_nothing_is_outstanding() -> None:
    """case 64: A single message bigger than W goes through when nothing is outstanding."""
    big, small = b"B" * 1000, b"s" * 10
    # The sender: the big message leaves at once; anything after it waits for its DEQUEUED.
    peer = client(flow_window=W)
    conn = peer.conn
    conn.send(ENTRYPOINT, big, now=peer.now)
    conn.send(ENTRYPOINT, small, now=peer.now)
    assert on_wire(peer) == [big]
    peer.routed(ENTRYPOINT, Dequeued(cost(big)))
    assert on_wire(peer) == [big, small]
    # The progress rule needs *nothing* outstanding, not merely room for part of it.
    conn.send(ENTRYPOINT, big, now=peer.now)
    assert on_wire(peer) == [big, small]
    peer.routed(ENTRYPOINT, Dequeued(cost(small, 1)))
    assert on_wire(peer) == [big, small, big]
    assert_open(peer)

    # The receiver: B = cost(m) > W is no violation; the application gets it whole.
    rx = server(EngineConfig(flow_window=W), flow_window=1 << 20)
    rx.routed(ENTRYPOINT, Message(0, payload=big))
    rx.routed(ENTRYPOINT, Message(1, payload=big))
    assert_violation(rx, CloseCode.LIMIT_VIOLATION)  # two at once: B > W and B != cost

    rx = server(EngineConfig(flow_window=W), flow_window=1 << 20)
    for num in range(3):
        rx.routed(ENTRYPOINT, Message(num, payload=big))
        msg = rx.conn.recv(ENTRYPOINT, now=rx.now)
        assert msg is not None and bytes(msg.payload) == big
    assert dequeued_frames(rx) == [Dequeued(cost(big, n)) for n in range(3)]
    assert_open(rx)


# -- case 65 ------------------------------------------------------------------------------


@pytest.mark.parametrize("datagram", [False, True], ids=["streams", "datagrams"])
def test_case_65_receiver_closes_with_code_3_when_the_window_is_exceeded(datagram: bool) -> None:
    """case 65: A receiver seeing B > W with B ≠ cost(m) closes the connection with code 3."""
    peer = server(EngineConfig(flow_window=W), flow_window=1 << 20)
    conn = peer.conn

    def deliver(num: int, size: int) -> None:
        msg = Message(num, payload=b"p" * size)
        if datagram:
            peer.routed_datagram(ENTRYPOINT, msg)
        else:
            peer.routed(ENTRYPOINT, msg)

    deliver(0, 59)  # B = 64
    assert conn.recv(ENTRYPOINT, now=peer.now) is not None
    assert dequeued_frames(peer) == [Dequeued(64 + OVH)]  # >= W/2: reported at once, B = 0
    deliver(1, 59)  # B = 64 + OVH
    deliver(2, 31)  # B = 100 + 2 OVH = W: still allowed
    assert conn.memory().received == {ENTRYPOINT: W}
    assert_open(peer)
    deliver(3, 0)  # B = W + 5 + OVH > W, and != cost(m) = 5 + OVH
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)
    assert conn.memory().total == 0  # nothing stays buffered on a closed connection


# -- case 66 ------------------------------------------------------------------------------


def test_case_66_nacked_unreliable_messages_release_their_cost() -> None:
    """case 66: The cost of nacked unreliable messages is released at the sender. Evictions
    count as dequeued.

    The engine never evicts on the receiving side (its queue is bounded by the window
    instead), so "evictions" here are the sender's drop-oldest queue: the eviction happens
    before numbering, so it never consumed credit and needs neither a nack nor a DEQUEUED.
    """
    peer = client(flow_window=W)
    conn = peer.conn
    conn.configure_sender(ENTRYPOINT, Mode.UNRELIABLE)
    payloads = [bytes([97 + i]) * 30 for i in range(4)]
    c = cost(payloads[0])
    for p in payloads:
        conn.send(ENTRYPOINT, p, now=peer.now)
    assert on_wire(peer) == payloads[:2]
    assert len(peer.wire.datagrams_to(ENTRYPOINT)) == 2
    peer.routed(ENTRYPOINT, AckNackUnreliable(encode_ack_nack([False, True])))
    assert on_wire(peer) == payloads[:3]  # the nack of #0 released c; the ack of #1 nothing
    peer.routed(ENTRYPOINT, Dequeued(c))  # #1 was dequeued
    assert on_wire(peer) == payloads
    peer.routed(ENTRYPOINT, Dequeued(2 * c))  # exactly #2 and #3 remain outstanding
    assert_open(peer)

    # Drop-oldest: the evicted message never took credit.
    peer = client(flow_window=W)
    conn = peer.conn
    conn.configure_sender(ENTRYPOINT, Mode.UNRELIABLE, QueuePolicy.DROP_OLDEST, 1)
    for p in payloads:
        conn.send(ENTRYPOINT, p, now=peer.now)  # #2 is evicted by #3 while the window is full
    assert on_wire(peer) == payloads[:2]
    peer.routed(ENTRYPOINT, Dequeued(c))
    assert on_wire(peer) == [payloads[0], payloads[1], payloads[3]]
    nums = [m.num for m in peer.wire.of_type(Message, route=ENTRYPOINT)]
    assert nums == [0, 1, 2]  # no gap in the numbers: nothing to nack
    peer.routed(ENTRYPOINT, Dequeued(2 * c))
    assert_open(peer)

    # The receiver never counts a datagram that arrives after its nack, so an honest sender
    # that spent the released credit is not taken for a cheat.
    rx = server(EngineConfig(flow_window=W), flow_window=1 << 20)
    late = Message(0, payload=b"l" * 30)
    rx.routed_datagram(ENTRYPOINT, Message(1, payload=b"m" * 30))  # #0 now known missing
    rx.advance(1.0)
    assert rx.wire.of_type(AckNackUnreliable) == [AckNackUnreliable(encode_ack_nack([False, True]))]
    rx.routed_datagram(ENTRYPOINT, late)  # ignored: never delivered, never counted
    rx.routed_datagram(ENTRYPOINT, Message(2, payload=b"n" * 30))  # B = 2c, not 3c
    assert rx.conn.memory().received == {ENTRYPOINT: 2 * c}
    assert_open(rx)


def test_lossy_unreliable_channel_with_a_one_byte_window_never_stalls() -> None:
    """Case 66 between two engines: half the datagrams are lost and a one-byte window lets
    one message out at a time. Each lost message's cost comes back only with its nack, so
    the channel finishes only if every nack releases credit."""
    config = EngineConfig(flow_window=1)
    net = SimNetwork(seed=66, loss=0.5, client_config=config, server_config=config)
    net.handshake()
    net.client.configure_sender(ENTRYPOINT, Mode.UNRELIABLE)
    sent = [b"u%03d" % i for i in range(100)]
    for payload in sent:
        net.client.send(ENTRYPOINT, payload, now=net.now)
    net.client.finish(ENTRYPOINT, now=net.now)
    got: list[bytes] = []
    finished = False
    for _ in range(1000):
        more, finished = drain(net.server, ENTRYPOINT, net.now)
        got += more
        if finished:
            break
        net.run()
    net.run()
    assert finished
    assert 0 < len(got) < len(sent)  # some were lost, and their cost was released
    assert got == [p for p in sent if p in set(got)]  # one at a time: in order, no duplicates
    ends = [e for e in net.client_events if isinstance(e, ChannelTerminated)]
    assert ends == [ChannelTerminated(ENTRYPOINT, Terminal.FINISHED)]
    assert net.client.memory().total == 0


# -- case 67 ------------------------------------------------------------------------------


def test_case_67_no_cross_channel_stall() -> None:
    """case 67: No cross-channel stall: channel B keeps flowing while channel A's app is
    stalled with a full window, including in UNORDERED mode with hundreds of streams."""
    window = 1024
    config = EngineConfig(flow_window=window)
    net = SimNetwork(seed=67, client_config=config, server_config=config)
    net.handshake()
    c, s = net.client, net.server
    a, b = c.send(ENTRYPOINT, b"A and B", attachments=[NewChannel(True)] * 2, now=net.now)
    for chan in (a, b):
        c.configure_sender(chan, Mode.UNORDERED)
    (child,) = c.send(a, b"A0 carries the child", attachments=[NewChannel(True)], now=net.now)
    c.configure_sender(child, Mode.UNORDERED)
    net.run()
    assert drain(s, ENTRYPOINT, net.now)[0] == [b"A and B"]
    first = s.recv(a, now=net.now)
    assert first is not None and [att.chanid for att in first.attachments] == [child]
    # From here on the application never reads A.
    peak = watch_buffered(s, a)
    stalled = [b"a%03d" % i + b"." * 96 for i in range(300)]
    for payload in stalled:
        c.send(a, payload, now=net.now)
    flowing = {chan: [b"%d-%03d" % (chan, i) for i in range(300)] for chan in (b, child)}
    for chan, payloads in flowing.items():
        for payload in payloads:
            c.send(chan, payload, now=net.now)
        c.finish(chan, now=net.now)

    got: dict[int, list[bytes]] = {b: [], child: []}
    done: set[int] = set()
    for _ in range(500):
        net.run()
        for chan in got:
            more, finished = drain(s, chan, net.now)
            got[chan] += more
            if finished:
                done.add(chan)
        if done == set(got):
            break
    assert done == {b, child}
    for chan, payloads in flowing.items():
        assert sorted(got[chan]) == payloads  # UNORDERED: every message, exactly once
    # A stayed stalled at its window the whole time: most of it still waits at the sender.
    a_cost = cost(stalled[0], 200)
    assert window - a_cost < s.memory().received[a] <= window
    assert peak() <= window
    assert c.memory().queued_to_send[a] > 250 * 100

    c.finish(a, now=net.now)
    rest: list[bytes] = []
    for _ in range(1000):
        more, finished = drain(s, a, net.now)
        rest += more
        if finished:
            break
        net.run()
    assert sorted(rest) == stalled


# -- case 68 ------------------------------------------------------------------------------


def test_case_68_the_engine_consumes_every_stream_while_the_app_queue_is_full() -> None:
    """case 68: The receive loop keeps reading QUIC while app queues are full, so QUIC
    MAX_STREAMS and MAX_DATA are never exhausted.

    In the engine this means: with a channel's window exactly full and its application
    reading nothing, every stream is still read to its end and acted on. Each of the
    hundreds of one-message streams is acked within the ack delay (what the transport needs
    to release QUIC credit), control frames on new streams are processed at once, and
    another channel's messages are delivered.
    """
    n = 300
    payload = b"q" * 20
    window = sum(cost(payload, i) for i in range(n))
    peer = server(EngineConfig(flow_window=window), flow_window=1 << 20)
    conn = peer.conn
    peer.routed(ENTRYPOINT, Message(0, attachments=(Attachment(C_SENDS_1), Attachment(C_SENDS_2))))
    assert conn.recv(ENTRYPOINT, now=peer.now) is not None
    for i in range(n):
        peer.routed(C_SENDS_1, Message(i, payload=payload))  # one stream each, with FIN
    assert conn.memory().received[C_SENDS_1] == window  # full, and nothing read
    peer.advance(conn.config.ack_delay)
    acked = peer.wire.of_type(AckReliable, route=C_SENDS_1)
    assert sum(acked[0].ranges[1::2]) == n and len(acked) == 1  # all n, in one ack
    peer.routed(C_SENDS_2, Message(0, payload=b"sibling"))
    sibling = conn.recv(C_SENDS_2, now=peer.now)
    assert sibling is not None and bytes(sibling.payload) == b"sibling"
    peer.routed(C_SENDS_1, FinishSender(n))
    assert peer.wire.of_type(CloseReceiver, route=C_SENDS_1) == [CloseReceiver()]
    got, finished = drain(conn, C_SENDS_1, peer.now)
    assert len(got) == n and finished
    assert dequeued_frames(peer, C_SENDS_1) == []  # never after CLOSE_RECEIVER
    assert_open(peer)


# -- case 69 ------------------------------------------------------------------------------


def test_case_69_a_peer_without_a_window_gets_unlimited_credit_and_no_dequeued() -> None:
    """case 69: A peer that does not advertise a window gets unlimited credit, and DEQUEUED
    is never sent to it."""
    blob = b"z" * 10_000
    # We send to a server that advertises nothing. Before its headers arrive the client
    # assumes a window of 1 (one message may go); once they arrive without a window, all go.
    peer = ScriptedPeer(Side.CLIENT)
    peer.start()
    conn = peer.conn
    for _ in range(100):
        conn.send(ENTRYPOINT, blob, now=peer.now)
    assert len(on_wire(peer)) == 1
    peer.handshake()
    assert len(on_wire(peer)) == 100  # 1 MB, four times our own default window
    assert conn.memory().queued_to_send == {}

    # We receive from a client that advertises nothing: 1 MB with no credit is no violation,
    # and what the application dequeues is never reported.
    peer = server(flow_window=None)
    conn = peer.conn
    for num in range(100):
        peer.routed(ENTRYPOINT, Message(num, payload=blob))
    assert conn.memory().received[ENTRYPOINT] == 100 * len(blob)
    got, _ = drain(conn, ENTRYPOINT, peer.now)
    assert len(got) == 100
    peer.advance(10.0)
    assert dequeued_frames(peer) == []
    assert_open(peer)


# -- the rest of §3.4 ---------------------------------------------------------------------


def test_metadata_never_waits_for_credit() -> None:
    """With the window full, FINISH and CANCEL leave at once (§3.2 item 7): only messages
    wait for credit, and FINISH only for the messages queued before it, which it counts."""
    peer = client(flow_window=1)
    conn = peer.conn
    conn.send(ENTRYPOINT, b"fills the window", now=peer.now)
    conn.finish(ENTRYPOINT, now=peer.now)
    assert peer.wire.of_type(FinishSender) == [FinishSender(1)]

    peer = client(flow_window=1)
    conn = peer.conn
    for _ in range(3):
        conn.send(ENTRYPOINT, b"m", now=peer.now)
    assert len(on_wire(peer)) == 1
    conn.cancel(ENTRYPOINT, now=peer.now)
    assert peer.wire.of_type(CancelSender) == [CancelSender()]
    assert conn.memory().queued_to_send == {}
    assert dequeued_frames(peer) == []


def test_channels_not_yet_attached_are_capped_in_number_and_bytes() -> None:
    """Data may arrive for channels whose attaching message has not (§3.2 item 8): beyond
    the configured count of such channels, or bytes buffered in them, code 3."""
    peer = server(EngineConfig(max_pending_channels=2), flow_window=1 << 20)
    peer.routed(C_SENDS_1, Message(0, payload=b"early"))
    peer.routed(C_SENDS_2, Message(0, payload=b"early"))
    assert peer.conn.pending_channels() == (2, 2 * len(b"early") + 2 * (5 + OVH))
    assert_open(peer)
    peer.routed(C_SENDS_2 + 8, Message(0, payload=b"one too many"))
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)

    peer = server(EngineConfig(max_pending_bytes=100 + 2 * OVH), flow_window=1 << 20)
    peer.routed(C_SENDS_1, Message(0, payload=b"x" * 60))
    assert_open(peer)
    peer.routed(C_SENDS_2, Message(0, payload=b"x" * 60))
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)


# -- the engine soak with tiny windows (issue 5 acceptance) -------------------------------


def soak_with_window(
    monkeypatch: pytest.MonkeyPatch, seed: int, window: int, *, decode: bool = False, **kw: int
) -> NetworkLog:
    """``run_workload`` of the engine soak with ``flow_window=window``; checks that both
    engines negotiated that window. Returns what each engine wrote (decoded if ``decode``)."""
    made: list[SimNetwork] = []
    log = NetworkLog()

    def recording(**kwargs: object) -> SimNetwork:
        tap = kwargs.pop("observer")

        def observe(side: Side, cmd: Command) -> None:
            tap(side, cmd)  # type: ignore[operator]
            if decode:
                log(side, cmd)

        net = SimNetwork(observer=observe, **kwargs)  # type: ignore[arg-type]
        made.append(net)
        return net

    monkeypatch.setattr(soak, "SimNetwork", recording)
    soak.run_workload(seed, flow_window=window, **kw)
    (net,) = made
    for conn in (net.client, net.server):
        assert conn.own_window == window and conn.peer_window == window, "not negotiated"
    return log


@pytest.mark.parametrize("window", [1, 1024])
@pytest.mark.parametrize("seed", range(100))
def test_soak_with_tiny_windows(monkeypatch: pytest.MonkeyPatch, seed: int, window: int) -> None:
    """The randomized engine soak (test_engine_soak.py: no deadlock, nothing lost that must
    arrive, one terminal state per handle, no leaked state) with flow control negotiated and
    windows of 1 byte and 1 KiB."""
    soak_with_window(monkeypatch, 50_000 + seed, window)


@pytest.mark.parametrize("window", [1, 1024])
def test_soak_with_tiny_windows_really_exercises_credit(
    monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    """Across a few soak seeds, receivers report DEQUEUED on both sides: the windows were
    not just negotiated but used."""
    counts = {Side.CLIENT: 0, Side.SERVER: 0}
    for seed in range(5):
        log = soak_with_window(monkeypatch, 60_000 + seed, window, decode=True)
        for side in Side:
            counts[side] += len(log[side].of_type(Dequeued))
    assert all(counts.values()), counts


@pytest.mark.slow
@pytest.mark.parametrize("window", [1, 1024])
@pytest.mark.parametrize("seed", range(3000))
def test_soak_with_tiny_windows_many(
    monkeypatch: pytest.MonkeyPatch, seed: int, window: int
) -> None:
    soak_with_window(monkeypatch, 100_000 + seed, window, steps=200)
