"""Errors raised inside Spark tasks reach the user with our class and message first, not
after a Python traceback (issue 17, item 5). What the user gets is PySpark's exception; its
text is what these tests read, as a user would.

The errors are real: a row over ``maxBatchBytes`` (InvalidRequest) in a write task, and data
files deleted under a planned read (DataLoss) in a read task."""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from aqueduct_core.errors import ConnectionLost
from aqueduct_spark import protocol as P
from aqueduct_spark.datasource import aqueduct_error
from aqueduct_spark.datasource.options import OptionError
from aqueduct_spark.datasource.task_errors import (
    HIDE_TRACEBACK,
    SIMPLIFIED_TRACEBACK,
    SOURCE_RUNNER,
    deferred,
    surfaced,
)
from aqueduct_spark.testing import ServiceProcess

TWO_MIB = 2 * 1024 * 1024


def ours_first(text: str, error: str) -> str:
    """The line of ``text`` naming our ``error``, after checking that no traceback (a
    ``Traceback`` header or a ``File "..."`` frame) comes before it and that Spark's own
    words before it fit on one line."""
    marker = f"aqueduct_spark.protocol.errors.{error}: "
    assert marker in text, text
    before, _, after = text.partition(marker)
    assert "Traceback" not in before and 'File "' not in before, text
    assert before.count("\n") <= 1, text  # Spark's preamble, then our line
    return marker + after.splitlines()[0]


def parquet_files(service: ServiceProcess, dataset: str) -> list[Path]:
    return sorted(Path(service.root, dataset).rglob("*.parquet"))


@pytest.mark.spark
@pytest.mark.quic
def test_a_write_task_error_comes_first_once_and_leaves_nothing(
    spark: Any, service: ServiceProcess
) -> None:
    service.client().write("task_err_w", pa.table({"id": [0], "s": ["kept"]}))
    before = parquet_files(service, "task_err_w")
    # Two tasks: one with an ordinary row and one with a 2 MiB cell, over the 1 MiB limit.
    df = spark.createDataFrame([(1, "small"), (2, "big")], "id long, s string").repartition(2)
    df = df.selectExpr("id", f"if(s = 'big', repeat('x', {TWO_MIB}), s) as s")
    sc = spark.sparkContext
    sc.setJobGroup("task-error-write", "a write task meets an error no retry heals")
    try:
        with pytest.raises(Exception) as e:
            df.write.format("aqueduct").options(**service.options).option(
                "maxBatchBytes", "1MB"
            ).mode("append").save("task_err_w")
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    text = str(e.value)
    line = ours_first(text, "InvalidRequest")
    assert text.splitlines()[0].endswith(line)  # on the very first line, after Spark's words
    assert "2.0 MiB" in line and "maxBatchBytes" in line and "--max-batch-bytes" in line
    found = aqueduct_error(e.value)  # our class, for a program that must tell errors apart
    assert isinstance(found, P.InvalidRequest) and str(found) == line.split(": ", 1)[1]
    # Failed once: the task handed the error to the driver instead of failing (and being
    # tried again by Spark, local[2,2]).
    failed = [
        sc.statusTracker().getStageInfo(stage).numFailedTasks
        for job in sc.statusTracker().getJobIdsForGroup("task-error-write")
        for stage in sc.statusTracker().getJobInfo(job).stageIds
    ]
    assert failed and sum(failed) == 0, failed
    # Nothing committed, nothing staged left behind (the other task's file was aborted).
    assert sorted(service.client().read("task_err_w").column("s").to_pylist()) == ["kept"]
    assert parquet_files(service, "task_err_w") == before


@pytest.mark.spark
@pytest.mark.quic
def test_a_read_task_error_comes_first(spark: Any, service: ServiceProcess) -> None:
    service.client().write("task_err_r", pa.table({"n": list(range(10))}))
    for f in parquet_files(service, "task_err_r"):
        os.remove(f)  # deleted outside the service: the read task meets DataLoss
    with pytest.raises(Exception) as e:
        spark.read.format("aqueduct").options(**service.options).load("task_err_r").collect()
    line = ours_first(str(e.value), "DataLoss")
    assert "task_err_r" in line and "is missing" in line
    assert isinstance(aqueduct_error(e.value), P.DataLoss)


@pytest.mark.spark
@pytest.mark.quic
def test_a_stream_write_task_error_comes_first(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    service.client().write("task_err_s", pa.table({"id": [0], "s": ["kept"]}))
    before = parquet_files(service, "task_err_s")
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 5)
        .load()
        .selectExpr("value as id", f"repeat('x', {TWO_MIB}) as s")
        .writeStream.format("aqueduct")
        .options(**service.options)
        .option("maxBatchBytes", "1MB")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start("task_err_s")
    )
    try:
        with pytest.raises(Exception) as e:
            query.awaitTermination(120)
    finally:
        query.stop()
    text = str(e.value)
    line = ours_first(text, "InvalidRequest")
    assert text.splitlines()[0].endswith(line)
    assert "maxBatchBytes" in line
    assert isinstance(aqueduct_error(e.value), P.InvalidRequest)
    assert service.client().read("task_err_s").column("s").to_pylist() == ["kept"]
    assert parquet_files(service, "task_err_s") == before  # the batch's staged files went


def test_only_errors_no_retry_heals_wait_for_the_commit() -> None:
    """A write task keeps raising what another attempt may heal (Spark retries it)."""
    for exc in (
        P.InvalidRequest("row too large"),
        P.Conflict("overwritten meanwhile"),
        P.PermissionDenied("read-only token"),
        P.SchemaMismatch("column s is int"),
        OptionError("bad option"),
    ):
        assert deferred(exc), exc
    for exc in (
        ConnectionLost("service restarted"),
        P.InternalError("the service failed"),
        P.Unavailable("shutting down"),
        P.Unavailable("busy", {"retry_after": 0.5}),
        KeyError("a bug of ours"),
    ):
        assert not deferred(exc), exc


def test_tracebacks_are_hidden_only_for_our_errors_in_a_spark_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @surfaced
    def hook(exc: BaseException) -> None:
        raise exc

    @surfaced
    def rows(exc: BaseException) -> Any:
        yield 1
        raise exc

    monkeypatch.delenv(HIDE_TRACEBACK, raising=False)
    monkeypatch.delenv(SIMPLIFIED_TRACEBACK, raising=False)
    with pytest.raises(P.Conflict):
        hook(P.Conflict("not in a worker"))
    assert HIDE_TRACEBACK not in os.environ  # the user's own process is left alone
    monkeypatch.setenv(SIMPLIFIED_TRACEBACK, "1")  # as Spark sets it in its workers
    with pytest.raises(KeyError):
        hook(KeyError("a bug: its traceback matters"))
    assert HIDE_TRACEBACK not in os.environ
    with pytest.raises(P.DataLoss):
        list(rows(P.DataLoss("gone")))
    assert os.environ[HIDE_TRACEBACK] == "1"
    # A streaming source's runner: Spark never sets SIMPLIFIED_TRACEBACK there.
    monkeypatch.delenv(HIDE_TRACEBACK)
    monkeypatch.delenv(SIMPLIFIED_TRACEBACK)
    runner = types.ModuleType("__main__")
    runner.__spec__ = importlib.machinery.ModuleSpec(SOURCE_RUNNER, None)  # python -m runner
    monkeypatch.setitem(sys.modules, "__main__", runner)
    with pytest.raises(P.Conflict):
        hook(P.Conflict("in the runner"))
    assert os.environ[HIDE_TRACEBACK] == "1"


SPARK_TEXTS = [
    (
        "[PYTHON_DATA_SOURCE_ERROR] Failed to commit or abort Python data source write: "
        "aqueduct_spark.protocol.errors.Conflict: version 7 was written meanwhile; retry\n"
        " SQLSTATE: 38000",
        P.Conflict,
        "version 7 was written meanwhile; retry",
    ),
    (
        "An exception was thrown from the Python worker:\n"
        "aqueduct_spark.protocol.errors.DataLoss: file f.parquet is missing\n",
        P.DataLoss,
        "file f.parquet is missing",
    ),
    (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source"
        " perform commit: aqueduct_spark.protocol.errors.SchemaMismatch: column s: string\n"
        "column n: missing\n SQLSTATE: 38000 SQLSTATE: XXKST\n=== Streaming Query ===\n...",
        P.SchemaMismatch,
        "column s: string\ncolumn n: missing",
    ),
    (
        "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: "
        "aqueduct_spark.datasource.option_values.OptionError: option 'cafile' must be absolute",
        OptionError,
        "option 'cafile' must be absolute",
    ),
]


@pytest.mark.parametrize(("text", "cls", "message"), SPARK_TEXTS)
def test_our_error_is_found_in_sparks_and_rebuilt_as_its_class(
    text: str, cls: type, message: str
) -> None:
    shown = text.replace(message, str(cls(message)))  # as Spark shows it: str(), remedy too
    found = aqueduct_error(RuntimeError(shown))
    assert type(found) is cls and str(found) == str(cls(message))
    assert found.args[0].rstrip(".") == message  # the remedy is not kept in the message


def test_an_error_not_ours_is_not_taken_for_one() -> None:
    assert aqueduct_error(RuntimeError("[DIVIDE_BY_ZERO] Division by zero.")) is None
    assert aqueduct_error(RuntimeError("os.errors.Nope: aqueduct_spark.protocol.Nope")) is None
    conflict = P.Conflict("as raised")
    assert aqueduct_error(conflict) is conflict
