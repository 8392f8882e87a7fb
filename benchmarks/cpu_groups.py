"""CPU seconds of groups of processes that never go backwards: a cgroup per group.

Summing each live process's times (``/proc/PID/stat``, with ``cutime`` for the children it
reaped) loses a process that exits unreaped or whose parent exits first (its orphans go to
init, and their seconds with them): between two readings the sum can fall (issue 30's Spark
host read -2.43 cores once its Python workers exited). A cgroup's CPU counter keeps the
seconds of every process that ever ran in it, and a child starts in its parent's group.

cgroup v2 (``cpu.stat``'s ``usage_usec``) where it is mounted (``/sys/fs/cgroup``, or
``/sys/fs/cgroup/unified`` beside v1 controllers), else v1's ``cpuacct.usage``. Needs root,
as the benchmarks that use it do.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def _hierarchy(root: Path = CGROUP) -> tuple[Path, str] | None:
    """Where groups can be made, and the file of their CPU counter; None without one."""
    for base in (root, root / "unified"):
        if (base / "cgroup.controllers").exists():
            return base, "cpu.stat"  # v2: every group has cpu.stat, controllers or not
    v1 = root / "cpuacct"
    if (v1 / "cpuacct.usage").exists():
        return v1, "cpuacct.usage"
    return None


def read_usage(group: Path, counter: str) -> float:
    """CPU seconds used by every process that ever ran in ``group``."""
    text = (group / counter).read_text()
    if counter == "cpuacct.usage":
        return int(text) / 1e9
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    raise ValueError(f"no usage_usec in {group / counter}")


class CpuGroups:
    """A cgroup per name (under one parent made for this run, removed by :meth:`close`):
    :meth:`add` moves a process (and its live descendants) into one, :meth:`seconds` reads
    its counter. ``available`` is false where no hierarchy can be written (not root): the
    caller falls back to summing processes, and says so."""

    def __init__(self, names: list[str], root: Path = CGROUP) -> None:
        self.groups: dict[str, Path] = {}
        self.counter = ""
        self.parent: Path | None = None
        found = _hierarchy(root)
        if found is None:
            return
        base, self.counter = found
        parent = base / f"aqueduct-bench-{os.getpid()}-{secrets.token_hex(2)}"
        try:
            parent.mkdir()
            self.parent = parent
            for name in names:
                (parent / name).mkdir()
                self.groups[name] = parent / name
        except OSError:
            self.close()
            self.groups = {}

    @property
    def available(self) -> bool:
        return bool(self.groups)

    def to_spec(self) -> dict[str, object]:
        """What another process needs to add to and read these groups (:meth:`attach`). The
        paths go through this process's root (``/proc/PID/root``): ``ip netns exec`` gives
        its command a fresh ``/sys``, without the cgroup mounts."""
        via = f"/proc/{os.getpid()}/root"
        return {
            "counter": self.counter,
            "groups": {n: via + str(g) for n, g in self.groups.items()},
        }

    @classmethod
    def attach(cls, spec: dict[str, object]) -> CpuGroups:
        """The groups another process made (its :meth:`to_spec`); closing is its job."""
        found = cls.__new__(cls)
        found.counter = str(spec["counter"])
        groups = spec["groups"]
        assert isinstance(groups, dict)
        found.groups = {str(n): Path(g) for n, g in groups.items()}
        found.parent = None
        return found

    def add(self, name: str, pid: int) -> None:
        """Move ``pid`` and its live descendants into group ``name`` (a process forked later
        starts in its parent's group)."""
        procs = self.groups[name] / ("tasks" if self.counter == "cpuacct.usage" else "cgroup.procs")
        for each in [pid, *descendants(pid)]:
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                procs.write_text(str(each))

    def seconds(self, name: str) -> float:
        return read_usage(self.groups[name], self.counter)

    def close(self) -> None:
        """Move what is left back to the hierarchy's root and remove the groups."""
        if self.parent is None:
            return
        root = self.parent.parent
        procs = "tasks" if self.counter == "cpuacct.usage" else "cgroup.procs"
        for group in [*self.groups.values(), self.parent]:
            with contextlib.suppress(OSError):
                for pid in (group / procs).read_text().split():
                    with contextlib.suppress(OSError):
                        (root / procs).write_text(pid)
            with contextlib.suppress(OSError):
                group.rmdir()
        self.parent = None


def descendants(pid: int) -> list[int]:
    """The live descendants of process ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children.get(child, [])
    return found
