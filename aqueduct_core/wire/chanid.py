"""Channel ids (`001` §1.6, profile G2).

bit0 = CREATOR (0: the client created the channel), bit1 = SENDER (0: the client holds the
sender half), bit2 = ONESHOT, bits 3..63 = INDEX, counted per (creator, sender, oneshot) space.
The entrypoint is chanid 0; the index counter of its space therefore starts at 1.
"""

from __future__ import annotations

import enum

from aqueduct_core.errors import LocalProtocolError

ENTRYPOINT = 0
MAX_INDEX = (1 << 61) - 1


class Side(enum.IntEnum):
    """Which end of the connection. The value is the bit a chanid uses for that side."""

    CLIENT = 0
    SERVER = 1

    @property
    def peer(self) -> Side:
        return Side(1 - self)


def make_chanid(creator: Side, sender: Side, oneshot: bool, index: int) -> int:
    if not 0 <= index <= MAX_INDEX:
        raise LocalProtocolError(f"chanid index out of range: {index}")
    return int(creator) | (int(sender) << 1) | (int(oneshot) << 2) | (index << 3)


def creator_of(chanid: int) -> Side:
    return Side(chanid & 1)


def sender_of(chanid: int) -> Side:
    return Side((chanid >> 1) & 1)


def is_oneshot(chanid: int) -> bool:
    return bool(chanid & 4)


def index_of(chanid: int) -> int:
    return chanid >> 3


def space_of(chanid: int) -> int:
    """The (creator, sender, oneshot) space of a chanid, as its low three bits."""
    return chanid & 7


def describe(chanid: int) -> str:
    """Human-readable form for logs and error messages."""
    if chanid == ENTRYPOINT:
        return "chan#0(entrypoint)"
    c = "client" if creator_of(chanid) is Side.CLIENT else "server"
    s = "client" if sender_of(chanid) is Side.CLIENT else "server"
    kind = "oneshot" if is_oneshot(chanid) else "multishot"
    return f"chan#{chanid}({c}-created, {s}-sends, {kind}, index {index_of(chanid)})"
