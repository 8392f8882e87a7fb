"""One connection to a dataset service, opened on first use and reopened after it is lost,
and the request/reply exchange over it (with retries for idempotent requests)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aqueduct_core.api import Connection, oneshot
from aqueduct_core.errors import AqueductError
from aqueduct_spark import protocol as P
from aqueduct_spark.client.config import ClientConfig
from aqueduct_spark.client.connecting import open_connection
from aqueduct_spark.client.failures import Kind, classify
from aqueduct_spark.client.retry import Retrying, RetryPolicy
from aqueduct_spark.client.urls import parse_endpoints

log = logging.getLogger("aqueduct.client")
T = TypeVar("T")


class Session:
    """An asyncio client's connection to one dataset service, and its requests."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._endpoints = parse_endpoints(config.url)
        self._conn: Connection | None = None
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Future[None]] = set()

    async def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and not conn.is_closed:
            return conn
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed:
                return self._conn
            headers: list[tuple[bytes, bytes]] = [(P.H_VERSION, str(P.PROTOCOL_VERSION).encode())]
            if self.config.token:
                headers.append((P.H_TOKEN, self.config.token.encode()))
            self._conn = await open_connection(self.config, self._endpoints, headers)
            return self._conn

    def _drop_connection(self, conn: Connection) -> None:
        """Forget ``conn`` and close it in the background: requests waiting on it fail now
        (and retry on a new one) instead of at its idle timeout."""
        if self._conn is conn:
            self._conn = None
        closing = asyncio.ensure_future(_close_quietly(conn))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Finish the entrypoint channel and close the connection (code 0)."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed:
            # The entrypoint may be gone already (ended by its garbage-collection backstop,
            # as at interpreter exit): the connection is closed all the same.
            with contextlib.suppress(AqueductError):
                conn.entrypoint.finish()
            await conn.close()

    @property
    def transport(self) -> str | None:
        """What carries the current connection (``quic`` or ``tcp``); None before one."""
        conn = self._conn
        return conn.transport if conn is not None else None

    # -- requests ---------------------------------------------------------------------

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        tries = Retrying(RetryPolicy.of(self.config))
        while True:
            try:
                return await attempt()
            except BaseException as exc:
                pause = tries.delay(exc)
                if pause is None:
                    raise
                log.warning("request to the dataset service failed (%s); retrying", exc)
                self._forget_failed(exc)
                await asyncio.sleep(pause)

    def _forget_failed(self, exc: BaseException) -> None:
        """After a connection failure, the next attempt opens a new connection."""
        if classify(exc) is Kind.TRANSIENT:
            self._conn = None

    async def _call_once(self, op: str, fields: dict[str, Any]) -> Any:
        conn = await self._connection()
        reply, answer = oneshot()
        await conn.entrypoint.send({"op": op, **fields, "reply": reply})
        try:
            result = await asyncio.wait_for(answer, self.config.timeout)
        except TimeoutError:
            answer.close()
            raise P.Unavailable(f"no answer to {op!r} within {self.config.timeout} s") from None
        return P.unwrap(result)

    async def call(self, op: str, *, idempotent: bool = True, **fields: Any) -> Any:
        """Send one request and return its result (raises the service's error)."""
        if idempotent:
            return await self._retrying(lambda: self._call_once(op, fields))
        return await self._call_once(op, fields)


async def _close_quietly(conn: Connection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 5.0)
