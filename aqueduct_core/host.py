"""What this process may use of its host."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's or ``taskset``'s
    limit), else every core of the machine."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1
