"""A real Aqueduct server in its own process, for fault tests (SIGKILL).

Run as ``python tests/core/quic_server_process.py BACKEND``; prints one JSON line with the
port and certificate fingerprint, then serves until killed. Requests: ``{"op": "blobs",
"out": <sender>}`` streams 1 MiB blobs until the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from aqueduct_core.api import Connection, Receiver
from aqueduct_core.errors import AqueductError
from aqueduct_core.transport import TransportConfig, serve


async def handler(conn: Connection, entry: Receiver[Any]) -> None:
    async for request in entry:
        out = request["out"]
        try:
            while True:
                await out.send(b"\x07" * (1 << 20))
        except AqueductError:
            return


async def main(backend: str) -> None:
    server = await serve(handler, config=TransportConfig(backend=backend))  # type: ignore[arg-type]
    print(json.dumps({"port": server.port, "fingerprint": server.fingerprint}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
