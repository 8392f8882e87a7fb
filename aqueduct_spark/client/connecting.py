"""Opening a connection to the service, within ``connect_timeout``.

Every address of the URL is tried in turn (each over the configured transport: QUIC and
TCP raced by default, the one the request's lane prefers first), and the round again after a
pause, for at most ``retries`` more rounds and ``connect_timeout`` seconds in all, pauses
included. How each attempt failed decides:

- a failure that cannot heal (a host name that does not resolve, a certificate that is not
  trusted or not the pinned one) on every address raises :class:`CannotConnect` at once;
- otherwise (nothing listens, nothing answers) the next round may succeed, as when the
  service is starting; when the rounds or the time run out, :class:`ServiceUnreachable`
  names the URL, what each address answered, and how to start a service.

A port nobody listens on costs a round trip per attempt: the host says so at once (a TCP
reset, an ICMP port unreachable that the QUIC attempt hears on its connected socket), so the
whole budget of rounds ends in about 1-3 s. A host that drops everything silently is given
the whole ``connect_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aqueduct_core.api import Connection
from aqueduct_core.errors import ConnectionLost
from aqueduct_core.transport import Refused, connect
from aqueduct_core.transport.config import is_loopback
from aqueduct_spark.client.config import ClientConfig
from aqueduct_spark.client.failures import CannotConnect, ServiceUnreachable, connect_problem
from aqueduct_spark.client.retry import Retrying, RetryPolicy
from aqueduct_spark.client.urls import DEFAULT_PORT, Endpoint

log = logging.getLogger("aqueduct.client")


async def open_connection(
    config: ClientConfig,
    endpoints: Sequence[Endpoint],
    headers: list[tuple[bytes, bytes]],
    prefer: str = "quic",
) -> Connection:
    """A connection to the first address of ``endpoints`` that answers (see the module's
    docstring), over the transport ``prefer``red when both are raced; raises CannotConnect
    or ServiceUnreachable."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    budget = config.connect_timeout
    tries = Retrying(RetryPolicy.of(config))
    rounds = 0
    while True:
        rounds += 1
        lost: list[tuple[Endpoint, str]] = []  # failures that may heal (a service starting)
        wrong: list[tuple[Endpoint, str]] = []  # failures that cannot, as configured
        refused = 0
        for endpoint in endpoints:
            remaining = started + budget - loop.time()
            if remaining <= 0:
                lost.append((endpoint, f"no answer within {budget:g} s"))
                continue
            try:
                async with asyncio.timeout(remaining):
                    return await connect(
                        endpoint.host,
                        endpoint.port,
                        transport=endpoint.transport,
                        headers=headers,
                        tls=config.tls,
                        config=config.connection_config(),
                        prefer=prefer,
                    )
            except TimeoutError:
                lost.append((endpoint, f"no answer within {budget:g} s"))
            except (ConnectionLost, OSError) as exc:
                problem = await connect_problem(endpoint, exc)
                if problem is not None:
                    wrong.append((endpoint, problem))
                elif isinstance(exc, Refused):
                    refused += 1
                    lost.append((endpoint, f"nothing listens there ({exc.reason})"))
                else:
                    lost.append((endpoint, str(exc)))
            # Only the words are kept: an exception would keep its traceback's frames, and
            # with them the failed attempt's sockets, alive until the next collection.
        if not lost:
            # No exception chained on purpose (see above): the message says it all.
            raise CannotConnect(
                "cannot connect to the dataset service at " + _each(config.url, wrong)
            )
        elapsed = loop.time() - started
        pause = tries.delay(ConnectionLost("unreachable"))
        if pause is None or elapsed + pause >= budget:
            raise ServiceUnreachable(
                unreachable_message(
                    config.url, endpoints, lost + wrong, elapsed, refused > 0, rounds
                )
            )
        log.debug("cannot reach %s yet (%s); trying again in %.2f s", config.url, lost, pause)
        await asyncio.sleep(pause)


def _each(url: str, answers: list[tuple[Endpoint, str]]) -> str:
    """``url: why`` for one address; ``url: first: why; second: why`` for several."""
    if len(answers) == 1:
        return f"{url}: {answers[0][1]}"
    return f"{url}: " + "; ".join(f"{endpoint}: {why}" for endpoint, why in answers)


def unreachable_message(
    url: str,
    endpoints: Sequence[Endpoint],
    answers: list[tuple[Endpoint, str]],
    elapsed: float,
    refused: bool,
    rounds: int = 1,
) -> str:
    """What a user reads when no address answered: the URL, what each said, how many times
    (``rounds`` over every address) in how long, and the fix."""
    ports = {e.port for e in endpoints}
    port = next(iter(ports)) if len(ports) == 1 else DEFAULT_PORT
    serve = "aqueduct serve" + ("" if port == DEFAULT_PORT else f" --port {port}")
    where = "" if all(is_loopback(e.host) for e in endpoints) else " on that host"
    fix = (
        f"Is the service running? Start it with `{serve}`{where}, or correct the host and "
        "port in the URL (option url, env AQUEDUCT_URL)"
    )
    if not refused:
        fix += "; if it is running, a firewall may drop UDP and TCP to that port"
    return (
        f"cannot reach the dataset service at {_each(url, answers)} "
        f"(tried {_times(rounds)} in {elapsed:.1f} s). {fix}."
    )


def _times(rounds: int) -> str:
    return "once" if rounds == 1 else f"{rounds} times"
