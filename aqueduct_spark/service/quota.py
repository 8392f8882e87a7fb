"""Staging quotas: how many bytes of staged, uncommitted data one transaction and one token
(or, on a service without tokens, one connection) may have on the store.

Every write task's bytes are charged as they land (:attr:`.staging.StageWriter.meter`): before
a row group or footer is written, a bound of what it takes; after, the difference to what it
took. A charge that would take its transaction or its owner past the limit is refused before
anything is written, with :class:`~aqueduct_spark.protocol.InvalidRequest` naming the limit
(never retried: the same write would meet it again); the write then deletes what it staged.
A transaction's bytes stay charged until it is committed, aborted or expired
(:mod:`.transactions`), whichever process that happens in.

The counts are this process's: what was staged through it since it started. A token writing
through several service processes (``--workers``, or several hosts) may stage the limit
through each. An owner is a token's grant, so a token's connections share one count however
many it opens; a service without tokens cannot tell its clients apart, so there the owner is
the connection, and a client that opens another connection starts another count.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from aqueduct_spark.protocol import InvalidRequest

Key = tuple[str, str]
"""A transaction: (dataset, txn)."""

TXN_FLAG = "--max-staged-bytes-per-txn (max_staged_bytes_per_txn in its --config file)"
TOKEN_FLAG = "--max-staged-bytes-per-token (max_staged_bytes_per_token in its --config file)"


def size(n: int) -> str:
    """``4,194,304 bytes (4.0 MiB)``."""
    if n < 1024:
        return f"{n} bytes"
    units = ("KiB", "MiB", "GiB", "TiB")
    value, i = n / 1024, 0
    while value >= 1024 and i < len(units) - 1:
        value, i = value / 1024, i + 1
    return f"{n:,} bytes ({value:.1f} {units[i]})"


@dataclass
class _Txn:
    bytes: int = 0
    owners: dict[object, int] = field(default_factory=dict)


class Ledger:
    """The staged bytes of this process, by transaction and by owner. Thread-safe."""

    def __init__(
        self,
        max_txn_bytes: int,
        max_owner_bytes: int,
        per_token: bool,
        refused: Callable[[str], None] = lambda scope: None,
    ) -> None:
        self.max_txn_bytes = max_txn_bytes
        self.max_owner_bytes = max_owner_bytes
        self.per_token = per_token
        """Owners are tokens' grants; else connections (a service without tokens)."""
        self._refused = refused
        self._lock = threading.Lock()
        self._txns: dict[Key, _Txn] = {}
        self._owners: dict[object, int] = {}
        self.total = 0

    @property
    def transactions(self) -> int:
        return len(self._txns)

    def transaction_keys(self) -> list[Key]:
        with self._lock:
            return list(self._txns)

    def owner_bytes(self, owner: object) -> int:
        return self._owners.get(owner, 0)

    def txn_bytes(self, key: Key) -> int:
        found = self._txns.get(key)
        return found.bytes if found is not None else 0

    def charge(self, key: Key, owner: object, owner_name: str) -> Charge:
        """A write of transaction ``key`` by ``owner`` (named so in refusals)."""
        return Charge(self, key, owner, owner_name)

    def _add(self, charge: Charge, n: int) -> None:
        with self._lock:
            txn = self._txns.get(charge.key)
            if n > 0:
                held = txn.bytes if txn is not None else 0
                if held + n > self.max_txn_bytes:
                    self._refused("transaction")
                    raise self._txn_refusal(charge, held, n)
                mine = self._owners.get(charge.owner, 0)
                if mine + n > self.max_owner_bytes:
                    self._refused("token" if self.per_token else "connection")
                    raise self._owner_refusal(charge, mine, n)
                if txn is None:
                    txn = self._txns[charge.key] = _Txn()
            elif txn is None:  # settled meanwhile (committed elsewhere): nothing counted
                charge.bytes = max(0, charge.bytes + n)
                return
            else:  # never below what this owner has in it
                n = max(n, -txn.owners.get(charge.owner, 0))
            txn.bytes += n
            txn.owners[charge.owner] = txn.owners.get(charge.owner, 0) + n
            if charge.owner in self._owners or n > 0:
                self._owners[charge.owner] = self._owners.get(charge.owner, 0) + n
            self.total += n
            charge.bytes += n

    def _txn_refusal(self, charge: Charge, held: int, n: int) -> InvalidRequest:
        dataset, txn = charge.key
        return InvalidRequest(
            f"the write was refused: it would take transaction {txn} of dataset {dataset!r} "
            f"past the service's limit of {size(self.max_txn_bytes)} of staged, uncommitted "
            f"data ({size(held)} staged, about {size(n)} more to write). Write less in one "
            f"transaction (commit and begin another), or raise aqueduct serve {TXN_FLAG}",
            {
                "limit": "max_staged_bytes_per_txn",
                "limit_bytes": self.max_txn_bytes,
                "staged": held,
            },
        )

    def _owner_refusal(self, charge: Charge, held: int, n: int) -> InvalidRequest:
        who = charge.owner_name
        if not self.per_token:
            who = "this connection (the service has no tokens: the limit is per connection)"
        return InvalidRequest(
            f"the write was refused: it would take {who} past the service's limit of "
            f"{size(self.max_owner_bytes)} of staged, uncommitted data ({size(held)} staged "
            f"in open transactions, about {size(n)} more to write). Commit or abort the open "
            f"transactions first, or raise aqueduct serve {TOKEN_FLAG}",
            {
                "limit": "max_staged_bytes_per_token",
                "limit_bytes": self.max_owner_bytes,
                "staged": held,
            },
        )

    def settle(self, key: Key) -> int:
        """The transaction was committed, aborted or expired: its bytes are no longer staged
        uncommitted data. Returns how many bytes it had."""
        with self._lock:
            txn = self._txns.pop(key, None)
            if txn is None:
                return 0
            for owner, n in txn.owners.items():
                if owner in self._owners:
                    self._owners[owner] -= n
                    if self._owners[owner] <= 0:
                        del self._owners[owner]
            self.total -= txn.bytes
            return txn.bytes

    def forget(self, owner: object) -> None:
        """An owner that cannot come back (a closed connection): drop its count."""
        with self._lock:
            self._owners.pop(owner, None)


class Charge:
    """The bytes one write staged, charged to its transaction and its owner as they land."""

    def __init__(self, ledger: Ledger, key: Key, owner: object, owner_name: str) -> None:
        self.ledger = ledger
        self.key = key
        self.owner = owner
        self.owner_name = owner_name
        self.bytes = 0
        self.expired: InvalidRequest | None = None
        """Set when the transaction expired under this write: its next charge fails."""

    def add(self, n: int) -> None:
        """``n`` more bytes (fewer if negative); refused past a limit, or once expired."""
        if self.expired is not None and n > 0:
            raise self.expired
        self.ledger._add(self, n)

    def release(self) -> None:
        """Everything this write staged was deleted."""
        self.ledger._add(self, -self.bytes)
