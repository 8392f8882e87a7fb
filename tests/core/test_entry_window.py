"""The entrypoint's window (profile §4, flow control item 9): a server grants the entrypoint
less credit than its other channels, so a client's burst of requests waits in the client.

Issue 26: one client firing 20,000 requests at once made the service hold about 3,900 of
them (the 16 MiB per-channel window over ~4.2 KiB per request), parse them and create a
reply channel for each before it could serve any, and serve them all after the client was
killed. With ``EngineConfig.entry_window`` the server holds at most that many bytes of one
client's requests, whatever the client sends; a client that honours the
``aqueduct-entry-window`` header never sends more, and one that does not is cut off with
code 3 and a reason naming the setting. Over real QUIC against a real service:
``tests/security/test_service_flood.py``.
"""

from __future__ import annotations

from engine_case_helpers import assert_open, assert_violation, drain, server
from test_flow_control import dequeued_frames, on_wire, watch_buffered

from aqueduct_core.engine import EngineConfig, NewChannel
from aqueduct_core.engine.flow import ENTRY_WINDOW_HEADER, encode_window, parse_window
from aqueduct_core.errors import CloseCode
from aqueduct_core.testing.scripted import ScriptedPeer
from aqueduct_core.testing.simnet import SimNetwork
from aqueduct_core.wire import ENTRYPOINT, ConnectionHeaders, Dequeued, Message, message_cost
from aqueduct_core.wire.chanid import Side

WINDOW = 1 << 20
COST = message_cost(Message(0, payload=b"r" * 90))
"""A 90-byte request without channels."""
ENTRY = 4 * COST
"""Room for four such requests."""


def test_a_server_with_an_entry_window_advertises_it() -> None:
    peer = server(EngineConfig(flow_window=WINDOW, entry_window=ENTRY), flow_window=WINDOW)
    (answer,) = peer.wire.of_type(ConnectionHeaders)
    assert parse_window(answer.headers, ENTRY_WINDOW_HEADER) == ENTRY
    plain = server(EngineConfig(flow_window=WINDOW), flow_window=WINDOW)
    (answer,) = plain.wire.of_type(ConnectionHeaders)
    assert parse_window(answer.headers, ENTRY_WINDOW_HEADER) is None


def test_a_client_sends_no_more_than_the_entry_window_ahead() -> None:
    """The client's credit on the entrypoint is the server's entry window, not its per-channel
    window: the fifth request waits in the client until the server reports room."""
    peer = ScriptedPeer(Side.CLIENT, EngineConfig(flow_window=WINDOW))
    peer.handshake([(ENTRY_WINDOW_HEADER, encode_window(ENTRY))], flow_window=WINDOW)
    conn = peer.conn
    payloads = [b"%03d" % i + b"." * 87 for i in range(10)]
    for p in payloads:
        conn.send(ENTRYPOINT, p, now=peer.now)
    assert on_wire(peer) == payloads[:4]
    assert conn.memory().queued_to_send == {ENTRYPOINT: 6 * 90}
    peer.routed(ENTRYPOINT, Dequeued(2 * COST))
    assert on_wire(peer) == payloads[:6]
    peer.routed(ENTRYPOINT, Dequeued(4 * COST))
    assert on_wire(peer) == payloads[:10]
    assert_open(peer)


def test_other_channels_keep_the_full_window() -> None:
    peer = ScriptedPeer(Side.CLIENT, EngineConfig(flow_window=WINDOW))
    peer.handshake([(ENTRY_WINDOW_HEADER, encode_window(ENTRY))], flow_window=WINDOW)
    conn = peer.conn
    (child,) = conn.send(
        ENTRYPOINT, b"open", attachments=[NewChannel(keep_sender=True)], now=peer.now
    )
    for i in range(20):
        conn.send(child, b"%03d" % i + b"." * 87, now=peer.now)
    assert len(on_wire(peer, child)) == 20


def test_a_client_sending_beyond_the_entry_window_is_cut_off_naming_the_setting() -> None:
    """A client that ignores the header (an older library, or an attacker) cannot make the
    server hold more: one request beyond the window closes the connection with code 3."""
    config = EngineConfig(
        flow_window=WINDOW, entry_window=ENTRY, entry_window_setting="--request-window"
    )
    peer = server(config, flow_window=WINDOW)
    for num in range(4):
        peer.routed(ENTRYPOINT, Message(num, payload=b"r" * 90))
    assert peer.conn.memory().received == {ENTRYPOINT: ENTRY}
    assert_open(peer)
    peer.routed(ENTRYPOINT, Message(4, payload=b"r" * 90))
    assert_violation(peer, CloseCode.LIMIT_VIOLATION)
    reason = peer.wire.closes[0].reason
    assert "entrypoint window" in reason and "--request-window" in reason, reason
    assert peer.conn.memory().total == 0


def test_the_server_reports_room_at_half_the_entry_window() -> None:
    """DEQUEUED goes out once half the entry window was taken, not half the channel window
    (which the entrypoint never reaches): a pipelining client is never starved."""
    peer = server(EngineConfig(flow_window=WINDOW, entry_window=ENTRY), flow_window=WINDOW)
    for num in range(4):
        peer.routed(ENTRYPOINT, Message(num, payload=b"r" * 90))
    conn = peer.conn
    assert conn.recv(ENTRYPOINT, now=peer.now) is not None
    assert dequeued_frames(peer) == []  # a quarter: waits for the delay or for more
    assert conn.recv(ENTRYPOINT, now=peer.now) is not None
    assert dequeued_frames(peer) == [Dequeued(2 * COST)]


def test_a_burst_between_two_engines_waits_in_the_client() -> None:
    """Two honest engines: 200 requests sent at once; the server never holds more than the
    entry window of them, and every one arrives, in order, as the server reads."""
    window = 64 * 1024
    entry = 10 * COST
    net = SimNetwork(
        seed=26,
        max_chunk=700,
        client_config=EngineConfig(flow_window=window),
        server_config=EngineConfig(flow_window=window, entry_window=entry),
    )
    net.handshake()
    peak = watch_buffered(net.server, ENTRYPOINT)
    sent = [b"%04d" % i + b"." * 86 for i in range(200)]
    for payload in sent:
        net.client.send(ENTRYPOINT, payload, now=net.now)
    net.run()
    assert net.server.memory().received == {ENTRYPOINT: entry}
    got: list[bytes] = []
    for _ in range(500):
        more, _ = drain(net.server, ENTRYPOINT, net.now)
        got += more
        net.run()
        if len(got) == len(sent):
            break
    assert got == sent
    assert peak() <= entry
