"""Lost-in-transit detection (profile §2.9; `000` "reachability").

Every networked channel ends up *accessible* (the other side's application can hold it) or
*lost* (it never can), never both. A channel X attached to message M sent on channel P is
accessible iff M was acked and P is accessible, and lost iff M was nacked or P is lost. Only
the creator of X, the sender on P, sees M's fate, so the creator tracks it in a :class:`Node`
per channel; the other side learns of a loss through FORGET_CHANNEL.

A node is separate from the channel's state machine and may outlive it: a sender that
finished while still pending keeps its links, so that if it turns out to be lost, the children
of its *acked* messages are lost too (case 58).

The cascade is iterative (a worklist), so arbitrarily deep trees cannot exhaust the stack.
"""

from __future__ import annotations

from collections.abc import Callable

MsgKey = tuple[bool, int]
"""(unreliable number space?, MESSAGE_NUM)."""


class Node:
    __slots__ = (
        "accessible",
        "acked_pending",
        "chanid",
        "has_sm",
        "kept_sender",
        "route_to_sent",
        "unacked",
    )

    def __init__(self, chanid: int, kept_sender: bool, accessible: bool) -> None:
        self.chanid = chanid
        self.kept_sender = kept_sender
        self.accessible = accessible
        self.route_to_sent = False
        self.has_sm = True
        self.unacked: dict[MsgKey, list[int]] = {}
        """Attachments of our numbered messages on this channel, not yet acked or nacked."""
        self.acked_pending: list[int] = []
        """Attachments of acked messages, held while this channel is still pending."""

    def __repr__(self) -> str:
        state = "accessible" if self.accessible else "pending"
        return f"Node({self.chanid}, {state}, unacked={self.unacked}, held={self.acked_pending})"


class Lineage:
    """All lineage nodes of one connection. ``on_lost(chanid, node)`` performs the local
    effects of a loss (destroy the SM, tell the application, FORGET) and returns the chanids
    of channels that rode in messages dropped before numbering, which are lost as well."""

    def __init__(self, on_lost: Callable[[int, Node], list[int]]) -> None:
        self.nodes: dict[int, Node] = {}
        self._on_lost = on_lost

    def add(self, chanid: int, kept_sender: bool, accessible: bool) -> Node:
        node = Node(chanid, kept_sender, accessible)
        self.nodes[chanid] = node
        return node

    def numbered(self, parent: int, key: MsgKey, children: list[int]) -> None:
        """Message ``key`` on ``parent`` got its number and carries ``children``."""
        if children:
            self.nodes[parent].unacked[key] = children

    def ack(self, parent: int, key: MsgKey) -> None:
        """Transition 1: message ``key`` on ``parent`` was acked."""
        node = self.nodes.get(parent)
        if node is None:
            return
        children = node.unacked.pop(key, None)
        if not children:
            return
        if node.accessible:
            for child in children:
                self.mark_accessible(child)
        else:
            node.acked_pending.extend(children)

    def nack(self, parent: int, key: MsgKey) -> None:
        """Transition 3: message ``key`` on ``parent`` was nacked (explicitly, by
        CLOSE_RECEIVER, or by FORGET as G28). Its children are lost."""
        node = self.nodes.get(parent)
        if node is None:
            return
        children = node.unacked.pop(key, None)
        if children:
            self.lose_all(children)

    def mark_accessible(self, chanid: int) -> None:
        """Transition 2, recursively through children acked while pending."""
        work = [chanid]
        while work:
            node = self.nodes.get(work.pop())
            if node is None or node.accessible:
                continue
            node.accessible = True
            work.extend(node.acked_pending)
            node.acked_pending = []
            self.maybe_free(node)

    def lose_all(self, chanids: list[int]) -> None:
        """Transition 4, lose(X), for each channel and everything under it."""
        work = list(chanids)
        while work:
            chanid = work.pop()
            node = self.nodes.pop(chanid, None)
            if node is None or node.accessible:
                # Already resolved (an accessible channel cannot be lost).
                if node is not None:
                    self.nodes[chanid] = node
                continue
            work.extend(self._on_lost(chanid, node))
            if node.kept_sender:
                for children in node.unacked.values():
                    work.extend(children)
                work.extend(node.acked_pending)
            node.unacked = {}
            node.acked_pending = []

    def sm_gone(self, chanid: int) -> None:
        node = self.nodes.get(chanid)
        if node is not None:
            node.has_sm = False
            self.maybe_free(node)

    def maybe_free(self, node: Node) -> None:
        """Free a node that can no longer matter: accessible, no SM, nothing unacked."""
        if node.accessible and not node.has_sm and not node.unacked:
            self.nodes.pop(node.chanid, None)
