"""The two ack range lists (profile §1.3, G7, G8, G9). All range coding lives here, so it can
be switched in one place if a future peer settles on "minus one" coding.

ACK_RELIABLE: gap, run, gap, run, ... counted from the receiver's lowest not-yet-acked
reliable number. Even and non-zero count; only the first gap may be 0; runs are non-zero.

ACK_NACK_UNRELIABLE: ack-run, nack-run, ack-run, ... counted from the ack/nack cursor. At least
one item; all non-zero except the first, which may be 0 when more items follow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from aqueduct_core.errors import LocalProtocolError, RemoteProtocolError


def check_ack_reliable(ranges: Sequence[int], error: type[Exception] = RemoteProtocolError) -> None:
    if not ranges or len(ranges) % 2:
        raise error(f"ACK_RELIABLE needs an even, non-zero number of varints, got {len(ranges)}")
    for i, value in enumerate(ranges):
        if value == 0 and i != 0:
            raise error("ACK_RELIABLE: only the first gap may be zero")


def check_ack_nack(ranges: Sequence[int], error: type[Exception] = RemoteProtocolError) -> None:
    if not ranges:
        raise error("ACK_NACK_UNRELIABLE needs at least one varint")
    for i, value in enumerate(ranges):
        if value == 0 and (i != 0 or len(ranges) == 1):
            raise error(
                "ACK_NACK_UNRELIABLE: only a leading ack run (followed by more) may be zero"
            )


def encode_ack_reliable(base: int, numbers: Iterable[int]) -> tuple[int, ...]:
    """Gap/run list acking ``numbers`` (each >= ``base``, distinct) relative to ``base``."""
    nums = sorted(numbers)
    if not nums:
        raise LocalProtocolError("ACK_RELIABLE must ack at least one number")
    out: list[int] = []
    cursor = base
    i = 0
    while i < len(nums):
        start = nums[i]
        if start < cursor:
            raise LocalProtocolError(f"cannot ack {start}: below base {base} or repeated")
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out += (start - cursor, nums[j] + 1 - start)
        cursor = nums[j] + 1
        i = j + 1
    return tuple(out)


def ack_reliable_runs(base: int, ranges: Sequence[int]) -> list[tuple[int, int]]:
    """Half-open ``[start, stop)`` runs acked by an ACK_RELIABLE decoded against ``base``."""
    runs = []
    cursor = base
    for i in range(0, len(ranges), 2):
        start = cursor + ranges[i]
        cursor = start + ranges[i + 1]
        runs.append((start, cursor))
    return runs


def encode_ack_nack(decisions: Sequence[bool]) -> tuple[int, ...]:
    """Run list for consecutive decisions from the cursor (True = ack, False = nack)."""
    if not decisions:
        raise LocalProtocolError("ACK_NACK_UNRELIABLE must decide at least one number")
    out: list[int] = []
    want = True
    count = 0
    for d in decisions:
        if d == want:
            count += 1
        else:
            out.append(count)
            want, count = d, 1
    out.append(count)
    return tuple(out)


def encode_ack_nack_runs(
    cursor: int, upto: int, acked: Sequence[tuple[int, int]]
) -> tuple[int, ...]:
    """Run list deciding ``[cursor, upto)``: the sorted, disjoint, non-adjacent half-open
    ``acked`` ranges are acked, the rest nacked. Its size depends on the number of ranges,
    never on the number of messages decided."""
    if upto <= cursor:
        raise LocalProtocolError("ACK_NACK_UNRELIABLE must decide at least one number")
    out: list[int] = []
    pos = cursor
    for start, stop in acked:
        if start < pos or stop <= start or stop > upto:
            raise LocalProtocolError(f"acked range [{start}, {stop}) is out of order or bounds")
        if start > pos:
            if not out:
                out.append(0)  # no leading ack run
            out.append(start - pos)
        elif out:
            raise LocalProtocolError("adjacent acked ranges must be merged")
        out.append(stop - start)
        pos = stop
    if pos < upto:
        if not out:
            out.append(0)
        out.append(upto - pos)
    return tuple(out)


def ack_nack_runs(cursor: int, ranges: Sequence[int]) -> list[tuple[int, int, bool]]:
    """``(start, stop, acked)`` runs of an ACK_NACK_UNRELIABLE read from ``cursor``."""
    runs = []
    acked = True
    for length in ranges:
        if length:
            runs.append((cursor, cursor + length, acked))
        cursor += length
        acked = not acked
    return runs
