"""The ``serve`` flags that bound writes: staging quotas and the lifetime of idle write
transactions (``docs/operations.md#uncommitted-writes``), and the memory for decoded write data
(``docs/operations.md#memory-bounds``)."""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from typing import Any

GiB = 1 << 30
MAX_TXN_BYTES = 64 * GiB
MAX_TOKEN_BYTES = 256 * GiB
LIFETIME_HOURS = 24.0
SWEEP_SECONDS = 600.0
"""The defaults, as ``service.transactions.StagingConfig`` has them (a test keeps them equal;
the client side of the command line does not import the service)."""
WRITE_BUFFER_BYTES = GiB
"""``--max-write-buffer-bytes``'s default, ``service.write_buffers.WRITE_BUFFER_BYTES`` (a
test keeps them equal)."""


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value


def add_serve_options(s: argparse.ArgumentParser, whole: Callable[[str], int]) -> None:
    """The staging flags of ``aqueduct serve`` (``whole`` parses a whole number >= 1)."""
    g = s.add_argument_group("uncommitted writes (docs/operations.md#uncommitted-writes)")
    g.add_argument(
        "--max-staged-bytes-per-txn",
        type=whole,
        default=MAX_TXN_BYTES,
        metavar="BYTES",
        help="staged, uncommitted bytes one write transaction may have; a write past it is "
        "refused (default %(default)s: 64 GiB)",
    )
    g.add_argument(
        "--max-staged-bytes-per-token",
        type=whole,
        default=MAX_TOKEN_BYTES,
        metavar="BYTES",
        help="staged bytes of the open transactions of one token, however many connections "
        "it uses (without tokens: of one connection) (default %(default)s: 256 GiB)",
    )
    g.add_argument(
        "--txn-lifetime-hours",
        type=_positive,
        default=LIFETIME_HOURS,
        metavar="H",
        help="a write transaction with no write, commit or abort for this long is aborted "
        "and its staged files deleted (default %(default)s)",
    )
    g.add_argument(
        "--txn-sweep-seconds",
        type=_positive,
        default=SWEEP_SECONDS,
        metavar="S",
        help="how often to look for such transactions (default %(default)s)",
    )
    m = s.add_argument_group("memory for writes (docs/operations.md#memory-bounds)")
    m.add_argument(
        "--max-write-buffer-bytes",
        type=whole,
        default=WRITE_BUFFER_BYTES,
        metavar="BYTES",
        help="bytes of write data this process holds decoded at once, over all writes (at "
        "least twice --max-batch-bytes); a data message beyond it waits unread, and its "
        "client with it (default %(default)s: 1 GiB)",
    )


def staging_config(args: argparse.Namespace) -> Any:
    """The service's StagingConfig for ``serve``'s flags."""
    from aqueduct_spark.service.transactions import StagingConfig

    return StagingConfig(
        max_txn_bytes=args.max_staged_bytes_per_txn,
        max_token_bytes=args.max_staged_bytes_per_token,
        lifetime=dt.timedelta(hours=args.txn_lifetime_hours),
        sweep_interval=dt.timedelta(seconds=args.txn_sweep_seconds),
    )
