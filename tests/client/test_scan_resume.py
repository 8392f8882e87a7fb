"""A cut scan resumes from the row it reached (issue 30): the new scan asks the service to
leave out the rows the reader has (``skip_rows``), and the service sends only the rest, on
the same endpoint (a new connection) or on another. Seen as a user sees it: every row
exactly once, and the service's access log counts the rows each scan sent. Against a
service that predates the field (it sends every row, unconfirmed) the client drops what it
has itself, still every row once. Hostile values are refused by name through a real
connection. In-process services on loopback (a second ``aqueduct serve`` costs seconds);
a real process killed behind a relay: test_client_urls.py."""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2
import pyarrow as pa
import pytest

from aqueduct_core.api import channel
from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.errors import EndOfChannel
from aqueduct_core.transport import TransportConfig
from aqueduct_spark import protocol as P
from aqueduct_spark.client import AsyncClient, ClientConfig
from aqueduct_spark.client.session import BULK
from aqueduct_spark.service import resume
from aqueduct_spark.service.server import ServiceConfig, start

ROWS = 12_000
SCHEMA = pa.schema([("id", pa.int64())])
CUT = 3_000
"""Rows delivered when the connection is cut (a few batches of 500)."""


def scans(records: list[logging.LogRecord]) -> list[int]:
    """The rows each scan sent, by the service's access log."""
    return [
        r.fields["rows"]  # type: ignore[attr-defined]
        for r in records
        if r.name == "aqueduct.access" and getattr(r, "fields", {}).get("op") == "scan"
    ]


def read_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, *, another: bool
) -> tuple[list[int], list[int]]:
    """Write ROWS rows through an in-process service, then scan them with the connection cut
    after CUT rows: resumed on the same endpoint (a new connection) or, with ``another``, on
    a second endpoint of the same service (another transport: what the client takes for
    another host). The ids delivered, and the rows each scan sent."""

    async def main() -> tuple[list[int], list[int]]:
        _, server = await start(ServiceConfig(str(tmp_path / "root")))
        port = server.port
        url = (
            f"tcp://127.0.0.1:{port},quic://127.0.0.1:{port}"
            if another
            else f"tcp://127.0.0.1:{port}"
        )
        config = ClientConfig(
            url,
            tls=server.client_tls(),
            retries=1,
            # a small window: the service cannot send the scan far ahead of the reader
            transport=TransportConfig(engine=EngineConfig(flow_window=16 * 1024)),
        )
        name = f"resume_{random.randrange(1 << 30)}"
        try:
            async with AsyncClient(config) as client:
                await client.write(name, pa.table({"id": pa.array(range(ROWS), pa.int64())}))
                plan = await client.plan(name)
                got: list[int] = []
                caplog.clear()
                options: dict[str, Any] = {"endpoint": (0, 1)} if another else {}
                async for batch in client.scan(
                    plan.splits[0], schema=plan.schema, batch_rows=500, **options
                ):
                    got += batch.column("id").to_pylist()
                    if len(got) == CUT:
                        owner = client._spreader._clients[0] if client._spreader else client
                        held = owner._held(BULK)
                        assert held is not None
                        await held.close()
                for _ in range(100):  # the access line follows the scan's end
                    if len(scans(caplog.records)) == 2:
                        break
                    await asyncio.sleep(0.01)
                return got, scans(caplog.records)
        finally:
            await server.close()

    with caplog.at_level(logging.INFO, logger="aqueduct"):
        return asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("another", [False, True], ids=["same endpoint", "another endpoint"])
def test_a_cut_scan_resumes_from_its_row_and_the_rest_is_sent_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, another: bool
) -> None:
    got, sent = read_cut(tmp_path, caplog, another=another)
    assert got == list(range(ROWS))  # every row exactly once, in order
    assert re.search(rf"resuming after row {CUT}\b", caplog.text), caplog.text
    first, second = sent
    assert first >= CUT  # what was delivered, and what was in flight when it was cut
    assert second == ROWS - CUT  # the resumed scan sent none of the rows delivered
    resumed = [r for r in caplog.records if getattr(r, "fields", {}).get("op") == "scan"][-1]
    assert resumed.fields["skip_rows"] == CUT  # type: ignore[attr-defined]  # operators see it


def test_against_a_service_that_ignores_skip_rows_every_row_arrives_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service that predates the field sends the scan from its first row, with no
    ``skipped`` in its first message: the client drops the rows it has itself."""
    monkeypatch.setattr("aqueduct_spark.service.server.skip_rows", lambda req: 0)
    got, sent = read_cut(tmp_path, caplog, another=True)
    assert got == list(range(ROWS))
    assert sent[1] == ROWS  # sent again from row 0 (what skip_rows saves)


async def _scan_raw(
    client: AsyncClient, **fields: Any
) -> tuple[list[int], P.DatasetError | None, int]:
    """A scan request of ``fields`` (a ``split`` or ``splits``, ``skip_rows``...) sent as is
    on the client's bulk connection: the ids received, the error the service answered (or
    None) and the ``skipped`` of its first message."""
    conn = await client._connection(BULK)
    tx, rx = channel(headers=[(P.H_SCHEMA, P.schema_to_bytes(SCHEMA))], codec="raw")
    await conn.entrypoint.send({"op": "scan", **fields, "out": tx})
    got: list[int] = []
    skipped = None
    try:
        while True:
            try:
                delivery = await rx.recv_message()
            except EndOfChannel:
                return got, None, skipped or 0
            error = P.find_header(delivery.headers, P.H_ERROR)
            if error is not None:
                return got, P.error_from_wire(cbor2.loads(error)), skipped or 0
            if skipped is None:
                skipped = P.skipped_rows(delivery.headers)
            got += P.read_data_message(delivery.value).decode(SCHEMA).column("id").to_pylist()
    finally:
        rx.close()


def test_skip_rows_refuses_what_is_not_a_row_count_and_a_huge_one_costs_nothing(
    tmp_path: Path,
) -> None:
    """Through a real connection: a negative, fractional, textual, boolean or absurd
    ``skip_rows`` is refused naming the field and what to send; the largest accepted value
    skips the whole split without sending a row; a partial one is confirmed in the first
    message, for a plain split and for the change feed's (another reader)."""
    refused: list[tuple[Any, str]] = [
        (-1, "must be from 0 to"),
        (2**63, "must be from 0 to"),
        (2**200, "a 201-bit number"),
        (1.5, "must be a whole number of rows"),
        ("10", "must be a whole number of rows"),
        (True, "must be a whole number of rows"),
    ]

    async def main() -> None:
        _, server = await start(ServiceConfig(str(tmp_path / "root")))
        config = ClientConfig(f"tcp://127.0.0.1:{server.port}", tls=server.client_tls())
        try:
            async with AsyncClient(config) as client:
                await client.write("t", pa.table({"id": pa.array(range(ROWS), pa.int64())}))
                split = (await client.plan("t")).splits[0]
                for value, says in refused:
                    got, error, _ = await _scan_raw(client, split=split, skip_rows=value)
                    assert got == [] and isinstance(error, P.InvalidRequest), value
                    assert "'skip_rows'" in str(error) and says in str(error), str(error)
                    assert "send the rows the reader already has" in str(error)
                biggest = resume.MAX_SKIP_ROWS
                assert await _scan_raw(client, split=split, skip_rows=biggest) == ([], None, 0)
                every = list(range(ROWS))
                assert await _scan_raw(client, split=split, skip_rows=None) == (every, None, 0)
                changed = (await client.feed("t", change_feed=True))["versions"][0]["files"]
                assert [c["change_type"] for c in changed] == ["insert"]  # the feed's reader
                for splits in ({"split": split}, {"splits": changed}):
                    rest = await _scan_raw(client, **splits, skip_rows=ROWS - 7)
                    assert rest == (every[-7:], None, ROWS - 7), splits
        finally:
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_service_claiming_to_skip_more_than_asked_is_refused() -> None:
    """Rows would be lost: the client refuses, naming what happened."""
    from aqueduct_spark.client.reads import _confirmed

    assert _confirmed(0, 10) == 0 and _confirmed(10, 10) == 10 and _confirmed(4, 10) == 4
    with pytest.raises(
        P.InvalidRequest, match="skipped 11 rows of a scan that asked it to skip 10"
    ):
        _confirmed(11, 10)
    bad: Callable[[bytes], int] = lambda raw: P.skipped_rows([(P.H_BATCH, raw)])  # noqa: E731
    assert bad(cbor2.dumps({"rows": 1, "seq": 0})) == 0 and P.skipped_rows([]) == 0
    with pytest.raises(P.InvalidRequest, match="not a count"):
        bad(cbor2.dumps({"rows": 1, "seq": 0, "skipped": -3}))
    with pytest.raises(P.InvalidRequest, match="not CBOR"):
        bad(b"\xff\xfe")
