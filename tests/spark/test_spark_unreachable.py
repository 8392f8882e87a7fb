"""A Spark read of a closed port fails fast with the client's message: the URL and how to
start a service. Counted rather than timed (Spark's own share of the time, a Python worker
started to ask the source for its schema, grows with the machine's load): the client's
rounds, each answered at once by the closed port, and one failure, not retried."""

from __future__ import annotations

import time
from typing import Any

import pytest

from aqueduct_spark.client import ClientConfig
from aqueduct_spark.testing import closed_port

pytestmark = pytest.mark.spark


def test_a_spark_read_of_a_wrong_port_fails_fast_with_the_clients_message(spark: Any) -> None:
    url = f"quic://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    with pytest.raises(Exception) as failed:
        spark.read.format("aqueduct").options(url=url, fingerprint="AB" * 32).load(
            "trips"
        ).collect()
    took = time.monotonic() - started
    message = str(failed.value)
    print(f"a Spark read of a wrong port failed after {took:.2f} s")
    assert url in message and "aqueduct serve" in message, message
    assert "nothing listens there" in message, message  # the host's answer, not a timeout
    # The default rounds (1 + retries, the pauses between them 2.8 s at most), no more.
    assert f"(tried {ClientConfig.retries + 1} times in " in message, message
    assert took < 60  # a backstop only: Spark alone takes ~2 s here, more under load
