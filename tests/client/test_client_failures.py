"""Failures that cannot heal fail at once, naming the problem and the fix; failures that can
heal are retried under the one retry policy. Each through a real resolver or a real service."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pyarrow as pa
import pytest

from aqueduct_core.errors import ConnectionLost
from aqueduct_core.transport import ClientTLS
from aqueduct_spark import protocol as P
from aqueduct_spark.client import (
    CannotConnect,
    Client,
    ClientConfig,
    RetryPolicy,
    ServiceUnreachable,
)
from aqueduct_spark.client.failures import Kind, classify
from aqueduct_spark.client.retry import Retrying
from aqueduct_spark.testing import ServiceProcess, start_service

WRONG_PIN = ":".join(["AB"] * 32)


@pytest.fixture
def retries(caplog: pytest.LogCaptureFixture) -> Any:
    """How many times the client said it retries (its warnings), read after the call."""
    caplog.set_level(logging.WARNING, logger="aqueduct.client")
    return lambda: sum("retrying" in r.getMessage() for r in caplog.records)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    svc = start_service(tmp_path_factory.mktemp("secured-root"), token="right-token")
    yield svc
    svc.stop()


def patient(url: str, **fields: Any) -> Client:
    """A client that would retry often (so a retry would show)."""
    return Client(url, retries=3, retry_backoff=0.01, **fields)


@pytest.mark.parametrize("scheme", ["quic", "tcp"])
def test_a_host_name_that_does_not_resolve_fails_at_once(scheme: str, retries: Any) -> None:
    with pytest.raises(CannotConnect) as failed:
        patient(f"{scheme}://no-such-service.invalid:4433").list()
    message = str(failed.value)
    assert f"{scheme}://no-such-service.invalid:4433" in message
    assert "does not resolve" in message and "check the host in the URL" in message
    assert retries() == 0


@pytest.mark.parametrize("transport", ["quic", "tcp", "auto"])
def test_a_wrong_fingerprint_fails_at_once(
    service: ServiceProcess, transport: str, retries: Any
) -> None:
    client = patient(service.url, tls=ClientTLS(fingerprint=WRONG_PIN), transport=transport)
    with pytest.raises(CannotConnect) as failed:
        client.list()
    message = str(failed.value)
    assert f"127.0.0.1:{service.port}" in message
    assert "does not have the pinned fingerprint" in message and "ready line" in message
    assert retries() == 0
    assert isinstance(failed.value, ConnectionLost)  # still caught where lost connections are


@pytest.mark.parametrize("transport", ["quic", "tcp"])
def test_an_untrusted_certificate_fails_at_once(
    service: ServiceProcess, transport: str, retries: Any
) -> None:
    """No fingerprint and no CA file: the system CAs do not know the development CA."""
    with pytest.raises(CannotConnect) as failed:
        patient(service.url, transport=transport).list()
    message = str(failed.value)
    assert "TLS handshake failed" in message
    assert "fingerprint" in message and ".aqueduct-tls/ca.pem" in message
    assert retries() == 0


@pytest.mark.parametrize("token", ["wrong-token", None])
def test_a_wrong_or_missing_token_fails_at_once(
    secured: Any, token: str | None, retries: Any
) -> None:
    client = patient(secured.url, tls=ClientTLS(fingerprint=secured.fingerprint), token=token)
    with pytest.raises(P.Unauthenticated, match="set the 'token' option"):
        client.list()
    assert retries() == 0
    right = patient(
        secured.url, tls=ClientTLS(fingerprint=secured.fingerprint), token="right-token"
    )
    assert right.list() == []


def test_a_service_that_is_not_there_is_retried_then_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing listens on TCP port 1: that may heal (a service starting), so connecting is
    tried ``retries`` more times, then reported as unreachable, not as a configuration
    error; the request itself is not retried on top of that."""
    caplog.set_level(logging.DEBUG, logger="aqueduct.client")
    with pytest.raises(ServiceUnreachable) as failed:
        Client("tcp://127.0.0.1:1", retries=2, retry_backoff=0.01).list()
    assert not isinstance(failed.value, CannotConnect)
    assert "cannot reach the dataset service at tcp://127.0.0.1:1" in str(failed.value)
    assert sum("trying again" in r.getMessage() for r in caplog.records) == 2
    assert not any("retrying" in r.getMessage() for r in caplog.records)


def test_one_address_that_can_heal_keeps_the_retries(caplog: pytest.LogCaptureFixture) -> None:
    """Of two addresses, one does not resolve and one refuses: the second may come up."""
    caplog.set_level(logging.DEBUG, logger="aqueduct.client")
    url = "tcp://no-such-service.invalid:4433,tcp://127.0.0.1:1"
    with pytest.raises(ServiceUnreachable) as failed:
        Client(url, retries=1, retry_backoff=0.01).list()
    assert not isinstance(failed.value, CannotConnect)
    assert "does not resolve" in str(failed.value) and "127.0.0.1:1" in str(failed.value)
    assert sum("trying again" in r.getMessage() for r in caplog.records) == 1


def test_a_subscription_ends_on_a_failure_that_cannot_heal(secured: Any) -> None:
    client = Client(
        secured.url, tls=ClientTLS(fingerprint=secured.fingerprint), token="wrong-token"
    )
    states: list[bool] = []
    future = client.subscribe("anything", lambda v: None, states.append)
    with pytest.raises(P.Unauthenticated):
        future.result(30)
    assert states == []  # never alive


def test_a_subscription_keeps_waiting_for_a_dataset_to_appear(service: ServiceProcess) -> None:
    """A missing dataset can heal (someone creates it): the subscription retries it."""
    client = service.client()
    seen = threading.Event()
    versions: list[int] = []

    def on_version(v: int) -> None:
        versions.append(v)
        seen.set()

    future = client.subscribe("appears-later", on_version, lambda alive: None)
    try:
        client.write("appears-later", pa.table({"n": [1]}))
        assert seen.wait(30), "the subscription gave up on a dataset that was then created"
        assert versions[-1] == 0
    finally:
        future.cancel()


# -- the policy itself -------------------------------------------------------------------


def test_failures_are_classified_by_whether_they_can_heal() -> None:
    class Forbidden(P.DatasetError):
        permanent = True

    assert classify(P.Unauthenticated("no")) is Kind.PERMANENT
    assert classify(P.InvalidRequest("bad")) is Kind.PERMANENT
    assert classify(Forbidden("marked by the service's class")) is Kind.PERMANENT
    assert classify(CannotConnect("x")) is Kind.PERMANENT
    assert classify(ServiceUnreachable("tried for 5 s")) is Kind.UNREACHABLE
    assert classify(ConnectionLost("gone")) is Kind.TRANSIENT
    assert classify(ConnectionRefusedError()) is Kind.TRANSIENT
    assert classify(P.Unavailable("busy", {"retry_after": 0.5})) is Kind.WAIT
    assert classify(P.DatasetNotFound("nope")) is Kind.OTHER
    assert classify(asyncio.CancelledError()) is Kind.OTHER


def test_backoff_doubles_with_jitter_up_to_the_cap_and_the_attempts() -> None:
    tries = Retrying(RetryPolicy(retries=4, backoff=0.1, max_backoff=0.3))
    pauses = [tries.delay(ConnectionLost("gone")) for _ in range(5)]
    bases = [0.1, 0.2, 0.3, 0.3]
    for pause, base in zip(pauses, bases, strict=False):
        assert pause is not None and base <= pause <= 2 * base
    assert pauses[4] is None  # four retries, then give up
    tries.reset()
    assert tries.delay(ConnectionLost("gone")) is not None


def test_retry_after_is_honoured_for_the_patience_only() -> None:
    tries = Retrying(RetryPolicy(retries=0, patience=1.0))
    busy = P.Unavailable("too many scans", {"retry_after": 0.4})
    pause = tries.delay(busy)
    assert pause is not None and 0.4 <= pause <= 0.8  # retries=0 does not apply to waits
    assert tries.delay(P.Unavailable("busy", {"retry_after": 5.0})) is None  # past patience
    assert tries.delay(P.DatasetNotFound("nope")) is None


def test_a_watcher_retries_other_failures_for_ever() -> None:
    tries = Retrying(RetryPolicy.of(ClientConfig("quic://h", retries=1)).watching())
    for _ in range(100):
        assert tries.delay(P.DatasetNotFound("not yet")) is not None
        assert tries.delay(ServiceUnreachable("down for now")) is not None
    assert Retrying(RetryPolicy()).delay(ServiceUnreachable("down")) is None  # a request
    assert tries.delay(P.Unauthenticated("no")) is None
