"""Engine vectors (docs/vectors/engine.json): scripted conversations with a client engine,
what it must write and report at each step. The Python engine (tests/core/test_vectors.py)
and the TypeScript client's (clients/typescript/test/engine-vectors.test.ts) both replay them.

Each scenario is a list of steps: an input (the transport's: ``handshake_done``, ``stream``,
``datagram``, ``reset``, ``timer``; the application's: ``send``, ``recv``, ``finish``,
``cancel``, ``close_receiver``) at a time ``at``, then what the engine must do: the
``commands`` it hands the transport (stream writes with their bytes, resets, datagrams, a
close with its code) and the ``events`` it hands the application, and what the call
returned (``result``). Close reasons are the implementations' own words and not compared.

The scenarios' inputs are written here; ``python -m tests.core.engine_vectors`` records what
the Python engine does with them into the JSON file. A change of that file is a change of
the engine's behaviour on the wire: review its diff as such, and the TypeScript engine must
follow (its tests fail until it does).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from aqueduct_core.engine import (
    ChannelTerminated,
    CloseConnection,
    Connection,
    ConnectionTerminated,
    EngineConfig,
    HeadersReceived,
    MessageArrived,
    NewChannel,
    ResetStream,
    SendDatagram,
    SenderReady,
    WriteStream,
)
from aqueduct_core.engine.flow import ENTRY_WINDOW_HEADER, FLOW_HEADER
from aqueduct_core.errors import AqueductError, EndOfChannel
from aqueduct_core.wire import (
    AckReliable,
    AckVersion,
    Attachment,
    CancelSender,
    CloseReceiver,
    ConnectionHeaders,
    Dequeued,
    FinishSender,
    ForgetChannel,
    Message,
    RouteTo,
    SentUnreliable,
    Side,
    Version,
    encode_frames,
    encode_varint,
)

PATH = Path(__file__).parents[2] / "docs" / "vectors" / "engine.json"
W = 16 * 1024 * 1024


def _h(pairs: Any) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((bytes.fromhex(k), bytes.fromhex(v)) for k, v in pairs)


def run(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """Replay a scenario's inputs on the Python engine; each step with what it did."""
    cfg = scenario.get("config", {})
    config = EngineConfig(
        flow_window=cfg.get("flow_window", W), handshake_timeout=cfg.get("handshake_timeout", 10.0)
    )
    conn = Connection(Side.CLIENT, config, headers=_h(scenario.get("headers", [])))
    out = []
    for step in scenario["steps"]:
        done = {k: v for k, v in step.items() if k not in ("commands", "events", "result")}
        now = step["at"]
        result: Any = None
        do = step["do"]
        if do == "handshake_done":
            conn.handshake_done(now, max_datagram=step.get("max_datagram", 1200))
        elif do == "stream":
            conn.stream_data(step["id"], bytes.fromhex(step["hex"]), step.get("fin", False), now)
        elif do == "datagram":
            conn.datagram_received(bytes.fromhex(step["hex"]), now)
        elif do == "reset":
            conn.stream_reset(step["id"], now)
        elif do == "timer":
            conn.handle_timer(now)
        elif do == "send":
            specs = [
                NewChannel(a["keep_sender"], a.get("oneshot", False), _h(a.get("headers", [])))
                for a in step.get("attach", [])
            ]
            try:
                result = conn.send(
                    step["chanid"],
                    bytes.fromhex(step.get("payload", "")),
                    headers=_h(step.get("headers", [])),
                    attachments=specs,
                    now=now,
                )
            except AqueductError as exc:
                result = "error:" + type(exc).__name__
        elif do == "recv":
            try:
                msg = conn.recv(step["chanid"], now)
                result = (
                    "none"
                    if msg is None
                    else {
                        "payload": bytes(msg.payload).hex(),
                        "headers": [[k.hex(), v.hex()] for k, v in msg.headers],
                        "attachments": [a.chanid for a in msg.attachments],
                    }
                )
            except EndOfChannel:
                result = "end"
            except AqueductError as exc:
                result = "error:" + type(exc).__name__
        elif do in ("finish", "cancel", "close_receiver"):
            getattr(conn, do)(step["chanid"], now)
        else:
            raise ValueError(f"unknown step {do!r}")
        commands: list[dict[str, Any]] = []
        for c in conn.commands():
            if isinstance(c, WriteStream):
                commands.append({"write": c.stream_id, "hex": bytes(c.data).hex(), "fin": c.fin})
            elif isinstance(c, ResetStream):
                commands.append({"reset": c.stream_id})
            elif isinstance(c, SendDatagram):
                commands.append({"datagram": bytes(c.data).hex()})
            elif isinstance(c, CloseConnection):
                commands.append({"close": c.code})
        events: list[dict[str, Any]] = []
        for e in conn.events():
            if isinstance(e, HeadersReceived):
                events.append({"headers": [[k.hex(), v.hex()] for k, v in e.headers]})
            elif isinstance(e, MessageArrived):
                events.append({"message": e.chanid})
            elif isinstance(e, SenderReady):
                events.append({"sender_ready": e.chanid})
            elif isinstance(e, ChannelTerminated):
                events.append({"terminated": e.chanid, "terminal": e.terminal.value})
            elif isinstance(e, ConnectionTerminated):
                events.append({"closed": e.code, "by_peer": e.by_peer})
        done["commands"] = _merge(commands)
        done["events"] = events
        if result is not None:
            done["result"] = result
        out.append(done)
    return out


def _merge(commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive writes to one stream as one (how a driver cuts its writes is its own
    business; the bytes and their order on each stream are what the peer sees)."""
    out: list[dict[str, Any]] = []
    for c in commands:
        last = out[-1] if out else None
        if (
            last
            and "write" in c
            and "write" in last
            and last["write"] == c["write"]
            and not last["fin"]
        ):
            last["hex"] += c["hex"]
            last["fin"] = c["fin"]
        else:
            out.append(dict(c))
    return out


# -- the scenarios' inputs -------------------------------------------------------------------


def hx(*frames: Any) -> str:
    return encode_frames(*frames).hex()


V = Version()
FLOW = (FLOW_HEADER, encode_varint(W))
TOKEN = [[b"aqds-version-4b1f0a".hex(), b"1".hex()]]


def server_hello(flow: int | None = W, entry: int | None = None, extra: tuple = ()) -> str:
    headers = list(extra)
    if flow is not None:
        headers.append((FLOW_HEADER, encode_varint(flow)))
    if entry is not None:
        headers.append((ENTRY_WINDOW_HEADER, encode_varint(entry)))
    return hx(V, AckVersion(), ConnectionHeaders(tuple(headers)))


def opened(flow: int | None = W, entry: int | None = None) -> list[dict[str, Any]]:
    """Handshake steps: the transport is up, the server's first stream arrives."""
    return [
        {"at": 0.0, "do": "handshake_done"},
        {"at": 0.01, "do": "stream", "id": 3, "hex": server_hello(flow, entry), "fin": True},
    ]


ONESHOT = {"keep_sender": False, "oneshot": True}
ONESHOT_ID = 6  # client-created, server sends, oneshot, index 0
DATA_ID = 2  # client-created, server sends, multishot, index 0
WRITE_ID = 8  # client-created, client sends, multishot, index 1 (0 is the entrypoint)


def request(payload: str = "a1", **kw: Any) -> dict[str, Any]:
    return {"at": 0.02, "do": "send", "chanid": 0, "payload": payload, "attach": [ONESHOT], **kw}


def routed(chanid: int, *frames: Any) -> str:
    return hx(RouteTo(chanid), *frames)


SCENARIOS: list[dict[str, Any]] = [
    {
        "name": "handshake: VERSION and headers out, the server's in",
        "headers": TOKEN,
        "steps": opened(),
    },
    {
        "name": "a request with a oneshot reply: acked, delivered, closed",
        "steps": [
            *opened(),
            request("a16170"),
            {
                "at": 0.03,
                "do": "stream",
                "id": 7,
                "hex": routed(0, AckReliable((0, 1))),
                "fin": False,
            },
            {
                "at": 0.04,
                "do": "stream",
                "id": 11,
                "hex": routed(ONESHOT_ID, Message(0, payload=b"ok")),
                "fin": True,
            },
            {"at": 0.05, "do": "recv", "chanid": ONESHOT_ID},
            {"at": 0.06, "do": "recv", "chanid": ONESHOT_ID},
            {"at": 0.1, "do": "timer"},
        ],
    },
    {
        "name": "a data channel: ordered messages, acks after the delay, DEQUEUED after the delay, FINISH",
        "steps": [
            *opened(),
            {
                "at": 0.02,
                "do": "send",
                "chanid": 0,
                "payload": "01",
                "attach": [{"keep_sender": False, "headers": [["6b", "76"]]}],
            },
            {
                "at": 0.03,
                "do": "stream",
                "id": 7,
                "hex": routed(
                    DATA_ID, Message(0, payload=b"a" * 10), Message(1, ((b"h", b"1"),), (), b"b")
                ),
                "fin": False,
            },
            {"at": 0.04, "do": "recv", "chanid": DATA_ID},
            {"at": 0.05, "do": "recv", "chanid": DATA_ID},
            {"at": 0.05, "do": "recv", "chanid": DATA_ID},
            {"at": 0.07, "do": "timer"},
            {"at": 0.08, "do": "timer"},
            {
                "at": 0.09,
                "do": "stream",
                "id": 7,
                "hex": hx(Message(2, payload=b"c"), FinishSender(3)),
                "fin": True,
            },
            {"at": 0.1, "do": "recv", "chanid": DATA_ID},
            {"at": 0.1, "do": "recv", "chanid": DATA_ID},
        ],
    },
    {
        "name": "flow control: DEQUEUED once half the window is taken",
        "config": {"flow_window": 1000},
        "steps": [
            *opened(),
            {
                "at": 0.02,
                "do": "send",
                "chanid": 0,
                "payload": "02",
                "attach": [{"keep_sender": False}],
            },
            {
                "at": 0.03,
                "do": "stream",
                "id": 7,
                "hex": routed(DATA_ID, *[Message(i, payload=b"x" * 200) for i in range(2)]),
            },
            {"at": 0.04, "do": "recv", "chanid": DATA_ID},
            {"at": 0.04, "do": "recv", "chanid": DATA_ID},
            {"at": 0.04, "do": "recv", "chanid": DATA_ID},
        ],
    },
    {
        "name": "flow control: a message beyond the window (not the only one) closes with code 3",
        "config": {"flow_window": 1000},
        "steps": [
            *opened(),
            {
                "at": 0.02,
                "do": "send",
                "chanid": 0,
                "payload": "02",
                "attach": [{"keep_sender": False}],
            },
            {
                "at": 0.03,
                "do": "stream",
                "id": 7,
                "hex": routed(DATA_ID, *[Message(i, payload=b"x" * 400) for i in range(3)]),
            },
        ],
    },
    {
        "name": "a write: the peer's credit, the progress rule, DEQUEUED, FINISH at the stream's tail, CLOSE",
        "steps": [
            *opened(flow=300),
            {
                "at": 0.02,
                "do": "send",
                "chanid": 0,
                "payload": "03",
                "attach": [{"keep_sender": True, "headers": [["73", "31"]]}],
            },
            {"at": 0.03, "do": "send", "chanid": WRITE_ID, "payload": "61" * 100},
            {"at": 0.03, "do": "send", "chanid": WRITE_ID, "payload": "62" * 100},
            {"at": 0.03, "do": "finish", "chanid": WRITE_ID},
            {
                "at": 0.04,
                "do": "stream",
                "id": 7,
                "hex": routed(WRITE_ID, AckReliable((0, 1)), Dequeued(233)),
            },
            {
                "at": 0.05,
                "do": "stream",
                "id": 7,
                "hex": hx(AckReliable((0, 1)), CloseReceiver()),
                "fin": True,
            },
        ],
    },
    {
        "name": "the entrypoint's window: a server's aqueduct-entry-window holds requests back",
        "steps": [
            *opened(entry=200),
            request("00" * 50),
            request("01" * 50),
            {
                "at": 0.03,
                "do": "stream",
                "id": 7,
                "hex": routed(0, AckReliable((0, 1)), Dequeued(4281)),
            },
        ],
    },
    {
        "name": "a cancelled write: queued data dropped, CANCEL on the control stream",
        "steps": [
            *opened(flow=300),
            {
                "at": 0.02,
                "do": "send",
                "chanid": 0,
                "payload": "03",
                "attach": [{"keep_sender": True}],
            },
            {"at": 0.03, "do": "send", "chanid": WRITE_ID, "payload": "61" * 100},
            {"at": 0.03, "do": "send", "chanid": WRITE_ID, "payload": "62" * 100},
            {"at": 0.04, "do": "cancel", "chanid": WRITE_ID},
            {
                "at": 0.05,
                "do": "stream",
                "id": 7,
                "hex": routed(WRITE_ID, CloseReceiver()),
                "fin": True,
            },
        ],
    },
    {
        "name": "the peer cancels a data channel: ChannelCancelled, final acks, CLOSE",
        "steps": [
            *opened(),
            {
                "at": 0.02,
                "do": "send",
                "chanid": 0,
                "payload": "01",
                "attach": [{"keep_sender": False}],
            },
            {
                "at": 0.03,
                "do": "stream",
                "id": 7,
                "hex": routed(DATA_ID, Message(0, payload=b"a"), CancelSender()),
            },
            {"at": 0.04, "do": "recv", "chanid": DATA_ID},
        ],
    },
    {
        "name": "the application closes a data channel early: final acks, then CLOSE_RECEIVER",
        "steps": [
            *opened(),
            {
                "at": 0.02,
                "do": "send",
                "chanid": 0,
                "payload": "01",
                "attach": [{"keep_sender": False}],
            },
            {
                "at": 0.03,
                "do": "stream",
                "id": 7,
                "hex": routed(DATA_ID, Message(0, payload=b"a"), Message(1, payload=b"b")),
            },
            {"at": 0.04, "do": "close_receiver", "chanid": DATA_ID},
            {"at": 0.05, "do": "stream", "id": 7, "hex": hx(Message(2, payload=b"c"))},
            {
                "at": 0.06,
                "do": "stream",
                "id": 11,
                "hex": routed(DATA_ID, Message(3, payload=b"d")),
                "fin": True,
            },
        ],
    },
    {
        "name": "unreliable messages: datagrams, SENT_UNRELIABLE, a nack after the receipt deadline",
        "steps": [
            *opened(),
            {
                "at": 0.02,
                "do": "send",
                "chanid": 0,
                "payload": "01",
                "attach": [{"keep_sender": False}],
            },
            {"at": 0.03, "do": "datagram", "hex": routed(DATA_ID, Message(0, payload=b"u0"))},
            {"at": 0.031, "do": "datagram", "hex": routed(DATA_ID, Message(2, payload=b"u2"))},
            {"at": 0.04, "do": "stream", "id": 7, "hex": routed(DATA_ID, SentUnreliable(4))},
            {"at": 0.04, "do": "recv", "chanid": DATA_ID},
            {"at": 0.04, "do": "recv", "chanid": DATA_ID},
            {"at": 0.14, "do": "timer"},
            {"at": 0.2, "do": "datagram", "hex": routed(DATA_ID, Message(1, payload=b"late"))},
            {"at": 0.2, "do": "stream", "id": 7, "hex": hx(FinishSender(0)), "fin": True},
            {"at": 0.2, "do": "recv", "chanid": DATA_ID},
        ],
    },
    {
        "name": "a channel the server created, routed to before the message that attaches it",
        "steps": [
            *opened(),
            request(),
            {
                "at": 0.03,
                "do": "stream",
                "id": 7,
                "hex": routed(3, Message(0, payload=b"early"), FinishSender(1)),
                "fin": True,
            },
            {
                "at": 0.04,
                "do": "stream",
                "id": 11,
                "hex": routed(ONESHOT_ID, Message(0, (), (Attachment(3),), b"\xd9\xac\x0d\x00")),
                "fin": True,
            },
            {"at": 0.05, "do": "recv", "chanid": ONESHOT_ID},
            {"at": 0.05, "do": "recv", "chanid": 3},
            {"at": 0.05, "do": "recv", "chanid": 3},
        ],
    },
    {
        "name": "a late frame for a closed channel is answered with FORGET_CHANNEL, at most once a second",
        "steps": [
            *opened(),
            request(),
            {
                "at": 0.03,
                "do": "stream",
                "id": 7,
                "hex": routed(ONESHOT_ID, Message(0, payload=b"x")),
                "fin": True,
            },
            {
                "at": 0.04,
                "do": "stream",
                "id": 11,
                "hex": routed(ONESHOT_ID, FinishSender(1)),
                "fin": True,
            },
            {
                "at": 0.05,
                "do": "stream",
                "id": 15,
                "hex": routed(ONESHOT_ID, FinishSender(1)),
                "fin": True,
            },
            {"at": 1.1, "do": "timer"},
            {
                "at": 1.1,
                "do": "stream",
                "id": 19,
                "hex": routed(ONESHOT_ID, FinishSender(1)),
                "fin": True,
            },
        ],
    },
    {
        "name": "handshake timeout: no CONNECTION_HEADERS within the limit closes with code 4",
        "config": {"handshake_timeout": 2.0},
        "steps": [
            {"at": 0.0, "do": "handshake_done"},
            {"at": 1.9, "do": "timer"},
            {"at": 2.0, "do": "timer"},
        ],
    },
]


def violation(name: str, data: str, code: int = 1, flow: int | None = W) -> dict[str, Any]:
    """A scenario where the server's stream 7, after the handshake, breaks a rule."""
    return {
        "name": f"violation: {name}",
        "steps": [
            *opened(flow),
            request(),
            {"at": 0.03, "do": "stream", "id": 7, "hex": data, "fin": True},
            {"at": 0.04, "do": "send", "chanid": 0, "payload": "00"},
        ],
    }


SCENARIOS += [
    {
        "name": "violation: a sequence without VERSION before we sent ACK_VERSION",
        "steps": [
            {"at": 0.0, "do": "handshake_done"},
            {
                "at": 0.01,
                "do": "stream",
                "id": 3,
                "hex": hx(AckVersion(), ConnectionHeaders((FLOW,))),
                "fin": True,
            },
        ],
    },
    {
        "name": "violation: another VERSION string closes with code 2",
        "steps": [
            {"at": 0.0, "do": "handshake_done"},
            {"at": 0.01, "do": "stream", "id": 3, "hex": hx(Version(b"1.0.0")), "fin": True},
        ],
    },
    {
        "name": "violation: a malformed flow-control header",
        "steps": [
            {"at": 0.0, "do": "handshake_done"},
            {
                "at": 0.01,
                "do": "stream",
                "id": 3,
                "hex": hx(V, ConnectionHeaders(((FLOW_HEADER, b"\x80"),))),
                "fin": True,
            },
        ],
    },
    violation("a second CONNECTION_HEADERS", hx(ConnectionHeaders((FLOW,)))),
    violation("MESSAGE routed to the entrypoint, which the client sends on", routed(0, Message(0))),
    violation(
        "ACK_RELIABLE routed to the oneshot the client receives on",
        routed(ONESHOT_ID, AckReliable((0, 1))),
    ),
    violation(
        "FORGET_CHANNEL for a channel the client created", routed(ONESHOT_ID, ForgetChannel())
    ),
    violation("ROUTE_TO a client index never allocated", routed(ONESHOT_ID + 8, Message(0))),
    violation("DEQUEUED without negotiated flow control", routed(0, Dequeued(5)), flow=None),
    violation("a oneshot carries only message 0", routed(ONESHOT_ID, Message(1))),
    violation("a duplicate reliable number", routed(3, Message(0), Message(0))),
    violation("FINISH_SENDER below a received number", routed(3, Message(4), FinishSender(2))),
    violation("an ack of a message never sent", routed(0, AckReliable((0, 2)))),
    violation(
        "a message number far beyond the lowest undecided one (G31)",
        routed(3, Message(1 << 20)),
        code=3,
    ),
    violation("a stream ending inside a frame", routed(3) + "0400", code=1),
]


def main() -> None:
    doc = {
        "about": (__doc__ or "").strip().split("\n\n")[0],
        "scenarios": [{**s, "steps": run(s)} for s in SCENARIOS],
    }
    PATH.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {PATH} ({len(SCENARIOS)} scenarios)", file=sys.stderr)


if __name__ == "__main__":
    main()
