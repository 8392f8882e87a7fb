"""How our errors reach the PySpark user: our class and message first, not a traceback.

Spark runs every hook of a Python data source in a worker process and hands the user the
worker's formatted exception inside its own (``PythonException``, ``AnalysisException`` with
``PYTHON_DATA_SOURCE_ERROR``, ``StreamingQueryException``). By default that text is a Python
traceback: the frames of the connector and its client, and our one useful line last. Two
things put that line first (measured with pyspark 4.3, see ``docs/troubleshooting.md``):

- :func:`surfaced`: where one of our errors (the :class:`AqueductError` tree: a service
  answer, an option, a connection that cannot be made) leaves a hook, the traceback is left
  out, so Spark shows ``aqueduct_spark.protocol.errors.Conflict: <message>`` alone. It sets
  PySpark's ``SPARK_HIDE_TRACEBACK`` in the worker, which Spark reads while it formats the
  exception and which ends with the worker (a worker exits after a failed hook). Only where
  Spark simplifies tracebacks, its default: with
  ``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled=false`` the whole
  traceback shows (except from a streaming source's driver-side runner, which Spark never
  tells), and outside a Spark worker nothing changes.
- :func:`deferred`: a write task that meets an error no retry can heal (a row over the
  message limit, a refused request) does not raise it. Spark would retry the task (up to
  ``spark.task.maxFailures`` times, each failing alike) and report the last attempt under
  "An exception was thrown from the Python worker". The task returns the error in its
  commit message instead; the driver's ``commit`` aborts the write (nothing becomes
  visible, staged files are removed) and raises it, once, where Spark puts it on the first
  line of its error. Failures that may heal (a lost connection) still raise in the task,
  so Spark retries them as before.

PySpark cannot raise our class in the driver program: :func:`aqueduct_error` finds our
error in PySpark's and rebuilds it, for code that needs to tell a ``Conflict`` from the rest.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from aqueduct_core.errors import FIX, AqueductError
from aqueduct_spark import protocol as P
from aqueduct_spark.datasource.option_values import OptionError

F = TypeVar("F", bound=Callable[..., Any])

HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"
"""Read by PySpark's worker when it formats a failed hook's exception: only the last line."""
SIMPLIFIED_TRACEBACK = "SPARK_SIMPLIFIED_TRACEBACK"
"""Set by Spark in its Python workers while ``...udf.simplifiedTraceback.enabled`` is true."""


SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
"""The driver-side process of a streaming source, which Spark starts without
``SPARK_SIMPLIFIED_TRACEBACK`` whatever the setting (pyspark 4.3)."""


def hide_traceback(exc: BaseException) -> None:
    """Let Spark show ``exc`` as its class and message only, if it is one of ours and this
    process is a Spark worker that simplifies tracebacks (or a streaming source's runner,
    which never does)."""
    if not isinstance(exc, AqueductError):
        return
    if os.environ.get(SIMPLIFIED_TRACEBACK) or _in_source_runner():
        os.environ[HIDE_TRACEBACK] = "1"


def _in_source_runner() -> bool:
    """Whether this process is a streaming source's runner (Spark runs it as ``python -m``)."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(main, "name", None) == SOURCE_RUNNER


def surfaced(hook: F) -> F:
    """Decorate a data source hook (a function or a generator) with :func:`hide_traceback`."""
    if inspect.isgeneratorfunction(hook):

        @functools.wraps(hook)
        def generate(*args: Any, **kwargs: Any) -> Any:
            try:
                return (yield from hook(*args, **kwargs))
            except AqueductError as exc:
                hide_traceback(exc)
                raise

        return generate  # type: ignore[return-value]

    @functools.wraps(hook)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except AqueductError as exc:
            hide_traceback(exc)
            raise

    return call  # type: ignore[return-value]


def deferred(exc: BaseException) -> bool:
    """Whether a write task returns ``exc`` for the driver's commit to raise, instead of
    raising it: an error of ours that another attempt of the task would meet again. A
    service failure (``InternalError``), a service shutting down (``Unavailable``) and
    connection failures may heal: Spark retries those tasks."""
    from aqueduct_spark.client.failures import Kind, classify  # only once a task failed

    if isinstance(exc, OptionError):
        return True
    if not isinstance(exc, AqueductError) or isinstance(exc, P.InternalError | P.Unavailable):
        return False
    return classify(exc) is Kind.PERMANENT or (
        isinstance(exc, P.DatasetError) and classify(exc) is Kind.OTHER
    )


def first_error(errors: Iterable[BaseException | None]) -> BaseException | None:
    """The error a failed write reports: the first task's that met one."""
    return next((e for e in errors if e is not None), None)


_NAMED = re.compile(r"\b((?:aqueduct_core|aqueduct_spark)(?:\.\w+)+)\.(\w+): (.*)")
_SPARK_TAIL = re.compile(r"\n SQLSTATE: |\n=== Streaming Query ===")


def aqueduct_error(exc: BaseException) -> AqueductError | None:
    """Our error inside a Spark exception, rebuilt as its class (``Conflict``, ``DataLoss``,
    ``OptionError``, ...), or None if ``exc`` does not carry one. PySpark raises its own
    classes in the driver program (``AnalysisException``, ``PythonException``,
    ``StreamingQueryException``) with ours as a line of their text; this finds that line::

        try:
            df.write.format("aqueduct").options(**opts).mode("append").save("trips")
        except Exception as exc:
            if isinstance(aqueduct_error(exc), Conflict):
                ...  # written meanwhile: try again

    The message is the text Spark kept (details the service sent with it are not)."""
    if isinstance(exc, AqueductError):
        return exc
    text = str(exc)
    found = _NAMED.search(text)
    if found is None:
        return None
    module, name, first = found.groups()
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    if not (isinstance(cls, type) and issubclass(cls, AqueductError)):
        return None
    rest = text[found.end() :]
    tail = _SPARK_TAIL.search(rest)
    message = first + (rest[: tail.start()] if tail else rest).rstrip()
    message = message.removesuffix(f" {FIX} {getattr(cls, 'remedy', '')}")  # str() adds it
    try:
        error: AqueductError = cls(message)
    except TypeError:  # a class built with more than a message
        return None
    return error
