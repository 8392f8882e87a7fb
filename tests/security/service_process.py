"""Helpers for the service attack tests: what /proc says about the server, and an attacking
client in its own process (so its CPU is not the victim's).

Run as ``python tests/security/service_process.py COMMAND URL FINGERPRINT ...``:

- ``flood N OP``: one connection sends N requests ``{"op": OP, "reply": <oneshot>}``
  without waiting for answers (yielding to its event loop every 100 requests, as an asyncio
  client awaiting its sends does) and prints ``SENT`` once the first is answered. Then each
  line on stdin makes it print ``ANSWERED <answers received so far>``, and an empty line
  makes it close the connection and print ``CLOSED``.
- ``burst N OP [TRANSPORT]``: issue 26's client (over ``quic``, or ``tcp``): the project's own ``AsyncClient`` fires N requests
  ``OP`` (``list``, or ``describe`` of dataset ``flood``) at once with ``asyncio.gather``,
  never yielding between them; prints ``FIRST`` when the first answer arrives. Then each
  line on stdin makes it print ``ANSWERED <answers so far>``, or for ``stalled``,
  ``STALLED`` once a request waits for the service's flow-control credit. The test kills it
  (SIGKILL).
- ``stall K DATASET``: one connection plans DATASET and opens K scans of its first split,
  takes the first message of each and stops reading; prints ``OPEN <scans that sent a
  batch> REFUSED <scans refused with a retry_after>`` and waits for a line on stdin,
  then closes and prints ``CLOSED``.
"""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from aqueduct_core.transport import TransportConfig

CLOCK_TICK = os.sysconf("SC_CLK_TCK")


class ProcessStats:
    """CPU time and memory of a process, from /proc/<pid>."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def cpu(self) -> float:
        """Seconds of CPU the process used so far (user + system, every thread)."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICK

    def rss(self) -> int:
        """Resident memory in bytes."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError(f"no VmRSS for process {self.pid}")

    def busy(self, window: float) -> float:
        """Fraction of one core the process used over the next ``window`` seconds."""
        start, t0 = self.cpu(), time.monotonic()
        time.sleep(window)
        return (self.cpu() - start) / (time.monotonic() - t0)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``predicate`` until it holds; returns the seconds it took. Fails after
    ``timeout`` naming ``what`` was awaited."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - start


def client_transport() -> TransportConfig:
    """The transport every client of these tests uses: QUIC, with a 1 MiB flow window (a
    stalled reader then holds little in its own process; the service holds the same)."""
    from aqueduct_core.engine import EngineConfig

    return TransportConfig(engine=EngineConfig(flow_window=1 << 20))


class Remote:
    """This module run as an attacking client in a child process (``env`` and ``cwd``: what
    it runs with, say another source tree's ``PYTHONPATH``). Its lines are read by a thread,
    so that waiting for one times out even when the child says nothing at all."""

    def __init__(
        self,
        command: str,
        url: str,
        fingerprint: str,
        *args: Any,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, command, url, fingerprint, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=None if env is None else {**os.environ, **env},
            cwd=cwd,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")  # the child's stdout closed

    def expect(self, word: str, timeout: float = 60) -> list[str]:
        """Wait for the child's line starting with ``word``; returns its other words."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if not line:
                raise AssertionError(f"the attacking client exited ({self.proc.wait()})")
            if line.startswith(word):
                return line.split()[1:]
        raise AssertionError(f"the attacking client did not say {word} within {timeout} s")

    def tell(self, line: str = "") -> None:
        """Send the child a line (an empty one: close the connection)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the child's side -----------------------------------------------------------------------


async def _connect(url: str, fingerprint: str) -> Any:
    from aqueduct_core.transport import ClientTLS, connect
    from aqueduct_spark import protocol as P

    host, port = url.removeprefix("quic://").rsplit(":", 1)
    return await connect(
        host,
        int(port),
        headers=[(P.H_VERSION, str(P.PROTOCOL_VERSION).encode())],
        tls=ClientTLS(fingerprint=fingerprint),
        config=client_transport(),
    )


async def _stdin_line() -> str:
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return line.strip()


async def flood(url: str, fingerprint: str, n: int, op: str) -> None:
    from aqueduct_core.api import oneshot

    conn = await _connect(url, fingerprint)
    answered = 0
    first = asyncio.Event()

    async def answer(rx: Any) -> None:
        nonlocal answered
        await rx
        answered += 1
        first.set()

    waiting = []  # kept: a dropped receiver would end its request at once

    async def send_all() -> None:
        for i in range(n):
            tx, rx = oneshot()
            await conn.entrypoint.send({"op": op, "dataset": "flood", "reply": tx})
            waiting.append(asyncio.ensure_future(answer(rx)))
            if i % 100 == 99:
                await asyncio.sleep(0)

    sending = asyncio.ensure_future(send_all())
    await first.wait()
    print("SENT", flush=True)  # the flood is on: the service answers it
    while await _stdin_line():
        print(f"ANSWERED {answered}", flush=True)
    await conn.close()
    for task in [sending, *waiting]:
        task.cancel()
    await asyncio.gather(sending, *waiting, return_exceptions=True)
    print("CLOSED", flush=True)


async def burst(url: str, fingerprint: str, n: int, op: str, transport: str = "quic") -> None:
    from aqueduct_core.transport import ClientTLS
    from aqueduct_spark.client import AsyncClient, ClientConfig
    from aqueduct_spark.client.session import CONTROL

    config = ClientConfig(
        url,
        tls=ClientTLS(fingerprint=fingerprint),
        retries=0,
        timeout=600,
        transport=TransportConfig(transport=transport),  # type: ignore[arg-type]
    )
    client = AsyncClient(config)
    await client.list()  # connected: the burst starts on an open connection
    answered = 0

    async def one() -> None:
        nonlocal answered
        await (client.list() if op == "list" else client.describe("flood"))
        answered += 1
        if answered == 1:
            print("FIRST", flush=True)

    calls = asyncio.gather(*(one() for _ in range(n)))
    while line := await _stdin_line():
        if line == "stalled":
            # Wait until a request waits for the service's credit: the service then holds
            # all of this client's requests it may (the test kills us at that moment).
            conn = client._open(CONTROL)
            assert conn is not None
            stalls = conn.flow_stalls().credit
            while conn.flow_stalls().credit == stalls:
                await asyncio.sleep(0.002)
            print("STALLED", flush=True)
        else:
            print(f"ANSWERED {answered}", flush=True)
    await calls


async def stall(url: str, fingerprint: str, k: int, dataset: str) -> None:
    import cbor2

    from aqueduct_core.api import channel, oneshot
    from aqueduct_spark import protocol as P

    conn = await _connect(url, fingerprint)
    tx, rx = oneshot()
    await conn.entrypoint.send({"op": "plan", "dataset": dataset, "reply": tx})
    plan = P.unwrap(await rx)
    scans = []
    for _ in range(k):
        out, data = channel(headers=[(P.H_SCHEMA, plan["schema"])], codec="raw")
        await conn.entrypoint.send({"op": "scan", "split": plan["splits"][0], "out": out})
        scans.append(data)
    opened = refused = 0
    for data in scans:
        first = await data.recv_message()
        error = P.find_header(first.headers, P.H_ERROR)
        if error is None:
            opened += 1
            continue
        exc = P.error_from_wire(cbor2.loads(error))
        if not (isinstance(exc, P.Unavailable) and "retry_after" in exc.details):
            raise exc
        refused += 1
    print(f"OPEN {opened} REFUSED {refused}", flush=True)
    await _stdin_line()
    await conn.close()
    print("CLOSED", flush=True)


if __name__ == "__main__":
    command, url, fingerprint, *rest = sys.argv[1:]
    if command == "flood":
        asyncio.run(flood(url, fingerprint, int(rest[0]), rest[1]))
    elif command == "burst":
        asyncio.run(burst(url, fingerprint, int(rest[0]), *rest[1:]))
    elif command == "stall":
        asyncio.run(stall(url, fingerprint, int(rest[0]), rest[1]))
    else:
        raise SystemExit(f"unknown command {command!r}: flood, burst or stall")
