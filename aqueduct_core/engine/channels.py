"""The channel tables: creating, attaching, ending and forgetting channels.

The layer of :class:`~aqueduct_core.engine.Connection` that owns every channel's two objects
(the state machine of :mod:`.sender` / :mod:`.receiver`, and the application's
:class:`~.endpoint.Endpoint`), the tombstones of remote-created channels (G19), the lineage of
the channels we created (§2.9, :mod:`.lineage`) and the caps on channels the peer created but
has not attached yet. The theory of operation, including why endpoint and machine are
separate and why every handle ends exactly once, is in ``aqueduct_core/engine/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.engine.endpoint import Endpoint, Queued
from aqueduct_core.engine.events import ChannelTerminated, MessageArrived, Terminal
from aqueduct_core.engine.lineage import Lineage, Node
from aqueduct_core.engine.output import Output
from aqueduct_core.engine.rangeset import RangeSet
from aqueduct_core.engine.receiver import ReceiverSM
from aqueduct_core.engine.sender import SenderSM, SendState
from aqueduct_core.errors import CloseCode, RemoteProtocolError
from aqueduct_core.wire.chanid import ENTRYPOINT, Side
from aqueduct_core.wire.frames import Attachment, ForgetChannel, Message, encode_frame, message_cost
from aqueduct_core.wire.primitives import Headers, check_headers


@dataclass(frozen=True, slots=True)
class NewChannel:
    """A channel to create and attach to an outgoing message. ``keep_sender``: our side keeps
    the sender half (the peer receives); otherwise the peer gets the sender."""

    keep_sender: bool
    oneshot: bool = False
    headers: Headers = ()


class ChannelTables(Output):
    """Channel state of one connection: machines, endpoints, tombstones, lineage."""

    def __init__(self, side: Side, config: EngineConfig | None) -> None:
        super().__init__(side, config)
        self._next_index = [0] * 8
        self._tombstones = [RangeSet() for _ in range(8)]
        self._attached_ever = [RangeSet() for _ in range(8)]
        self._forget_log: dict[int, float] = {}
        self.senders: dict[int, SenderSM] = {}
        self.receivers: dict[int, ReceiverSM] = {}
        self.endpoints: dict[int, Endpoint] = {}
        self.lineage = Lineage(self._on_lost)
        self._unattached = 0
        self._unattached_bytes = 0
        self.peer_window: int | None = None if self.config.flow_window is None else 1
        """Credit the peer grants each of our senders (§3.4); None without flow control."""
        self.own_window: int | None = None
        """Credit we grant each of the peer's senders, once both sides advertised it."""
        if side is Side.CLIENT:
            self.senders[ENTRYPOINT] = SenderSM(self, ENTRYPOINT, False)
            self.endpoints[ENTRYPOINT] = Endpoint(ENTRYPOINT, True, True, held=True)
            self.lineage.add(ENTRYPOINT, kept_sender=True, accessible=True)
            self._next_index[0] = 1

    # == used by the state machines ========================================================

    def route_sent(self, chanid: int) -> None:
        node = self.lineage.nodes.get(chanid)
        if node is not None:
            node.route_to_sent = True

    def ctrl_write(self, sm: SenderSM | ReceiverSM, data: bytes, fin: bool = False) -> None:
        """Write on the channel's control stream, opening it with ROUTE_TO first (G21)."""
        if sm.ctrl_stream is None:
            sm.ctrl_stream = self.open_stream()
            data = self.seq_prefix(sm.chanid) + data
            self.route_sent(sm.chanid)
        self.write(sm.ctrl_stream, data, fin)
        if fin:
            sm.ctrl_stream = None

    def message_arrived(self, rm: ReceiverSM, frame: Message) -> int:
        """A receiver accepted ``frame``: create its attachments and queue it."""
        ep = self.endpoints[rm.chanid]
        for att in frame.attachments:
            self._attach(att)
        cost = message_cost(frame) if self.own_window is not None else len(frame.payload)
        ep.queue.append(Queued(frame, cost))
        ep.buffered += cost
        if not ep.attached:
            self._unattached_bytes += cost
            if self._unattached_bytes > self.config.max_pending_bytes:
                raise RemoteProtocolError(
                    "too many bytes buffered in channels that are not attached yet",
                    CloseCode.LIMIT_VIOLATION,
                )
        if ep.held:
            self._events.append(MessageArrived(rm.chanid))
        return cost

    def receiver_closed(self, rm: ReceiverSM, terminal: Terminal) -> None:
        """Send final acks and CLOSE_RECEIVER, destroy the SM (finish, cancel, app close)."""
        self.ctrl_write(rm, rm.final_acks(), fin=True)
        del self.receivers[rm.chanid]
        ep = self.endpoints[rm.chanid]
        self._set_terminal(ep, terminal)
        if terminal is not Terminal.FINISHED:
            self._discard_queue(ep)
        self._sm_destroyed(rm.chanid)

    # == channel state =====================================================================

    def _mint(self, spec: NewChannel) -> int:
        sender_bit = self.side if spec.keep_sender else 1 - self.side
        space = int(self.side) | (sender_bit << 1) | (int(spec.oneshot) << 2)
        index = self._next_index[space]
        self._next_index[space] = index + 1
        chanid = space | (index << 3)
        if spec.keep_sender:
            self.senders[chanid] = SenderSM(self, chanid, spec.oneshot)
        else:
            self.receivers[chanid] = ReceiverSM(self, chanid, spec.oneshot)
        self.endpoints[chanid] = Endpoint(
            chanid, spec.keep_sender, True, held=True, headers=check_headers(spec.headers)
        )
        self.lineage.add(chanid, kept_sender=spec.keep_sender, accessible=False)
        return chanid

    def _create_remote(self, chanid: int, attached: bool) -> Endpoint:
        """State for a channel the peer created, from ROUTE_TO or from an attachment."""
        if len(self.senders) + len(self.receivers) >= self.config.max_channels:
            raise RemoteProtocolError(
                f"more than {self.config.max_channels} live channels on one connection "
                "(channels stay until the peer closes its end)",
                CloseCode.LIMIT_VIOLATION,
            )
        if not attached and self._unattached >= self.config.max_pending_channels:
            raise RemoteProtocolError(
                "too many channels that are not attached yet", CloseCode.LIMIT_VIOLATION
            )
        oneshot = bool(chanid & 4)
        we_send = (chanid >> 1) & 1 == self.side
        sm: SenderSM | ReceiverSM
        if we_send:
            sm = self.senders[chanid] = SenderSM(self, chanid, oneshot)
            # The peer kept the receiver: its application already holds it, so what we
            # attach to our messages on this channel needs no ancestry (§2.9).
            self.lineage.add(chanid, kept_sender=True, accessible=True)
        else:
            sm = self.receivers[chanid] = ReceiverSM(self, chanid, oneshot)
        ep = self.endpoints[chanid] = Endpoint(chanid, we_send, attached)
        if not attached:
            self._unattached += 1
            if not we_send:
                # Send-back ROUTE_TO as the first frame of our receiver control stream (§2.8,
                # G21), so a creator that no longer knows the channel answers FORGET. Not for
                # a sender: the creator's receiver routed to us on the stream that will carry
                # its CLOSE (or it lost the channel and sends FORGET), so a send-back could
                # only overtake that CLOSE and draw a spurious FORGET.
                self.ctrl_write(sm, b"")
        return ep

    def _attach(self, att: Attachment) -> None:
        chanid = att.chanid
        if chanid & 1 == self.side:
            raise RemoteProtocolError(
                f"attachment {chanid} was not created by the message's sender"
            )
        space, index = chanid & 7, chanid >> 3
        if index in self._attached_ever[space]:
            raise RemoteProtocolError(f"chanid {chanid} attached twice")
        self._attached_ever[space].add(index)
        ep = self.endpoints.get(chanid)
        if ep is None:
            if index in self._tombstones[space]:
                # Destroyed and forgotten before its message arrived: it can only be lost.
                ep = Endpoint(chanid, (chanid >> 1) & 1 == self.side, True)
                ep.set_terminal(Terminal.LOST_IN_TRANSIT)
                self.endpoints[chanid] = ep
            else:
                ep = self._create_remote(chanid, attached=True)
        elif not ep.attached:
            ep.attached = True
            self._unattached -= 1
            self._unattached_bytes -= ep.buffered
        ep.headers = att.headers

    def _sm_destroyed(self, chanid: int) -> None:
        if chanid & 1 != self.side:
            self._tombstones[chanid & 7].add(chanid >> 3)
        self.lineage.sm_gone(chanid)
        ep = self.endpoints.get(chanid)
        if ep is not None:
            self._maybe_free(ep)

    def _maybe_free(self, ep: Endpoint) -> None:
        chanid = ep.chanid
        if not ep.app_done or chanid in self.senders or chanid in self.receivers:
            return
        if self.endpoints.pop(chanid, None) is not None and not ep.attached:
            self._unattached -= 1
            self._unattached_bytes -= ep.buffered

    def _set_terminal(self, ep: Endpoint, terminal: Terminal) -> None:
        if ep.set_terminal(terminal):
            self._events.append(ChannelTerminated(ep.chanid, terminal))

    def _sender_forgotten(self, sm: SenderSM) -> None:
        """FORGET_CHANNEL from the creator to our sender (G28, refined).

        If the application holds the handle the channel is provably accessible, so FORGET is
        the creator's answer to a late frame of ours: its receiver already closed and the
        CLOSE_RECEIVER with its final acks is still in flight on another stream. Treating
        FORGET as that CLOSE would nack messages whose acks are on the way and falsely lose
        their attachments, so the sender only stops (the application sees ReceiverDropped,
        case 61) and the nacks wait for the CLOSE. Otherwise the channel is lost."""
        ep = self.endpoints[sm.chanid]
        if not ep.held:
            self._forgotten(sm.chanid)
        elif sm.state is SendState.OPEN:
            sm.receiver_gone()
            self._set_terminal(ep, Terminal.RECEIVER_DROPPED)

    def _sender_closed(self, sm: SenderSM) -> None:
        """CLOSE_RECEIVER: every number not yet acked is nacked (§2.5)."""
        sm.nack_everything()
        ep = self.endpoints[sm.chanid]
        if sm.state is SendState.FINISHING:
            self._set_terminal(ep, Terminal.FINISHED)
        else:
            self._set_terminal(ep, Terminal.RECEIVER_DROPPED)
        del self.senders[sm.chanid]
        self._blocked.pop(sm.chanid, None)
        lost = sm.teardown(reset_ctrl=False)
        self._sm_destroyed(sm.chanid)
        if lost:
            self.lineage.lose_all(lost)

    def _forgotten(self, chanid: int) -> None:
        """FORGET from the creator of a channel we did not create (§2.6, §2.8). A handle the
        application holds is provably accessible, so FORGET is then a late no-op; otherwise
        the channel is lost: its state and any retained data go, silently."""
        ep = self.endpoints.get(chanid)
        if ep is None or ep.held:
            return
        self._set_terminal(ep, Terminal.LOST_IN_TRANSIT)
        self._destroy_silently(chanid)

    def _destroy_silently(self, chanid: int) -> None:
        """Destroy a remote-created channel, and those in its queue, without CLOSE or
        CANCEL: the creator already counts them lost."""
        root = chanid
        work = [chanid]
        while work:
            chanid = work.pop()
            ep = self.endpoints.get(chanid)
            sm: SenderSM | ReceiverSM | None = self.senders.pop(chanid, None)
            if sm is None:
                sm = self.receivers.pop(chanid, None)
            if sm is not None:
                if isinstance(sm, SenderSM):
                    sm.teardown(reset_ctrl=True)
                else:
                    sm.abandon()
                    if sm.ctrl_stream is not None:
                        self.reset(sm.ctrl_stream)
            if ep is not None:
                self._set_terminal(ep, Terminal.LOST_IN_TRANSIT)
                for item in ep.queue:
                    work.extend(a.chanid for a in item.message.attachments)
                ep.queue.clear()
                if chanid == root and ep.attached:
                    # Its attaching message waits in a live queue: the application may
                    # still take the handle, which must then say LostInTransit (§2.10). It
                    # is freed when the application ends it or that message is discarded.
                    ep.buffered = 0
                else:
                    ep.app_done = True
            if sm is not None:
                self._sm_destroyed(chanid)
            elif ep is not None:
                self._maybe_free(ep)

    def _cancel_sender(self, ep: Endpoint) -> None:
        sm = self.senders.get(ep.chanid)
        if sm is not None and sm.state is SendState.OPEN:
            sm.cancel()
            self._set_terminal(ep, Terminal.CANCELLED)

    def _discard_queue(self, ep: Endpoint) -> None:
        """Messages the application will never take: close their attachments normally
        (remote senders see ReceiverDropped, remote receivers Cancelled; §2.6)."""
        work = [ep]
        while work:
            current = work.pop()
            items = list(current.queue)
            current.queue.clear()
            if not current.attached:
                self._unattached_bytes -= current.buffered
            current.buffered = 0
            for item in items:
                for att in item.message.attachments:
                    child = self.endpoints.get(att.chanid)
                    if child is None or child.app_done:
                        continue
                    child.app_done = True
                    if child.is_sender:
                        self._cancel_sender(child)
                    else:
                        rm = self.receivers.get(child.chanid)
                        if rm is not None:
                            rm.close()
                        work.append(child)
                    self._maybe_free(child)

    def _on_lost(self, chanid: int, node: Node) -> list[int]:
        """lose(X) of §2.9 for a channel we created: its local effects."""
        lost: list[int] = []
        sm = self.senders.pop(chanid, None)
        if sm is not None:
            self._blocked.pop(chanid, None)
            lost = sm.teardown(reset_ctrl=True)
        else:
            rm = self.receivers.pop(chanid, None)
            if rm is not None:
                rm.abandon()
                if rm.ctrl_stream is not None:
                    self.reset(rm.ctrl_stream)
        ep = self.endpoints.get(chanid)
        if ep is not None:
            self._set_terminal(ep, Terminal.LOST_IN_TRANSIT)
            self._discard_queue(ep)
            self._maybe_free(ep)
        if node.route_to_sent:
            self._forget(chanid)
        return lost

    def _forget(self, chanid: int) -> None:
        """FORGET_CHANNEL on a fresh stream, at most once per channel per interval (G20)."""
        last = self._forget_log.get(chanid)
        if last is not None and self.now - last < self.config.forget_interval:
            return
        if not self._forget_log:
            self.schedule(self.config.forget_interval, self._prune_forget_log)
        self._forget_log[chanid] = self.now
        self.write(self.open_stream(), self.seq_prefix(chanid) + _FORGET_BYTES, True)

    def _prune_forget_log(self) -> None:
        horizon = self.now - self.config.forget_interval
        self._forget_log = {c: t for c, t in self._forget_log.items() if t > horizon}
        if self._forget_log:
            self.schedule(self.config.forget_interval, self._prune_forget_log)

    def _pump_all(self) -> None:
        for sm in list(self.senders.values()):
            if sm.alive and sm.queue:
                sm.pump()

    def _drop_state(self, detail: str) -> None:
        super()._drop_state(detail)
        for ep in list(self.endpoints.values()):
            if ep.terminal is not Terminal.FINISHED:
                ep.queue.clear()
                ep.buffered = 0
            self._set_terminal(ep, Terminal.CONNECTION_LOST)
            ep.detail = ep.detail or detail
            if ep.app_done or not ep.held:
                del self.endpoints[ep.chanid]
        for sm in self.senders.values():
            sm.alive = False
        for rm in self.receivers.values():
            rm.abandon()
        self.senders.clear()
        self.receivers.clear()
        self.lineage.nodes.clear()
        self._forget_log.clear()
        self._unattached = self._unattached_bytes = 0


_FORGET_BYTES = encode_frame(ForgetChannel())
