"""Row groups as stored Parquet over a real connection (issue 28): a client that offers to
decode Parquet (``decode=auto``, the default) reads the same rows as one that asks for Arrow
(``decode=service``), through fewer bytes, and the service's access log says which went how.
A service started with ``--no-pass-parquet`` sends Arrow only. A service whose Parquet message
lies is refused by name, at once, with no retry. In-process services on loopback."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import cbor2
import pyarrow as pa
import pytest

from aqueduct_spark import protocol as P
from aqueduct_spark.client import AsyncClient, ClientConfig
from aqueduct_spark.datasource.options import OptionError, parse
from aqueduct_spark.protocol import parquet as PQ
from aqueduct_spark.service import pass_parquet
from aqueduct_spark.service.server import ServiceConfig, start

ROWS = 30_000


def data() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "s": pa.array([f"row-{i}" for i in range(ROWS)]),
        }
    )


def scan_lines(records: list[logging.LogRecord]) -> list[dict[str, Any]]:
    return [
        r.fields  # type: ignore[attr-defined]
        for r in records
        if r.name == "aqueduct.access" and getattr(r, "fields", {}).get("op") == "scan"
    ]


async def read_both(
    root: Path, service: ServiceConfig | None = None, **client: Any
) -> dict[str, pa.Table]:
    _, server = await start(service or ServiceConfig(str(root)))
    url = f"tcp://127.0.0.1:{server.port}"
    out = {}
    try:
        for decode in ("auto", "service"):
            config = ClientConfig(url, tls=server.client_tls(), decode=decode, **client)
            async with AsyncClient(config) as c:
                if decode == "auto":
                    await c.create("t", data().schema)
                    # row groups of ~100 KiB: several, each sent as stored (PASS_FROM below)
                    await c.append("t", data())
                out[decode] = await c.read("t")
    finally:
        await server.close()
    return out


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pass_parquet, "PASS_FROM", 8 << 10)  # this test's row groups count as large


def test_a_client_that_decodes_parquet_reads_the_same_rows_through_fewer_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aqueduct.access")
    got = asyncio.run(read_both(tmp_path / "root"))
    assert got["auto"].equals(got["service"])
    assert got["auto"].column("id").to_pylist() == list(range(ROWS))
    stored, arrow = scan_lines(caplog.records)[-2:]
    assert "parquet" in stored["compression"] and "parquet" not in arrow["compression"]
    assert stored["rows"] == arrow["rows"] == ROWS
    assert stored["bytes"] < arrow["bytes"] * 0.8, (stored, arrow)


def test_a_service_told_not_to_pass_parquet_sends_arrow(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aqueduct.access")
    config = ServiceConfig(str(tmp_path / "root"), pass_parquet=False)
    got = asyncio.run(read_both(tmp_path / "root", config))
    assert got["auto"].equals(got["service"])
    assert not any("parquet" in line["compression"] for line in scan_lines(caplog.records))


def test_a_lying_parquet_message_fails_the_read_at_once_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    honest = PQ.ParquetPiece.header

    def lying(self: PQ.ParquetPiece, codec: str | None = None) -> tuple[bytes, bytes]:
        key, value = honest(self, codec)
        fields = cbor2.loads(value)
        fields["rows"] += 1  # one row more than the footer says: rows would be made up
        return key, cbor2.dumps(fields)

    monkeypatch.setattr(PQ.ParquetPiece, "header", lying)
    with pytest.raises(P.InvalidRequest, match=r"row count .* is not its row group.s") as info:
        asyncio.run(read_both(tmp_path / "root", retries=3))
    assert "decode=service" in str(info.value)


def test_decode_is_checked_where_it_is_given() -> None:
    with pytest.raises(ValueError, match=r"ClientConfig\.decode must be auto or service"):
        ClientConfig("tcp://127.0.0.1:1", decode="client")
    assert ClientConfig("tcp://127.0.0.1:1", decode="Service").decode == "service"
    base = {"url": "quic://127.0.0.1:4433", "path": "t"}
    with pytest.raises(OptionError, match="option 'decode' must be auto or service"):
        parse({**base, "decode": "spark"})
    assert parse(base).decode == "auto"


def test_stored_row_groups_take_the_readers_compression_on_top(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aqueduct.access")
    got = asyncio.run(read_both(tmp_path / "root", compression="zstd"))
    assert got["auto"].equals(got["service"])
    stored = scan_lines(caplog.records)[-2]
    assert "parquet+zstd" in stored["compression"], stored
    assert stored["bytes"] < stored["arrow_bytes"], stored


def test_stored_parquet_a_client_did_not_offer_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a service that sends row groups as stored whatever the reader offered
    monkeypatch.setattr(PQ, "offered_formats", lambda headers: frozenset({PQ.PARQUET}))

    async def main() -> None:
        _, server = await start(ServiceConfig(str(tmp_path / "root")))
        url = f"tcp://127.0.0.1:{server.port}"
        try:
            config = ClientConfig(url, tls=server.client_tls(), decode="service", retries=3)
            async with AsyncClient(config) as c:
                await c.create("t", data().schema)
                await c.append("t", data())
                with pytest.raises(P.InvalidRequest, match="which this client did not offer"):
                    await c.read("t")
        finally:
            await server.close()

    asyncio.run(main())
