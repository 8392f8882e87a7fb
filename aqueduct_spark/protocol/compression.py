"""Arrow IPC body compression on data channels: the setting, what a reader offers, and the
``auto`` policy that decides batch by batch from what the connection measures.

Every data message is one Arrow IPC record batch message, and each declares its own body
compression (LZ4 frame or zstd, per buffer): any Arrow reader decodes it, and the choice may
change from one batch to the next. So the sender decides alone, per batch:

- a fixed setting (``none``, ``lz4``, ``zstd``, ``zstd:LEVEL``) is used for every batch;
- ``auto`` compresses when the network path, not the CPU, is the limit, and only when the
  codec is fast enough to gain from it (:class:`AutoCompression`).

Scans: the reader asks with channel headers. A fixed setting goes in ``aqds-compression``
(old services understand ``none``, ``lz4`` and ``zstd``); ``auto`` sends ``none`` there (what
an old service then does) and the codecs it decodes in ``aqds-codecs``, leaving the choice to
the service (:func:`negotiate`). Writes: the writer decides, among the codecs the service's
``begin`` answer says it accepts.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .errors import InvalidRequest
from .headers import H_CODECS, H_COMPRESSION

if TYPE_CHECKING:  # both imported where used: the Spark options check imports this module
    import pyarrow as pa

    from aqueduct_core.api.path import PathReading, PathSample

CODECS = ("lz4", "zstd")
"""The codecs an Arrow IPC message can declare, lightest first (the order ``auto`` prefers
them)."""
LIGHTEST_FIRST = ("none", *CODECS)
"""Every setting ``auto`` chooses from, by CPU per byte (at both ends): a heavier codec must
beat each lighter one by ``auto``'s margin to be chosen, and to be kept (:func:`choose`)."""
SETTINGS = ("auto", "none", *CODECS)
ZSTD_LEVELS = (-7, 22)
"""The zstd levels a setting may name (negative: faster, larger)."""
AUTO_LEVEL = {"lz4": None, "zstd": 1}
"""The level ``auto`` compresses at (None: the codec's default)."""


@dataclass(frozen=True, slots=True)
class Compression:
    """A compression setting: ``auto``, ``none``, ``lz4``, or ``zstd`` with an optional
    level (``zstd:3``; zstd takes -7 to 22, higher is smaller and slower)."""

    codec: str
    level: int | None = None

    @classmethod
    def parse(cls, text: str, where: str = "compression") -> Compression:
        """``text`` as a setting; ValueError naming ``where`` and the values it takes."""
        name, _, level = str(text).strip().lower().partition(":")
        if name not in SETTINGS or (level and name != "zstd"):
            raise ValueError(
                f"{where} must be auto, none, lz4, zstd or zstd:LEVEL (e.g. zstd:3), got {text!r}"
            )
        if not level:
            return cls(name)
        value = int(level) if level.lstrip("-").isdigit() else None
        if value is None or not ZSTD_LEVELS[0] <= value <= ZSTD_LEVELS[1]:
            raise ValueError(
                f"{where}: the zstd level must be {ZSTD_LEVELS[0]} to {ZSTD_LEVELS[1]}, "
                f"got {level!r}"
            )
        return cls(name, value)

    def __str__(self) -> str:
        return self.codec if self.level is None else f"{self.codec}:{self.level}"

    @property
    def auto(self) -> bool:
        return self.codec == "auto"

    def options(self) -> pa.ipc.IpcWriteOptions:
        """The IPC write options of a fixed setting (``auto`` has none of its own)."""
        if self.auto:
            raise ValueError("'auto' chooses a codec per batch: ask AutoCompression.codec()")
        return write_options(str(self))


AUTO = Compression("auto")
NONE = Compression("none")


@functools.lru_cache(maxsize=64)
def write_options(setting: str) -> pa.ipc.IpcWriteOptions:
    """IPC write options for ``none``, ``lz4``, ``zstd`` or ``zstd:LEVEL`` (kept: one per
    setting, asked for once per batch)."""
    import pyarrow as pa

    name, _, level = setting.partition(":")
    if name == "none":
        return pa.ipc.IpcWriteOptions()
    codec = pa.Codec(name, int(level)) if level else pa.Codec(name)
    return pa.ipc.IpcWriteOptions(compression=codec)


def auto_setting(codec: str) -> str:
    """The setting ``auto`` encodes with when it chose ``codec``."""
    level = AUTO_LEVEL.get(codec)
    return codec if level is None else f"{codec}:{level}"


def request_headers(setting: Compression) -> list[tuple[bytes, bytes]]:
    """The channel headers a reader sends with a scan for ``setting``."""
    if setting.auto:
        return [(H_COMPRESSION, b"none"), (H_CODECS, ",".join(CODECS).encode())]
    return [(H_COMPRESSION, str(setting).encode())]


def negotiate(
    requested: bytes | None, offered: bytes | None, service: Compression
) -> tuple[Compression, tuple[str, ...]]:
    """What a scan's sender uses: the reader's fixed setting, honoured; or, when the reader
    offered codecs (its setting is ``auto``), the service's own setting (``--compression``)
    among them: ``auto`` (returned with the codecs it may choose from), ``none``, or a fixed
    codec if the reader offered it (else ``none``). A reader that sends neither header (an
    old client) gets ``none``."""
    if offered is not None:
        text = offered.decode("ascii", "replace")
        codecs = tuple(c for c in CODECS if c in {x.strip().lower() for x in text.split(",")})
        if service.auto:
            return (AUTO, codecs) if codecs else (NONE, ())
        if service.codec in codecs:
            return service, ()
        return NONE, ()
    text = (requested or b"none").decode("ascii", "replace")
    try:
        fixed = Compression.parse(text, "the channel's compression")
    except ValueError as exc:
        raise InvalidRequest(f"unknown compression {text!r}: {exc}; send one of those") from exc
    if fixed.auto:
        raise InvalidRequest(
            "compression 'auto' is asked for with the codecs the reader decodes (header "
            "aqds-codecs), not in the compression header; send none there"
        )
    return fixed, ()


def accepted_codecs(answer: Iterable[str] | None) -> tuple[str, ...]:
    """The codecs a service's ``begin`` answer says it accepts in writes (``codecs``); a
    service that does not say (older) decodes what any Arrow IPC message declares."""
    if answer is None:
        return CODECS
    wanted = {str(c).lower() for c in answer}
    return tuple(c for c in CODECS if c in wanted)


# -- auto --------------------------------------------------------------------------------


@dataclass
class _Rates:
    """Decaying sums of what one codec did: Arrow bytes in, bytes out, encoding seconds."""

    arrow: float = 0.0
    wire: float = 0.0
    seconds: float = 0.0
    at: float = 0.0

    def add(self, arrow: int, wire: int, seconds: float, now: float, keep: float) -> None:
        self.arrow = self.arrow * keep + arrow
        self.wire = self.wire * keep + wire
        self.seconds = self.seconds * keep + seconds
        self.at = now

    @property
    def ratio(self) -> float:
        return self.wire / self.arrow if self.arrow else 1.0

    @property
    def speed(self) -> float:
        """Arrow bytes encoded per second of the sender's thread (pyarrow spreads one
        batch's buffers over its own threads: wall time, so that counts)."""
        return self.arrow / self.seconds if self.seconds > 0 else float("inf")


@dataclass(frozen=True, slots=True)
class Estimate:
    """What ``auto`` knows when it decides: the link's rate while it was the limit, for
    each codec its ratio (wire bytes per Arrow byte) and the rate it encodes at, and the
    Arrow bytes per second each codec really delivered on this path lately (``delivered``:
    the reader's CPU, the machine's other work and everything a model leaves out)."""

    link: float
    ratios: dict[str, float]
    sender: dict[str, float]
    delivered: dict[str, float] = field(default_factory=dict)

    def rate(self, codec: str) -> float:
        """Arrow bytes per second the path would carry with ``codec``: what it delivered
        lately if it was measured; else the link's rate over the codec's ratio, or the
        codec's own rate if that is lower (its encoding runs beside the network). The rest
        of the sender's work and the reader's are left out: sending fewer bytes frees CPU
        at both ends that the codec then uses, which no per-batch timing shows, so a codec
        is tried on this promise and kept only if it delivers."""
        if codec in self.delivered:
            return self.delivered[codec]
        if codec == "none":
            return min(self.link, self.sender.get("none", float("inf")))
        return min(self.link / max(self.ratios[codec], 1e-6), self.sender[codec])


def choose(
    current: str,
    reading: PathReading,
    arrow_rate: float,
    estimate: Estimate,
    margin: float,
    own: bool = True,
) -> str:
    """The codec for the next interval, from one interval's reading (a pure function), by
    the Arrow bytes per second each is expected to deliver (:meth:`Estimate.rate`; the
    current codec at ``arrow_rate``, what it moved lately, when the network was not the
    limit). Among the codecs, starting from the lightest, a heavier one (more CPU per
    byte, at both ends: :data:`LIGHTEST_FIRST`) is taken only if it beats every lighter
    one by more than ``margin``: it must win by the margin to be chosen and to be kept
    (zstd that delivers about what lz4 does goes back to lz4), as the CPU it takes from
    the rest of the machine is not in its figure. Between none and the codec so taken,
    the one in use stays unless the other beats it by more than ``margin``.

    The network the limit with the current codec's own batches (``own``: nearly all the
    interval delivered was sent with it, not a probe's or the last codec's): the next
    heavier codec is considered, one step at a time (a lighter codec is tried before a
    heavier one: one probe batch tells its ratio well, its speed less so). Not the limit
    (our CPU, the reader's, or the application was): no heavier codec than the current
    one is, as it would only add work where the work is the limit; uncompressed, it stays
    so.
    """
    offered = [c for c in LIGHTEST_FIRST if c == "none" or c in estimate.ratios]
    if current in offered:  # lighter ones, as it is, and the next heavier one if the link asks
        offered = offered[: offered.index(current) + (2 if reading.link_limited and own else 1)]
    rates = {c: estimate.rate(c) for c in offered}
    if not reading.link_limited and current in rates:
        rates[current] = arrow_rate  # the CPU is the limit: what the codec does now
    codecs = offered[1:]
    if not codecs:
        return "none"
    best, bar = codecs[0], rates[codecs[0]]
    for codec in codecs[1:]:
        if rates[codec] > bar * (1 + margin):
            best = codec
        bar = max(bar, rates[codec])
    if current == "none":
        return best if rates[best] > rates["none"] * (1 + margin) else "none"
    return "none" if rates["none"] > rates[best] * (1 + margin) else best


QUEUED = 512
"""Batches ``auto`` follows from being sent to being delivered, at most."""
MEASURED = 3
"""Intervals of a codec's own (:data:`CLEAN`) that make its measurement count."""
RECENT = 1 / 3
"""Weight of an interval's delivered rate in a codec's measurement (the rest: the ones
before): a few slow intervals (a file opening, a busy moment) do not decide alone."""
CLEAN = 0.9
"""The least share of an interval's delivered Arrow bytes one codec must have carried for
the interval to count as that codec's measurement."""


@dataclass
class AutoCompression:
    """``auto`` for one connection's data channels in one direction: asked for a codec per
    batch (:meth:`codec`), told what each batch cost (:meth:`sent`) and what the transport
    measured (:meth:`path`, when :meth:`due`), it decides once per ``interval``:

    - uncompressed, as long as the network is not the limit (an interval where data waited
      to go out nearly all the time, not held back by the reader's window); until it has
      been, a batch costs an append to a queue and the transport is sampled once per
      interval;
    - once it is, one batch is compressed with each offered codec it has not measured (or
      not for ``revisit`` seconds): its ratio and speed on this data;
    - then the codec expected to deliver the most Arrow bytes per second: what it delivered
      on this path (the current codec: lately; another: in the last ``retry`` seconds), or
      for a codec not measured so the link's rate over its ratio, capped by how fast the
      codec encodes and by what a lighter codec delivered with the CPU the limit (a
      promise: a codec is tried on it, and kept only if it delivers). A heavier codec
      (more CPU per byte: zstd over lz4) must beat each lighter one by more than
      ``margin`` to be chosen, and to be kept; between none and a codec, the one in use
      stays unless the other wins by ``margin`` (:func:`choose`). A heavier codec is
      considered one step at a time, and only while the network is the limit with the
      current one's own batches. A switch between codecs, or back to none, must be agreed
      by ``settle`` intervals in a row (leaving none for a codec the link asks for is at
      once). A codec tried on a promise that does not deliver the margin goes back, and
      is not tried again until its measurement is ``retry`` seconds old (a measurement
      from a busy moment of the machine does not rule a codec out for long).

    Sans-IO: the caller passes the clock and the transport's samples.
    """

    codecs: Sequence[str] = CODECS
    interval: float = 0.1
    margin: float = 0.15
    settle: int = 2
    revisit: float = 30.0
    retry: float = 10.0
    """Seconds a codec's delivered rate counts once it is no longer in use."""
    keep: float = 0.8
    """Weight of what was measured before, per message (recent batches count most)."""
    current: str = "none"
    link: float | None = None
    """The link's rate (wire bytes/s) the last time it was the limit."""
    link_at: float = 0.0
    switches: int = 0
    _rates: dict[str, _Rates] = field(default_factory=dict)
    _delivered: dict[str, tuple[float, float, int, float]] = field(default_factory=dict)
    """Per codec: Arrow bytes/s it delivered over whole intervals (decaying), when, over
    how many intervals in a row, and the share of them the network was the limit in
    (decaying the same way)."""
    _probe: list[str] = field(default_factory=list)
    _last: PathSample | None = None
    _due: float = float("-inf")
    _resumed: bool = False
    """Whether the last interval delivered data of ours too (the stream was flowing)."""
    _now: float = 0.0
    _queue: deque[list[Any]] = field(default_factory=deque)
    """Batches sent and not yet delivered, oldest first: [codec, wire bytes left, Arrow
    bytes per wire byte]. What the path delivers in an interval is taken from its head, so
    the Arrow bytes delivered are counted per codec as they reach the reader (a batch is
    queued well before it is on the wire: the channel's window, the socket's buffer)."""
    _votes: int = 0
    _wanted: str = "none"

    def codec(self) -> str:
        """The codec for the next batch: ``none``, ``lz4`` or ``zstd``."""
        return self._probe[0] if self._probe else self.current

    def setting(self) -> str:
        """The next batch's codec as a setting (``zstd:1``): :func:`write_options` of it."""
        return auto_setting(self.codec())

    def sent(
        self, codec: str, arrow: int, wire: int, encode: float, work: float, now: float
    ) -> None:
        """One batch went out with ``codec``: ``arrow`` bytes of Arrow data as ``wire`` bytes,
        ``encode`` seconds of encoding (wall time: pyarrow spreads a batch's buffers over its
        threads), ``work`` seconds of the sender's thread for it in all (not used since what
        each codec delivers is measured; kept for callers)."""
        self._queue.append([codec, wire, arrow / wire if wire else 0.0])
        if len(self._queue) > QUEUED:
            self._queue.popleft()
        if self.link is None and not self._probe:
            return  # the network was never the limit: nothing below would be used
        self._rates.setdefault(codec, _Rates()).add(arrow, wire, encode, now, self.keep)
        if self._probe and self._probe[0] == codec:
            self._probe.pop(0)

    def forget_batches(self) -> None:
        """Drop the batches followed to delivery (the connection ended; what was measured
        stays, for :meth:`seeded`)."""
        self._queue.clear()

    def due(self, now: float) -> bool:
        """Whether to sample the transport now (:meth:`path`): once per ``interval``, so a
        batch costs no system call in between."""
        return now >= self._due

    def path(self, sample: PathSample | None, now: float) -> bool:
        """A sample of the transport's counters; True if the codec changed (decisions are
        taken once per ``interval`` of samples)."""
        if sample is None:
            self._queue.clear()  # a transport that measures nothing: nothing to follow
            return False
        from aqueduct_core.api.path import PathReading

        last = self._last
        if last is None or sample.at - last.at < self.interval:
            if last is None:
                self._last = sample
                self._due = now + self.interval
            return False
        self._last, self._now = sample, now
        self._due = now + self.interval
        reading = PathReading.between(last, sample)
        if reading is None:
            return False
        arrow = self._drain(reading.delivered)
        total = sum(arrow.values())
        resumed, self._resumed = self._resumed, bool(total)
        if not total:
            return False  # nothing of ours was delivered: the interval tells nothing
        arrow_rate = total / reading.seconds
        main = max(arrow, key=lambda c: arrow[c])
        # the current codec's (not a probe's: one batch says nothing of a steady stream),
        # and not the first of a stream (a scan starting: its files opening)
        clean = resumed and main == self.current and arrow[main] >= CLEAN * total
        if reading.link_limited:
            self.link, self.link_at = reading.link_rate, now
            if self._probe_due(now):
                return False
        if self.link is None:
            return False  # never limited by the network: nothing to gain
        if clean:
            self._measured(main, arrow_rate, now, reading.link_limited)
        if self.current != "none" and now - self.link_at > self.revisit:
            wanted = "none"  # compressing for long with the CPU the limit: is the link still slow?
        else:
            # the current codec at what it delivered lately (this interval's measurement
            # included, averaged: one interval of a busy host does not decide alone)
            estimate = self._estimate(now)
            own = main == self.current and arrow[main] >= CLEAN * total
            wanted = choose(
                self.current, reading, estimate.rate(self.current), estimate, self.margin, own
            )
        return self._vote(wanted)

    def explain(self) -> str:
        """What the last decision saw: each codec's expected Arrow MB/s (measured: ``=``)."""
        e = self._estimate(self._now)
        parts = [
            f"{c} {'=' if c in e.delivered else '~'}{e.rate(c) / 1e6:.0f}"
            for c in ("none", *e.ratios)
        ]
        return "expected MB/s of Arrow: " + ", ".join(parts)

    def _drain(self, delivered: int) -> dict[str, float]:
        """Arrow bytes per codec of the ``delivered`` wire bytes, oldest batches first."""
        got: dict[str, float] = {}
        queue = self._queue
        while delivered > 0 and queue:
            head = queue[0]
            take = min(head[1], delivered)
            got[head[0]] = got.get(head[0], 0.0) + take * head[2]
            head[1] -= take
            delivered -= take
            if head[1] <= 0:
                queue.popleft()
        return got

    def _measured(self, codec: str, rate: float, now: float, limited: bool) -> None:
        old = self._delivered.get(codec)
        if old is None or now - old[1] > self.retry:
            self._delivered[codec] = (rate, now, 1, float(limited))
        else:
            self._delivered[codec] = (
                old[0] + (rate - old[0]) * RECENT,
                now,
                old[2] + 1,
                old[3] + (limited - old[3]) * RECENT,
            )

    def _probe_due(self, now: float) -> bool:
        """Queue one compressed batch of each codec not measured lately."""
        stale = [
            c for c in self.codecs if c not in self._rates or now - self._rates[c].at > self.revisit
        ]
        self._probe = [c for c in stale if c not in self._probe] + self._probe
        return bool(self._probe)

    def _estimate(self, now: float) -> Estimate:
        measured = {c: r for c, r in self._rates.items() if c in (*self.codecs, "none")}
        sender = {c: r.speed for c, r in measured.items()}
        ratios = {c: r.ratio for c, r in measured.items() if c != "none"}
        delivered = {
            c: rate
            for c, (rate, at, intervals, _) in self._delivered.items()
            if now - at <= (self.revisit if c == self.current else self.retry)
            and intervals >= MEASURED
            and (c == "none" or c in ratios)
        }
        # A codec that delivered this much with the CPU, not the network, the limit: a
        # heavier one (more CPU per byte at both ends) is not promised more than that.
        cap = float("inf")
        for codec in CODECS:
            if codec in sender:
                sender[codec] = min(sender[codec], cap)
            if codec in delivered and self._delivered[codec][3] < 0.5:
                cap = min(cap, delivered[codec])
        return Estimate(self.link or 0.0, ratios, sender, delivered)

    def _vote(self, wanted: str) -> bool:
        if wanted == self.current:
            self._votes = 0
            return False
        self._votes = self._votes + 1 if wanted == self._wanted else 1
        self._wanted = wanted
        if self._votes < self.settle and self.current != "none":
            return False
        self.current, self._votes = wanted, 0
        self.switches += 1
        return True

    def seeded(self, codecs: Sequence[str], now: float) -> AutoCompression:
        """A policy for a new connection over the same path (the same peer host): what this
        one measured, if the network was the limit within ``revisit`` seconds; its first
        batches go out as this one's last did, and are checked from the first interval on
        against the lighter codecs, as :func:`choose` does (a choice carried over is kept
        only while it beats them by the margin)."""
        new = AutoCompression(codecs)
        stale = self.link is None or now - self.link_at > self.revisit
        if stale or tuple(codecs) != tuple(self.codecs):
            return new
        new.current = self.current if self.current in (*codecs, "none") else "none"
        new.link, new.link_at = self.link, self.link_at
        new._rates = {c: replace(r) for c, r in self._rates.items()}
        new._delivered = dict(self._delivered)
        return new
