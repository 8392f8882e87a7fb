"""The sans-IO Aqueduct protocol engine. (Theory of operation: see below once written.)"""

from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.engine.connection import Connection, MemoryReport, NewChannel
from aqueduct_core.engine.events import (
    ChannelTerminated,
    CloseConnection,
    Command,
    ConnectionTerminated,
    Event,
    HeadersReceived,
    MessageArrived,
    ResetStream,
    SendDatagram,
    SenderReady,
    Terminal,
    WriteStream,
)
from aqueduct_core.engine.sender import Mode, QueuePolicy

__all__ = [
    "ChannelTerminated",
    "CloseConnection",
    "Command",
    "Connection",
    "ConnectionTerminated",
    "EngineConfig",
    "Event",
    "HeadersReceived",
    "MemoryReport",
    "MessageArrived",
    "Mode",
    "NewChannel",
    "QueuePolicy",
    "ResetStream",
    "SendDatagram",
    "SenderReady",
    "Terminal",
    "WriteStream",
]
