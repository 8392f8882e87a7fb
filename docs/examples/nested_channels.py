"""A tree of channels: channels travel inside messages, in both directions.

The client asks for a directory listing; the server answers with one channel per directory,
each of which carries the files in it; the client answers every file on a channel of its own.

Run: python docs/examples/nested_channels.py
"""

import asyncio

from aqueduct_core import Connection, Receiver, channel, connect, serve

TREE = {"docs": ["intro.md", "spec.md"], "src": ["main.py"]}


async def handler(conn: Connection, requests: Receiver) -> None:
    async for request in requests:
        async with request["dirs"] as dirs:  # finished when the block ends
            for name, files in TREE.items():
                files_tx, files_rx = channel()  # a channel inside a message inside a channel
                await dirs.send({"name": name, "files": files_rx})
                async with files_tx:
                    for f in files:
                        acks_tx, acks_rx = channel()  # and the client's answers, level three
                        await files_tx.send({"file": f, "acks": acks_tx})
                        print("  server: client says", await acks_rx.recv())
                        acks_rx.close()


async def main() -> None:
    server = await serve(handler)
    conn = await connect("127.0.0.1", server.port, tls=server.client_tls())
    dirs_tx, dirs_rx = channel()
    await conn.entrypoint.send({"dirs": dirs_tx})
    async for directory in dirs_rx:
        print("directory", directory["name"])
        async for entry in directory["files"]:
            print("  file", entry["file"])
            async with entry["acks"] as acks:
                await acks.send(f"got {entry['file']}")
    conn.entrypoint.finish()
    await conn.close()
    await server.close()


if __name__ == "__main__":
    asyncio.run(main())
