"""The asyncio API: what an application using Aqueduct sees.

Every scenario runs over the in-memory transport and over real QUIC on loopback with each
backend, and across backends (aioquic client with a qh3 server and the reverse).
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from aqueduct_core.api import channel, oneshot
from aqueduct_core.engine import EngineConfig
from aqueduct_core.errors import (
    ChannelCancelled,
    ChannelClosed,
    ConnectionLost,
    DecodeError,
    EndOfChannel,
    LocalProtocolError,
    ReceiverDropped,
    WouldBlock,
)
from aqueduct_core.testing.memory import memory_pair
from aqueduct_core.testing.quicpair import quic_pair

Scenario = Callable[[Any], Awaitable[None]]

TRANSPORTS = [
    "memory",
    "aioquic",
    "qh3",
    "qh3-server+aioquic-client",
    "aioquic-server+qh3-client",
    "tcp",
]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run(transport: str, scenario: Scenario, **kw: Any) -> None:
    async def main() -> None:
        if transport == "memory":
            async with memory_pair(**kw) as pair:
                await asyncio.wait_for(scenario(pair), 20)
            return
        if "+" in transport:
            server, client = (part.split("-")[0] for part in transport.split("+"))
        else:
            server = client = transport
        async with quic_pair(server, client, **kw) as qpair:  # type: ignore[arg-type]
            await asyncio.wait_for(scenario(qpair), 20)

    asyncio.run(main())


def test_rpc_over_oneshot(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        reply, answer = oneshot()
        await pair.client.entrypoint.send({"op": "add", "args": [2, 3], "reply": reply})
        request = await pair.entrypoint_receiver.recv()
        request["reply"].send(sum(request["args"]))
        assert await answer == 5

    run(transport, scenario)


def test_stream_back_and_finish(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        tx, rx = channel()
        await pair.client.entrypoint.send({"out": tx})
        out = (await pair.entrypoint_receiver.recv())["out"]
        async with out:
            for i in range(100):
                await out.send({"i": i})
        assert [m["i"] async for m in rx] == list(range(100))
        await out.wait_closed()

    run(transport, scenario)


@pytest.mark.parametrize("mode", ["ordered", "unordered", "unreliable"])
def test_modes_both_directions(mode: str, transport: str) -> None:
    async def scenario(pair: Any) -> None:
        # client -> server on a channel the client keeps the sender of
        up_tx, up_rx = channel()
        down_tx, down_rx = channel()
        await pair.client.entrypoint.send({"up": up_rx, "down": down_tx})
        req = await pair.entrypoint_receiver.recv()
        getattr(up_tx, mode)(maxsize=None)
        getattr(req["down"], mode)(maxsize=None)
        for i in range(20):
            up_tx.send_nowait(i)
            req["down"].send_nowait(-i)
        up_tx.finish()
        req["down"].finish()
        up = [v async for v in req["up"]]
        down = [v async for v in down_rx]
        if mode == "ordered":
            assert up == list(range(20)) and down == [-i for i in range(20)]
        elif mode == "unordered":
            assert sorted(up) == list(range(20)) and sorted(down) == sorted(-i for i in range(20))
        else:  # datagrams may be lost, never duplicated or invented
            assert len(set(up)) == len(up) and set(up) <= set(range(20))
            assert len(set(down)) == len(down) and set(down) <= {-i for i in range(20)}

    run(transport, scenario)


def test_nested_three_levels_both_ways(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        a_tx, a_rx = channel()  # client gives the server a sender (server -> client)
        await pair.client.entrypoint.send({"a": a_tx})
        a = (await pair.entrypoint_receiver.recv())["a"]
        b_tx, b_rx = channel()  # server gives the client a sender on a (client -> server)
        await a.send({"b": b_tx})
        b = (await a_rx.recv())["b"]
        c_tx, c_rx = channel()  # client gives the server a receiver on b (client -> server)
        await b.send({"c": c_rx})
        c = (await b_rx.recv())["c"]
        await c_tx.send("deep")
        c_tx.finish()
        assert [v async for v in c] == ["deep"]
        for handle in (a, b):
            handle.finish()
        assert [v async for v in a_rx] == []
        assert [v async for v in b_rx] == []

    run(transport, scenario)


def test_cancel_is_seen_by_the_receiver(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        tx, rx = channel()
        await pair.client.entrypoint.send({"in": rx})
        inbox = (await pair.entrypoint_receiver.recv())["in"]
        await tx.send(1)
        assert await inbox.recv() == 1
        tx.cancel()
        with pytest.raises(ChannelCancelled):
            await inbox.recv()

    run(transport, scenario)


def test_receiver_closed_is_seen_by_the_sender(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        tx, rx = channel()
        await pair.client.entrypoint.send({"in": rx})
        inbox = (await pair.entrypoint_receiver.recv())["in"]
        inbox.close()
        with pytest.raises(ReceiverDropped):
            await tx.wait_closed()
        with pytest.raises(ReceiverDropped):
            await tx.send("late")

    run(transport, scenario)


def test_unclaimed_attachments_are_closed_not_leaked(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        tx, rx = channel()
        # The server's codec decodes the value, but the application drops the handle
        # inside it without using it: it was detached, so it is the app's; closing the
        # message without detaching is what the raw codec does.
        tx2, rx2 = channel()
        await pair.client.entrypoint.send({"in": rx})
        req = await pair.entrypoint_receiver.recv()
        req["in"].close()
        with pytest.raises(ReceiverDropped):
            await tx.wait_closed()
        # A raw-codec channel cannot carry handles at all:
        raw_tx, raw_rx = channel(codec="raw")
        await pair.client.entrypoint.send({"data": raw_rx})
        data = (await pair.entrypoint_receiver.recv())["data"]
        with pytest.raises(LocalProtocolError):
            await raw_tx.send({"not": "bytes"})
        await raw_tx.send(b"\x00\x01")
        raw_tx.finish()
        assert [bytes(v) async for v in data] == [b"\x00\x01"]
        tx2.cancel()
        rx2.close()

    run(transport, scenario)


def test_headers_connection_channel_message(transport: str) -> None:
    def hook(client_headers: Any) -> Any:
        token = dict(client_headers).get(b"token")
        return [("welcome", b"yes" if token == b"s3cret" else b"no")]

    async def scenario(pair: Any) -> None:
        assert pair.client.peer_header("welcome") == b"yes"
        assert pair.server.peer_header("token") == b"s3cret"
        tx, rx = channel(headers={"schema": "v1"})
        await pair.client.entrypoint.send({"in": rx}, headers={"trace": "abc"})
        delivery = await pair.entrypoint_receiver.recv_message()
        assert dict(delivery.headers) == {b"trace": b"abc"}
        inbox = delivery.value["in"]
        assert dict(inbox.headers)[b"schema"] == b"v1"
        tx.finish()
        assert [v async for v in inbox] == []

    run(transport, scenario, client_headers={"token": "s3cret"}, server_headers=hook)


def test_local_channel_behaves_like_a_networked_one() -> None:
    async def main() -> None:
        tx, rx = channel()
        tx.ordered(maxsize=2)
        await tx.send(1)
        await tx.send(2)
        with pytest.raises(WouldBlock):
            tx.send_nowait(3)
        assert await rx.recv() == 1
        tx.send_nowait(3)
        tx.finish()
        assert [v async for v in rx] == [2, 3]
        with pytest.raises(ChannelClosed):
            tx.send_nowait(4)
        one_tx, one_rx = oneshot()
        one_tx.send("x")
        assert await one_rx == "x"
        tx2, rx2 = channel()
        rx2.close()
        with pytest.raises(ReceiverDropped):
            await tx2.send(1)

    asyncio.run(main())


def test_values_queued_locally_are_sent_when_the_receiver_goes_to_the_peer(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        tx, rx = channel()
        await tx.send("before-1")
        await tx.send("before-2")
        await pair.client.entrypoint.send({"in": rx})
        inbox = (await pair.entrypoint_receiver.recv())["in"]
        await tx.send("after")
        tx.finish()
        assert [v async for v in inbox] == ["before-1", "before-2", "after"]

    run(transport, scenario)


def test_misuse_raises_at_once(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        tx, rx = channel()
        await pair.client.entrypoint.send({"in": rx})
        with pytest.raises(LocalProtocolError, match="sent to the peer"):
            await rx.recv()
        with pytest.raises(LocalProtocolError, match="fresh local handle"):
            await pair.client.entrypoint.send({"again": tx})
        with pytest.raises(LocalProtocolError, match="cannot encode"):
            await pair.client.entrypoint.send({"x": object()})
        with pytest.raises(LocalProtocolError, match="maxsize"):
            tx.ordered(maxsize=0)
        inbox = (await pair.entrypoint_receiver.recv())["in"]
        tx.finish()
        with pytest.raises(ChannelClosed):
            await tx.send(1)
        assert [v async for v in inbox] == []

    run(transport, scenario)


def test_undecodable_payload_is_a_decode_error_not_a_dead_connection(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        tx, rx = channel()
        await pair.client.entrypoint.send({"in": rx})
        inbox = (await pair.entrypoint_receiver.recv())["in"]
        # A buggy peer puts bytes that are not CBOR on a CBOR channel.
        pair.client.engine.send(tx._chanid, b"\xff\xfe not cbor", now=pair.client._now())
        pair.client._flush()
        await tx.send(1)
        tx.finish()
        with pytest.raises(DecodeError, match="could not decode"):
            await inbox.recv()
        assert [v async for v in inbox] == [1]
        assert not pair.client.is_closed and not pair.server.is_closed

    run(transport, scenario)


def test_connection_close_ends_every_handle(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        tx, rx = channel()
        await pair.client.entrypoint.send({"in": rx})
        inbox = (await pair.entrypoint_receiver.recv())["in"]
        await pair.server.close()
        with pytest.raises(ConnectionLost):
            await inbox.recv()
        await pair.client.wait_closed()
        with pytest.raises(ConnectionLost):
            await tx.send(1)

    run(transport, scenario)


def test_backpressure_bounded_sender_waits_for_the_consumer(transport: str) -> None:
    window = 256 * 1024  # a window of one 200 kB message at a time

    async def scenario(pair: Any) -> None:
        tx, rx = channel()
        await pair.client.entrypoint.send({"in": rx})
        inbox = (await pair.entrypoint_receiver.recv())["in"]
        tx.ordered(maxsize=2)
        payload = b"x" * 200_000  # one message outstanding at a time

        async def produce() -> int:
            sent = 0
            for _ in range(20):
                await tx.send(payload)
                sent += 1
            tx.finish()
            return sent

        producer = asyncio.create_task(produce())
        await asyncio.sleep(0.05)
        assert not producer.done(), "send should wait while nothing is consumed"
        buffered = pair.server.memory().received.get(inbox._chanid, 0)
        assert buffered <= window + 200_100
        assert len([v async for v in inbox]) == 20
        assert await producer == 20

    run(transport, scenario, config=EngineConfig(flow_window=window))


def test_dropping_a_live_handle_cancels_it_with_a_warning(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        tx, rx = channel()
        await pair.client.entrypoint.send({"in": rx})
        inbox = (await pair.entrypoint_receiver.recv())["in"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del tx
            gc.collect()
        assert any(issubclass(w.category, ResourceWarning) for w in caught)
        with pytest.raises(ChannelCancelled):
            await inbox.recv()

    run(transport, scenario)


def test_entrypoint_end(transport: str) -> None:
    async def scenario(pair: Any) -> None:
        pair.client.entrypoint.finish()
        with pytest.raises(EndOfChannel):
            await pair.entrypoint_receiver.recv()

    run(transport, scenario)


def test_a_server_hook_can_refuse_a_connection() -> None:
    """Raising in the server's headers hook closes that connection with the reason; the
    client's connect() says so (it does not time out)."""
    from aqueduct_core.transport import ConnectError, TransportConfig, connect, serve

    def hook(client_headers: Any) -> Any:
        raise PermissionError("no token, no service")

    async def handler(conn: Any, rx: Any) -> None:
        raise AssertionError("never reached")

    async def main() -> None:
        server = await serve(
            handler, headers=hook, config=TransportConfig(engine=EngineConfig(handshake_timeout=5))
        )
        try:
            with pytest.raises(ConnectError, match="no token, no service"):
                await connect("127.0.0.1", server.port, tls=server.client_tls())
        finally:
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_both_sides_use_the_negotiated_codec(transport: str) -> None:
    """A connection whose default codec is not CBOR: both ends encode and decode with it."""
    import json

    from aqueduct_core.api import CborCodec
    from aqueduct_core.api.channel import Handle

    class JsonCodec:
        name = "json"

        def encode(self, value: Any, attach: Any) -> bytes:
            return json.dumps(value).encode()

        def decode(self, payload: Any, detach: Any) -> Any:
            return json.loads(bytes(payload))

    codecs = {"json": JsonCodec(), "cbor": CborCodec((Handle,))}

    async def scenario(pair: Any) -> None:
        assert pair.client.codec == pair.server.codec == "json"
        await pair.client.entrypoint.send({"hello": [1, 2]})
        assert await pair.entrypoint_receiver.recv() == {"hello": [1, 2]}

    if transport == "memory":
        run(transport, scenario, codecs=codecs)
    else:

        async def main() -> None:
            from aqueduct_core.transport import connect, serve

            got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

            async def handler(conn: Any, rx: Any) -> None:
                got.set_result((conn.codec, await rx.recv()))
                await rx.recv()  # until the client finishes

            server = await serve(handler, codecs=codecs)
            conn = await connect("127.0.0.1", server.port, tls=server.client_tls(), codecs=codecs)
            assert conn.codec == "json"
            await conn.entrypoint.send({"hello": [1, 2]})
            assert await got == ("json", {"hello": [1, 2]})
            conn.entrypoint.finish()
            await conn.close()
            await server.close()

        asyncio.run(asyncio.wait_for(main(), 20))


def test_tasks_waiting_to_send_on_one_channel_take_turns_in_order() -> None:
    """Issue 26: a client firing thousands of requests at once (``asyncio.gather``) had them
    all waiting for room on its entrypoint, and every freed slot woke every one of them to
    retry: work quadratic in the backlog. Now each freed slot wakes one waiter, first come,
    first served, and it hands the turn on: a few tries per message, in order."""
    n = 2000
    tries = 0

    async def main() -> list[int]:
        async with memory_pair(config=EngineConfig(flow_window=4096)) as pair:
            tx, rx = channel()
            await pair.client.entrypoint.send({"in": rx})
            inbox = (await pair.entrypoint_receiver.recv())["in"]
            tx.ordered(maxsize=4)
            send_nowait = tx.send_nowait

            def counted(value: Any, *, headers: Any = ()) -> None:
                nonlocal tries
                tries += 1
                send_nowait(value, headers=headers)

            tx.send_nowait = counted  # type: ignore[method-assign]
            senders = [asyncio.ensure_future(tx.send(i)) for i in range(n)]
            got = [await inbox.recv() for _ in range(n)]
            await asyncio.gather(*senders)
            tx.finish()
            return got

    assert asyncio.run(asyncio.wait_for(main(), 60)) == list(range(n))
    assert tries < 3 * n, f"{tries} tries to send {n} messages"


def test_a_task_woken_to_send_and_cancelled_hands_its_turn_on() -> None:
    """The turn of a waiter cancelled just after it was woken is not lost: the next waiter
    sends, without waiting for another slot to free (which might never come)."""

    async def main() -> list[object]:
        # A one-byte window: one message on the wire at a time, one more queued.
        async with memory_pair(config=EngineConfig(flow_window=1)) as pair:
            tx, rx = channel()
            await pair.client.entrypoint.send({"in": rx})
            inbox = (await pair.entrypoint_receiver.recv())["in"]
            tx.ordered(maxsize=1)
            tx.send_nowait(0)  # on the wire
            tx.send_nowait(1)  # queued
            with pytest.raises(WouldBlock):
                tx.send_nowait(2)
            first = asyncio.ensure_future(tx.send("cancelled"))
            second = asyncio.ensure_future(tx.send("second"))
            await asyncio.sleep(0.01)
            assert not first.done() and not second.done()
            wake_room = pair.client._wake_room

            def wake_then_cancel(chanid: int, every: bool = False) -> None:
                wake_room(chanid, every)
                first.cancel()  # woken, and cancelled before it ran

            pair.client._wake_room = wake_then_cancel  # type: ignore[method-assign]
            got = [await inbox.recv() for _ in range(3)]
            await asyncio.wait_for(second, 5)
            assert first.cancelled()
            tx.finish()
            return got

    assert asyncio.run(asyncio.wait_for(main(), 20)) == [0, 1, "second"]
