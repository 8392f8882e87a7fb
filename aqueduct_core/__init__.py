"""Aqueduct: message channels inside QUIC, where channels travel inside messages.

The asyncio API (see ``docs/core-api.md``)::

    from aqueduct_core import channel, connect, oneshot, serve

    server = await serve(handler)                 # handler(connection, entrypoint_receiver)
    conn = await connect("127.0.0.1", server.port, tls=server.client_tls())
    reply, answer = oneshot()
    await conn.entrypoint.send({"question": 42, "reply": reply})
    print(await answer)

Layers, each usable on its own: :mod:`aqueduct_core.wire` (frames), :mod:`aqueduct_core.engine`
(the sans-IO protocol), :mod:`aqueduct_core.transport` (QUIC), :mod:`aqueduct_core.api`
(handles and codecs), :mod:`aqueduct_core.testing` (simulated networks and fakes).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aqueduct_core.api import (
        CborCodec,
        Codec,
        Connection,
        Delivery,
        OneshotReceiver,
        OneshotSender,
        RawCodec,
        Receiver,
        Sender,
        channel,
        oneshot,
    )
    from aqueduct_core.errors import (
        AqueductError,
        ChannelCancelled,
        ChannelClosed,
        ChannelError,
        CloseCode,
        ConnectionLost,
        DecodeError,
        EndOfChannel,
        LocalProtocolError,
        LostInTransit,
        ProtocolError,
        ReceiverDropped,
        RemoteProtocolError,
        WouldBlock,
    )
    from aqueduct_core.transport import (
        ClientTLS,
        ConnectError,
        Server,
        ServerTLS,
        TransportConfig,
        connect,
        make_dev_certificates,
        serve,
    )
else:
    from aqueduct_core.lazy import attach

    __getattr__, __dir__ = attach(__name__, __file__)

__version__ = "0.1.0"

__all__ = [
    "AqueductError",
    "CborCodec",
    "ChannelCancelled",
    "ChannelClosed",
    "ChannelError",
    "ClientTLS",
    "CloseCode",
    "Codec",
    "ConnectError",
    "Connection",
    "ConnectionLost",
    "DecodeError",
    "Delivery",
    "EndOfChannel",
    "LocalProtocolError",
    "LostInTransit",
    "OneshotReceiver",
    "OneshotSender",
    "ProtocolError",
    "RawCodec",
    "Receiver",
    "ReceiverDropped",
    "RemoteProtocolError",
    "Sender",
    "Server",
    "ServerTLS",
    "TransportConfig",
    "WouldBlock",
    "channel",
    "connect",
    "make_dev_certificates",
    "oneshot",
    "serve",
]
