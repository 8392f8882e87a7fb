"""Python client of the dataset service, usable without Spark (and used by it).

:class:`AsyncClient` is the asyncio client. :class:`Client` is the blocking facade: one
event-loop thread per process runs every connection (the anyio "blocking portal" shape),
so Spark's synchronous ``read()``/``write()`` and plain scripts share a connection pool.

Reads, plans and other idempotent requests are retried with exponential backoff when the
connection is lost; a scan resumes where it stopped (a scan of a pinned version yields its
rows in one order, so the service leaves out the rows already delivered). Writes are not retried here:
the Spark job retries the task, and only committed staged files ever become visible.

The modules, bottom up: ``config`` (:class:`ClientConfig`), ``urls`` (service addresses),
``models`` (what answers carry), ``failures`` (which can heal) and ``retry`` (the one retry
policy), ``connecting`` (opening a connection within ``connect_timeout``), ``session`` (the connection and requests), ``reads``, ``writes`` and
``subscriptions`` (the sides of :class:`AsyncClient`, in ``aio``), ``pool`` (the loop
thread, the connection pool, closing it at exit; ``exit_signals`` makes sure an exit
signal's handler runs) and ``blocking`` (:class:`Client`).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aqueduct_spark.client.aio import AsyncClient
    from aqueduct_spark.client.blocking import Client
    from aqueduct_spark.client.config import CHUNK_BYTES, ClientConfig
    from aqueduct_spark.client.failures import CannotConnect, ServiceUnreachable
    from aqueduct_spark.client.models import (
        DatasetDescription,
        DatasetInfo,
        Plan,
        Transaction,
        to_wire_filters,
    )
    from aqueduct_spark.client.retry import RetryPolicy
    from aqueduct_spark.client.urls import DEFAULT_PORT, Endpoint, parse_endpoints, parse_url
else:
    from aqueduct_core.lazy import attach

    __getattr__, __dir__ = attach(__name__, __file__)

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_PORT",
    "AsyncClient",
    "CannotConnect",
    "Client",
    "ClientConfig",
    "DatasetDescription",
    "DatasetInfo",
    "Endpoint",
    "Plan",
    "RetryPolicy",
    "ServiceUnreachable",
    "Transaction",
    "parse_endpoints",
    "parse_url",
    "to_wire_filters",
]
