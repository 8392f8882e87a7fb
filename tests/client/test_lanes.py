"""Which request goes where (issue 28): with the default ``transport=auto`` a client sends the
requests that carry a data channel (``scan``, ``write`` and the ``ping`` that proves a write's
connection) over TLS/TCP, the rest (list, describe, plan, begin, commit, ...) over QUIC, on at
most two connections; ``transport=quic`` or ``tcp`` puts everything on one connection of that
transport. Seen from the service: its access log says which connection carried each request,
and its connection log which transport each connection is.

Between two network namespaces, with nftables dropping UDP (or TCP) from the client's host:
everything goes over the transport that gets through, on one connection, and a client whose
QUIC connection stops getting through in the middle of its work moves it to TCP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from aqueduct_spark.client import AsyncClient, ClientConfig
from aqueduct_spark.service.server import ServiceConfig, start
from benchmarks.realpath_link import Link, require_root, spawn_in, stop, veth_link

CONTROL_OPS = {"list", "describe", "plan", "begin", "commit", "status"}
BULK_OPS = {"scan", "write"}


def carried(records: list[logging.LogRecord]) -> tuple[dict[str, set[str]], int]:
    """From the service's log records: the transports that carried each op, and how many
    connections made requests."""
    transport: dict[str, str] = {}
    ops: dict[str, list[str]] = {}
    for r in records:
        fields = getattr(r, "fields", None)
        if not isinstance(fields, dict):
            continue
        if r.getMessage() == "connection opened":
            transport[fields["peer"]] = fields["transport"]
        elif r.name == "aqueduct.access" and "op" in fields:
            ops.setdefault(fields["op"], []).append(fields["peer"])
    return {op: {transport[p] for p in peers} for op, peers in ops.items()}, len(transport)


def work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, transport: str | None
) -> tuple[dict[str, str], str | None]:
    """A program's usual calls against an in-process service on loopback: list, write
    (begin, write, commit), read (plan, scan); what carried each lane at the end, and what
    ``client.transport`` said."""

    async def main() -> tuple[dict[str, str], str | None]:
        _, server = await start(ServiceConfig(str(tmp_path / "root")))
        try:
            url = f"quic://127.0.0.1:{server.port}"
            tls = server.client_tls()
            config = ClientConfig(url, tls=tls, retries=0, transport=transport or "auto")
            async with AsyncClient(config) as client:
                await client.list()
                await client.write("t", pa.table({"id": list(range(1000))}), mode="overwrite")
                back = await client.read("t")
                assert back.column("id").to_pylist() == list(range(1000))
                return client.transports, client.transport
        finally:
            await server.close()

    with caplog.at_level(logging.INFO, logger="aqueduct"):
        return asyncio.run(asyncio.wait_for(main(), 60))


def test_auto_sends_bulk_over_tcp_and_the_rest_over_quic(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AQUEDUCT_TRANSPORT", raising=False)
    lanes, shown = work(tmp_path, caplog, None)
    assert lanes == {"control": "quic", "bulk": "tcp"}
    assert shown == "quic"  # what `aqueduct status` reports: the control lane
    ops, connections = carried(caplog.records)
    assert connections == 2
    assert CONTROL_OPS & ops.keys() >= {"list", "begin", "commit", "plan"}, ops
    for op in CONTROL_OPS & ops.keys():
        assert ops[op] == {"quic"}, (op, ops)
    for op in BULK_OPS:
        assert ops[op] == {"tcp"}, (op, ops)


@pytest.mark.parametrize("transport", ["quic", "tcp"])
def test_one_transport_named_carries_everything_on_one_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, transport: str
) -> None:
    lanes, _ = work(tmp_path, caplog, transport)
    assert lanes == {"control": transport, "bulk": transport}
    ops, connections = carried(caplog.records)
    assert connections == 1
    assert ops.keys() >= BULK_OPS | {"list", "begin", "commit", "plan"}, ops
    assert set().union(*ops.values()) == {transport}


# -- between two hosts, one transport blocked ---------------------------------------------

CLIENT = """
import json, sys
import pyarrow as pa
from aqueduct_core.transport import ClientTLS, TransportConfig, dial
from aqueduct_core.transport.mux_wire import TcpSettings
from aqueduct_spark.client import Client

url, pin = sys.argv[1], sys.argv[2]
# A QUIC handshake slower than the race delay loses to TCP: 1.5 s, not 250 ms, for a loaded
# machine; a QUIC connection dies 1 s after it stops getting through.
config = TransportConfig(idle_timeout=1.0, tcp=TcpSettings(race_delay=1.5))
client = None
for line in sys.stdin:  # "new": a fresh client, as a new process would have; else work
    if line.strip() == "new":
        if client is not None:
            client.close()
        dial.forget()
        client = Client(url, tls=ClientTLS(fingerprint=pin), transport=config)
        continue
    client.list()
    client.write("t", pa.table({"id": list(range(1000))}), mode="overwrite")
    assert client.read("t").column("id").to_pylist() == list(range(1000))
    print(json.dumps(client.transports), flush=True)
"""

_why_not = require_root("the namespace tests")


def block(link: Link, proto: str | None, port: int) -> None:
    """Drop every ``proto`` (udp, tcp) packet from the client's host to the service's port,
    silently (no ICMP: a firewall, not a closed port); None: drop nothing."""
    ns = link.client_ns
    subprocess.run(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "aqblock"],
                   capture_output=True)  # fmt: skip
    if proto is None:
        return
    rules = (
        "table inet aqblock {\n chain out {\n"
        "  type filter hook output priority 0; policy accept;\n"
        f"  {proto} dport {port} drop\n }}\n}}\n"
    )
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, text=True,
                   check=True)  # fmt: skip


@pytest.mark.slow  # 20 s: two namespaces, a service, a QUIC idle timeout; fast: test_tcp's races
@pytest.mark.skipif(_why_not is not None, reason=_why_not or "")
def test_one_transport_blocked_everything_goes_over_the_other(tmp_path: Path) -> None:
    with veth_link(1500, prefix="aql") as link:
        cmd = ["-m", "aqueduct_spark.cli", "serve", "--root", str(tmp_path / "root")]
        cmd += ["--host", link.server_ip, "--port", "0", "--allow-anonymous"]
        cmd += ["--log-level", "info"]
        with open(tmp_path / "service.log", "w") as log:
            service, banner = spawn_in(link.server_ns, cmd, "AQUEDUCT_READY ", stderr=log)
        try:
            info = json.loads(banner)
            port = int(info["url"].rsplit(":", 1)[1])
            seen = {}
            argv = ["ip", "netns", "exec", link.client_ns, sys.executable, "-c", CLIENT]
            client = subprocess.Popen(
                [*argv, info["url"], info["fingerprint"]],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert client.stdout is not None and client.stdin is not None

            def work(*lines: str) -> Any:
                assert client.stdin is not None and client.stdout is not None
                client.stdin.write("".join(f"{x}\n" for x in lines))
                client.stdin.flush()
                return json.loads(client.stdout.readline())

            try:
                for first, then in (("udp", "udp"), ("tcp", "tcp"), (None, "udp")):
                    block(link, first, port)
                    before = work("new", "work")
                    block(link, then, port)
                    seen[(first, then)] = (before, work("work"))
                client.stdin.close()
                assert client.wait(60) == 0
            finally:
                stop(client)
        finally:
            block(link, None, 0)
            stop(service)
    both = {"control": "tcp", "bulk": "tcp"}
    assert seen[("udp", "udp")] == (both, both)
    quic = {"control": "quic", "bulk": "quic"}
    assert seen[("tcp", "tcp")] == (quic, quic)
    # QUIC stopped getting through mid-job: its requests moved to the TCP connection.
    assert seen[(None, "udp")] == ({"control": "quic", "bulk": "tcp"}, both)
