"""An unreliable telemetry channel: datagrams, never retransmitted, never duplicated.

Readings that are lost stay lost (the newest value matters, not every value); the sender
never waits. Over loopback nearly everything arrives.

Run: python docs/examples/unreliable_telemetry.py
"""

import asyncio

from aqueduct_core import Connection, Receiver, channel, connect, serve


async def handler(conn: Connection, requests: Receiver) -> None:
    async for request in requests:
        readings = request["readings"]
        received = [r async for r in readings]  # ends when the client finishes
        print(f"server: {len(received)} readings, last {received[-1] if received else None}")


async def main() -> None:
    server = await serve(handler)
    conn = await connect("127.0.0.1", server.port, tls=server.client_tls())
    tx, rx = channel()
    tx.unreliable(maxsize=64)  # datagrams; when 64 wait, the oldest is dropped
    await conn.entrypoint.send({"readings": rx})
    for i in range(100):
        tx.send_nowait({"sensor": "t1", "celsius": 20 + i / 100})
        await asyncio.sleep(0.001)
    tx.finish()
    await tx.wait_closed()  # the server has seen everything that made it
    conn.entrypoint.finish()
    await conn.close()
    await server.close()


if __name__ == "__main__":
    asyncio.run(main())
