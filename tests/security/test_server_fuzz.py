"""A fuzzer of the server side (issue 13): a sans-IO server engine fed what a hostile client
may send, checked for the h11 invariant and for bounded work and memory.

Inputs are runs of transport events (stream chunks, FINs, resets, datagrams, time passing)
drawn three ways: random bytes on random streams and datagrams; a proper handshake followed
by grammatical sequences of hostile frames (claimed message numbers from small to 2**64-1,
client-created attachments, unfinished messages announcing up to 2**64-1 bytes, streams cut
at any byte and reset midway, datagrams); and the same with flow control negotiated.

After every input, and after enough virtual time for every timer (acks, unreliable
deadlines, the handshake timeout) to fire:

- nothing escapes the engine: it either carries on or closes the connection with a
  protocol error code, exactly once, and says so to the application;
- the work is bounded: each input is handled within a CPU-time budget that no input of a
  few kilobytes needs, so per-number work on a claimed 2**40 shows as a failure, not a hang
  (the test process's address space is capped meanwhile, so per-number memory fails with a
  MemoryError instead of swapping);
- the memory is bounded: what the engine holds grows with the bytes it was given, never
  with numbers or lengths the peer claims, and its own accounting (each channel's buffered
  bytes, ``pending_channels()``) is consistent and within the window and the caps.

``make test`` runs a few hundred inputs of each kind (seconds); ``pytest -m slow`` many more.
"""

from __future__ import annotations

import gc
import resource
import signal
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aqueduct_core.engine import ConnectionTerminated, EngineConfig
from aqueduct_core.engine.flow import FLOW_HEADER, encode_window
from aqueduct_core.errors import CloseCode, RemoteProtocolError
from aqueduct_core.testing import strategies as aqs
from aqueduct_core.testing.scripted import ScriptedPeer
from aqueduct_core.wire import (
    ConnectionHeaders,
    FinishSender,
    Frame,
    RouteTo,
    SentUnreliable,
    Side,
    Version,
    encode_frames,
)

FAST = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SLOW = settings(FAST, max_examples=5000)

WINDOW = 64 * 1024
"""The flow-control window both sides advertise when the input negotiates it: small, so a
few kilobytes of hostile input reach it."""
BUDGET = 2.0
"""CPU seconds one input may take, timers included. The largest inputs here are a few
kilobytes; the engine handles them in milliseconds (CPU time, with the garbage collector
paused: a loaded machine stretches wall-clock time, not this)."""
HANG = 10.0
"""CPU seconds after which an input that is still running is interrupted: per-number work
on a claimed 2**40 would otherwise run for hours."""
SETTLE = 12.0
"""Virtual seconds allowed to pass after an input: beyond the handshake timeout (10 s), the
longest unreliable deadline (1 s) and the ack delay."""
HELD_PER_BYTE = 1024
"""How many bytes of memory the engine may hold per byte it was given. Generous (a channel
created by a 3-byte attachment costs a few kilobytes of state), but finite: memory that
follows a claimed number or length blows through it."""
HELD_BASE = 256 * 1024
PROTOCOL_CODES = {
    CloseCode.PROTOCOL_VIOLATION,
    CloseCode.UNSUPPORTED_VERSION,
    CloseCode.LIMIT_VIOLATION,
    CloseCode.HANDSHAKE_TIMEOUT,
}
ADDRESS_SPACE_HEADROOM = 1 << 30


# -- the input: transport events ------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """Bytes of the client's ``stream``-th unidirectional stream (QUIC id 2 + 4 * stream)."""

    stream: int
    data: bytes
    fin: bool = False


@dataclass(frozen=True)
class Datagram:
    data: bytes


@dataclass(frozen=True)
class Reset:
    stream: int


@dataclass(frozen=True)
class Wait:
    seconds: float


Step = Chunk | Datagram | Reset | Wait


def stream_id(index: int) -> int:
    return 2 + 4 * index


@st.composite
def interleaved(draw: st.DrawFn, queues: list[list[Step]]) -> list[Step]:
    """One run of steps taking from ``queues`` in an arbitrary interleaving that keeps the
    order within each queue (a stream's bytes arrive in order)."""
    rnd = draw(st.randoms(use_true_random=False))
    queues = [list(reversed(q)) for q in queues if q]
    out: list[Step] = []
    while queues:
        i = rnd.randrange(len(queues))
        out.append(queues[i].pop())
        if not queues[i]:
            del queues[i]
    return out


@st.composite
def stream_steps(draw: st.DrawFn, index: int, data: bytes, complete: bool = True) -> list[Step]:
    """``data`` on stream ``index``, cut anywhere; ended with FIN, a reset, or left open.
    Data that ends mid-frame (not ``complete``) is rarely FINished: that is a plain
    protocol violation, which would end most inputs early."""
    pieces = draw(aqs.splits(data))
    endings = ["fin", "reset", "open"] if complete else ["reset", "open"] * 4 + ["fin"]
    ending = draw(st.sampled_from(endings))
    steps: list[Step] = [Chunk(index, p) for p in pieces]
    if ending == "fin":
        steps.append(Chunk(index, b"", fin=True))
    elif ending == "reset":
        steps.append(Reset(index))
    return steps


CLIENT_CHANIDS = aqs.client_chanids()
SENDING_CHANIDS = aqs.client_chanids(sender=Side.CLIENT)
ROUTED = {flow: aqs.hostile_routed_frames(flow) for flow in (False, True)}
DATA_FRAMES = st.one_of(
    aqs.hostile_messages(),
    aqs.hostile_messages(),
    aqs.hostile_messages(),
    st.builds(SentUnreliable, aqs.claimed_numbers()),
    st.builds(FinishSender, aqs.claimed_numbers()),
)
"""What a sender writes (mostly MESSAGE): sequences of these often keep the connection open
long enough for the timers that act on what they claimed."""
DATAGRAM_MESSAGES = aqs.hostile_messages(max_payload=32)
UNFINISHED = aqs.unfinished_messages()


def hello(flow: bool) -> bytes:
    headers = ((FLOW_HEADER, encode_window(WINDOW)),) if flow else ()
    return encode_frames(Version(), ConnectionHeaders(headers))


@st.composite
def hostile_sequence(draw: st.DrawFn, flow: bool, version: bool) -> tuple[bytes, bool]:
    """One stream's bytes: [VERSION] ROUTE_TO frames... and perhaps an unfinished MESSAGE at
    the end (then the second item is False). The frames are any routed frames, or (as
    often) only what a sender writes. VERSION comes first if ``version``, else sometimes."""
    frames: list[Frame] = [Version()] if version or draw(st.booleans()) else []
    if draw(st.booleans()):
        frames.append(RouteTo(draw(CLIENT_CHANIDS)))
        frames += draw(st.lists(ROUTED[flow], max_size=5))
    else:
        frames.append(RouteTo(draw(SENDING_CHANIDS)))
        frames += draw(st.lists(DATA_FRAMES, max_size=5))
    data = encode_frames(*frames)
    if draw(st.integers(0, 3)) == 0:
        return data + draw(UNFINISHED), False
    return data, True


@st.composite
def hostile_datagram(draw: st.DrawFn, version: bool) -> bytes:
    frames: list[Frame] = [Version()] if version or draw(st.booleans()) else []
    frames.append(RouteTo(draw(SENDING_CHANIDS)))
    frames += draw(st.lists(DATAGRAM_MESSAGES, max_size=3))
    return encode_frames(*frames)


@st.composite
def after_handshake(draw: st.DrawFn, flow: bool) -> list[Step]:
    """A client that sends its headers, then hostile frame sequences on several streams and
    in datagrams, with time passing in between. Mostly the headers arrive first; otherwise
    they are interleaved with the rest, whose sequences then start with VERSION (as they
    must before ACK_VERSION) and wait for the headers (profile G25)."""
    first = draw(st.integers(0, 3)) > 0
    version = not first
    queues: list[list[Step]] = []
    for index in range(1, draw(st.integers(1, 4)) + 1):
        data, complete = draw(hostile_sequence(flow, version))
        queues.append(draw(stream_steps(index, data, complete)))
    for _ in range(draw(st.integers(0, 3))):
        queues.append([Datagram(draw(hostile_datagram(version)))])
    for _ in range(draw(st.integers(0, 2))):
        queues.append([Wait(draw(st.sampled_from([0.01, 0.05, 0.2, 1.1])))])
    headers: list[Step] = [Chunk(0, hello(flow), fin=True)]
    if first:
        return headers + draw(interleaved(queues))
    return draw(interleaved([*queues, headers]))


@st.composite
def random_bytes(draw: st.DrawFn) -> list[Step]:
    """Any bytes on any of a few streams and in datagrams, with or without a handshake."""
    steps: list[Step] = []
    if draw(st.booleans()):
        steps.append(Chunk(0, hello(draw(st.booleans())), fin=True))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["chunk", "fin", "datagram", "reset"]))
        index = draw(st.integers(0, 3))
        if kind == "datagram":
            steps.append(Datagram(draw(st.binary(max_size=64))))
        elif kind == "reset":
            steps.append(Reset(index))
        else:
            steps.append(Chunk(index, draw(st.binary(max_size=64)), fin=kind == "fin"))
    return steps


# -- running an input under a budget ------------------------------------------------------


class OverBudget(Exception):
    """The engine was still busy with one input after :data:`HANG` CPU seconds."""


@contextmanager
def bounded() -> Iterator[Callable[[], float]]:
    """Yield a function giving the CPU seconds spent inside the block. Meanwhile the garbage
    collector is paused, :class:`OverBudget` interrupts the block after :data:`HANG` CPU
    seconds (repeatedly, should the first land where it is swallowed), and the address
    space is capped at its current size + 1 GiB: per-number work or memory on a claimed
    number fails the test instead of hanging it or swapping the machine."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise OverBudget(f"one input still ran after {HANG} s of CPU time")

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    cap = size + ADDRESS_SPACE_HEADROOM
    previous = signal.signal(signal.SIGPROF, expire)
    collecting = gc.isenabled()
    gc.disable()
    if hard == resource.RLIM_INFINITY or cap < hard:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    start = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, HANG, 1.0)
    try:
        yield lambda: time.process_time() - start
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        if collecting:
            gc.enable()


def feed(peer: ScriptedPeer, step: Step) -> int:
    """Hand one step to the engine; returns the bytes it carried."""
    if isinstance(step, Chunk):
        peer.conn.stream_data(stream_id(step.stream), step.data, step.fin, peer.now)
        peer.collect()
        return len(step.data)
    if isinstance(step, Datagram):
        peer.datagram(step.data)
        return len(step.data)
    if isinstance(step, Reset):
        peer.reset(stream_id(step.stream))
        return 0
    peer.advance(step.seconds)
    return 0


def check_input(steps: list[Step], config: EngineConfig) -> None:
    peer = ScriptedPeer(Side.SERVER, config)
    peer.start()
    fed = 0
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with bounded() as spent:
            for step in steps:
                fed += feed(peer, step)
                check_accounting(peer)
            peer.advance(SETTLE)
            check_accounting(peer)
            cpu = spent()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert cpu <= BUDGET, f"the engine spent {cpu:.1f} s of CPU time on {fed} bytes"
    assert held <= HELD_BASE + HELD_PER_BYTE * fed, (
        f"the engine holds {held} bytes after being given {fed}"
    )
    check_closed_cleanly(peer)


def check_accounting(peer: ScriptedPeer) -> None:
    """The engine's own accounting holds and stays within its limits: a channel's buffered
    bytes are the costs of the messages it queues; with flow control, no channel holds more
    than its window (or one larger message: the progress rule), since our application never
    takes anything; channels not attached yet stay within their caps."""
    conn = peer.conn
    for chanid, ep in conn.endpoints.items():
        costs = [item.cost for item in ep.queue]
        assert ep.buffered == sum(costs), f"channel {chanid}: {ep.buffered} != sum {costs}"
        if conn.own_window is not None and costs:
            assert ep.buffered <= max(conn.own_window, *costs), (
                f"channel {chanid} holds {ep.buffered} bytes, window {conn.own_window}"
            )
    channels, nbytes = conn.pending_channels()
    assert channels <= conn.config.max_pending_channels
    assert nbytes <= conn.config.max_pending_bytes


def check_closed_cleanly(peer: ScriptedPeer) -> None:
    """Either still open, or closed once with a protocol error code, reported to the
    application as the peer's fault (h11's invariant)."""
    ends = [e for e in peer.events if isinstance(e, ConnectionTerminated)]
    if peer.close_code is None:
        assert not ends, f"terminated without a close command: {ends}"
        return
    assert len(peer.wire.closes) == 1, f"closed more than once: {peer.wire.closes}"
    assert peer.close_code in PROTOCOL_CODES, f"closed with {peer.wire.closes[0]}"
    assert len(ends) == 1 and not ends[0].by_peer
    assert isinstance(ends[0].error, RemoteProtocolError)


def flow_config(flow: bool) -> EngineConfig:
    return EngineConfig(flow_window=WINDOW) if flow else EngineConfig()


# -- the targets -----------------------------------------------------------------------------


@FAST
@given(steps=random_bytes())
def test_random_bytes(steps: list[Step]) -> None:
    check_input(steps, EngineConfig())


@pytest.mark.parametrize("flow", [False, True], ids=["no-flow-control", "flow-control"])
@FAST
@given(data=st.data())
def test_hostile_frames_after_a_handshake(flow: bool, data: st.DataObject) -> None:
    check_input(data.draw(after_handshake(flow)), flow_config(flow))


@pytest.mark.slow
@SLOW
@given(steps=random_bytes())
def test_random_bytes_slow(steps: list[Step]) -> None:
    check_input(steps, EngineConfig())


@pytest.mark.slow
@pytest.mark.parametrize("flow", [False, True], ids=["no-flow-control", "flow-control"])
@SLOW
@given(data=st.data())
def test_hostile_frames_after_a_handshake_slow(flow: bool, data: st.DataObject) -> None:
    check_input(data.draw(after_handshake(flow)), flow_config(flow))
