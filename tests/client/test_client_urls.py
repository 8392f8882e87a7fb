"""Service addresses: what the client accepts, what it refuses (at once, saying what
works), and that each accepted form reaches a real service."""

from __future__ import annotations

import pyarrow as pa
import pytest

from aqueduct_core.transport import ClientTLS
from aqueduct_spark.client import DEFAULT_PORT, Client, Endpoint, parse_endpoints, parse_url
from aqueduct_spark.testing import ServiceProcess, start_service


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("quic://data1:5000", [Endpoint("data1", 5000)]),
        ("aqueduct://data1:5000", [Endpoint("data1", 5000)]),
        ("tcp://data1:5000", [Endpoint("data1", 5000, "tcp")]),
        ("data1:5000", [Endpoint("data1", 5000)]),
        ("data1", [Endpoint("data1", DEFAULT_PORT)]),
        ("quic://data1", [Endpoint("data1", DEFAULT_PORT)]),
        ("QUIC://Data1:5000/", [Endpoint("data1", 5000)]),
        ("quic://[::1]:4433", [Endpoint("::1", 4433)]),
        ("tcp://[2001:db8::7]", [Endpoint("2001:db8::7", DEFAULT_PORT, "tcp")]),
        ("[::1]:5000", [Endpoint("::1", 5000)]),
        ("::1", [Endpoint("::1", DEFAULT_PORT)]),
        ("10.0.0.7:5000", [Endpoint("10.0.0.7", 5000)]),
        (
            "quic://a:1, tcp://b:2,c,",
            [Endpoint("a", 1), Endpoint("b", 2, "tcp"), Endpoint("c", DEFAULT_PORT)],
        ),
    ],
)
def test_accepted_addresses(url: str, expected: list[Endpoint]) -> None:
    assert parse_endpoints(url) == expected
    assert parse_url(url) == [(e.host, e.port) for e in expected]


def test_the_default_port_is_the_one_aqueduct_serve_listens_on() -> None:
    from aqueduct_spark.cli.arguments import DEFAULT_URL, build_parser

    assert parse_url(DEFAULT_URL) == [("127.0.0.1", DEFAULT_PORT)]
    assert build_parser().parse_args(["serve"]).port == DEFAULT_PORT


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://data1:4433", "http:// is not one this client speaks (the service speaks Aqueduct"),
        ("https://data1", "https:// is not one this client speaks"),
        ("udp://data1:4433", "udp:// is not one"),
        ("quic://data1:0", "1 to 65535"),
        ("quic://data1:70000", "'70000' is not a number from 1 to 65535"),
        ("data1:port", "'port' is not a number"),
        ("quic://::1:4433", "an IPv6 address goes in brackets"),
        ("quic://[::1", "Invalid IPv6 URL"),
        ("quic://admin:pw@data1:4433", "give the token option instead"),
        ("quic://data1:4433/trips", "no path"),
        ("quic://:4433", "no host name"),
    ],
)
def test_refused_addresses_say_what_is_wrong_and_what_works(url: str, problem: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_endpoints(url)
    message = str(refused.value)
    assert repr(url.strip()) in message and problem in message
    assert "use quic://host:port (or tcp://host:port" in message
    assert "quic://[::1]:4433" in message  # the IPv6 form is shown


@pytest.mark.parametrize("url", ["", " , ,"])
def test_no_address_at_all(url: str) -> None:
    with pytest.raises(ValueError, match="no service address given: use quic://host:port"):
        parse_endpoints(url)


def test_a_client_with_a_bad_address_fails_when_made_before_any_network() -> None:
    with pytest.raises(ValueError, match="http:// is not one this client speaks"):
        Client("http://127.0.0.1:4433")


def _client(svc: ServiceProcess, url: str) -> Client:
    return Client(url, tls=ClientTLS(fingerprint=svc.fingerprint), retries=0)


def test_each_form_reaches_a_real_service(service: ServiceProcess) -> None:
    port = service.port
    _client(service, f"quic://127.0.0.1:{port}").write("urls", pa.table({"n": [1, 2]}))
    for url in (f"aqueduct://127.0.0.1:{port}", f"127.0.0.1:{port}", f"localhost:{port}"):
        assert _client(service, url).describe("urls").rows == 2, url
    over_tcp = _client(service, f"tcp://127.0.0.1:{port}")
    assert over_tcp.read("urls").num_rows == 2
    assert over_tcp.transport == "tcp"  # tcp:// forces TLS/TCP (the default races QUIC first)


def test_a_list_is_tried_in_order(service: ServiceProcess) -> None:
    """The first address refuses (nothing listens on TCP port 1), the second answers."""
    client = _client(service, f"tcp://127.0.0.1:1, quic://127.0.0.1:{service.port}")
    client.list()
    assert client.transport in ("quic", "tcp")


def test_an_ipv6_literal_reaches_a_service_on_ipv6(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    svc = start_service(tmp_path_factory.mktemp("v6-root"), args=["--host", "::1"])
    try:
        assert svc.url == f"quic://[::1]:{svc.port}"  # what serve prints is usable as is
        for url in (svc.url, f"tcp://[::1]:{svc.port}"):
            client = _client(svc, url)
            client.write("v6", pa.table({"n": [1]}))
            assert client.read("v6").num_rows >= 1, url
    finally:
        svc.stop()
