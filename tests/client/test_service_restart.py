"""After the service restarts (SIGKILL, then a new process on the same port and root), a
client goes on within seconds with default options: the new process answers packets of the
old connection with a stateless reset, so the client does not wait out its idle timeout
(30 s). Issue 17's target: 3 s. The figure is printed.

A write cannot be retried (its batches are consumed as they are sent): it goes out on a
connection proven alive, so the dead pooled connection costs a new one, not the write."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from aqueduct_core.transport import ClientTLS
from aqueduct_spark.client import Client
from aqueduct_spark.client.session import BULK, PROBE_AFTER
from aqueduct_spark.testing import start_service

pytestmark = pytest.mark.fault


class Restartable:
    """A service process that a test kills (SIGKILL: no goodbye to anyone) and starts again
    on the same port and root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.services = [start_service(root)]

    def client(self, transport: str = "quic", **options: Any) -> Client:
        """A client with default options (only the certificate pinned), or ``options``."""
        svc = self.services[0]
        url = svc.url.replace("quic://", f"{transport}://")
        return Client(url, tls=ClientTLS(fingerprint=svc.fingerprint), **options)

    def kill(self) -> None:
        self.services[-1].kill()

    def start_again(self) -> float:
        """Start a new process; returns when it was ready (``time.monotonic()``)."""
        self.services.append(start_service(self.root, port=self.services[0].port))
        return time.monotonic()

    def stop(self) -> None:
        for s in self.services:
            s.stop()


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Restartable]:
    svc = Restartable(tmp_path / "root")
    yield svc
    svc.stop()


@pytest.mark.parametrize("transport", ["quic", "tcp"])
def test_a_pooled_client_goes_on_within_3_s_of_a_service_restart(
    restartable: Restartable, transport: str
) -> None:
    client = restartable.client(transport)
    client.write("t", pa.table({"n": list(range(50))}))
    assert client.read("t").num_rows == 50  # the pooled connection is in use

    restartable.kill()
    ready = restartable.start_again()
    table = client.read("t")  # over the connection the old process had
    took = time.monotonic() - ready
    print(f"{transport}: a read {took:.2f} s after the restarted service was ready")
    assert table.num_rows == 50
    assert took < 3.0


@pytest.mark.parametrize("transport", ["quic", "tcp"])
def test_a_write_on_a_pooled_connection_the_restart_killed_succeeds(
    restartable: Restartable, transport: str
) -> None:
    client = restartable.client(transport)
    client.write("t", pa.table({"n": list(range(50))}))
    txn = client.begin("t", pa.schema([("n", pa.int64())]))  # before the restart
    # The client trusts a connection that answered within PROBE_AFTER (1 s) and proves a
    # quieter one with a ping before a write. The case here is the quiet one: at low load
    # the kill and the new process's start took 0.97 s after the begin's answer, and the
    # write went out, unproven, on the dead connection (ConnectionLost).
    time.sleep(PROBE_AFTER)
    restartable.kill()
    ready = restartable.start_again()
    staged = client.write_task(txn, [pa.record_batch({"n": list(range(50, 80))})])
    took = time.monotonic() - ready
    print(f"{transport}: a write {took:.2f} s after the restarted service was ready")
    client.commit(txn, [staged])
    assert sorted(client.read("t").column("n").to_pylist()) == list(range(80))
    assert took < 3.0


def test_a_write_that_fails_on_a_lost_connection_raises_its_own_error(
    restartable: Restartable,
) -> None:
    """The batches' own error, not the ConnectionLost of cancelling the data channel."""
    client = restartable.client()
    client.write("t", pa.table({"n": [0]}))
    txn = client.begin("t", pa.schema([("n", pa.int64())]))
    session = client._client

    def batches() -> Iterator[pa.RecordBatch]:
        yield pa.record_batch({"n": [1, 2]})
        conn = session._open(BULK)  # the write's connection
        assert conn is not None
        asyncio.run_coroutine_threadsafe(conn.close(), client._portal.loop).result(5)
        raise RuntimeError("the batches failed")

    with pytest.raises(RuntimeError, match="the batches failed"):
        client.write_task(txn, batches())


def test_a_request_made_while_the_service_restarts_waits_for_it(
    restartable: Restartable,
) -> None:
    """A client that reached the service before presumes it restarts: a request made while
    nothing listens waits for it (up to the request timeout) instead of failing within the
    connect_timeout meant for a service that was never there. (A 3 s connect_timeout, not
    the default 15 s: the service stays away longer than it either way, 12 s sooner.)"""
    client = restartable.client(connect_timeout=3.0)
    client.write("t", pa.table({"n": list(range(5))}))
    restartable.kill()
    answered: list[Any] = []
    reader = threading.Thread(target=lambda: answered.append(client.read("t").num_rows))
    reader.start()
    time.sleep(client.config.connect_timeout + 1)  # the service is away this long
    ready = restartable.start_again()
    reader.join(30)
    took = time.monotonic() - ready
    print(f"a read made during the restart answered {took:.2f} s after it was ready")
    assert answered == [5]
    assert took < 3.0  # issue 17: within 3 s (0.3-0.5 s at idle; 1.4 s seen at load 8)
