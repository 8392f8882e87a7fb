"""Spreading work over the endpoints of a URL that names several service processes.

A URL such as ``quic://svc1:4433,quic://svc2:4433,quic://svc3:4433`` names processes that
serve one root. Requests about datasets (plan, begin, commit, describe...) go to the first
that answers, in order (:mod:`.connecting`). The bulk of the bytes does not: each scan (a
read task's splits) and each ``write_task`` (a writer's data) goes to the endpoint that can
take it soonest, as this process sees it (:class:`Spread`), and so does a whole ``write``
(its begin, data and commit: :meth:`.spreader.Spreader.write`), so that each process commits the
writes it received:

- **least outstanding bytes**: each endpoint counts the bytes of the work this process has
  under way there (a scan's planned bytes; a write's size when known, else the mean of the
  writes that finished; a whole write's until its commit is answered), and the next piece
  goes where that sum, with the new piece, is smallest. A host that moves bytes slower, or
  commits slower, keeps its work longer, so it gets less;
- **ties** (nothing under way, as in a Spark task's process at the start of each task) go to
  the endpoint the caller prefers (the planner's choice: the Spark reader assigns each task
  on the driver by the same rule, over the tasks' bytes), else to one picked at random, so
  processes that start together do not all pick the first. The planner also gives each
  task the endpoint it moves to if its own fails (:func:`plan_orders`): the tasks of one
  host go to all the others, spread by bytes, so a host lost mid-read leaves its work to
  every survivor, not all to the next one in the list (each task's process decides alone);
- **an endpoint that fails** (its connection lost, nothing answering) is avoided for
  :data:`AVOID` seconds, doubling with each failure in a row up to :data:`AVOID_MAX`, then
  tried again; one success clears it. When every endpoint is being avoided, the one whose
  pause ends first is tried.

How the work fails over (a dead host noticed, a scan resumed, a write redirected) is
:mod:`.spreader`'s.

The state is per process and per URL (:func:`spread_for`): every client of one URL shares
what it learned of the endpoints.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aqueduct_spark.client.urls import Endpoint

Preference = int | Sequence[int] | None
"""An endpoint a piece of work prefers when the endpoints are even (its index), or several
in the order preferred (:func:`plan_orders`)."""

AVOID = 1.0
"""Seconds an endpoint that just failed is avoided (doubled per failure in a row)."""
AVOID_MAX = 30.0
"""The longest an endpoint is avoided before it is tried again."""
UNKNOWN_SIZE = 1 << 20
"""Bytes counted for a piece of work of unknown size before any finished."""


@dataclass
class _State:
    outstanding: int = 0
    leases: int = 0
    done: int = 0
    failures: int = 0
    avoid_until: float = 0.0


class Lease:
    """One piece of work under way at an endpoint: counted there until :meth:`end`."""

    def __init__(self, spread: Spread, index: int, size: int) -> None:
        self.spread, self.index, self.size = spread, index, size
        self.moved: int | None = None
        """Bytes the work moved, when known at the end (a write's): teaches the mean."""
        self._open = True

    def end(self) -> None:
        if self._open:
            self._open = False
            self.spread._ended(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


class Spread:
    """Which of ``endpoints`` gets the next piece of work (see the module's docstring).
    Not thread-safe: used from one event loop (the client's)."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.endpoints = list(endpoints)
        self._state = [_State() for _ in self.endpoints]
        self._clock = clock
        self._rng = rng or random.Random()
        self._sizes = (0, 0)  # finished work of unknown size: count, bytes

    def __len__(self) -> int:
        return len(self.endpoints)

    def outstanding(self) -> list[int]:
        """Bytes under way at each endpoint."""
        return [s.outstanding for s in self._state]

    def done(self) -> list[int]:
        """Pieces of work each endpoint finished (failed ones included)."""
        return [s.done for s in self._state]

    def avoided(self) -> list[bool]:
        """Whether each endpoint is being avoided now."""
        now = self._clock()
        return [s.avoid_until > now for s in self._state]

    def guess(self, size: int | None) -> int:
        """``size``, or for work of unknown size the mean of such work that finished."""
        if size is not None:
            return max(0, size)
        count, total = self._sizes
        return total // count if count else UNKNOWN_SIZE

    def pick(
        self,
        size: int | None = None,
        prefer: Preference = None,
        exclude: Iterable[int] = (),
    ) -> int | None:
        """The endpoint (its index) for a piece of ``size`` bytes: the usable one with the
        least outstanding bytes after it; ties to ``prefer`` (an index, or indices in the
        order preferred), then the next ones after it (a random start without one). None
        when every endpoint is excluded."""
        n = len(self.endpoints)
        skip = set(exclude)
        left = [i for i in range(n) if i not in skip]
        if not left:
            return None
        now = self._clock()
        usable = [i for i in left if self._state[i].avoid_until <= now]
        if not usable:  # all are being avoided: try the one whose pause ends first
            return min(left, key=lambda i: self._state[i].avoid_until)
        order = [prefer] if isinstance(prefer, int) else list(prefer or ())
        start = order[0] % n if order else self._rng.randrange(n)
        rank = {i % n: r for r, i in reversed(list(enumerate(order)))}
        add = self.guess(size)
        return min(
            usable,
            key=lambda i: (
                self._state[i].outstanding + add,
                self._state[i].leases,
                rank.get(i, len(order)),
                (i - start) % n,
            ),
        )

    def lease(self, index: int, size: int | None = None) -> Lease:
        """Count a piece of work at endpoint ``index`` until the lease ends."""
        lease = Lease(self, index, self.guess(size))
        if size is None:
            lease.moved = 0
        state = self._state[index]
        state.outstanding += lease.size
        state.leases += 1
        return lease

    def _ended(self, lease: Lease) -> None:
        state = self._state[lease.index]
        state.outstanding -= lease.size
        state.leases -= 1
        state.done += 1
        if lease.moved:
            count, total = self._sizes
            self._sizes = (count + 1, total + lease.moved)

    def failed(self, index: int) -> None:
        """Endpoint ``index`` failed: avoid it for a while (longer after each failure)."""
        state = self._state[index]
        state.failures += 1
        pause = min(AVOID * 2.0 ** (state.failures - 1), AVOID_MAX)
        state.avoid_until = self._clock() + pause

    def avoid(self, index: int, seconds: float) -> None:
        """Avoid endpoint ``index`` for ``seconds`` more (unless already for longer): another
        process on this host saw it fail. Not a failure here, so the pause does not grow."""
        state = self._state[index]
        state.avoid_until = max(state.avoid_until, self._clock() + max(0.0, seconds))

    def succeeded(self, index: int) -> None:
        """Endpoint ``index`` did its work: it is no longer avoided."""
        state = self._state[index]
        state.failures = 0
        state.avoid_until = 0.0


def assign(sizes: Sequence[int], endpoints: int) -> list[int]:
    """The endpoint for each piece of work of ``sizes`` bytes, all under way together: each
    in turn to the least loaded (the planner's use of :class:`Spread`, on the driver)."""
    plan = Spread([Endpoint("", 0)] * endpoints, rng=random.Random(0))
    chosen: list[int] = []
    for size in sizes:
        index = plan.pick(size, prefer=len(chosen))
        assert index is not None
        plan.lease(index, size)
        chosen.append(index)
    return chosen


def plan_orders(sizes: Sequence[int], endpoints: int) -> list[tuple[int, ...]]:
    """Each task's endpoints in the order it prefers them (the planner's, on the driver):
    first its home (:func:`assign`), then the endpoint it moves to if its home fails. The
    tasks of one home are spread over the others by bytes, like the homes themselves: a host
    lost mid-read hands its tasks (those cut, those not begun) to all the survivors, not to
    one. Every process of a read works alone, so this rule is what keeps them apart."""
    homes = assign(sizes, endpoints)
    fallback = [0] * len(sizes)
    for home in range(endpoints):
        mine = [t for t, h in enumerate(homes) if h == home]
        others = [(home + 1 + j) % endpoints for j in range(endpoints - 1)]
        if not others:
            continue
        for t, j in zip(mine, assign([sizes[t] for t in mine], len(others)), strict=True):
            fallback[t] = others[j]
    orders = []
    for t, home in enumerate(homes):
        rest = [(home + j) % endpoints for j in range(1, endpoints)]
        rest = [i for i in rest if i != fallback[t]]
        orders.append((home, fallback[t], *rest) if endpoints > 1 else (home,))
    return orders


_spreads: dict[tuple[Endpoint, ...], Spread] = {}
_spreads_pid = os.getpid()


def spread_for(endpoints: Sequence[Endpoint]) -> Spread:
    """This process's :class:`Spread` of ``endpoints`` (shared by its clients of that URL)."""
    global _spreads_pid
    if _spreads_pid != os.getpid():  # a forked child learns for itself
        _spreads.clear()
        _spreads_pid = os.getpid()
    key = tuple(endpoints)
    found = _spreads.get(key)
    if found is None:
        found = _spreads[key] = Spread(key)
    return found


def split_bytes(split: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> int | None:
    """The planned bytes of a split or of a task's splits (None if the plan gave none)."""
    splits = [split] if isinstance(split, Mapping) else list(split)
    sizes = [s.get("bytes") for s in splits]
    if not sizes or any(not isinstance(b, int) for b in sizes):
        return None
    return sum(b for b in sizes if isinstance(b, int))
