"""The receiver's transition table, walked through the real engine.

Every (state, input) pair of :data:`aqueduct_core.engine.receiver.TRANSITIONS` is driven
through a :class:`~aqueduct_core.engine.Connection` by raw frames from a scripted peer (the
test plays the client; the engine under test is the server, receiving on a channel the
client created by ROUTE_TO). Every pair the table leaves out is shown to be refused: a frame
from the peer closes the connection with a protocol violation, and the engine's own inputs
out of place are a bug it reports loudly.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from engine_case_helpers import C_SENDS_1, assert_open, assert_violation, server

from aqueduct_core.engine.receiver import TRANSITIONS, ReceiverSM, RecvInput, RecvState
from aqueduct_core.testing.scripted import ScriptedPeer
from aqueduct_core.wire.frames import (
    CancelSender,
    CloseReceiver,
    FinishSender,
    ForgetChannel,
    Message,
    SentUnreliable,
)

CHAN = C_SENDS_1
S, In = RecvState, RecvInput
LIVE = (S.OPEN, S.FINISH_PENDING)
FROM_PEER = (In.MESSAGE, In.SENT_UNRELIABLE, In.FINISH_SENDER, In.CANCEL_SENDER)

# How to bring a fresh receiver (created by a bare ROUTE_TO) into each state.
REACH: dict[RecvState, Callable[[ScriptedPeer], object]] = {
    S.OPEN: lambda p: None,
    S.FINISH_PENDING: lambda p: p.routed(CHAN, FinishSender(2)),  # messages 0 and 1 to come
    S.CLOSED: lambda p: p.routed(CHAN, CancelSender()),
    S.ABANDONED: lambda p: p.routed(CHAN, ForgetChannel()),  # the creator forgot it (§2.8)
}


def _close(p: ScriptedPeer) -> None:
    if CHAN not in p.conn.endpoints:
        return  # abandoned before it was attached: no handle is left for anyone to close
    p.conn.close_receiver(CHAN, p.now)
    p.collect()


# How to give the receiver each input. COMPLETE is what the last missing message brings
# once FINISH counted it; in OPEN those messages are plain MESSAGE inputs.
APPLY: dict[RecvInput, Callable[[ScriptedPeer], object]] = {
    In.MESSAGE: lambda p: p.routed(CHAN, Message(0, payload=b"m0")),
    In.SENT_UNRELIABLE: lambda p: p.routed(CHAN, SentUnreliable(1)),
    In.FINISH_SENDER: lambda p: p.routed(CHAN, FinishSender(2)),
    In.CANCEL_SENDER: lambda p: p.routed(CHAN, CancelSender()),
    In.COMPLETE: lambda p: p.routed(CHAN, Message(0, payload=b"m0"), Message(1, payload=b"m1")),
    In.APP_CLOSE: _close,
    In.ABANDON: lambda p: p.routed(CHAN, ForgetChannel()),
}


def receiver_in(state: RecvState) -> tuple[ScriptedPeer, ReceiverSM]:
    peer = server()
    peer.routed(CHAN)  # ROUTE_TO alone creates the remote channel's receiver (§2.8)
    rm = peer.conn.receivers[CHAN]
    REACH[state](peer)
    assert rm.state is state
    assert_open(peer)
    return peer, rm


@pytest.mark.parametrize(("state", "event"), sorted(TRANSITIONS, key=str), ids=str)
def test_every_transition_in_the_table_happens_through_the_engine(
    state: RecvState, event: RecvInput
) -> None:
    peer, rm = receiver_in(state)
    closes_before = len(peer.wire.of_type(CloseReceiver, route=CHAN))
    APPLY[event](peer)
    target = TRANSITIONS[state, event]
    assert rm.state is target
    assert_open(peer)
    # CLOSED means CLOSE_RECEIVER went out (after the final acks, G17); nothing else sends it.
    closes = len(peer.wire.of_type(CloseReceiver, route=CHAN)) - closes_before
    assert closes == (1 if target is S.CLOSED else 0)
    assert (CHAN in peer.conn.receivers) is rm.alive


@pytest.mark.parametrize(
    ("state", "event"),
    [(s, e) for s, e in itertools.product(LIVE, FROM_PEER) if (s, e) not in TRANSITIONS],
    ids=str,
)
def test_a_frame_the_table_refuses_closes_the_connection(
    state: RecvState, event: RecvInput
) -> None:
    peer, rm = receiver_in(state)
    APPLY[event](peer)
    assert_violation(peer)
    assert rm.state is S.ABANDONED  # the connection ended, and every machine with it


@pytest.mark.parametrize(
    ("state", "event"), list(itertools.product((S.CLOSED, S.ABANDONED), RecvInput)), ids=str
)
def test_a_destroyed_receiver_takes_no_input(state: RecvState, event: RecvInput) -> None:
    """No pair leaves CLOSED or ABANDONED: the machine is gone from the connection's tables,
    and late frames meet the tombstone (G19) and are ignored."""
    assert (state, event) not in TRANSITIONS
    peer, rm = receiver_in(state)
    assert CHAN not in peer.conn.receivers
    APPLY[event](peer)
    assert rm.state is state
    assert_open(peer)


@pytest.mark.parametrize("state", [S.CLOSED, S.ABANDONED], ids=str)
def test_the_engine_s_own_inputs_out_of_place_are_reported_as_a_bug(state: RecvState) -> None:
    _, rm = receiver_in(state)
    with pytest.raises(AssertionError, match="engine bug: application close in receiver state"):
        rm.close()
    with pytest.raises(AssertionError, match="engine bug: abandon in receiver state"):
        rm.abandon()
    assert rm.state is state


def test_every_state_is_reached_and_only_the_two_ends_have_no_way_out() -> None:
    targets = {new for new in TRANSITIONS.values()}
    sources = {state for state, _ in TRANSITIONS}
    assert targets | {S.OPEN} == set(RecvState)
    assert set(RecvState) - sources == {S.CLOSED, S.ABANDONED}
