"""The notebooks run top to bottom (issue 9): a user opening them gets working cells."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(name: str) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # The kernel is this interpreter; Spark's workers must be too.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    return nb


def outputs(nb: nbformat.NotebookNode) -> str:
    return "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "stream"
    )


@pytest.mark.quic
def test_protocol_notebook() -> None:
    text = outputs(execute("protocol.ipynb"))
    assert "answer 42" in text and "stream [0, 1, 2, 3, 4]" in text
    assert "lost in transit" in text and "buffered while stalled" in text


# Slow (300 s, a timeout, at load 15; the suite's most expensive test: a kernel with a Spark
# application of its own). The fast suite covers each of its steps against the suite's Spark
# session: tests/spark/test_batch.py (write, overwrite and append, a filtered read,
# versionAsOf), tests/service (Client.read with columns and a filter, list, describe) and
# tests/spark/test_streaming.py::test_available_now_with_max_rows_reads_the_backlog_in_limited_batches.
@pytest.mark.slow
@pytest.mark.spark
def test_quickstart_notebook() -> None:
    text = outputs(execute("quickstart.ipynb"))
    assert "micro-batches" in text and "rows in trips_copy" in text
