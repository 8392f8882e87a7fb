"""Push notifications: a subscription that hears each new version of a dataset, kept alive
across lost connections and a service that went away without a word."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import cbor2

from aqueduct_core.api import channel
from aqueduct_core.errors import EndOfChannel
from aqueduct_spark import protocol as P
from aqueduct_spark.client.retry import Retrying, RetryPolicy
from aqueduct_spark.client.session import Session, log


class Subscriptions(Session):
    """The push side of :class:`~aqueduct_spark.client.AsyncClient`."""

    async def subscribe(
        self,
        name: str,
        on_version: Callable[[int], None],
        on_state: Callable[[bool], None] = lambda alive: None,
    ) -> None:
        """Call ``on_version(v)`` with each newer version the service pushes, until
        cancelled; reconnects with backoff. ``on_state`` says whether pushes are flowing.

        The service re-sends the latest version as a heartbeat when nothing happened for a
        while (it says how often in each note): a subscription that hears nothing for three
        heartbeats is treated as dead (the service went away without a word, e.g. killed or
        restarted) and reconnects over a new connection. A failure that cannot heal (see
        :mod:`~aqueduct_spark.client.failures`) ends it with that error."""
        tries = Retrying(RetryPolicy.of(self.config).watching())
        while True:
            alive = False
            try:
                conn = await self._connection()
                tx, rx = channel()
                await conn.entrypoint.send({"op": "subscribe", "dataset": name, "out": tx})
                silence: float | None = None  # until the first note says the heartbeat
                try:
                    while True:
                        try:
                            delivery = await asyncio.wait_for(rx.recv_message(), silence)
                        except TimeoutError:
                            # The connection is dead (the service cannot say so: a restarted
                            # one does not know it). Close it, so requests waiting on it fail
                            # and retry now on a new one instead of at the idle timeout.
                            log.info("subscription to %s went silent; reconnecting", name)
                            self._drop_connection(conn)
                            break
                        except EndOfChannel:
                            break
                        error = P.find_header(delivery.headers, P.H_ERROR)
                        if error is not None:
                            raise P.error_from_wire(cbor2.loads(error))
                        note = delivery.value
                        if isinstance(note, Mapping) and isinstance(note.get("version"), int):
                            beat = note.get("heartbeat")
                            if isinstance(beat, int | float) and beat > 0:
                                silence = 3 * float(beat)
                            if not alive:
                                alive = True
                                on_state(True)
                            on_version(note["version"])
                            tries.reset()
                finally:
                    rx.close()
            except asyncio.CancelledError:
                on_state(False)
                raise
            except Exception as exc:  # report, back off, subscribe again (if it can heal)
                pause = tries.delay(exc)
                if pause is None:
                    log.warning("subscription to %s failed: %s", name, exc)
                    if alive:
                        on_state(False)
                    raise
                log.info("subscription to %s interrupted (%s); retrying", name, exc)
                self._forget_failed(exc)
            else:
                pause = tries.backoff()  # the channel ended, or went silent
            if alive:
                on_state(False)
            await asyncio.sleep(pause)
