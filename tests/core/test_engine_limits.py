"""Engine limits against a hostile peer (issue 13): message-number gaps (G31), acks as
ranges, bytes of unfinished messages charged to the windows, bytes before headers.

Each test plays the attacker by raw frames against the sans-IO engine and checks what the
service would feel: how fast the engine decides, how much it holds, and that it closes the
connection with code 3 (limit violation) instead of doing per-number work.
"""

from __future__ import annotations

import time

from engine_case_helpers import C_SENDS_1, C_SENDS_2, SERVER, assert_open, assert_violation, server

from aqueduct_core.engine import EngineConfig
from aqueduct_core.errors import CloseCode
from aqueduct_core.testing.scripted import ScriptedPeer
from aqueduct_core.wire import (
    ENTRYPOINT,
    AckNackUnreliable,
    ConnectionHeaders,
    Message,
    RouteTo,
    SentUnreliable,
    Version,
    encode_frames,
)
from aqueduct_core.wire import ranges as wr
from aqueduct_core.wire.primitives import encode_varint

MiB = 1024 * 1024
W = 16 * MiB
GAP = EngineConfig().max_message_gap


def unfinished(chanid: int, payload_len: int, sent: int = 16) -> bytes:
    """VERSION ROUTE_TO(chanid) and a MESSAGE announcing ``payload_len`` bytes, of which only
    ``sent`` follow."""
    head = encode_frames(Version(), RouteTo(chanid), Message(0, (), (), b""))
    # The payload length is the head's last varint (0 here, one byte): announce ours.
    assert head.endswith(b"\0")
    return head[:-1] + encode_varint(payload_len) + b"\0" * sent


def flow_server() -> ScriptedPeer:
    return server(EngineConfig(flow_window=W), flow_window=W)


# -- G31: message numbers far beyond the cursor -------------------------------------------


def test_one_datagram_numbered_2_40_is_refused_at_once() -> None:
    """The attack that drove the service to 11-20 GB: one datagram, MESSAGE 2**40."""
    peer = server()
    started = time.perf_counter()
    peer.routed_datagram(ENTRYPOINT, Message(1 << 40, (), (), b"x"))
    peer.advance(5.0)  # every ack and deadline timer fires
    assert time.perf_counter() - started < 1.0
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)
    assert "G31" in peer.wire.closes[0].reason


def test_reliable_number_far_beyond_the_base_is_refused() -> None:
    peer = server()
    peer.routed(ENTRYPOINT, Message(1 << 40, (), (), b"x"))
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)


def test_sent_unreliable_far_beyond_the_cursor_is_refused() -> None:
    peer = server()
    peer.routed(ENTRYPOINT, SentUnreliable(1 << 40))
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)


def test_numbers_just_inside_the_gap_are_accepted() -> None:
    peer = server()
    peer.routed_datagram(ENTRYPOINT, Message(GAP - 1, (), (), b"x"))
    peer.routed(ENTRYPOINT, Message(GAP - 1, (), (), b"y"))
    assert_open(peer)


def test_a_wide_gap_is_nacked_as_one_range_quickly() -> None:
    """Received 1 and GAP-1: the deadline decides a million numbers in one short frame."""
    peer = server()
    peer.routed_datagram(ENTRYPOINT, Message(1, (), (), b"a"))
    peer.routed_datagram(ENTRYPOINT, Message(GAP - 1, (), (), b"b"))
    started = time.perf_counter()
    peer.advance(5.0)
    assert time.perf_counter() - started < 0.5
    assert_open(peer)
    acks = [f.ranges for f in peer.wire.of_type(AckNackUnreliable, route=ENTRYPOINT)]
    # Each frame's runs start at the cursor the previous frames left.
    cursor = 0
    runs = []
    for ranges in acks:
        runs += wr.ack_nack_runs(cursor, ranges)
        cursor += sum(ranges)
    assert cursor == GAP
    assert [(a, b, ok) for a, b, ok in runs] == [
        (0, 1, False),
        (1, 2, True),
        (2, GAP - 1, False),
        (GAP - 1, GAP, True),
    ]
    assert sum(len(r) for r in acks) <= 6


def test_encode_ack_nack_runs_matches_the_per_number_encoder() -> None:
    acked = [(3, 5), (7, 8), (9, 12)]
    decisions = [any(a <= n < b for a, b in acked) for n in range(2, 14)]
    assert wr.encode_ack_nack_runs(2, 14, [(3, 5), (7, 8), (9, 12)]) == wr.encode_ack_nack(
        decisions
    )
    assert wr.encode_ack_nack_runs(0, 4, [(0, 4)]) == (4,)
    assert wr.encode_ack_nack_runs(0, 4, []) == (0, 4)


# -- bytes of unfinished messages ----------------------------------------------------------


def test_unfinished_messages_are_charged_to_the_channel_window() -> None:
    """Two unfinished 10 MiB messages on one channel exceed its 16 MiB window before their
    payloads arrive: the second head alone is refused, with only a few bytes sent."""
    peer = flow_server()
    peer.stream(unfinished(ENTRYPOINT, 10 * MiB), fin=False)
    assert_open(peer)
    peer.stream(unfinished(ENTRYPOINT, 10 * MiB), fin=False)
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)
    assert "unfinished" in peer.wire.closes[0].reason


def test_unfinished_messages_on_unattached_channels_hit_the_connection_cap() -> None:
    """The same with a fresh channel per message: the connection's cap for bytes no attached
    window covers (max_pending_bytes) stops it, again before any payload is held."""
    config = EngineConfig(flow_window=W, max_pending_bytes=64 * MiB)
    peer = server(config, flow_window=W)
    for i in range(1, 4):
        chanid = C_SENDS_1 + (i - 1) * 8
        peer.stream(unfinished(chanid, 15 * MiB), fin=False)
        assert_open(peer)
    peer.stream(unfinished(C_SENDS_1 + 3 * 8, 30 * MiB), fin=False)
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)
    assert peer.conn.memory().total < 1 * MiB


def test_a_reset_unfinished_message_gives_its_charge_back() -> None:
    peer = flow_server()
    sid = peer.stream(unfinished(ENTRYPOINT, 10 * MiB), fin=False)
    peer.reset(sid)
    peer.stream(unfinished(ENTRYPOINT, 10 * MiB), fin=False)
    assert_open(peer)


def test_a_message_arriving_in_pieces_is_charged_once() -> None:
    """The charge taken at the head is handed to the complete message, not added to it."""
    peer = flow_server()
    frames = [Version(), RouteTo(ENTRYPOINT), Message(0, (), (), b"z" * (4 * MiB))]
    peer.stream(frames, chunk=1200, fin=False)
    assert_open(peer)
    rm = peer.conn.receivers[ENTRYPOINT]
    assert 4 * MiB < rm.in_flight < 4 * MiB + 256
    peer.stream([RouteTo(ENTRYPOINT), Message(1, (), (), b"z" * (4 * MiB))], chunk=1200, fin=False)
    assert 8 * MiB < rm.in_flight < 8 * MiB + 512
    assert_open(peer)


def test_unfinished_message_on_a_channel_we_send_on_is_not_held() -> None:
    """A head routed to a channel the peer may not send on is charged as loose bytes, then
    refused when it completes."""
    peer = server(EngineConfig(flow_window=W, max_pending_bytes=8 * MiB), flow_window=W)
    peer.stream(unfinished(C_SENDS_2, 9 * MiB), fin=False)
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)


# -- bytes before CONNECTION_HEADERS ---------------------------------------------------------


def test_bytes_before_connection_headers_are_capped() -> None:
    peer = ScriptedPeer(SERVER, EngineConfig(max_early_bytes=64 * 1024))
    peer.start()
    for _ in range(3):
        peer.stream(unfinished(C_SENDS_1, 1 << 20, sent=30_000), fin=False)
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)
    assert "before the peer's CONNECTION_HEADERS" in peer.wire.closes[0].reason


def test_bytes_before_the_quic_handshake_count_too() -> None:
    """Held 0-RTT-era input (before handshake_done) is capped the same way."""
    peer = ScriptedPeer(SERVER, EngineConfig(max_early_bytes=64 * 1024))
    for _ in range(3):
        peer.stream(unfinished(C_SENDS_1, 1 << 20, sent=30_000), fin=False)
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)


def test_headers_then_data_is_not_counted_as_early() -> None:
    peer = ScriptedPeer(SERVER, EngineConfig(max_early_bytes=4096))
    peer.start()
    peer.stream([Version(), ConnectionHeaders(())])
    peer.routed(ENTRYPOINT, Message(0, (), (), b"p" * 100_000), version=True)
    assert_open(peer)


def test_incomplete_frame_heads_across_many_streams_are_capped() -> None:
    """Each stream may hold an unfinished MESSAGE head (up to the 64 KiB header limit);
    thousands of streams of those count against max_pending_bytes."""
    peer = server(EngineConfig(max_pending_bytes=4 * MiB))
    headers = ((b"k", b"v" * 60_000),)
    head = encode_frames(Version(), RouteTo(ENTRYPOINT), Message(0, headers, (), b""))
    for _ in range(80):
        peer.stream(head[:-100], fin=False)
        if peer.close_code is not None:
            break
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)
    assert "unfinished frames" in peer.wire.closes[0].reason


def test_a_reset_stream_gives_its_fragment_back() -> None:
    peer = server(EngineConfig(max_pending_bytes=4 * MiB))
    headers = ((b"k", b"v" * 60_000),)
    head = encode_frames(Version(), RouteTo(ENTRYPOINT), Message(0, headers, (), b""))
    for _ in range(200):
        peer.reset(peer.stream(head[:-100], fin=False))
    assert_open(peer)


# -- attachments count in the window; flow control can be required ---------------------------


def test_a_window_of_tiny_messages_attaching_channels_is_bounded() -> None:
    """Each attachment costs ATTACHMENT_COST: a peer ignoring its credit with ~50-byte
    requests that each attach a channel is cut off after window / 4 KiB of them, instead of
    making the receiver create state for ~100x the window."""
    from aqueduct_core.wire import Attachment
    from aqueduct_core.wire.frames import ATTACHMENT_COST

    window = 1 * MiB
    peer = server(EngineConfig(flow_window=window), flow_window=window)
    sent = 0
    for i in range(2 * window // ATTACHMENT_COST):
        chanid = C_SENDS_1 + i * 8
        peer.routed(ENTRYPOINT, Message(i, (), (Attachment(chanid, ()),), b"x" * 40))
        sent += 1
        if peer.close_code is not None:
            break
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)
    assert sent <= window // ATTACHMENT_COST + 1
    assert len(peer.conn.receivers) <= window // ATTACHMENT_COST + 2


def test_require_flow_control_refuses_a_peer_without_a_window() -> None:
    peer = ScriptedPeer(SERVER, EngineConfig(require_flow_control=True))
    peer.handshake()  # no flow window advertised
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)
    assert "flow control" in peer.wire.closes[0].reason


def test_require_flow_control_accepts_a_peer_with_a_window() -> None:
    peer = ScriptedPeer(SERVER, EngineConfig(require_flow_control=True))
    peer.handshake(flow_window=W)
    assert_open(peer)


def test_live_channels_are_capped_even_within_credit() -> None:
    """Channels live until the peer closes its end: a peer that attaches channels (keeping
    to its credit, the application reading every message) and never closes them is cut off
    at max_channels instead of growing our state for ever."""
    from aqueduct_core.wire import Attachment

    peer = server(EngineConfig(max_channels=100))
    for i in range(200):
        peer.routed(ENTRYPOINT, Message(i, (), (Attachment(C_SENDS_1 + i * 8, ()),), b"r"))
        if peer.close_code is not None:
            break
        while peer.conn.recv(ENTRYPOINT, peer.now) is not None:
            pass
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)
    assert "live channels" in peer.wire.closes[0].reason
    assert len(peer.conn.receivers) + len(peer.conn.senders) <= 100
