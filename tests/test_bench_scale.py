"""The measuring parts of ``benchmarks/bench_scale.py`` (issue 30), cheap enough for the fast
suite: each namespace's CPU counter (a cgroup, which keeps the seconds of processes that
exited, orphans included), a read's timeline (which host each task ran on, each host's idle
time, the tail) and the fit of a read's part that does not shrink with hosts."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks.bench_scale import fixed_part
from benchmarks.cpu_groups import CpuGroups
from benchmarks.spark_phases import render, timeline

ORPHAN = """
import os, sys, time
sys.stdin.readline()
if os.fork() == 0:  # the grandchild outlives its parent: init reaps it, not us
    start = time.process_time()
    while time.process_time() - start < 0.2:
        pass
    os._exit(0)
os._exit(0)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are made by root (CI runs as root)")
def test_a_namespaces_cpu_keeps_the_seconds_of_processes_that_exited() -> None:
    """Summing live processes' times loses an orphan's seconds once it exits (the Spark host
    read -2.43 cores): the group's counter keeps them, so it never goes backwards."""
    groups = CpuGroups(["spark"])
    if not groups.available:
        pytest.skip("no writable cgroup hierarchy here")
    try:
        child = subprocess.Popen([sys.executable, "-c", ORPHAN], stdin=subprocess.PIPE)
        groups.add("spark", child.pid)
        before = groups.seconds("spark")
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        child.stdin.close()
        child.wait(10)
        procs = "tasks" if groups.counter == "cpuacct.usage" else "cgroup.procs"
        deadline = time.monotonic() + 10
        while (groups.groups["spark"] / procs).read_text().strip():
            assert time.monotonic() < deadline, "the orphan did not end"
            time.sleep(0.02)
        after = groups.seconds("spark")
        assert after - before >= 0.19  # the orphan's 0.2 s, though nobody here reaped it
        # as the Spark host reads it, from its namespace (through our /proc/PID/root)
        assert CpuGroups.attach(groups.to_spec()).seconds("spark") >= after
    finally:
        groups.close()
    assert groups.parent is None and not any(g.exists() for g in groups.groups.values())


def _task(pid: int, part: int, start: float, end: float, hosts: list[int]) -> dict[str, object]:
    return {
        "kind": "task",
        "pid": pid,
        "age": 30.0,
        "partition": part,
        "attempt": 0,
        "start": start,
        "started_age": 20.0,
        "first": start + 0.5,
        "end": end,
        "rows": 10,
        "bytes": 4_000_000,
        "endpoints": hosts,
    }


def test_a_reads_timeline_shows_each_hosts_idle_time_and_the_tail() -> None:
    t0 = 1000.0
    events = [
        {"kind": "schema", "pid": 1, "age": 5.2, "start": t0 + 0.1, "end": t0 + 0.3},
        {
            "kind": "plan",
            "pid": 1,
            "age": 5.5,
            "start": t0 + 0.4,
            "end": t0 + 0.6,
            "homes": [0, 1, 0],
            "sizes": [4e6, 4e6, 4e6],
        },
        _task(11, 0, t0 + 1.0, t0 + 5.0, [0]),
        _task(12, 1, t0 + 1.0, t0 + 3.0, [1]),
        _task(13, 2, t0 + 1.2, t0 + 7.0, [0, 1]),  # cut on a, resumed on b
        {"kind": "connect", "pid": 11, "age": 1, "start": t0 + 1, "end": t0 + 1.1},
        # a's cable: idle for 2 s, then full (10 bytes/s) to 5 s, idle again
        *(
            {"kind": "link", "host": "a", "at": t0 + i / 2, "tx": 10 * min(max(i / 2 - 2, 0), 3)}
            for i in range(17)
        ),
        {"kind": "link", "host": "c", "at": t0, "tx": 0},  # a host of the URL given no task
        {"kind": "link", "host": "c", "at": t0 + 8, "tx": 0},
    ]
    shape = timeline(events, t0, t0 + 8.0, ["a", "b"], link_rate=10.0)
    assert shape["plan"]["start"] == 0.4 and shape["plan"]["process_age"] == 5.3
    assert [(t["partition"], t["host"], t["moved"]) for t in shape["tasks"]] == [
        (0, "a", False),
        (1, "b", False),
        (2, "b", True),
    ]
    a, b = shape["hosts"]["a"], shape["hosts"]["b"]
    assert (a["tasks"], a["busy"], a["idle"], a["last_end"]) == (1, 3.5, 4.5, 5.0)
    # b's two tasks overlap from 1.7 to 3.0: counted once
    assert (b["tasks"], b["busy"], b["last_end"]) == (2, 5.5, 7.0)
    assert (shape["first_task"], shape["tail"], shape["hosts_end_spread"]) == (1.0, 1.0, 2.0)
    assert (a["link_full"], a["link_from"], a["link_to"]) == (3.0, 2.0, 4.5)
    assert a["link"] == " " * 16 + "#" * 24 + " " * 24  # 64 columns of 1/8 s
    assert shape["hosts"]["c"]["link_full"] == 0 and "tasks" not in shape["hosts"]["c"]
    text = "\n".join(render(shape))
    assert "p 2     b*|" in text and "tail 1.00 s" in text


def test_the_part_of_a_read_that_does_not_shrink_with_hosts() -> None:
    fixed, work = fixed_part([30.17, 17.13, 11.87])  # the last quiet run: 2.54x
    assert round(fixed, 2) == 2.72 and round(work, 2) == 27.45
    assert fixed_part([30.0, 16.0, 11.0]) == (1.5, 28.5)


def test_the_report_prints_each_reads_shape(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.bench_scale import report

    def read(k: int, seconds: float) -> dict[str, object]:
        hosts = {f"svc{i + 1}": {"tx": 100 if i < k else 0, "rx": 1} for i in range(3)}
        shape = {
            "first_task": 0.3,
            "hosts_end_spread": 0.5,
            "tail": 0.2,
            "hosts": {
                **{f"svc{i + 1}": {"idle": 1.0, "link": "#"} for i in range(k)},
                **{f"svc{i + 1}": {"link": " "} for i in range(k, 3)},  # given no task
            },
        }
        cpu = {n: 1.0 for n in ("svc1", "svc2", "svc3", "store", "spark")}
        return {
            "endpoints": k,
            "seconds": seconds,
            "rows_per_s": 8e6 / seconds,
            "hosts": hosts,
            "cpu": cpu,
            "cpu_share": 0.2,
            "machine_busy": 0.3,
            "timeline": shape,
        }

    out = {
        "rate": "100mbit",
        "load_before": [1.0],
        "load_after": [1.0],
        "wall_seconds": 60,
        "dataset": {"rows": 8_000_000, "parquet_bytes": 145e6},
        "reads": [read(1, 30.0), read(2, 16.0), read(3, 11.0)],
    }
    report(out)
    text = capsys.readouterr().out
    assert "F 1.50 s that does not shrink with hosts" in text
    assert "1 host(s) timeline: first task at 0.30 s" in text and "idle (s): svc1 1.00\n" in text


def test_the_report_gives_the_cold_read_before_the_kill(capsys: pytest.CaptureFixture[str]) -> None:
    """The kill is measured warm; what the first read after Spark's idle minute took is
    still shown, beside the kill, so a cold start is neither hidden nor blamed on the kill."""
    from benchmarks.bench_scale import report

    hosts = {f"svc{i + 1}": {"tx": 100, "rx": 1} for i in range(3)}
    out = {
        "rate": "100mbit",
        "load_before": [1.0],
        "load_after": [1.0],
        "wall_seconds": 60,
        "kill_read": {
            "seconds": 13.0,
            "vs_undisturbed": 1.24,
            "exactly_once": True,
            "killed_mid_way": True,
            "hosts": hosts,
        },
        "read_before_kill": {"seconds": 19.5, "idle_before": 66.0},
    }
    report(out)
    text = capsys.readouterr().out
    assert "13.00 s = 1.24x undisturbed" in text
    assert "after 66 s without Spark work" in text and "took 19.50 s" in text
