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
