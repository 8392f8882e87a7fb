"""A service that is not there fails fast, naming the URL and how to start one: a real closed
port (the host answers at once: ICMP port unreachable, TCP reset), a real silent one (a UDP
socket and a TCP listener that never answer), through the Python client and the CLI (Spark:
``tests/spark/test_spark_unreachable.py``). And
every client takes the service's address, token and fingerprint from the environment."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from aqueduct_core.errors import ConnectionLost
from aqueduct_core.transport import ClientTLS
from aqueduct_spark.cli import main as cli
from aqueduct_spark.client import (
    CannotConnect,
    Client,
    ClientConfig,
    ServiceUnreachable,
    connecting,
)
from aqueduct_spark.testing import ServiceProcess, closed_port, start_service

HANDSHAKE_TIMEOUT = ClientConfig("quic://x").transport.handshake_timeout
"""What a silent port would cost an attempt that did not keep to its budget (10 s)."""


class Silent:
    """A port where packets arrive and nothing ever answers: a UDP socket that never reads,
    and a TCP listener whose kernel completes the handshake but which never speaks TLS."""

    def __init__(self, tcp: socket.socket, udp: socket.socket) -> None:
        self.tcp, self.udp = tcp, udp
        self.port: int = tcp.getsockname()[1]

    def contacted(self) -> bool:
        """Whether anything reached the port: a TCP connection or a UDP datagram (on
        loopback both arrive within the sender's own system call)."""
        self.tcp.setblocking(False)
        self.udp.setblocking(False)
        for receive in (self.tcp.accept, lambda: self.udp.recv(65536)):
            try:
                receive()
            except BlockingIOError:
                continue
            return True
        return False


@pytest.fixture
def silent() -> Iterator[Silent]:
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("127.0.0.1", 0))
        udp.bind(("127.0.0.1", tcp.getsockname()[1]))
        tcp.listen(16)
        yield Silent(tcp, udp)


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Each connection attempt the client makes (an address of its URL, QUIC and TCP raced
    or one alone): the port and how it ended (``connected`` or the exception's class)."""
    made: list[tuple[int, str]] = []
    real = connecting.connect

    async def attempt(host: str, port: int, **kw: Any) -> Any:
        try:
            conn = await real(host, port, **kw)
        except BaseException as exc:
            made.append((port, type(exc).__name__))
            raise
        made.append((port, "connected"))
        return conn

    monkeypatch.setattr(connecting, "connect", attempt)
    return made


@pytest.mark.parametrize("scheme,transport", [("quic", "auto"), ("quic", "quic"), ("tcp", "tcp")])
def test_a_wrong_port_fails_fast_naming_the_url_and_aqueduct_serve(
    scheme: str, transport: str, attempts: list[tuple[int, str]]
) -> None:
    """Fast, counted rather than timed (a wall-clock bound fails on a loaded machine): every
    round (1 + ``retries``) was refused by the host at once, and all of them fitted in the
    connect budget (15 s), which a round that waited for an answer would not have."""
    port = closed_port()
    url = f"{scheme}://127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(ServiceUnreachable) as failed:
        Client(url, transport=transport).list()  # default retries and timeouts
    took = time.monotonic() - started
    message = str(failed.value)
    print(f"{transport}: failed after {took:.2f} s: {message}")
    rounds = ClientConfig.retries + 1
    assert attempts == [(port, "Refused")] * rounds  # the host's answer, each time
    assert f"(tried {rounds} times in " in message
    assert url in message and "nothing listens there" in message
    assert "aqueduct serve --port" in message
    assert "firewall" not in message  # the host said the port is closed: no need to guess
    assert isinstance(failed.value, ConnectionLost)  # still caught where lost connections are


def test_an_http_url_fails_at_once(silent: Silent) -> None:
    """Refused before any attempt: nothing reaches the port."""
    with pytest.raises(ValueError, match="not HTTP"):
        Client(f"http://127.0.0.1:{silent.port}").list()
    assert not silent.contacted()


def test_a_silent_service_fails_within_the_connect_timeout(silent: Silent) -> None:
    """Nothing answers at all (a firewall that drops): the client gives up at its budget, not
    after the handshake timeout (10 s) times the attempts (the default budget, 15 s, is not
    waited out here). Timed because the behaviour is about time: no sooner than the budget,
    and well before the handshake timeout (the margin is for a loaded machine)."""
    url = f"quic://127.0.0.1:{silent.port}"
    started = time.monotonic()
    with pytest.raises(ServiceUnreachable) as failed:
        Client(url, connect_timeout=3.0).list()
    took = time.monotonic() - started
    print(f"a silent service: failed after {took:.2f} s")
    assert 2.9 <= took < HANDSHAKE_TIMEOUT - 2  # 0.1 s for two clocks read apart
    message = str(failed.value)
    assert url in message and "no answer within 3 s" in message
    assert "aqueduct serve" in message and "firewall" in message
    assert silent.contacted()  # it was tried, and heard nothing


def test_the_connect_timeout_is_an_option(silent: Silent) -> None:
    """The option, not the default budget (15 s), bounds the wait: no sooner than it, and
    well before the handshake timeout (10 s)."""
    started = time.monotonic()
    with pytest.raises(ServiceUnreachable, match="no answer within 1 s"):
        Client(f"tcp://127.0.0.1:{silent.port}", connect_timeout=1.0).list()
    assert 0.9 <= time.monotonic() - started < HANDSHAKE_TIMEOUT - 2


def test_the_next_address_is_tried_within_the_same_budget(
    service: ServiceProcess, attempts: list[tuple[int, str]]
) -> None:
    """A closed port first, then the service: the host refuses the first at once, and the
    client goes on to the second in the same round (no pause, no second round)."""
    closed = closed_port()
    url = f"quic://127.0.0.1:{closed},{service.url}"
    client = Client(url, tls=ClientTLS(fingerprint=service.fingerprint))
    try:
        assert client.list() == []
    finally:
        client.close()
    assert attempts == [(closed, "Refused"), (service.port, "connected")]


def test_a_name_that_does_not_resolve_still_fails_at_once(
    attempts: list[tuple[int, str]],
) -> None:
    """It cannot heal, so it is not retried: one attempt, and the message says what to fix."""
    with pytest.raises(CannotConnect, match="does not resolve") as failed:
        Client("quic://no-such-service.invalid:4433").list()
    assert len(attempts) == 1
    assert "no-such-service.invalid" in str(failed.value) and "check the host" in str(failed.value)


def test_the_cli_fails_fast_on_a_wrong_port(capsys: pytest.CaptureFixture[str]) -> None:
    """Fast, counted rather than timed (a wall-clock bound fails on a loaded machine): the
    client's own rounds (1 + ``retries``, every one answered at once by the closed port) and
    nothing around them (the CLI does not retry an unreachable service)."""
    url = f"quic://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    assert cli(["ls", "--url", url]) == 1
    took = time.monotonic() - started
    err = capsys.readouterr().err
    print(f"aqueduct ls: failed after {took:.2f} s: {err}")
    assert url in err and "aqueduct serve" in err
    assert "nothing listens there" in err  # the host's answer, not a timeout
    assert f"(tried {ClientConfig.retries + 1} times in " in err  # no more rounds
    assert err.count("cannot reach") == 1  # one failure reported: no retry around it
    assert "ServiceUnreachable" not in err  # no class names (issue 20, item 9)
    assert took < 60  # a backstop: the default pauses add up to 2.8 s at most


def test_the_cli_refuses_an_http_url_at_once(
    capsys: pytest.CaptureFixture[str], silent: Silent
) -> None:
    """A usage error (exit 2) before any attempt: nothing reaches the port."""
    assert cli(["ls", "--url", f"http://127.0.0.1:{silent.port}"]) == 2
    assert not silent.contacted()
    err = capsys.readouterr().err
    assert "not HTTP" in err and "quic://host:port" in err


# -- the environment -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("env-root"), token="env-token")
    yield svc
    svc.stop()


@pytest.fixture
def environment(secured: ServiceProcess, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {
        "AQUEDUCT_URL": secured.url,
        "AQUEDUCT_TOKEN": "env-token",
        "AQUEDUCT_FINGERPRINT": secured.fingerprint,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_the_python_client_reads_url_token_and_fingerprint_from_the_environment(
    environment: dict[str, str],
) -> None:
    client = Client()
    assert client.list() == []
    assert client.config.url == environment["AQUEDUCT_URL"]
    client.close()


def test_given_settings_win_over_the_environment(
    environment: dict[str, str], secured: ServiceProcess
) -> None:
    wrong = Client(secured.url, token="not-the-token", retries=0)
    with pytest.raises(Exception, match="token"):
        wrong.list()
    assert Client(secured.url, tls=ClientTLS(insecure=True)).config.tls.fingerprint is None


def test_no_url_anywhere_names_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AQUEDUCT_URL", raising=False)
    with pytest.raises(ValueError, match="AQUEDUCT_URL"):
        Client()


def test_spark_options_read_the_fingerprint_from_the_environment(
    environment: dict[str, str],
) -> None:
    from aqueduct_spark.datasource.options import parse

    opts = parse({"path": "t"})
    assert opts.url == environment["AQUEDUCT_URL"]
    assert opts.token == "env-token"
    assert opts.fingerprint == environment["AQUEDUCT_FINGERPRINT"]
    config = opts.client_config()
    assert config.tls.fingerprint == environment["AQUEDUCT_FINGERPRINT"]
    # An explicit way to trust wins over the environment's fingerprint.
    assert parse({"path": "t", "insecure": "true"}).fingerprint is None


def test_the_cli_reads_the_environment(
    environment: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["ls"]) == 0, capsys.readouterr().err
