"""A set of non-negative integers stored as sorted, disjoint half-open ranges.

Used for received message numbers, acked numbers, and the permanent tombstones of G19:
indices are assigned sequentially, so these sets stay a handful of ranges.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator


class RangeSet:
    __slots__ = ("_starts", "_stops")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []

    def __contains__(self, value: int) -> bool:
        i = bisect_right(self._starts, value) - 1
        return i >= 0 and value < self._stops[i]

    def __len__(self) -> int:
        return sum(b - a for a, b in zip(self._starts, self._stops, strict=True))

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __iter__(self) -> Iterator[int]:
        for a, b in zip(self._starts, self._stops, strict=True):
            yield from range(a, b)

    def __repr__(self) -> str:
        return f"RangeSet({list(zip(self._starts, self._stops, strict=True))})"

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._stops, strict=True))

    def ranges_within(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The members in ``[start, stop)`` as sorted half-open ranges, clipped to it."""
        out = []
        i = max(bisect_right(self._starts, start) - 1, 0)
        starts, stops = self._starts, self._stops
        while i < len(starts) and starts[i] < stop:
            a, b = max(starts[i], start), min(stops[i], stop)
            if a < b:
                out.append((a, b))
            i += 1
        return out

    def add(self, value: int) -> None:
        self.add_range(value, value + 1)

    def add_range(self, start: int, stop: int) -> None:
        """Add ``[start, stop)``."""
        if start >= stop:
            return
        starts, stops = self._starts, self._stops
        i = bisect_right(starts, start) - 1
        if i >= 0 and stops[i] >= start:
            start = starts[i]
        else:
            i += 1
        j = i
        while j < len(starts) and starts[j] <= stop:
            stop = max(stop, stops[j])
            j += 1
        starts[i:j] = [start]
        stops[i:j] = [stop]

    def overlaps(self, start: int, stop: int) -> bool:
        """True if any member lies in ``[start, stop)``."""
        i = bisect_right(self._starts, stop - 1) - 1
        return i >= 0 and self._stops[i] > start

    def first_gap(self, base: int = 0) -> int:
        """The smallest value >= ``base`` not in the set."""
        i = bisect_right(self._starts, base) - 1
        if i >= 0 and base < self._stops[i]:
            return self._stops[i]
        return base

    def discard_below(self, value: int) -> None:
        """Forget every member below ``value`` (keeps the set small)."""
        while self._starts and self._stops[0] <= value:
            del self._starts[0], self._stops[0]
        if self._starts and self._starts[0] < value:
            self._starts[0] = value
