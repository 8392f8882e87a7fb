"""A request the client cannot send in time fails within its timeout, saying why.

A service lets a connection send only ``--request-window`` bytes of requests ahead of those
it serves (issue 26): beyond that the client's next request waits in the client. Before,
such a request waited unread in the service, inside the time the client gives an answer;
now the wait to send counts in the same timeout, so a call still ends when the caller said.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aqueduct_core.engine import EngineConfig
from aqueduct_core.transport import TransportConfig, serve
from aqueduct_spark import protocol as P
from aqueduct_spark.client import AsyncClient, ClientConfig


def test_a_request_that_cannot_be_sent_fails_within_the_timeout() -> None:
    async def main() -> tuple[list[Any], float]:
        async def handler(conn: Any, entry: Any) -> None:
            await conn.wait_closed()  # reads nothing: every slot of the service is taken

        server = await serve(
            handler,
            transport="quic",
            headers=lambda _: [(P.H_VERSION, str(P.PROTOCOL_VERSION).encode())],
            # One byte: one request may be outstanding (flow control's progress rule).
            config=TransportConfig(engine=EngineConfig(entry_window=1)),
        )
        try:
            url = f"quic://127.0.0.1:{server.port}"
            config = ClientConfig(url, tls=server.client_tls(), retries=0, timeout=0.5)
            client = AsyncClient(config)
            try:
                started = time.monotonic()
                # One on the wire, 16 queued in the client's engine (the entrypoint sender's
                # queue), and three that cannot even be queued.
                calls = [client.list() for _ in range(20)]
                results = await asyncio.gather(*calls, return_exceptions=True)
                return results, time.monotonic() - started
            finally:
                await client.close()
        finally:
            await server.close()

    results, took = asyncio.run(asyncio.wait_for(main(), 30))
    assert all(isinstance(r, P.Unavailable) for r in results), results
    unsent = [r for r in results if "'list' could not be sent within 0.5 s" in str(r)]
    unanswered = [r for r in results if "no answer to 'list' within 0.5 s" in str(r)]
    assert (len(unsent), len(unanswered)) == (3, 17), results
    assert took < 5, f"the calls took {took:.1f} s, with a timeout of 0.5 s"
