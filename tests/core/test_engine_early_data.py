"""The engine's side of 0-RTT (profile §2.11): ``early_data()`` starts the Aqueduct handshake
on 0-RTT keys. The transport's side (tickets, rejection, replay) is in test_zero_rtt.py."""

from __future__ import annotations

from engine_case_helpers import CLIENT, SERVER, assert_open

from aqueduct_core.engine import HeadersReceived, MessageArrived
from aqueduct_core.testing.scripted import ScriptedPeer
from aqueduct_core.wire import ENTRYPOINT, ConnectionHeaders, Message, Version


def test_server_holds_input_until_handshake_done_without_early_data() -> None:
    peer = ScriptedPeer(SERVER)
    peer.stream([Version(), ConnectionHeaders(())])
    peer.routed(ENTRYPOINT, Message(0, (), (), b"ls"), version=True)
    assert peer.new_events() == []
    assert not peer.conn.handshake_confirmed
    peer.start()
    kinds = [type(e) for e in peer.new_events()]
    assert HeadersReceived in kinds and MessageArrived in kinds


def test_server_acts_on_early_data_before_the_handshake_is_confirmed() -> None:
    """With early_data() the request is delivered at once, flagged as unconfirmed, so the
    application can answer safe requests a round trip sooner and hold the rest."""
    peer = ScriptedPeer(SERVER)
    peer.conn.early_data(peer.now)
    peer.stream([Version(), ConnectionHeaders(())])
    peer.routed(ENTRYPOINT, Message(0, (), (), b"ls"), version=True)
    kinds = [type(e) for e in peer.new_events()]
    assert HeadersReceived in kinds and MessageArrived in kinds
    assert not peer.conn.handshake_confirmed
    assert peer.conn.recv(ENTRYPOINT, peer.now) is not None
    peer.start()  # the handshake completes: nothing is replayed or delivered twice
    assert peer.conn.handshake_confirmed
    assert [e for e in peer.new_events() if isinstance(e, MessageArrived)] == []
    assert_open(peer)


def test_client_sends_its_headers_with_early_data_and_only_once() -> None:
    peer = ScriptedPeer(CLIENT)
    peer.conn.early_data(peer.now)
    assert len(peer.wire.of_type(ConnectionHeaders)) == 1
    peer.conn.send(ENTRYPOINT, b"ls", now=peer.now)
    peer.start()
    assert len(peer.wire.of_type(ConnectionHeaders)) == 1
    assert peer.wire.of_type(Message, route=ENTRYPOINT)
    assert_open(peer)
