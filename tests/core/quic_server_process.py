"""A real Aqueduct server in its own process, for fault tests (SIGKILL).

Run as ``python tests/core/quic_server_process.py BACKEND [PORT CERT_DIR]``; prints one JSON
line with the port and certificate fingerprint, then serves until killed. With a port and a
directory (its certificate is made there once, then reused) a restart is the same server to
its clients, as ``aqueduct serve`` is over one root. Requests: ``{"op": "blobs",
"out": <sender>}`` streams 1 MiB blobs until the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aqueduct_core.api import Connection, Receiver
from aqueduct_core.errors import AqueductError
from aqueduct_core.transport import ServerTLS, TransportConfig, serve
from aqueduct_core.transport.tls import make_dev_certificates


async def handler(conn: Connection, entry: Receiver[Any]) -> None:
    async for request in entry:
        out = request["out"]
        try:
            while True:
                await out.send(b"\x07" * (1 << 20))
        except AqueductError:
            return


async def main(backend: str, port: int = 0, cert_dir: str | None = None) -> None:
    tls = None
    if cert_dir is not None:
        where = Path(cert_dir)
        if not (where / "server.pem").exists():
            make_dev_certificates(where)
        tls = ServerTLS(str(where / "server.pem"), str(where / "server.key"))
    config = TransportConfig(backend=backend, transport="quic")  # type: ignore[arg-type]
    server = await serve(handler, port=port, tls=tls, config=config)
    print(json.dumps({"port": server.port, "fingerprint": server.fingerprint}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    if len(sys.argv) > 2:
        asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
    else:
        asyncio.run(main(sys.argv[1]))
