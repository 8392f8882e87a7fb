"""Where a read task sends its scan when its URL names several endpoints: where the driver
planned it, unless that endpoint has over a task's bytes more under way than the least
loaded one, counting every read task of this executor host, not only this Python worker.

Spark runs each task in a Python worker process that knows only its own work, and a worker
starting a task has nothing under way: left alone, it takes the endpoint the driver planned
(:func:`~aqueduct_spark.client.spread.plan_orders`). The plan is right while every task
starts together; after that, Spark hands the next task, whatever its planned home, to
whichever slot freed first, so a host whose tasks ended may get none until later while
another runs three (measured with ``bench_scale --timeline``: one host's link idle 2.5 s
of a 15 s read while another's carried three tasks). Here each worker publishes the bytes
its tasks have under way at each endpoint in a small file of its own (one directory per
URL, under the machine's temporary directory: the tasks of every Spark application on this
host that read through these endpoints share their links too), and a task starting reads
them all (:meth:`HostLoad.choose`): it keeps to its plan while its planned endpoint is
within one task of the least loaded (the plan puts several tasks on each host at once, and
tasks taken up together in any order would otherwise see each other as load and move off
their homes one after the other: a first wave went 2/1/3 instead of 2/2/2), else takes the
least loaded, and orders the others the same way for the client's failover (a lost host's
tasks go to the survivors with the least under way).

An endpoint the client of one worker is avoiding (it failed there: a host killed mid-read
or mid-write) is published too, for :data:`AVOID_SHARED` seconds, renewed while that worker still avoids
it: a read task starting in another worker puts it last, instead of finding it the least
loaded (its tasks are gone) and paying a failed attempt of its own (up to 3 s over QUIC),
and a write task's client avoids it (:func:`shared_avoidance`).

The files are advisory: a worker that died leaves a file that readers ignore (and remove)
once its process is gone; a directory that cannot be written leaves the planned order.
Within one process the client's spread (:mod:`aqueduct_spark.client.spread`) still
decides, and avoids an endpoint that failed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from aqueduct_spark.client.spread import spread_for
from aqueduct_spark.client.urls import Endpoint

AVOID_SHARED = 5.0
"""Seconds the other workers of a host avoid an endpoint one of them is avoiding (renewed
while it still does; its own pause grows from 1 s to 30 s, :mod:`~aqueduct_spark.client.spread`)."""


def _directory() -> Path:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"aqueduct-reads-{uid}"


class HostLoad:
    """The bytes the read tasks of this host have under way per endpoint of one URL (``key``,
    with ``endpoints`` of them); this process's share is published as file ``pid``."""

    def __init__(
        self,
        key: str,
        endpoints: int,
        directory: Path | None = None,
        pid: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        self.dir = (directory or _directory()) / digest
        self.endpoints = endpoints
        self.pid = os.getpid() if pid is None else pid
        self.clock = clock
        self.mine = [0] * endpoints
        self.avoid = [0.0] * endpoints
        """Until when (wall clock: other processes compare it) this process asks the others
        to avoid each endpoint."""

    def loads(self) -> list[int]:
        """Bytes under way at each endpoint: this process's and every live process's file."""
        return self._read()[0]

    def _read(self) -> tuple[list[int], list[float]]:
        """Every live process's loads and avoidances, this one's included."""
        loads, avoid = list(self.mine), list(self.avoid)
        if not _private(self.dir.parent):
            return loads, avoid
        try:
            entries = list(self.dir.iterdir())
        except OSError:
            return loads, avoid
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) == self.pid:
                continue
            if not _alive(int(entry.name)):
                with contextlib.suppress(OSError):
                    entry.unlink()
                continue
            try:
                theirs = json.loads(entry.read_text())
                their_loads, their_avoid = theirs["loads"], theirs["avoid"]
            except (OSError, ValueError, TypeError, KeyError):
                continue  # being replaced, or not ours: advisory only
            if len(their_loads) != self.endpoints or len(their_avoid) != self.endpoints:
                continue
            for i in range(self.endpoints):
                if isinstance(their_loads[i], int) and their_loads[i] > 0:
                    loads[i] += their_loads[i]
                if isinstance(their_avoid[i], (int, float)):
                    avoid[i] = max(avoid[i], float(their_avoid[i]))
        return loads, avoid

    def avoided_for(self) -> list[float]:
        """Seconds each endpoint is still to be avoided, as this host's workers ask (0: not)."""
        now = self.clock()
        return [max(0.0, until - now) for until in self._read()[1]]

    def note_avoided(self, avoided: Sequence[bool]) -> None:
        """This process's client avoids these endpoints now: ask the others to, for
        :data:`AVOID_SHARED` s (published again only once half of that has passed)."""
        now = self.clock()
        renew = [
            i for i, yes in enumerate(avoided) if yes and self.avoid[i] - now < AVOID_SHARED / 2
        ]
        for i in renew:
            self.avoid[i] = now + AVOID_SHARED
        if renew:
            self._publish()

    def choose(self, planned: Sequence[int], size: int = 0) -> tuple[int, ...]:
        """Every endpoint in the order to try them: the ``planned`` order (the driver's
        :func:`~aqueduct_spark.client.spread.plan_orders` for this task), except that an
        endpoint with more than one task (of this ``size``) under way beyond the least
        loaded goes after those that have not, the busier the later, and one another worker
        is avoiding goes last. Within one task of the least the plan holds: it puts several
        tasks on each host at once, and tasks starting together, in whatever order their
        workers take them, would otherwise each see the plan's other tasks as load and move
        off their planned host one after the other."""
        loads, avoid = self._read()
        now = self.clock()
        size = max(1, size)
        unit = max(1, size // 2)
        rank = {i: r for r, i in reversed(list(enumerate(planned)))}
        least = min(loads)
        return tuple(
            sorted(
                range(self.endpoints),
                key=lambda i: (
                    avoid[i] > now,  # another worker's client is avoiding it: last
                    max(0, loads[i] - least - size) // unit,
                    rank.get(i, len(rank)),
                    i,
                ),
            )
        )

    @contextlib.contextmanager
    def claim(self, size: int, planned: Sequence[int]) -> Iterator[tuple[int, ...]]:
        """The order to scan in (:meth:`choose`), with ``size`` bytes counted at its first
        endpoint for this host's other tasks until the block ends."""
        order = self.choose(planned, size)
        self._add(order[0], size)
        try:
            yield order
        finally:
            self._add(order[0], -size)

    def _add(self, index: int, size: int) -> None:
        self.mine[index] = max(0, self.mine[index] + size)
        self._publish()

    def _publish(self) -> None:
        path = self.dir / str(self.pid)
        try:
            if not any(self.mine) and max(self.avoid) <= self.clock():
                path.unlink(missing_ok=True)
                return
            if not _private(self.dir.parent):
                return  # another user's, or writable by others: not to be trusted
            self.dir.mkdir(mode=0o700, exist_ok=True)
            staged = self.dir / f".{self.pid}.tmp"
            staged.write_text(json.dumps({"loads": self.mine, "avoid": self.avoid}))
            os.replace(staged, path)
        except OSError:
            pass  # advisory: this host's other tasks keep to their plan


def _private(path: Path) -> bool:
    """Whether ``path`` is a directory of this user that no other user may write, made so if
    it is missing: the files steer this host's reads, so a directory another local user
    created first (the name is predictable) or may write to is not used."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    return stat.S_ISDIR(st.st_mode) and mine and not st.st_mode & 0o022


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_loads: dict[tuple[str, int], HostLoad] = {}


@contextlib.contextmanager
def shared_avoidance(endpoints: Sequence[Endpoint], load: HostLoad | None = None) -> Iterator[None]:
    """A write task's part in this host's avoidances (reads take theirs in
    :meth:`HostLoad.claim`): an endpoint another worker avoids is avoided by this process's
    client too, for what is left of that, instead of a fresh worker paying a failed attempt
    at a host already lost (a stream's micro-batch after a kill: 0.2-1.8 s a task); one this
    task's client came to avoid is published for the others."""
    if len(endpoints) < 2:
        yield
        return
    load = load or host_load(" ".join(map(str, endpoints)), len(endpoints))
    spread = spread_for(endpoints)
    for index, left in enumerate(load.avoided_for()):
        if left > 0:
            spread.avoid(index, left)
    try:
        yield
    finally:
        load.note_avoided(spread.avoided())


def host_load(key: str, endpoints: int) -> HostLoad:
    """This process's :class:`HostLoad` of a URL (a forked child makes its own)."""
    found = _loads.get((key, endpoints))
    if found is None or found.pid != os.getpid():
        found = _loads[(key, endpoints)] = HostLoad(key, endpoints)
    return found
