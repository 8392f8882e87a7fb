"""The dataset protocol over the browsers' transports (issue 29): a real ``aqueduct serve
--web`` answers list, describe, plan, scan, write and subscribe over WebTransport (profile
§8) and over WebSocket (§9), through the Python client, as a browser's client would ask.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest
from conftest import ServiceProcess

from aqueduct_core.transport import ClientTLS, TransportConfig


def client(service: ServiceProcess, over: str) -> Any:
    # WebTransport connections get the certificate a browser pins, not the service's own.
    pin = service.webtransport_hashes[0] if over == "webtransport" else service.fingerprint
    return service.client(transport=TransportConfig(transport=over), tls=ClientTLS(fingerprint=pin))  # type: ignore[arg-type]


@pytest.mark.parametrize("over", ["webtransport", "websocket"])
def test_the_dataset_protocol_runs_over_a_browsers_transport(
    web_service: ServiceProcess, over: str
) -> None:
    assert len(web_service.webtransport_hashes) == 2
    c = client(web_service, over)
    name = f"rides_{over}"
    rows = pa.table({"id": list(range(20_000)), "s": [f"r{i}" for i in range(20_000)]})
    c.create(name, rows.schema)
    seen: list[int] = []
    alive, third = threading.Event(), threading.Event()

    def on_version(v: int) -> None:
        seen.append(v)
        if v >= 2:
            third.set()

    sub = c.subscribe(name, on_version, lambda ok: alive.set() if ok else None)
    try:
        assert alive.wait(10)
        c.append(name, rows)  # a write: batches on a channel, then the commit
        c.append(name, rows.slice(0, 5))
        assert third.wait(10), f"saw {seen}"  # pushed as committed
    finally:
        sub.cancel()
    assert c.transport == over
    assert name in [d.name for d in c.list()]
    assert c.describe(name).rows == 20_005
    plan = c.plan(name, filter=[("id", ">=", 19_990)])
    got = pa.Table.from_batches(
        [
            b
            for s in plan.splits
            for b in c.scan(s, schema=plan.schema, filter=[("id", ">=", 19_990)])
        ],
        schema=plan.schema,
    )
    assert sorted(got.column("id").to_pylist()) == list(range(19_990, 20_000))
    c.close()
