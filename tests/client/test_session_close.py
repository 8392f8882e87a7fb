"""A client session closed while one of its connections is still being opened closes that
connection too once it is open: nobody else holds it, and left alone its socket would be
reclaimed by the garbage collector (a ``ResourceWarning: unclosed <socket>``, issue 26)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aqueduct_core.errors import ConnectionLost


def test_a_connection_opened_after_close_is_closed_not_kept() -> None:
    from aqueduct_core.transport import serve
    from aqueduct_spark.client import ClientConfig
    from aqueduct_spark.client.session import Session

    async def handler(conn: Any, rx: Any) -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        server = await serve(handler)
        try:
            session = Session(
                ClientConfig(f"quic://127.0.0.1:{server.port}", tls=server.client_tls())
            )
            opening = asyncio.ensure_future(session._connection())
            await asyncio.sleep(0)  # the handshake is under way
            await session.close()
            with pytest.raises(ConnectionLost, match="closed while it connected"):
                await opening
            assert session._open("control") is None
        finally:
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 10))
