"""Shared helpers of the conformance-case tests (``test_engine_cases_*.py``, profile §6)."""

from __future__ import annotations

from aqueduct_core.engine import (
    ChannelTerminated,
    Connection,
    ConnectionTerminated,
    EngineConfig,
    Event,
    MessageArrived,
    Terminal,
)
from aqueduct_core.errors import CloseCode, EndOfChannel, RemoteProtocolError
from aqueduct_core.testing.scripted import ScriptedPeer
from aqueduct_core.wire.chanid import Side, make_chanid

CLIENT, SERVER = Side.CLIENT, Side.SERVER

# Channels created by the client (the scripted peer, when the engine under test is a server).
C_SENDS_1 = make_chanid(CLIENT, CLIENT, False, 1)  # 8: the client sends, the server receives
C_SENDS_2 = make_chanid(CLIENT, CLIENT, False, 2)  # 16
S_SENDS_0 = make_chanid(CLIENT, SERVER, False, 0)  # 2: the server sends
C_ONESHOT_0 = make_chanid(CLIENT, CLIENT, True, 0)  # 4: oneshot, the client sends


def server(config: EngineConfig | None = None, flow_window: int | None = None) -> ScriptedPeer:
    """An engine under test on the server side, handshake done; the test plays the client."""
    peer = ScriptedPeer(SERVER, config)
    peer.handshake(flow_window=flow_window)
    peer.new_events()
    return peer


def client(config: EngineConfig | None = None, flow_window: int | None = None) -> ScriptedPeer:
    """An engine under test on the client side, handshake done; the test plays the server."""
    peer = ScriptedPeer(CLIENT, config)
    peer.handshake(flow_window=flow_window)
    peer.new_events()
    return peer


def assert_violation(peer: ScriptedPeer, code: int = CloseCode.PROTOCOL_VIOLATION) -> None:
    """The engine closed the connection with ``code`` because of the peer (never raised),
    exactly once, and told the application so."""
    assert peer.close_code == code, f"expected close code {code}, wire: {peer.wire.closes}"
    assert len(peer.wire.closes) == 1
    ends = [e for e in peer.events if isinstance(e, ConnectionTerminated)]
    assert len(ends) == 1
    assert ends[0].code == code and not ends[0].by_peer
    assert isinstance(ends[0].error, RemoteProtocolError)


def assert_open(peer: ScriptedPeer) -> None:
    assert peer.close_code is None, f"unexpected close: {peer.wire.closes}"
    assert not any(isinstance(e, ConnectionTerminated) for e in peer.events)


def terminals(events: list[Event]) -> dict[int, list[Terminal]]:
    """chanid -> the terminal states reported for it, in order."""
    out: dict[int, list[Terminal]] = {}
    for ev in events:
        if isinstance(ev, ChannelTerminated):
            out.setdefault(ev.chanid, []).append(ev.terminal)
    return out


def arrived(events: list[Event]) -> list[int]:
    return [e.chanid for e in events if isinstance(e, MessageArrived)]


def drain(conn: Connection, chanid: int, now: float) -> tuple[list[bytes], bool]:
    """Every queued payload, and whether the channel then reported a clean finish."""
    out: list[bytes] = []
    while True:
        try:
            msg = conn.recv(chanid, now=now)
        except EndOfChannel:
            return out, True
        if msg is None:
            return out, False
        out.append(bytes(msg.payload))
