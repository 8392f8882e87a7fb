"""Randomized soak of the engine over the simulated network (issue 3 acceptance).

Each seed runs a random workload: trees of channels several levels deep created by attachments
in both directions, all three modes and oneshots, finish/cancel/close at random moments, 0-30%
datagram loss and reordering between streams. After quiescence it checks what a user would
notice, against predictions made from the wire by :mod:`soak_oracle` (not by the engine):

- every message on a channel that finished was delivered exactly once (reliable ones all, in
  order for ORDERED; unreliable ones at most once) and no unreliable message arrived after its
  nack;
- every handle an application held reached exactly one terminal state, consistent with the
  other side's and with the predicted fate of the channel (a lost channel is never held by the
  non-creator; an accessible one is never reported lost; pairings follow profile §2.10);
- a lost parent makes every descendant lost on both sides;
- neither engine keeps state for channels that ended (no leaks).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from soak_oracle import WireTap

from aqueduct_core.engine import (
    ChannelTerminated,
    Connection,
    EngineConfig,
    Mode,
    NewChannel,
    QueuePolicy,
    Terminal,
)
from aqueduct_core.errors import ChannelError, EndOfChannel, WouldBlock
from aqueduct_core.testing.simnet import SimNetwork
from aqueduct_core.wire.chanid import ENTRYPOINT, Side, creator_of, is_oneshot, sender_of

BIG = 2500  # does not fit a 1200-byte datagram: goes on a stream (G13)


@dataclass
class Handle:
    side: Side
    chanid: int
    sender: bool
    mode: Mode | None = None
    evicting: bool = False
    """A drop-oldest queue: any message may be discarded before it is numbered."""
    sent: list[tuple[bytes, bool, bool]] = field(default_factory=list)
    """(payload id, went on a stream (reliable number space)?, must it arrive?)"""
    received: list[tuple[bytes, int]] = field(default_factory=list)
    """(payload id, MESSAGE_NUM)"""
    done: bool = False
    action: str | None = None
    """What the application did to end it: finish, cancel, close, drained, error."""
    seen_error: type[Exception] | None = None


class App:
    """One side's application: holds handles, sends, receives, ends channels."""

    def __init__(self, net: SimNetwork, side: Side, rng: random.Random, big: bool) -> None:
        self.net = net
        self.side = side
        self.conn: Connection = net.engine(side)
        self.rng = rng
        self.big = big
        self.handles: dict[int, Handle] = {}
        self.counter = 0
        # Each side holds its end of the entrypoint from the start.
        self.handles[ENTRYPOINT] = Handle(side, ENTRYPOINT, side is Side.CLIENT)

    def adopt(self, chanid: int) -> None:
        self.handles[chanid] = Handle(self.side, chanid, sender_of(chanid) is self.side)

    def live(self, sender: bool) -> list[Handle]:
        return [h for h in self.handles.values() if h.sender is sender and not h.done]

    # -- actions ------------------------------------------------------------------------

    def send(self, h: Handle) -> None:
        conn, now = self.conn, self.net.now
        if h.mode is None:
            if is_oneshot(h.chanid):
                h.mode = Mode.ONESHOT
            else:
                h.mode = self.rng.choice([Mode.ORDERED, Mode.UNORDERED, Mode.UNRELIABLE])
                policy, maxsize = QueuePolicy.UNBOUNDED, 0
                if h.mode is Mode.UNRELIABLE and self.rng.random() < 0.3:
                    policy, maxsize = QueuePolicy.DROP_OLDEST, 4
                    h.evicting = True
                elif self.rng.random() < 0.3:
                    policy, maxsize = QueuePolicy.BLOCK, 3
                conn.configure_sender(h.chanid, h.mode, policy, maxsize)
        specs = [
            NewChannel(keep_sender=self.rng.random() < 0.5, oneshot=self.rng.random() < 0.2)
            for _ in range(self.rng.choice([0, 0, 0, 1, 1, 2]))
        ]
        self.counter += 1
        ident = f"{int(self.side)}:{h.chanid}:{self.counter}:".encode()
        size = BIG if self.big and self.rng.random() < 0.05 else self.rng.randint(0, 60)
        payload = ident + b"x" * size
        on_stream = h.mode is not Mode.UNRELIABLE or size >= BIG
        try:
            children = conn.send(h.chanid, payload, attachments=specs, now=now)
        except WouldBlock:
            return
        except ChannelError as exc:
            self.end_sender(h, "error", type(exc))
            return
        h.sent.append((ident, on_stream, on_stream and not h.evicting))
        for spec, child in zip(specs, children, strict=True):
            self.handles[child] = Handle(self.side, child, spec.keep_sender)
        if h.mode is Mode.ONESHOT:
            self.end_sender(h, "finish")

    def end_sender(self, h: Handle, action: str, error: type[Exception] | None = None) -> None:
        if action == "cancel":
            self.conn.cancel(h.chanid, now=self.net.now)
        else:
            self.conn.finish(h.chanid, now=self.net.now)
        h.done, h.action, h.seen_error = True, action, error

    def drain(self, h: Handle, limit: int | None = None) -> None:
        conn = self.conn
        taken = 0
        while limit is None or taken < limit:
            try:
                msg = conn.recv(h.chanid, now=self.net.now)
            except EndOfChannel:
                self.close(h, "drained")
                return
            except ChannelError as exc:
                self.close(h, "error", type(exc))
                return
            if msg is None:
                return
            taken += 1
            ident = bytes(msg.payload).split(b":", 3)
            h.received.append((b":".join(ident[:3]) + b":", msg.num))
            for att in msg.attachments:
                self.adopt(att.chanid)

    def close(self, h: Handle, action: str, error: type[Exception] | None = None) -> None:
        self.conn.close_receiver(h.chanid, now=self.net.now)
        h.done, h.action, h.seen_error = True, action, error

    def random_step(self) -> None:
        rng = self.rng
        senders, receivers = self.live(True), self.live(False)
        roll = rng.random()
        if senders and roll < 0.45:
            self.send(rng.choice(senders))
        elif receivers and roll < 0.8:
            self.drain(rng.choice(receivers), limit=rng.randint(1, 4))
        elif senders and roll < 0.9:
            h = rng.choice(senders)
            if h.chanid != ENTRYPOINT:
                self.end_sender(h, "cancel" if rng.random() < 0.3 else "finish")
        elif receivers and roll < 0.95:
            h = rng.choice(receivers)
            if h.chanid != ENTRYPOINT:
                self.close(h, "close")

    def wind_down(self) -> None:
        for h in list(self.handles.values()):
            if h.done:
                continue
            if h.sender:
                self.end_sender(h, "finish")
            else:
                self.drain(h)


def terminals(events: list[object]) -> dict[int, list[Terminal]]:
    out: dict[int, list[Terminal]] = {}
    for ev in events:
        if isinstance(ev, ChannelTerminated):
            out.setdefault(ev.chanid, []).append(ev.terminal)
    return out


def assert_no_state(conn: Connection) -> None:
    leftovers = {
        "senders": conn.senders,
        "receivers": conn.receivers,
        "endpoints": conn.endpoints,
        "lineage": conn.lineage.nodes,
        "open streams": conn.open_streams,
        "incoming streams": conn._in,
        "forget log": conn._forget_log,
        "timers": conn._timers,
        "blocked": conn._blocked,
    }
    leaks = {name: value for name, value in leftovers.items() if value}
    assert not leaks, f"{conn.side.name} keeps state after quiescence: {leaks}"
    assert conn.pending_channels() == (0, 0)


def run_workload(seed: int, *, flow_window: int | None = 256 * 1024, steps: int = 120) -> None:
    rng = random.Random(seed)
    loss = rng.choice([0.0, 0.05, 0.15, 0.3])
    tap = WireTap()
    config = EngineConfig(flow_window=flow_window)
    net = SimNetwork(
        seed=seed,
        loss=loss,
        stream_loss=rng.choice([0.0, 0.2]),
        max_chunk=rng.choice([1, 7, 200, 1400]),
        client_config=config,
        server_config=config,
        observer=tap,
    )
    net.handshake()
    apps = {side: App(net, side, random.Random(rng.random()), big=True) for side in Side}
    for _ in range(steps):
        rng.choice(list(apps.values())).random_step()
        net.flush()
        net.advance(rng.choice([0.0, 0.001, 0.005, 0.02, 0.2]))
    for _ in range(200):
        for app in apps.values():
            app.wind_down()
        net.run()
        if all(h.done for app in apps.values() for h in app.handles.values()) and net.idle:
            break
    context = f"seed={seed} loss={loss} window={flow_window}"
    stuck = [h for app in apps.values() for h in app.handles.values() if not h.done]
    assert not stuck, f"{context}: handles never ended: {stuck[:5]}"
    check(net, tap, apps, context)
    assert_no_state(net.client)
    assert_no_state(net.server)


def check(net: SimNetwork, tap: WireTap, apps: dict[Side, App], context: str) -> None:
    ends = {Side.CLIENT: terminals(net.client_events), Side.SERVER: terminals(net.server_events)}
    for side, per_chan in ends.items():
        doubled = {c: t for c, t in per_chan.items() if len(t) > 1}
        assert not doubled, f"{context}: {side.name} handles with two terminal states: {doubled}"

    def terminal(side: Side, chanid: int) -> Terminal | None:
        got = ends[side].get(chanid)
        return got[0] if got else None

    chans = set(apps[Side.CLIENT].handles) | set(apps[Side.SERVER].handles)
    for chanid in chans:
        hs = {side: apps[side].handles.get(chanid) for side in Side}
        ts = {side: terminal(side, chanid) for side in Side if hs[side] is not None}
        for side, t in ts.items():
            assert t is not None, f"{context}: {side.name} handle {chanid} has no terminal state"
        lost, accessible = tap.lost(chanid), tap.accessible(chanid)
        creator = creator_of(chanid)
        where = f"{context} chan {chanid} {ts}"
        assert lost != accessible, f"{where}: neither lost nor accessible after quiescence"
        if lost:
            # The non-creator can never have held it (its message was never delivered).
            assert hs[creator.peer] is None, f"{where}: non-creator holds a lost channel"
            h = hs[creator]
            if h is not None:
                allowed = {Terminal.LOST_IN_TRANSIT}
                allowed |= {Terminal.CANCELLED} if h.action == "cancel" else set()
                allowed |= {Terminal.CLOSED} if h.action == "close" else set()
                allowed |= {Terminal.FINISHED} if h.sender and h.action == "finish" else set()
                carrier = tap.carried_by.get(chanid)
                if carrier is not None and tap.fate(carrier):
                    # Delivered into a parent that was lost: the peer's engine discarded that
                    # parent's queue and closed this attachment normally (§2.6), which may
                    # reach us before our own cascade declares it lost.
                    allowed.add(Terminal.RECEIVER_DROPPED if h.sender else Terminal.CANCELLED)
                assert ts[creator] in allowed, f"{where}: lost, creator saw {ts[creator]}"
            continue
        assert Terminal.LOST_IN_TRANSIT not in ts.values(), f"{where}: accessible but lost"
        s_side = sender_of(chanid)
        sh, rh = hs[s_side], hs[s_side.peer]
        st, rt = ts.get(s_side), ts.get(s_side.peer)
        if sh is not None and rh is not None:
            pairs = {
                Terminal.FINISHED: {Terminal.FINISHED, Terminal.CLOSED},
                Terminal.CANCELLED: {Terminal.CANCELLED, Terminal.CLOSED},
                Terminal.RECEIVER_DROPPED: {Terminal.CLOSED},
            }
            assert st in pairs and rt in pairs[st], f"{where}: sender {st} with receiver {rt}"
            check_delivery(sh, rh, rt, tap, where)


def check_delivery(sh: Handle, rh: Handle, rt: Terminal | None, tap: WireTap, where: str) -> None:
    got = [ident for ident, _ in rh.received]
    dups = [i for i, n in Counter(got).items() if n > 1]
    assert not dups, f"{where}: delivered twice: {dups[:3]}"
    on_stream = {ident: stream for ident, stream, _ in sh.sent}
    assert set(got) <= set(on_stream), f"{where}: delivered something never sent"
    for ident, num in rh.received:
        if not on_stream[ident]:
            nacked = (rh.chanid, True, num) in tap.nacked
            assert not nacked, f"{where}: unreliable {ident!r} delivered after its nack"
    if rt is Terminal.FINISHED and rh.action == "drained":
        want = [ident for ident, _, must_arrive in sh.sent if must_arrive]
        have = [ident for ident in got if ident in set(want)]
        assert sorted(have) == sorted(want), f"{where}: finished but reliable messages missing"
        if sh.mode is Mode.ORDERED:
            assert have == want, f"{where}: ORDERED channel delivered out of order"


@pytest.mark.parametrize("seed", range(300))
def test_soak(seed: int) -> None:
    run_workload(seed)


@pytest.mark.parametrize("seed", range(60))
def test_soak_without_flow_control(seed: int) -> None:
    run_workload(10_000 + seed, flow_window=None)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(300, 3300))
def test_soak_many(seed: int) -> None:
    run_workload(seed, steps=200)
