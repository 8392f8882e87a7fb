"""The engine counts how often its senders wait (``Connection.flow_stalls()``): for the peer's
flow-control credit, and for the transport's backlog. It only counts; the service turns the
counts into the ``aqueduct_flow_control_stalls_total`` metric. Sans-IO, a scripted peer."""

from __future__ import annotations

from engine_case_helpers import client

from aqueduct_core.engine import FlowStalls
from aqueduct_core.wire import ENTRYPOINT, Dequeued, Message, message_cost
from aqueduct_core.wire.frames import MESSAGE_OVERHEAD

W = 100 + 2 * MESSAGE_OVERHEAD
"""Two 30-byte messages fit the window, a third does not."""


def test_a_sender_out_of_credit_counts_once_per_wait_not_per_message() -> None:
    peer = client(flow_window=W)
    conn = peer.conn
    payload = b"x" * 30
    c = message_cost(Message(0, payload=payload))
    assert conn.flow_stalls() == FlowStalls(0, 0)
    for _ in range(6):  # two leave, four wait: one wait, however many queue behind it
        conn.send(ENTRYPOINT, payload, now=peer.now)
    assert conn.flow_stalls() == FlowStalls(credit=1, transport=0)
    peer.routed(ENTRYPOINT, Dequeued(c))  # one more leaves, the next waits again
    assert conn.flow_stalls().credit == 2
    peer.routed(ENTRYPOINT, Dequeued(2 * c))
    assert conn.flow_stalls().credit == 3
    peer.routed(ENTRYPOINT, Dequeued(2 * c))  # the last one leaves: nothing waits now
    assert conn.flow_stalls().credit == 3
    assert conn.memory().queued_to_send == {}


def test_a_sender_held_by_the_transport_backlog_counts_once_until_it_resumes() -> None:
    peer = client()  # no flow control: only the transport can hold a sender back
    conn = peer.conn
    conn.set_transport_backlog(10_000, 1_000)  # over budget: senders pause
    conn.send(ENTRYPOINT, b"a", now=peer.now)
    conn.send(ENTRYPOINT, b"b", now=peer.now)
    assert conn.flow_stalls() == FlowStalls(credit=0, transport=1)
    assert conn.set_transport_backlog(0, 1_000)  # drained: the sender resumes
    assert conn.memory().queued_to_send == {}
    conn.set_transport_backlog(10_000, 1_000)
    conn.send(ENTRYPOINT, b"c", now=peer.now)
    assert conn.flow_stalls().transport == 2
