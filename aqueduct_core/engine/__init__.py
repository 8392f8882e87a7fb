"""The sans-IO Aqueduct protocol engine.

Theory of operation
===================

This package is the whole Aqueduct protocol and nothing else: no sockets, no event loop, no
clock, no QUIC library. A :class:`Connection` is fed what a QUIC connection reports
(``stream_data``, ``stream_reset``, ``datagram_received``, ``handshake_done``,
``connection_lost``) together with the current time, and what the application asks for
(``send``, ``recv``, ``finish``, ``cancel``, ``close_receiver``). It answers with transport
*commands* (``commands()``: write to a unidirectional stream, reset one, send a datagram,
close) and application *events* (``events()``: a message arrived, a queue has room, a channel
ended, the connection ended), and says when it next wants ``handle_timer``. Because time is an
argument, a simulated network (:mod:`aqueduct_core.testing.simnet`) can drop, delay and reorder
everything deterministically, thousands of runs a second. Section numbers below are those of
``protocol-profile.md``; Gn are its resolved gaps.

The pieces
----------

Where they live: :class:`Connection` is built in layers, each module using only those below
it (:mod:`.output`, :mod:`.channels`, :mod:`.handshake`, :mod:`.dispatch`, :mod:`.connection`),
and the state machines (:mod:`.sender`, :mod:`.receiver`) reach their connection only through
the small protocol each declares (``SenderHost``, ``ReceiverHost``), never by importing it.

*Frames in.* Every QUIC stream and datagram carries one frame sequence,
``prelude* [ROUTE_TO routed*]`` (§1.2, G3), parsed by :mod:`aqueduct_core.wire`. Prelude
frames run the handshake at once (G25): a sequence that does not start with VERSION before we
sent ACK_VERSION closes the connection (§2.2); CONNECTION_HEADERS arrive exactly once per side.
Routed frames wait, per sequence and in order, until the peer's headers are in (§2.3). Nothing
at all is processed before the QUIC handshake completes, so 0-RTT data is never acted on
(§2.11).

*Routing.* ROUTE_TO names a chanid whose bits say who created the channel and who sends on it
(G2). The direction of every routed frame is checked against those bits before anything else
(cases 25-27). Then state is found:

- a channel *we* created: an index we never allocated is a violation (case 29); no state means
  we destroyed it, so the sequence is ignored and FORGET_CHANNEL goes back, at most once per
  channel per second (G20);
- a channel the *peer* created: a permanent tombstone (a range set per id space, G19) means
  "destroyed, ignore"; no state and no tombstone means create it now. A ROUTE_TO may arrive
  before the message that attaches the channel: streams are independent.

*Two objects per channel.* The state machine (:mod:`.sender`, :mod:`.receiver`) is the wire
protocol of one channel; the :class:`~.endpoint.Endpoint` is what the application's handle
stands for: the queue of received messages and the one terminal state. They are separate
(G18, G22) because the endpoint must outlive the machine: a channel created early by ROUTE_TO
can receive all its data, FINISH and close before the message attaching it arrives, and that
data still belongs to the application. A retained endpoint lives until its attaching message
arrives, until FORGET says it is lost, or until the connection ends.

*Senders* (§2.5). Messages the application sends wait in the machine's queue until the channel
has credit (§3.4). Only when a message leaves the queue is its transport chosen and then its
number assigned (G13): ORDERED writes to one long-lived stream, UNORDERED opens a stream per
message, UNRELIABLE uses a datagram if the whole sequence fits and otherwise a stream, numbered
in the *reliable* space. Unreliable sends are declared by SENT_UNRELIABLE within a short delay.
``finish`` waits for the queue to drain, flushes SENT_UNRELIABLE and sends FINISH_SENDER with
the reliable count; with no SENT_UNRELIABLE ever sent it may ride at the tail of the ordered
stream (G15). ``cancel`` drops the queue, resets the message streams and sends CANCEL on the
control stream, which is never reset (G15).

*Receivers* (§2.6). "Received means acked": every message is acked within the ack delay, on
the receiver's single control stream, so the gap/run base (G8) and the ack/nack cursor (G9) are
the same numbers on both sides. An unreliable number becomes known when SENT_UNRELIABLE
declares it or a higher number arrives (G14); after the receipt deadline, missing numbers are
nacked and a late datagram below the cursor is dropped, never delivered (case 41). FINISH
completes only when every reliable message arrived and every declared unreliable number was
decided, never earlier (case 43). Every way a receiver ends (finish, cancel, application close)
first flushes the acks for everything received and then sends CLOSE_RECEIVER on the same
stream (G17): otherwise a message the application already took would count as nacked and the
channels it carried would be falsely declared lost.

*Lineage* (§2.9, :mod:`.lineage`). Channels are created by attaching them to messages, so
whether the other side can ever hold a channel depends on that message: X, attached to M on P,
is accessible iff M was acked and P is accessible, lost iff M was nacked or P is lost. Only
the creator sees M's fate, so the creator keeps a node per channel it created, separate from
the state machine: a sender can finish and be destroyed while still pending, and if it turns
out lost, the channels attached to its *acked* messages are lost too (case 58). lose(X)
destroys X's state, tells the application LostInTransit, sends FORGET if X was ever routed to,
and cascades to everything attached to messages on X. A message dropped before it got a number
(cancel, drop-oldest eviction) loses its attachments locally, with no wire traffic at all.

*Flow control* (§3.4, :mod:`.flow`). Negotiated by a connection header; when both sides
advertise, each receiver grants a per-channel window of bytes and reports what its application
dequeued with DEQUEUED on its control stream. A message may always leave when nothing is
outstanding, so any window, even one byte, makes progress; metadata never waits for credit;
nacked datagrams release theirs. There is deliberately no connection-wide blocking budget:
a child channel's data could fill it while the parent message that carries the child's handle
waits behind it (§3.2 item 10). Memory is bounded per channel instead, plus caps on channels
that exist but are not attached yet. The receive side always drains QUIC at once, so QUIC's own
limits never couple channels (case 68).

Why it is safe
--------------

*Every handle ends exactly once.* Terminal states are written to the endpoint only if none is
there yet (§2.10: the first one wins), and every path that destroys state writes one: FINISH
completion, CANCEL, CLOSE_RECEIVER, FORGET, lose(), connection loss.

*Nothing the application holds is ever declared lost.* The application holds a handle only
after dequeuing the message that carried it from a channel it already held; by induction from
the entrypoint, every held channel is accessible. Ack-before-close (G17) makes "dequeued"
imply "acked" on the creator's side too. That is also why FORGET for a held handle can only be
a late answer to a late frame, never a loss, which gives the refinements below.

*State is eventually freed.* A state machine ends on CLOSE (both sides), FORGET, lose() or
connection loss; a remote-created one leaves a permanent, compact tombstone so late frames can
never resurrect it (G19). A ghost (state made by a late ROUTE_TO) is told to go away by FORGET
from the creator, within a round trip. The soak test checks that after quiescence neither
engine holds any state for channels that ended.

*Violations never escape.* A frame that breaks the profile raises RemoteProtocolError inside
the engine; the input method catches it, emits CloseConnection with the profile's code (G24)
and ends every handle with ConnectionLost. Misuse by our own caller raises LocalProtocolError
at once and changes nothing.

Refinements of the profile found by the soak test
-------------------------------------------------

1. *FORGET to a held sender* (refines G28). A creator answers a late frame for a channel it
   already closed with FORGET on a fresh stream, and that FORGET can overtake the
   CLOSE_RECEIVER still in flight on the creator's control stream together with its final
   acks. Taking FORGET as CLOSE there would nack messages whose acks are on the way and
   falsely lose their attachments. Since a held sender's channel is accessible, FORGET only
   stops it (RECEIVER_GONE: the application sees ReceiverDropped, case 61); the nacks wait for
   the CLOSE, which must come.
2. *Send-back only from receivers* (refines G21). A non-creator *sender* created by ROUTE_TO was
   routed to by the creator's receiver control stream, which ends with CLOSE or is followed by
   FORGET, so a send-back could only overtake that CLOSE and draw a spurious FORGET that
   discards the retained endpoint. Non-creator receivers still send it back, as the first
   frame of their control stream, which is what lets a creator that lost a channel kill the
   ghost.
3. *FORGET always reaches a retained endpoint*, including when it arrives after the tombstone
   (the state machine was already destroyed by CLOSE).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aqueduct_core.engine.config import EngineConfig
    from aqueduct_core.engine.connection import Connection, MemoryReport, NewChannel
    from aqueduct_core.engine.events import (
        ChannelTerminated,
        CloseConnection,
        Command,
        ConnectionTerminated,
        Event,
        HeadersReceived,
        MessageArrived,
        ResetStream,
        SendDatagram,
        SenderReady,
        Terminal,
        WriteStream,
    )
    from aqueduct_core.engine.output import FlowStalls
    from aqueduct_core.engine.sender import Mode, QueuePolicy
else:
    from aqueduct_core.lazy import attach

    __getattr__, __dir__ = attach(__name__, __file__)

__all__ = [
    "ChannelTerminated",
    "CloseConnection",
    "Command",
    "Connection",
    "ConnectionTerminated",
    "EngineConfig",
    "Event",
    "FlowStalls",
    "HeadersReceived",
    "MemoryReport",
    "MessageArrived",
    "Mode",
    "NewChannel",
    "QueuePolicy",
    "ResetStream",
    "SendDatagram",
    "SenderReady",
    "Terminal",
    "WriteStream",
]
