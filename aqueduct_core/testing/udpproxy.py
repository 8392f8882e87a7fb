"""A UDP relay that drops packets: loss injected at the socket, under real QUIC.

    proxy = await LossyUDPProxy.start(("127.0.0.1", server.port), loss=0.2, seed=1)
    conn = await connect("127.0.0.1", proxy.port, ...)

Packets in both directions are dropped with probability ``loss`` (seeded). QUIC retransmits
stream data; DATAGRAM frames in a dropped packet are gone for good.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any


class _Upstream(asyncio.DatagramProtocol):
    def __init__(self, proxy: LossyUDPProxy, client_addr: Any) -> None:
        self.proxy = proxy
        self.client_addr = client_addr
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.proxy._relay(data, self.proxy._front, self.client_addr)


class LossyUDPProxy(asyncio.DatagramProtocol):
    def __init__(self, target: tuple[str, int], loss: float, seed: int) -> None:
        self.target = target
        self.loss = loss
        self.rng = random.Random(seed)
        self.port = 0
        self.forwarded = 0
        self.dropped = 0
        self._front: asyncio.DatagramTransport | None = None
        self._upstreams: dict[Any, _Upstream] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(cls, target: tuple[str, int], loss: float, seed: int = 0) -> LossyUDPProxy:
        loop = asyncio.get_running_loop()
        proxy = cls(target, loss, seed)
        transport, _ = await loop.create_datagram_endpoint(
            lambda: proxy, local_addr=("127.0.0.1", 0)
        )
        proxy.port = transport.get_extra_info("sockname")[1]
        return proxy

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._front = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        upstream = self._upstreams.get(addr)
        if upstream is None:
            upstream = self._upstreams[addr] = _Upstream(self, addr)
            task = asyncio.get_running_loop().create_task(self._open(upstream, data))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._relay(data, upstream.transport, self.target)

    async def _open(self, upstream: _Upstream, first: bytes) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: upstream, local_addr=("127.0.0.1", 0))
        self._relay(first, upstream.transport, self.target)

    def _relay(self, data: bytes, transport: asyncio.DatagramTransport | None, addr: Any) -> None:
        if transport is None:
            return
        if self.rng.random() < self.loss:
            self.dropped += 1
            return
        self.forwarded += 1
        transport.sendto(data, addr)

    def close(self) -> None:
        for upstream in self._upstreams.values():
            if upstream.transport is not None:
                upstream.transport.close()
        if self._front is not None:
            self._front.close()
