"""A read task's endpoint, chosen by the bytes every read task of this host has under way
(:mod:`aqueduct_spark.datasource.host_load`): Spark hands the next task to whichever slot
freed first, whatever host the driver planned it for, so a task placed by the plan alone can
leave one host idle while another carries three. Processes are stood in for by ``pid``s
(this one, its parent: both alive; a reaped child: gone). The Spark read through three
hosts is ``tests/spark/test_scale_out.py`` (slow) and ``benchmarks/bench_scale.py``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

from aqueduct_spark.datasource.host_load import AVOID_SHARED, HostLoad, host_load


def _gone() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_task_goes_where_this_hosts_other_tasks_have_least_under_way(tmp_path: Path) -> None:
    url = "tcp://a:1 tcp://b:1 tcp://c:1"
    ours = HostLoad(url, 3, tmp_path, pid=os.getpid())
    theirs = HostLoad(url, 3, tmp_path, pid=os.getppid())
    assert ours.choose((0, 1, 2), 100) == (0, 1, 2)  # nothing under way: the plan's order
    with theirs.claim(100, (0, 2, 1)) as first:
        assert first == (0, 2, 1)
        # one task more than the least at its planned host: the plan holds
        assert ours.choose((0, 2, 1), 100) == (0, 2, 1)
        # two more (the bench_scale case: a host carrying the tasks Spark handed out by
        # partition, another idle): the idle ones first, in the plan's order
        with theirs.claim(100, (0, 1, 2)), ours.claim(100, (0, 2, 1)) as second:
            assert second == (2, 1, 0)
            assert ours.loads() == [200, 0, 100]
        assert theirs.loads() == [100, 0, 0]  # ours ended: its file is gone
    assert not list(ours.dir.iterdir())  # every task ended: no file left


def test_tasks_starting_together_in_any_order_keep_the_plans_spread(tmp_path: Path) -> None:
    """Spark launches a wave's tasks in partition order, but their workers take them up in
    any order: each sees the plan's other tasks already under way as load. Were the least
    loaded host to win at once, they would move off their homes one after the other (a
    3-host read's first wave went 2/1/3 instead of 2/2/2)."""
    url = "tcp://a:1 tcp://b:1 tcp://c:1"
    homes = [(0, 1, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0), (0, 2, 1), (1, 0, 2)]
    alive = [subprocess.Popen(["sleep", "60"]) for _ in homes]  # a pid per worker
    try:
        for started in ([5, 3, 1, 0, 4, 2], [0, 1, 2, 3, 4, 5], [2, 4, 5, 1, 3, 0]):
            _wave(url, homes, started, [p.pid for p in alive], tmp_path / str(started))
    finally:
        for proc in alive:
            proc.kill()
            proc.wait()


def _wave(
    url: str, homes: list[tuple[int, ...]], started: list[int], pids: list[int], where: Path
) -> None:
    """The tasks of ``homes`` started in the order ``started``, each in its own worker:
    each keeps its planned host."""
    workers = [HostLoad(url, 3, where, pid=pid) for pid in pids]
    with contextlib.ExitStack() as running:
        chosen = [running.enter_context(workers[t].claim(100, homes[t]))[0] for t in started]
        assert [c for t, c in sorted(zip(started, chosen, strict=True))] == [h[0] for h in homes]


def test_a_dead_workers_tasks_and_a_broken_directory_are_ignored(tmp_path: Path) -> None:
    url = "tcp://a:1 tcp://b:1"
    dead = HostLoad(url, 2, tmp_path, pid=_gone())
    dead._add(0, 1 << 30)  # killed mid-task: its file stays behind
    ours = HostLoad(url, 2, tmp_path, pid=os.getpid())
    assert ours.choose((0, 1)) == (0, 1) and not (dead.dir / str(dead.pid)).exists()
    (ours.dir / str(os.getppid())).write_text("not json")  # half-written, or not ours
    assert ours.loads() == [0, 0]
    other = HostLoad("tcp://x:1 tcp://y:1", 2, tmp_path, pid=os.getppid())
    with other.claim(5, (0, 1)):
        assert ours.loads() == [0, 0]  # another URL's endpoints are not these
    blocked = tmp_path / "file"
    blocked.write_text("")
    nowhere = HostLoad(url, 2, blocked, pid=os.getpid())
    with nowhere.claim(5, (1, 0)) as order:  # cannot publish: the plan still holds
        assert order == (1, 0) and nowhere.loads() == [0, 5]
    assert host_load(url, 2) is host_load(url, 2) and host_load(url, 2).pid == os.getpid()


def test_hosts_within_a_task_of_each_other_are_even(tmp_path: Path) -> None:
    """Two tasks starting together each read the loads before the other claims: were a few
    bytes to decide, both would take the same host; within a task the plan does."""
    url = "tcp://a:1 tcp://b:1 tcp://c:1"
    busy = HostLoad(url, 3, tmp_path, pid=os.getppid())
    ours = HostLoad(url, 3, tmp_path, pid=os.getpid())
    with busy.claim(12_100_000, (0, 1, 2)), busy.claim(12_080_000, (2, 0, 1)):
        assert busy.loads() == [12_100_000, 0, 12_080_000]
        assert ours.choose((0, 2, 1), 12_000_000) == (0, 2, 1)
        assert ours.choose((2, 0, 1), 12_000_000) == (2, 0, 1)
        assert ours.choose((2, 0, 1), 100) == (1, 2, 0)  # a tiny task: bytes decide


def test_an_endpoint_one_worker_avoids_comes_last_for_the_others(tmp_path: Path) -> None:
    """A host killed mid-read has no task under way any more: by load alone every task
    starting in another worker would try it first and pay a failed attempt of its own."""
    now = [1000.0]
    url = "tcp://a:1 tcp://b:1 tcp://c:1"
    saw = HostLoad(url, 3, tmp_path, pid=os.getppid(), clock=lambda: now[0])
    ours = HostLoad(url, 3, tmp_path, pid=os.getpid(), clock=lambda: now[0])
    with saw.claim(100, (0, 1, 2)), saw.claim(100, (2, 0, 1)):
        saw.note_avoided([False, True, False])  # b failed under its client
        assert ours.choose((1, 0, 2), 100) == (0, 2, 1)  # idle b last, the plan for the rest
    now[0] += AVOID_SHARED - 1
    assert ours.choose((1, 0, 2), 100)[-1] == 1  # its tasks ended: the file stays for this
    saw.note_avoided([False, True, False])  # still avoided there: renewed
    now[0] += AVOID_SHARED - 1
    assert ours.choose((1, 0, 2), 100)[-1] == 1
    now[0] += AVOID_SHARED  # not renewed: tried again
    assert ours.choose((1, 0, 2), 100) == (1, 0, 2)


def test_a_directory_other_users_may_write_steers_nothing(tmp_path: Path) -> None:
    """The directory's name is predictable: a local user who made it first, or may write
    to it, could plant loads that send this host's reads elsewhere. Such a directory is
    neither read nor written; the plan holds."""
    url = "tcp://a:1 tcp://b:1"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    planted = HostLoad(url, 2, shared, pid=os.getppid())
    planted.dir.mkdir()
    (planted.dir / str(os.getppid())).write_text(
        json.dumps({"loads": [1 << 30, 0], "avoid": [0, 0]})
    )
    ours = HostLoad(url, 2, shared, pid=os.getpid())
    assert ours.choose((0, 1), 100) == (0, 1)  # the planted load is not read
    with ours.claim(100, (0, 1)):
        assert not (ours.dir / str(os.getpid())).exists()  # and nothing is published there
    shared.chmod(0o700)  # this user's alone: used
    assert ours.choose((0, 1), 100) == (1, 0)


def test_a_write_task_avoids_an_endpoint_another_worker_lost(tmp_path: Path) -> None:
    """A stream's next micro-batch runs its write tasks in workers that never saw the host
    die: each would try it first (its partition's endpoint) and pay a failed attempt. They
    take this host's avoidances instead, and publish one their own client comes to."""
    from aqueduct_spark.client.spread import spread_for
    from aqueduct_spark.client.urls import parse_endpoints
    from aqueduct_spark.datasource.host_load import shared_avoidance

    url = f"tcp://a{os.getpid()}.invalid:1,tcp://b.invalid:1,tcp://c.invalid:1"
    endpoints = parse_endpoints(url)
    key = " ".join(map(str, endpoints))
    saw = HostLoad(key, 3, tmp_path, pid=os.getppid())
    ours = HostLoad(key, 3, tmp_path, pid=os.getpid())
    spread = spread_for(endpoints)
    assert spread.pick(prefer=1) == 1  # by itself, this worker would go to b
    saw.note_avoided([False, True, False])  # b failed under another worker's client
    with shared_avoidance(endpoints, ours):
        assert spread.pick(prefer=1) != 1
        assert spread.avoided() == [False, True, False]
        spread.failed(2)  # then c fails under this one
    later = HostLoad(key, 3, tmp_path, pid=_gone())
    left = later.avoided_for()
    assert left[2] > AVOID_SHARED - 1 and left[0] == 0.0  # published for the others
