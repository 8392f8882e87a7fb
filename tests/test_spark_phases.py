"""benchmarks.spark_phases times a write task's parts: before Spark's first batch
(``write.first``) and after its last (``write.tail``: what the sink does once the data
ended), which is where a small write's fixed cost shows (issue 28)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.spark_phases import _PhasedWriter, summary


class SlowSink:
    """A writer that takes 50 ms after the last batch, as a service staging it would."""

    def write(self, batches: Iterator[Any]) -> str:
        seen = list(batches)
        time.sleep(0.05)
        return f"{len(seen)} batches"


def test_a_write_is_timed_before_its_first_batch_and_after_its_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "phases.log"
    monkeypatch.setenv("AQUEDUCT_PHASES", str(log))

    def spark() -> Iterator[int]:
        time.sleep(0.02)
        yield from (1, 2, 3)

    assert _PhasedWriter(SlowSink(), "fl").write(spark()) == "3 batches"
    got = summary(log)
    assert got["fl.write"][0] == 1 and got["fl.write"][1] >= 0.07
    assert 0.05 <= got["fl.write.tail"][1] < got["fl.write"][1]
    assert 0.02 <= got["fl.write.first"][1] < 0.05


def test_a_write_query_splits_into_spark_s_parts_and_the_source_s() -> None:
    """The timeline of one write (seconds from 100): planning until the set-up, the set-up,
    two tasks, the commit; another source's events in the same window do not count."""
    from benchmarks.spark_phases import WRITE_STEPS, write_path

    events = [
        {"kind": "writer", "source": "aq", "start": 100.05, "end": 100.06},
        {"kind": "write", "source": "aq", "start": 100.10, "first": 100.11, "last": 100.15,
         "end": 100.18},
        {"kind": "write", "source": "aq", "start": 100.12, "first": 100.12, "last": 100.20,
         "end": 100.22},
        {"kind": "write", "source": "fl", "start": 100.13, "end": 100.50},
        {"kind": "commit", "source": "aq", "start": 100.25, "end": 100.28},
    ]  # fmt: skip
    got = write_path(events, "aq", {"start": 100.0, "end": 100.30})
    assert list(got) == list(WRITE_STEPS)
    want = {
        "query": 0.30, "to_writer": 0.05, "writer": 0.01, "to_tasks": 0.04, "tasks": 0.12,
        "task_first": 0.005, "task_tail": 0.025, "to_commit": 0.03, "commit": 0.03,
        "after_commit": 0.02,
    }  # fmt: skip
    assert got == pytest.approx(want)
    assert write_path(events[:3], "aq", {"start": 100.0, "end": 100.30}) == {}  # no commit
