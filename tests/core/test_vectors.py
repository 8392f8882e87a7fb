"""The shared golden vectors of docs/vectors/wire.json, against the Python codec.

The same file is read by the TypeScript client's tests (clients/typescript/test/), so the two
implementations agree byte for byte on everything the profile's §1 writes out; a vector
changes only with the profile's text, and then both implementations follow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aqueduct_core.errors import RemoteProtocolError
from aqueduct_core.wire import (
    AckNackUnreliable,
    AckReliable,
    AckVersion,
    Attachment,
    CancelSender,
    CloseReceiver,
    ConnectionHeaders,
    Dequeued,
    FinishSender,
    ForgetChannel,
    Frame,
    Message,
    RouteTo,
    SentUnreliable,
    Side,
    StreamParser,
    Version,
    creator_of,
    decode_frame,
    encode_frame,
    encode_frames,
    encode_varint,
    index_of,
    is_oneshot,
    message_cost,
    parse_datagram,
    pull_varint,
    sender_of,
)

VECTORS = json.loads(
    (Path(__file__).parents[2] / "docs" / "vectors" / "wire.json").read_text(encoding="utf-8")
)


def _headers(pairs: list[list[str]]) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((bytes.fromhex(k), bytes.fromhex(v)) for k, v in pairs)


def frame_of(spec: dict[str, Any]) -> Frame:
    """A frame from its JSON form (the TypeScript tests read the same form)."""
    kind = spec["type"]
    if kind == "MESSAGE":
        atts = tuple(Attachment(a["chanid"], _headers(a["headers"])) for a in spec["attachments"])
        return Message(spec["num"], _headers(spec["headers"]), atts, bytes.fromhex(spec["payload"]))
    simple: dict[str, Frame] = {
        "ACK_VERSION": AckVersion(),
        "CANCEL_SENDER": CancelSender(),
        "CLOSE_RECEIVER": CloseReceiver(),
        "FORGET_CHANNEL": ForgetChannel(),
    }
    if kind in simple:
        return simple[kind]
    made: dict[str, Any] = {
        "VERSION": lambda: Version(bytes.fromhex(spec["version"])),
        "CONNECTION_HEADERS": lambda: ConnectionHeaders(_headers(spec["headers"])),
        "ROUTE_TO": lambda: RouteTo(spec["chanid"]),
        "SENT_UNRELIABLE": lambda: SentUnreliable(spec["count"]),
        "FINISH_SENDER": lambda: FinishSender(spec["sentReliable"]),
        "ACK_RELIABLE": lambda: AckReliable(tuple(spec["ranges"])),
        "ACK_NACK_UNRELIABLE": lambda: AckNackUnreliable(tuple(spec["ranges"])),
        "DEQUEUED": lambda: Dequeued(spec["numBytes"]),
    }
    return made[kind]()  # type: ignore[no-any-return]


def wire_of(vector: dict[str, Any]) -> bytes:
    data = bytes.fromhex(vector["hex"])
    repeat = vector.get("repeat")
    return data + bytes.fromhex(repeat["hex"]) * repeat["count"] if repeat else data


def normalised(frames: list[Frame]) -> list[Frame]:
    """Payloads as bytes (the stream parser may hand out a bytearray)."""
    return [
        Message(f.num, f.headers, f.attachments, bytes(f.payload)) if isinstance(f, Message) else f
        for f in frames
    ]


@pytest.mark.parametrize("vector", VECTORS["varint"], ids=lambda v: v["value"])
def test_varints(vector: dict[str, str]) -> None:
    value, wire = int(vector["value"]), bytes.fromhex(vector["hex"])
    assert encode_varint(value) == wire
    assert pull_varint(memoryview(wire), 0) == (value, len(wire))


@pytest.mark.parametrize("vector", VECTORS["varint_rejected"], ids=lambda v: v["hex"])
def test_overlong_varints_are_refused(vector: dict[str, str]) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        pull_varint(memoryview(bytes.fromhex(vector["hex"])), 0)
    assert info.value.code == 1


@pytest.mark.parametrize("vector", VECTORS["chanid"], ids=lambda v: v["hex"])
def test_chanids(vector: dict[str, Any]) -> None:
    chanid = int(vector["hex"], 16)
    assert creator_of(chanid) is Side[vector["creator"].upper()]
    assert sender_of(chanid) is Side[vector["sender"].upper()]
    assert is_oneshot(chanid) is vector["oneshot"]
    assert index_of(chanid) == vector["index"]


@pytest.mark.parametrize("vector", VECTORS["frames"], ids=lambda v: v["hex"][:24])
def test_frames(vector: dict[str, Any]) -> None:
    frame, wire = frame_of(vector["frame"]), bytes.fromhex(vector["hex"])
    assert encode_frame(frame) == wire
    assert decode_frame(wire, flow_control=True) == frame


@pytest.mark.parametrize("vector", VECTORS["message_cost"], ids=lambda v: str(v["cost"]))
def test_message_costs(vector: dict[str, Any]) -> None:
    message = frame_of(vector["frame"])
    assert isinstance(message, Message)
    assert message_cost(message) == vector["cost"]


@pytest.mark.parametrize("vector", VECTORS["sequences"], ids=lambda v: v["name"][:30])
def test_sequences(vector: dict[str, Any]) -> None:
    wire, flow = bytes.fromhex(vector["hex"]), vector.get("flow_control", False)
    frames = [frame_of(f) for f in vector["frames"]]
    assert encode_frames(*frames) == wire
    for cut in range(len(wire) + 1):  # any split of the stream gives the same frames
        parser = StreamParser(flow_control=flow)
        got = parser.feed(wire[:cut]) + parser.feed(wire[cut:])
        parser.finish()
        assert normalised(got) == frames
    if vector["datagram"]:
        assert parse_datagram(wire, flow_control=flow)[0] == frames


@pytest.mark.parametrize("vector", VECTORS["malformed"], ids=lambda v: v["why"][:40])
def test_malformed_input_closes_with_its_code(vector: dict[str, Any]) -> None:
    wire, flow = wire_of(vector), vector.get("flow_control", False)
    for where in vector["where"]:
        with pytest.raises(RemoteProtocolError) as info:
            if where == "frame":
                decode_frame(wire, flow_control=flow)
            elif where == "datagram":
                parse_datagram(wire, flow_control=flow)
            else:
                parser = StreamParser(flow_control=flow)
                parser.feed(wire)
                parser.finish()
        assert info.value.code == vector["code"], (where, info.value)


ENGINE = json.loads(
    (Path(__file__).parents[2] / "docs" / "vectors" / "engine.json").read_text(encoding="utf-8")
)


@pytest.mark.parametrize("scenario", ENGINE["scenarios"], ids=lambda s: s["name"][:50])
def test_engine_vectors(scenario: dict[str, Any]) -> None:
    """The client engine's conversations of docs/vectors/engine.json, step by step (the
    TypeScript engine replays the same file)."""
    from tests.core.engine_vectors import run

    for got, want in zip(run(scenario), scenario["steps"], strict=True):
        assert got == want, f"step {want['do']} at {want['at']}"
