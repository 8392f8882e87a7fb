"""A burst of requests on one connection, against the real service code in memory: what the
service holds of it, and what is left of it once the connection is gone.

Issue 26. Over real QUIC against ``aqueduct serve``: ``tests/security/test_service_flood.py``.
Here the in-memory transport makes it exact: one call of the client's requests runs and is
held there (a ``threading.Event``), so what the service does with the others is what its
admission decided, not what the scheduler happened to do.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from aqueduct_core.api import oneshot
from aqueduct_core.engine import EngineConfig
from aqueduct_core.testing.memory import memory_pair
from aqueduct_core.wire import ENTRYPOINT
from aqueduct_core.wire.frames import ATTACHMENT_COST, MESSAGE_OVERHEAD
from aqueduct_spark.service.server import DatasetService, ServiceConfig

PER_REQUEST = ATTACHMENT_COST + MESSAGE_OVERHEAD + 64
"""About what a small request costs in the window (its reply channel, and a few bytes)."""


def test_a_burst_waits_in_the_client_and_dies_with_its_connection(tmp_path: Path) -> None:
    """200 requests at once, two served at a time (one running, one waiting for a thread),
    a window of five more: the service holds those seven and nothing else, and when the
    connection closes the running one is cancelled and none of the others ever starts."""
    window = 5 * PER_REQUEST
    service = DatasetService(ServiceConfig(str(tmp_path), max_requests=2, threads=4))
    started: list[int] = []
    release = threading.Event()

    def held_list(req: dict[str, Any]) -> dict[str, Any]:
        started.append(len(started))
        assert release.wait(10)
        return {"datasets": []}

    service._ops["list"] = held_list

    async def main() -> tuple[int, int, int]:
        engine = EngineConfig(entry_window=window, require_flow_control=True)
        async with memory_pair(config=engine, codecs=service.codecs()) as pair:
            serving = asyncio.ensure_future(service.handle(pair.server, pair.entrypoint_receiver))
            replies = [oneshot() for _ in range(200)]  # the receivers kept: still wanted
            sending = [
                asyncio.ensure_future(pair.client.entrypoint.send({"op": "list", "reply": tx}))
                for tx, _ in replies
            ]
            while not started:
                await asyncio.sleep(0.005)
            for _ in range(20):  # whatever else would happen, happens
                await asyncio.sleep(0.005)
            held = pair.server.memory().received.get(ENTRYPOINT, 0)
            waiting = sum(not s.done() for s in sending)
            await pair.client.close()
            await asyncio.wait_for(serving, 5)  # the connection's work ended with it
            release.set()
            for s in sending:
                s.cancel()
            await asyncio.gather(*sending, return_exceptions=True)
            return held, waiting, len(started)

    held, waiting, ran = asyncio.run(asyncio.wait_for(main(), 30))
    service._pool.shutdown()
    assert held <= window, f"the service held {held} bytes of requests, its window is {window}"
    assert waiting > 150, f"only {waiting} requests waited in the client"
    assert ran == 1, f"{ran} requests of a closed connection ran; only the first had started"
