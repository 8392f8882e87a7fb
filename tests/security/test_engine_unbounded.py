"""Attacks found while writing the issue 13 regression tests, each a few kilobytes from a
client without the service's token, against a real ``aqueduct serve`` over QUIC.

The harness and the assertions are those of ``test_engine_attacks.py``: the server's peak
RSS stays within 50 MB of idle plus what the engine's limits grant, another client's ``ls``
is answered, and the server process survives.

- Attachments: each creates channel state (a few kilobytes of engine and API objects) for
  about four bytes on the wire. Before attachments were charged to the window
  (``ATTACHMENT_COST``), 0.4 MB of them made the server grow by 260-330 MB and stop
  answering ``ls``.
- Without flow control (the client decides: it only has to leave the window header out),
  bytes of an unfinished message routed to an attached channel were charged to nothing:
  16 unfinished 64 MiB messages grew the server by 120 MB per 116 MB sent. The service now
  requires flow control of its clients.
- Channels created by attachments outlive the message that carried them: the service
  dequeues a request (its credit comes back) and cancels the senders it did not use, but
  each stays until the client closes its end, which an attacker never does. Keeping to its
  credit, 25 messages of 1,000 attachments (100 KB) grew the server by 67 MB, without
  bound. Live channels per connection are now capped (``max_channels``).
- Empty messages (5-7 bytes) to a channel nobody attached cost ~150 bytes of objects and
  ~20 us of CPU each, but counted only their encoded size: the server held ~23x what the
  window says, and 0.4 MB of them kept it from answering ``ls`` for over 2 s. Each message
  now costs ``MESSAGE_OVERHEAD`` (128 bytes) more.
"""

from __future__ import annotations

import pytest
from conftest import (
    MEMORY_SLACK,
    MIB,
    REQUEST,
    Attacker,
    Target,
    assert_cut_off,
    attacked,
    run,
    unfinished_messages_attack,
)

from aqueduct_core.engine.config import DEFAULT_WINDOW
from aqueduct_core.wire import Attachment, Message, RouteTo, encode_frame, encode_frames
from aqueduct_core.wire.chanid import Side, make_chanid
from aqueduct_core.wire.frames import message_cost

pytestmark = [pytest.mark.quic, pytest.mark.timeout(180)]

NOBODY_READS = make_chanid(Side.CLIENT, Side.CLIENT, False, 1)
"""A channel the client created and never attached: the server buffers what is sent on it
until the message attaching it arrives (profile G22), which never happens."""


def test_unfinished_messages_without_flow_control_hold_no_more_than_the_grant(
    target: Target,
) -> None:
    """As ``test_messages_that_never_finish_hold_no_more_than_the_grant``, by a client that
    does not take part in flow control: 16 streams, each a MESSAGE announcing 64 MiB to the
    entrypoint, payload trickled and never finished."""
    assert_cut_off(run(unfinished_messages_attack(target, 16, 64 * MIB, None)))


@pytest.mark.parametrize(
    "chanid",
    [pytest.param(0, id="entrypoint"), pytest.param(NOBODY_READS, id="unattached-channel")],
)
@pytest.mark.parametrize(
    "flow_window",
    [pytest.param(None, id="no-flow-control"), pytest.param(16 * MIB, id="flow-control")],
)
def test_a_flood_of_attachments_holds_no_more_than_the_grant(
    target: Target, chanid: int, flow_window: int | None
) -> None:
    """Messages of 5,000 attachments each (about 20 KB): every attachment is a channel the
    server must track. The server may hold what one channel's window grants, not kilobytes
    per attachment without limit."""
    allowance = DEFAULT_WINDOW
    per_message = 5000

    async def attachment_flood(attacker: Attacker) -> None:
        attacker.hello(flow_window)
        await attacker.wait_server_headers()
        idle = target.memory.rss
        sid = attacker.stream(encode_frames(RouteTo(chanid)))
        for num in range(200):  # 4 MB at most
            atts = tuple(
                Attachment(make_chanid(Side.CLIENT, Side.SERVER, False, num * per_message + i))
                for i in range(per_message)
            )
            attacker.stream(encode_frame(Message(num, (), atts, REQUEST)), stream_id=sid)
            if not await attacker.flush(256 * 1024, stall=3.0):
                return
            if target.memory.rss - idle > MEMORY_SLACK + allowance:
                return

    run(attacked(target, attachment_flood, allowance=allowance))


def test_attachments_sent_within_the_credit_hold_no_more_than_the_grant(target: Target) -> None:
    """An attacker that takes part in flow control and keeps to its credit: messages of
    1,000 attachments each to the entrypoint, the next one only after the service dequeued
    the previous. Dequeuing returns the credit, but the channels the attachments created
    stay: memory must stay bounded all the same."""
    allowance = DEFAULT_WINDOW
    per_message = 1000

    async def attachments_within_credit(attacker: Attacker) -> None:
        attacker.hello(16 * MIB)
        await attacker.wait_server_headers()
        idle = target.memory.rss
        sid = attacker.stream(encode_frames(RouteTo(0)))
        for num in range(300):
            atts = tuple(
                Attachment(make_chanid(Side.CLIENT, Side.SERVER, False, num * per_message + i))
                for i in range(per_message)
            )
            message = Message(num, (), atts, REQUEST)
            attacker.stream(encode_frame(message), stream_id=sid)
            attacker.charged += message_cost(message)
            if not await attacker.wait_credit(0):
                return
            if target.memory.rss - idle > MEMORY_SLACK + allowance:
                return

    run(attacked(target, attachments_within_credit, allowance=allowance))


@pytest.mark.parametrize("flow_window", [None, 16 * MIB], ids=["no-flow-control", "flow-control"])
def test_a_flood_of_empty_messages_holds_no_more_than_the_window(
    target: Target, flow_window: int | None
) -> None:
    """Empty messages (5-7 bytes each) to a channel nobody reads: each costs the server
    ~150 bytes of objects and ~20 us of CPU. The server may hold what the channel's window
    grants, whatever the messages' size, and cut off a client that sends beyond it."""
    allowance = DEFAULT_WINDOW

    async def empty_messages(attacker: Attacker) -> None:
        attacker.hello(flow_window)
        await attacker.wait_server_headers()
        idle = target.memory.rss
        sid = attacker.stream(encode_frames(RouteTo(NOBODY_READS)))
        batch = 20_000
        for first in range(0, 4_000_000, batch):
            data = b"".join(encode_frame(Message(n)) for n in range(first, first + batch))
            attacker.stream(data, stream_id=sid)
            if not await attacker.flush(256 * 1024, stall=3.0):
                return
            if target.memory.rss - idle > MEMORY_SLACK + allowance:
                return

    assert_cut_off(
        run(attacked(target, empty_messages, allowance=allowance, cut_off=True), timeout=170)
    )
