"""What one connection may ask of ``aqueduct serve``, over real QUIC against a real process.

- A request whose payload is not valid CBOR is answered ``INVALID_REQUEST`` on its own reply
  channel, and the connection serves on (issue 13 "Low": it used to close with code 5).
- Requests beyond ``--max-requests`` wait unread until one ends, then are all answered.
- Scans beyond ``--max-scans`` are refused with a retryable ``UNAVAILABLE``, which the Python
  client waits out; stalled scans are capped, and the server's memory stays bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import numpy as np
import pyarrow as pa
import pytest
from service_process import ProcessStats, Remote, client_transport, wait_until

from aqueduct_core.api import channel, oneshot
from aqueduct_core.api.channel import Handle
from aqueduct_core.api.codec import Attach, CborCodec, RawCodec
from aqueduct_core.api.connection import Connection
from aqueduct_core.transport import ClientTLS, connect
from aqueduct_spark import protocol as P
from aqueduct_spark.client import AsyncClient, ClientConfig
from aqueduct_spark.client.session import BULK
from aqueduct_spark.testing import ServiceProcess, start_service

pytestmark = [pytest.mark.quic]

MB = 1_000_000
SCAN_BUDGET = 40 * MB
"""Server memory one stalled scan may hold: docs/operations.md says about 25 MB for this
dataset's batches; the rest is allowance for the allocator. A stalled scan held ~150 MB
before issue 13."""
ROWS = 1_000_000
"""One Parquet row group of about 40 MB decoded: what a scan reader must not hold whole."""


class Corrupting(CborCodec):
    """The client's CBOR codec, except that a request with ``op`` ``"corrupt-garbage"`` or
    ``"corrupt-truncated"`` goes out as bytes that are not CBOR, its channels still
    attached."""

    def encode(self, value: Any, attach: Attach) -> bytes:
        payload = super().encode(value, attach)
        op = value.get("op") if isinstance(value, dict) else None
        if op == "corrupt-garbage":
            return b"\xff\xfe" + payload
        if op == "corrupt-truncated":
            return payload[: len(payload) // 2]
        return payload


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(
        tmp_path_factory.mktemp("requests-root"), args=["--max-scans", "4", "--max-requests", "8"]
    )
    client = svc.client(transport=client_transport())
    rng = np.random.default_rng(13)
    client.overwrite(
        "wide",
        pa.table(
            {
                "id": pa.array(np.arange(ROWS)),
                "v": pa.array(rng.random(ROWS)),
                "s": pa.array([f"row-{i}" for i in range(ROWS)]),
            }
        ),
    )
    yield svc
    svc.stop()


async def open_connection(svc: ServiceProcess, *, corrupting: bool = False) -> Connection:
    codecs = {"cbor": Corrupting((Handle,)), "raw": RawCodec()} if corrupting else None
    return await connect(
        "127.0.0.1",
        svc.port,
        headers=[(P.H_VERSION, str(P.PROTOCOL_VERSION).encode())],
        tls=ClientTLS(fingerprint=svc.fingerprint),
        config=client_transport(),
        codecs=codecs,
    )


async def call(conn: Connection, op: str, **fields: Any) -> Any:
    reply, answer = oneshot()
    await conn.entrypoint.send({"op": op, **fields, "reply": reply})
    return P.unwrap(await asyncio.wait_for(answer, 30))


def async_client(svc: ServiceProcess, **config: Any) -> AsyncClient:
    return AsyncClient(
        ClientConfig(
            svc.url,
            tls=ClientTLS(fingerprint=svc.fingerprint),
            transport=client_transport(),
            retries=0,
            **config,
        )
    )


# -- malformed requests ----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["garbage", "truncated"])
def test_a_malformed_request_is_answered_invalid_and_the_connection_serves_on(
    service: ServiceProcess, how: str
) -> None:
    async def scenario() -> None:
        conn = await open_connection(service, corrupting=True)
        try:
            with pytest.raises(P.InvalidRequest, match="could not be decoded"):
                await call(conn, f"corrupt-{how}", dataset="wide")
            # A data channel carried by a malformed request gets the error as its last
            # message, as a failed scan's does.
            out, data = channel(codec="raw")
            await conn.entrypoint.send({"op": f"corrupt-{how}", "out": out})
            first = await asyncio.wait_for(data.recv_message(), 30)
            error = P.find_header(first.headers, P.H_ERROR)
            assert error is not None
            with pytest.raises(P.InvalidRequest):
                raise P.error_from_wire(cbor2.loads(error))
            data.close()
            # The same connection still answers, and was never closed.
            names = {d["name"] for d in (await call(conn, "list"))["datasets"]}
            assert "wide" in names
            assert not conn.is_closed
        finally:
            await conn.close()

    asyncio.run(scenario())


# -- requests in flight ----------------------------------------------------------------------


def test_requests_beyond_max_requests_wait_unread_and_are_all_answered(tmp_path: Path) -> None:
    """With ``--max-requests 2``, two writes whose data has not come hold both slots: a third
    request waits (the service does not even read it) until a write ends."""
    svc = start_service(tmp_path / "root", args=["--max-requests", "2"])

    async def scenario() -> None:
        client = async_client(svc)
        schema = pa.schema([("id", pa.int64())])
        txn = await client.begin("held", schema, mode="create")
        conn = await open_connection(svc)
        writes = []
        for task in ("t1", "t2"):
            tx, rx = channel(headers=[(P.H_SCHEMA, P.schema_to_bytes(schema))], codec="raw")
            reply, answer = oneshot()
            await conn.entrypoint.send(
                {"op": "write", "dataset": "held", "txn": txn.txn, "task": task}
                | {"data": rx, "reply": reply}
            )
            writes.append((tx, answer))
        listing = asyncio.ensure_future(call(conn, "list"))
        done, _ = await asyncio.wait([listing], timeout=1.5)
        assert not done, "a third request was served while two requests held both slots"
        for tx, answer in writes:
            tx.finish()  # the write ends (no rows) and frees its slot
            assert P.unwrap(await asyncio.wait_for(answer, 30))["rows"] == 0
        assert "datasets" in await asyncio.wait_for(listing, 30)
        await conn.close()
        await client.close()

    try:
        asyncio.run(scenario())
    finally:
        svc.stop()


# -- open scans --------------------------------------------------------------------------------


def test_scans_beyond_max_scans_are_refused_and_the_client_waits_its_turn(
    service: ServiceProcess,
) -> None:
    """``--max-scans 4``: a fifth scan on the connection is refused with ``UNAVAILABLE``
    and a ``retry_after``; the Python client waits and retries, and reads it all once one
    of the four ends."""

    async def scenario() -> None:
        # Arrow batches: a scan whose reader stops reading stays open on the service (a
        # row group sent as stored could be one message that ends the scan at once)
        client = async_client(service, decode="service")
        plan = await client.plan("wide")
        split = plan.splits[0]
        held = []
        for _ in range(4):  # four scans, one batch read from each, then not read further
            scan = client.scan(split, schema=plan.schema)
            await scan.__anext__()
            held.append(scan)
        conn = await client._connection(BULK)  # where the four scans run
        out, data = channel(headers=[(P.H_SCHEMA, P.schema_to_bytes(plan.schema))], codec="raw")
        await conn.entrypoint.send({"op": "scan", "split": split, "out": out})
        first = await asyncio.wait_for(data.recv_message(), 30)
        error = P.error_from_wire(cbor2.loads(P.find_header(first.headers, P.H_ERROR)))
        assert isinstance(error, P.Unavailable), error
        assert error.details["retry_after"] > 0 and "--max-scans 4" in error.message
        data.close()

        async def read_all() -> int:
            return sum([b.num_rows async for b in client.scan(split, schema=plan.schema)])

        waiting = asyncio.ensure_future(read_all())
        await asyncio.sleep(1.5)
        assert not waiting.done(), "a fifth scan ran while four were open"
        await held.pop().aclose()  # one reader gives up: its scan ends, a slot frees
        assert await asyncio.wait_for(waiting, 30) == ROWS
        for scan in held:
            await scan.aclose()
        await client.close()

    asyncio.run(scenario())


def test_stalled_scans_are_capped_and_server_memory_stays_bounded(
    service: ServiceProcess,
) -> None:
    """Twelve scans opened on one connection and never read: four run (``--max-scans 4``),
    eight are refused, and each costs the server no more than its budget.

    A fresh ``aqueduct serve`` on the same root, so that its allocator holds nothing from
    earlier scans or writes that new scans could reuse unseen; the cost is measured against
    one scan already stalled on another connection, which pays for what the first scan of
    a process sets up (thread pools, readers)."""
    fresh = start_service(service.root, args=["--max-scans", "4"])
    try:
        stats = ProcessStats(fresh.proc.pid)
        client = fresh.client(transport=client_transport())
        assert client.plan("wide").rows == ROWS  # Delta Lake loaded, the table opened

        def settled() -> int:
            wait_until(lambda: stats.busy(0.2) < 0.1, 30, "the stalled scans to stop working")
            return stats.rss()

        with Remote("stall", fresh.url, fresh.fingerprint, 1, "wide") as first:
            assert first.expect("OPEN")[:3] == ["1", "REFUSED", "0"]
            before = settled()
            with Remote("stall", fresh.url, fresh.fingerprint, 12, "wide") as attacker:
                opened, _, refused = attacker.expect("OPEN")[:3]
                assert (int(opened), int(refused)) == (4, 8)
                grown = settled() - before
                start = time.monotonic()
                assert client.list()  # the service still answers another client at once
                answered = time.monotonic() - start
    finally:
        fresh.stop()
    print(f"4 stalled scans: server RSS +{grown / MB:.0f} MB ({grown / 4 / MB:.1f} MB per scan)")
    assert grown < 4 * SCAN_BUDGET, f"4 stalled scans hold {grown / MB:.0f} MB"
    assert answered < 5
