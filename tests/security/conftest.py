"""The attack harness: a real ``aqueduct serve`` under a memory cap, a victim client, and a raw
QUIC attacker that writes crafted Aqueduct frames.

- :func:`target` starts ``aqueduct serve`` (with a token: the attacker never has it) and caps
  its address space at its idle size + 2 GiB (``prlimit``), so a regression fails the test
  with a MemoryError in the server instead of swapping the machine. :class:`ServerMemory`
  reads the server's RSS and its peak (``VmHWM``, reset through ``clear_refs``) from /proc.
- :class:`Victim` is an honest client, connected before the attack, whose ``ls`` latency is
  what another user of the service notices.
- :class:`Attacker` is a bare qh3 client connection (ALPN ``aqueduct``) driven by hand: it
  opens streams and sends datagrams with whatever bytes the test builds with
  :mod:`aqueduct_core.wire`, and records how the server closed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import resource
import ssl
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cbor2
import pytest
from qh3.asyncio.client import connect as qh3_connect
from qh3.asyncio.protocol import QuicConnectionProtocol
from qh3.quic.configuration import QuicConfiguration
from qh3.quic.connection import QuicConnectionError
from qh3.quic.events import ConnectionTerminated, StreamDataReceived

from aqueduct_core.api.codec import CODEC_HEADER
from aqueduct_core.engine.config import DEFAULT_WINDOW
from aqueduct_core.engine.flow import FLOW_HEADER, encode_window
from aqueduct_core.errors import AqueductError, CloseCode
from aqueduct_core.transport import ClientTLS
from aqueduct_core.wire import (
    ConnectionHeaders,
    Dequeued,
    RouteTo,
    StreamParser,
    Version,
    WireLimits,
    encode_frames,
)
from aqueduct_core.wire.frames import TAG_MESSAGE
from aqueduct_core.wire.primitives import encode_varint
from aqueduct_spark import protocol as P
from aqueduct_spark.client import AsyncClient, ClientConfig
from aqueduct_spark.testing import ServiceProcess, start_service

MIB = 1 << 20
GIB = 1 << 30
TOKEN = "attack-test-token-5e1f"
MEMORY_CAP_HEADROOM = 2 * GIB
"""Address space the server may add to its idle size before allocations fail."""
MEMORY_SLACK = 50 * MIB
"""Growth of the server's peak RSS an attack may cause (issue 13's acceptance)."""


# -- the server and its memory -----------------------------------------------------------


class ServerMemory:
    """Memory figures of one process, from /proc/<pid>/status (bytes)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def _status(self) -> dict[str, int]:
        out = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if value.strip().endswith("kB"):
                    out[key] = int(value.split()[0]) * 1024
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used (/proc/<pid>/stat)."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @property
    def rss(self) -> int:
        return self._status()["VmRSS"]

    @property
    def peak(self) -> int:
        """The highest RSS since the last :meth:`reset_peak`."""
        return self._status()["VmHWM"]

    @property
    def address_space(self) -> int:
        return self._status()["VmSize"]

    def reset_peak(self) -> None:
        with open(f"/proc/{self.pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


@dataclass
class Target:
    svc: ServiceProcess
    memory: ServerMemory

    @property
    def alive(self) -> bool:
        return self.svc.proc.poll() is None

    @property
    def port(self) -> int:
        return self.svc.port


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Target]:
    """A fresh ``aqueduct serve`` (token-protected) under an address-space cap."""
    svc = start_service(tmp_path / "root", token=TOKEN)
    try:
        memory = ServerMemory(svc.proc.pid)
        cap = memory.address_space + MEMORY_CAP_HEADROOM
        _, hard = resource.prlimit(svc.proc.pid, resource.RLIMIT_AS)
        resource.prlimit(svc.proc.pid, resource.RLIMIT_AS, (cap, hard))
        yield Target(svc, memory)
    finally:
        svc.stop()


# -- the victim ----------------------------------------------------------------------------


class Victim:
    """An honest client of the service: its ``ls`` latency is what a user notices."""

    def __init__(self, target: Target) -> None:
        self.client = AsyncClient(
            ClientConfig(
                target.svc.url,
                token=TOKEN,
                tls=ClientTLS(fingerprint=target.svc.fingerprint),
                retries=0,
            )
        )
        self.baseline = 0.0

    async def ls(self) -> float:
        """Seconds one ``ls`` took; ``inf`` if it failed or took longer than the client's
        timeout (:meth:`bound`, once warmed up)."""
        start = time.monotonic()
        try:
            await self.client.list()
        except AqueductError:
            return math.inf
        return time.monotonic() - start

    async def warm_up(self) -> None:
        """Connect, measure the unloaded ``ls`` latency (median of five), then make
        :meth:`bound` the client's request timeout."""
        await self.client.list()
        self.baseline = statistics.median([await self.ls() for _ in range(5)])
        assert self.baseline < math.inf, "the service does not answer ls even unattacked"
        # The client reads its configuration per request; its own timeout (rather than a
        # wait_for around it) closes the abandoned reply channel cleanly.
        self.client.config = replace(self.client.config, timeout=self.bound())

    def bound(self) -> float:
        """The longest an ``ls`` may take while the service is attacked: ten times the
        unloaded latency, but never under 2 s (five engineers share two cores), which the
        attacks this file guards against (seconds of a blocked event loop, a dead
        process) exceed."""
        return max(2.0, 10 * self.baseline)

    async def ls_for(self, seconds: float) -> float:
        """``ls`` back to back for ``seconds``; returns the slowest (``inf`` when one took
        longer than :meth:`bound`, or failed; then it stops)."""
        worst = 0.0
        end = time.monotonic() + seconds
        while time.monotonic() < end and worst < math.inf:
            worst = max(worst, await self.ls())
        return worst

    async def close(self) -> None:
        await self.client.close()


@asynccontextmanager
async def victim_of(target: Target) -> AsyncIterator[Victim]:
    victim = Victim(target)
    try:
        await victim.warm_up()
        yield victim
    finally:
        await victim.close()


# -- the attacker --------------------------------------------------------------------------

_GENEROUS = WireLimits(max_payload_bytes=1 << 40, max_header_bytes=1 << 30, max_list_bytes=1 << 30)


class _Recorder(QuicConnectionProtocol):  # type: ignore[misc]
    """Records how the connection ended and whether the server sent its headers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.terminated: ConnectionTerminated | None = None
        self.ended = asyncio.Event()
        self.server_headers = asyncio.Event()
        self.dequeued = 0
        """Bytes the server reported dequeued (DEQUEUED frames, flow control credit)."""
        self.credit = asyncio.Event()
        self._parsers: dict[int, StreamParser] = {}

    def quic_event_received(self, event: Any) -> None:
        if isinstance(event, ConnectionTerminated):
            if self.terminated is None:
                self.terminated = event
            self.ended.set()
        elif isinstance(event, StreamDataReceived) and event.data:
            parser = self._parsers.setdefault(event.stream_id, StreamParser(_GENEROUS, True))
            for frame in parser.feed(event.data):
                if isinstance(frame, ConnectionHeaders):
                    self.server_headers.set()
                elif isinstance(frame, Dequeued):
                    self.dequeued += frame.num_bytes
                    self.credit.set()


class Attacker:
    """A raw QUIC connection to the service that sends whatever bytes the test builds."""

    def __init__(self, proto: _Recorder) -> None:
        self.proto = proto
        self.quic = proto._quic
        self.sent = 0
        """Stream and datagram bytes handed to QUIC so far."""
        self._next_stream = 2  # client-initiated unidirectional
        self._refused = False
        self.charged = 0
        """Flow-control cost of the messages sent, as the test counts it."""

    @property
    def closed(self) -> ConnectionTerminated | None:
        """How the server closed the connection, or None while it is open."""
        return self.proto.terminated

    def stream(self, data: bytes = b"", *, stream_id: int | None = None, end: bool = False) -> int:
        """Write ``data`` on a new unidirectional stream (or ``stream_id``); returns its id.
        Writes after the server closed the connection are dropped."""
        if stream_id is None:
            stream_id = self._next_stream
            self._next_stream += 4
        if self._send(self.quic.send_stream_data, stream_id, data, end):
            self.sent += len(data)
        return stream_id

    def datagram(self, data: bytes) -> None:
        if self._send(self.quic.send_datagram_frame, data):
            self.sent += len(data)

    @property
    def gone(self) -> bool:
        """The connection is closed (by the server, or it refused a write)."""
        return self.closed is not None or self._refused

    def _send(self, write: Any, *args: Any) -> bool:
        if self.gone:
            return False
        try:
            write(*args)
        except (RuntimeError, ValueError, QuicConnectionError):
            self._refused = True  # closed by the server; the event is on its way
            return False
        self.proto.transmit()
        return True

    def hello(self, flow_window: int | None = DEFAULT_WINDOW) -> int:
        """VERSION + CONNECTION_HEADERS as the service's clients send them (taking part in
        flow control with ``flow_window``, profile §3.4), without a token. ``None``: no
        flow-control header (a server requiring flow control refuses that)."""
        headers = [(P.H_VERSION, str(P.PROTOCOL_VERSION).encode()), (CODEC_HEADER, b"cbor")]
        if flow_window is not None:
            headers.append((FLOW_HEADER, encode_window(flow_window)))
        return self.stream(encode_frames(Version(), ConnectionHeaders(tuple(headers))), end=True)

    async def wait_server_headers(self, timeout: float = 10) -> None:
        """Wait for the server's CONNECTION_HEADERS, or for it to close the connection."""
        ended = asyncio.ensure_future(self.proto.ended.wait())
        headers = asyncio.ensure_future(self.proto.server_headers.wait())
        try:
            await asyncio.wait([ended, headers], timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            ended.cancel()
            headers.cancel()
        assert self.proto.server_headers.is_set() or self.gone, "the server never answered"

    async def wait_credit(self, outstanding: int, timeout: float = 10) -> bool:
        """Wait until the server has reported all but ``outstanding`` of the bytes
        :meth:`charge` counted as dequeued (flow control, profile §3.4). False if it did not
        within ``timeout`` or the connection closed."""
        deadline = time.monotonic() + timeout
        while not self.gone and self.charged - self.proto.dequeued > outstanding:
            self.proto.credit.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proto.credit.wait(), min(left, 0.05))
        return not self.gone

    async def wait_closed(self, timeout: float) -> ConnectionTerminated | None:
        """Wait up to ``timeout`` s for the server to close us; how it did, or None. A PING
        every half second makes a server that already closed repeat its CONNECTION_CLOSE
        (the first may have been lost) and keeps our loss recovery going, without sending
        the server anything it must process."""
        deadline = time.monotonic() + timeout
        while self.closed is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proto.ended.wait(), 0.5)
                break
            if time.monotonic() > deadline:
                return None
            with contextlib.suppress(Exception):
                self.quic.send_ping(0)
                self.proto.transmit()
        return self.closed

    async def flush(self, low_water: int, stall: float) -> bool:
        """Wait until fewer than ``low_water`` bytes wait in our send buffer. Returns False
        if the server stopped taking bytes for ``stall`` seconds (flow control) or closed
        the connection."""
        await asyncio.sleep(0)  # let the connection's events in, whatever happens next
        last = self.quic.get_send_buffer_size()
        since = time.monotonic()
        while not self.gone:
            left = self.quic.get_send_buffer_size()
            if left < low_water:
                return True
            if left < last:
                last, since = left, time.monotonic()
            elif time.monotonic() - since > stall:
                return False
            await asyncio.sleep(0.005)
        return False


@asynccontextmanager
async def attacker_of(target: Target, *, max_datagram_size: int = 1350) -> AsyncIterator[Attacker]:
    config = QuicConfiguration(
        is_client=True,
        alpn_protocols=["aqueduct"],
        max_datagram_frame_size=65536,
        max_datagram_size=max_datagram_size,
        idle_timeout=60.0,
    )
    config.verify_mode = ssl.CERT_NONE
    async with qh3_connect(
        "127.0.0.1", target.port, configuration=config, create_protocol=_Recorder
    ) as proto:
        yield Attacker(proto)


# -- running an attack ------------------------------------------------------------------------

REQUEST = cbor2.dumps({"op": "list"})
"""A well-formed service request (no reply channel), so the service itself has no reason to
close the connection: whatever happens is the engine's doing."""
WATCH = 1.5
"""Seconds the victim keeps asking after the attack: longer than the engine's unreliable
receipt deadline (at most 1 s), when the acks or nacks of a datagram gap are built."""
CLOSE_ARRIVES = 5.0
"""Seconds the attacker waits for a close the server sent (far below the 10 s handshake
timeout and the 30 s idle timeout, whose closes would not count as a cut-off anyway)."""
CUT_OFF_ARRIVES = 60.0
"""Seconds an attack that must be cut off waits for the close: on a loaded machine the
server can take many seconds to get (loss recovery backs off) and process a flood, and the
wait ends as soon as the close arrives. The close code tells a cut-off from a timeout."""
ATTACKER_CUT_OFF = (CloseCode.PROTOCOL_VIOLATION, CloseCode.LIMIT_VIOLATION)


def run(coro: Awaitable[Any], timeout: float = 90) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def report(name: str, **figures: object) -> None:
    """Print the figures a test measured (``pytest -s`` shows them)."""
    print(f"\n[{name}] " + " ".join(f"{k}={v}" for k, v in figures.items()))


async def attacked(
    target: Target,
    attack: Callable[[Attacker], Awaitable[None]],
    *,
    allowance: int = 0,
    packet_size: int = 1350,
    cut_off: bool = False,
) -> ConnectionTerminated | None:
    """Run ``attack`` against the service while a victim uses it. Asserts that the server
    stayed alive, kept its peak RSS within idle + 50 MB + ``allowance``, and answered every
    ``ls`` of the victim within its bound. Returns how the server closed the attacker, if it
    did (None: the attacker was still connected). ``packet_size``: the attacker's QUIC
    packets (a datagram must fit in one). ``cut_off``: the attack must end in a close (wait
    for it up to :data:`CUT_OFF_ARRIVES`)."""
    async with victim_of(target) as victim:
        idle = target.memory.rss
        target.memory.reset_peak()
        async with attacker_of(target, max_datagram_size=packet_size) as attacker:
            await attack(attacker)
            worst = await victim.ls_for(WATCH)
            # A close sent during a flood may be lost; QUIC repeats it when the peer next
            # sends, which a stalled attacker may not do for a while.
            closed = await attacker.wait_closed(CUT_OFF_ARRIVES if cut_off else CLOSE_ARRIVES)
        alive = target.alive
        growth = (target.memory.peak - idle) if alive else None
        report(
            attack.__name__,
            idle_rss_mb=f"{idle / MIB:.0f}",
            peak_growth_mb=f"{growth / MIB:.1f}" if growth is not None else "(died)",
            ls_baseline_ms=f"{victim.baseline * 1000:.0f}",
            ls_worst_ms=f"{worst * 1000:.0f}",
            attacker_sent_mb=f"{attacker.sent / MIB:.1f}",
            attacker_closed=closed,
        )
        assert growth is not None, "the server process died"
        assert growth < MEMORY_SLACK + allowance, (
            f"the server's peak RSS grew by {growth / MIB:.0f} MB during the attack"
        )
        assert worst <= victim.bound(), (
            f"another client's ls took {worst:.2f} s (unloaded: {victim.baseline:.3f} s)"
        )
        return closed


def assert_cut_off(closed: ConnectionTerminated | None) -> None:
    """The server closed the attacker for breaking a rule (not idle, not a handshake
    timeout)."""
    assert closed is not None, "the server did not close the attacker's connection"
    assert closed.error_code in ATTACKER_CUT_OFF, f"closed with {closed}"


BUDGET = 256 * MIB
"""The most an attack sends; a server that neither cut it off nor grew by then holds it
within its grant."""


async def trickle(
    attacker: Attacker, target: Target, streams: list[int], *, limit: int, chunk: int = 256 * 1024
) -> None:
    """Feed ``chunk``-sized pieces to ``streams`` in turn, never finishing anything, until the
    server cuts the attacker off, stops taking bytes (flow control), grows by more than
    ``limit``, or :data:`BUDGET` was sent."""
    idle = target.memory.rss
    filler = b"\xa5" * chunk
    while attacker.sent < BUDGET and not attacker.gone:
        for sid in streams:
            attacker.stream(filler, stream_id=sid)
        if not await attacker.flush(4 * MIB, stall=3.0):
            return
        if target.memory.rss - idle > limit:
            return  # the assertion on the peak reports it


def message_head(num: int, payload_len: int) -> bytes:
    """A MESSAGE up to its payload: no headers, no attachments, ``payload_len`` announced."""
    return bytes([TAG_MESSAGE]) + encode_varint(num) + b"\x00\x00" + encode_varint(payload_len)


async def unfinished_messages_attack(
    target: Target, messages: int, announced: int, flow_window: int | None
) -> ConnectionTerminated | None:
    """(Its callers expect a cut-off.) Issue 13's never-finished message: after the handshake (taking part in flow control
    if ``flow_window``), ``messages`` streams to the entrypoint, each a MESSAGE head
    announcing ``announced`` payload bytes, then payload trickled to all of them and never
    finished. The server may hold one message of the largest payload (the progress rule of
    flow control lets one message larger than the window through)."""
    allowance = WireLimits().max_payload_bytes

    async def never_finished(attacker: Attacker) -> None:
        attacker.hello(flow_window)
        await attacker.wait_server_headers()
        streams = [
            attacker.stream(encode_frames(RouteTo(0)) + message_head(i, announced))
            for i in range(messages)
        ]
        await trickle(attacker, target, streams, limit=MEMORY_SLACK + allowance)

    return await attacked(target, never_finished, allowance=allowance, cut_off=True)
