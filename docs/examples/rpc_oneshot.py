"""RPC over a oneshot: the request carries the channel for its own answer.

Run: python docs/examples/rpc_oneshot.py
"""

import asyncio

from aqueduct_core import Connection, Receiver, connect, oneshot, serve


async def handler(conn: Connection, requests: Receiver) -> None:
    # One task per connection; every request arrives on the entrypoint channel.
    async for request in requests:
        result = sum(request["numbers"])
        request["reply"].send({"sum": result})  # a oneshot send never blocks


async def main() -> None:
    server = await serve(handler)  # 127.0.0.1, a free port, a development certificate
    conn = await connect("127.0.0.1", server.port, tls=server.client_tls())
    reply, answer = oneshot()
    await conn.entrypoint.send({"numbers": [1, 2, 3, 4], "reply": reply})
    print("sum:", (await answer)["sum"])
    conn.entrypoint.finish()
    await conn.close()
    await server.close()


if __name__ == "__main__":
    asyncio.run(main())
