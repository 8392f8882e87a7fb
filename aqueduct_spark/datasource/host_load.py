"""Where a read task sends its scan when its URL names several endpoints: to the endpoint
with the fewest bytes under way from every read task of this executor host, not only from
this Python worker.

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
them all: it takes the least loaded endpoint, ties going to the planned order, and orders
the others the same way for the client's failover (a lost host's tasks go to the survivors
with the least under way).

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
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path


def _directory() -> Path:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"aqueduct-reads-{uid}"


class HostLoad:
    """The bytes the read tasks of this host have under way per endpoint of one URL (``key``,
    with ``endpoints`` of them); this process's share is published as file ``pid``."""

    def __init__(
        self, key: str, endpoints: int, directory: Path | None = None, pid: int | None = None
    ) -> None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        self.dir = (directory or _directory()) / digest
        self.endpoints = endpoints
        self.pid = os.getpid() if pid is None else pid
        self.mine = [0] * endpoints

    def loads(self) -> list[int]:
        """Bytes under way at each endpoint: this process's and every live process's file."""
        total = list(self.mine)
        try:
            entries = list(self.dir.iterdir())
        except OSError:
            return total
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) == self.pid:
                continue
            if not _alive(int(entry.name)):
                with contextlib.suppress(OSError):
                    entry.unlink()
                continue
            try:
                theirs = json.loads(entry.read_text())
            except (OSError, ValueError):
                continue  # being replaced, or not ours: advisory only
            if isinstance(theirs, list) and len(theirs) == self.endpoints:
                for i, n in enumerate(theirs):
                    if isinstance(n, int) and n > 0:
                        total[i] += n
        return total

    def choose(self, planned: Sequence[int], size: int = 0) -> tuple[int, ...]:
        """Every endpoint, least loaded first; ties in the ``planned`` order (the driver's
        :func:`~aqueduct_spark.client.spread.plan_orders` for this task). Loads that differ
        by less than half of this task's ``size`` are even: two hosts each running a task
        of a similar size are level, so tasks starting together (each before it sees the
        others' choice) keep to their different plans instead of all taking the host whose
        task is a few bytes smaller."""
        loads = self.loads()
        unit = max(1, size // 2)
        rank = {i: r for r, i in reversed(list(enumerate(planned)))}
        least = min(loads)
        return tuple(
            sorted(
                range(self.endpoints),
                key=lambda i: ((loads[i] - least) // unit, rank.get(i, len(rank)), i),
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
        path = self.dir / str(self.pid)
        try:
            if not any(self.mine):
                path.unlink(missing_ok=True)
                return
            self.dir.mkdir(parents=True, exist_ok=True)
            staged = self.dir / f".{self.pid}.tmp"
            staged.write_text(json.dumps(self.mine))
            os.replace(staged, path)
        except OSError:
            pass  # advisory: this host's other tasks keep to their plan


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_loads: dict[tuple[str, int], HostLoad] = {}


def host_load(key: str, endpoints: int) -> HostLoad:
    """This process's :class:`HostLoad` of a URL (a forked child makes its own)."""
    found = _loads.get((key, endpoints))
    if found is None or found.pid != os.getpid():
        found = _loads[(key, endpoints)] = HostLoad(key, endpoints)
    return found
