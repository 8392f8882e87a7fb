"""The asyncio API of Aqueduct: connections, channels, codecs."""

from aqueduct_core.api.channel import (
    Delivery,
    OneshotReceiver,
    OneshotSender,
    Receiver,
    Sender,
    channel,
    oneshot,
)
from aqueduct_core.api.codec import CborCodec, Codec, RawCodec
from aqueduct_core.api.connection import Connection
from aqueduct_core.api.path import PathReading, PathSample
from aqueduct_core.wire.frames import Gather

__all__ = [
    "CborCodec",
    "Codec",
    "Connection",
    "Delivery",
    "Gather",
    "OneshotReceiver",
    "OneshotSender",
    "PathReading",
    "PathSample",
    "RawCodec",
    "Receiver",
    "Sender",
    "channel",
    "oneshot",
]
