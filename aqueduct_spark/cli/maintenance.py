"""Table maintenance from the command line: ``compact``, ``vacuum``, ``restore`` and
``delete`` (requests to the service, which it authorises as writes), and the ``serve`` flags
of the maintenance the service does itself (``--maintenance`` and its settings)."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
from collections.abc import Callable
from typing import Any

from aqueduct_core.errors import AqueductError


class MaintenanceError(AqueductError):
    """A maintenance command cannot run here."""

    remedy = "install Delta Lake (pip install 'aqueduct-spark[service]'), or ask the service"


SERVE_FLAGS = (
    # flag, type, default (as service.maintenance.MaintenanceConfig has it), metavar, help
    ("--checkpoint-interval", int, 100, "N", "a checkpoint every N versions"),
    ("--log-retention-hours", float, 720.0, "H", "keep the log (time travel) this far back"),
    ("--compact-min-files", int, 50, "N", "compact once N files are smaller than the target"),
    ("--compact-target-bytes", int, 128 << 20, "BYTES", "size of compacted files"),
    ("--vacuum-retention-hours", float, 168.0, "H", "delete removed files after this long"),
    ("--vacuum-interval-hours", float, 24.0, "H", "vacuum each dataset this often"),
)
"""The maintenance settings of ``aqueduct serve`` (a test keeps the defaults equal to the
service's; the client side of the command line does not import the service)."""


def add_serve_options(s: argparse.ArgumentParser) -> None:
    """The maintenance flags of ``aqueduct serve``."""
    g = s.add_argument_group("table maintenance (after commits, in the background)")
    g.add_argument(
        "--maintenance",
        action="store_true",
        help="maintain the tables: checkpoints, log cleanup, compaction, vacuum (default off)",
    )
    for flag, kind, default, metavar, text in SERVE_FLAGS:
        g.add_argument(
            flag, type=kind, default=default, metavar=metavar, help=f"{text} (default %(default)s)"
        )


def maintenance_config(args: argparse.Namespace) -> Any:
    """The service's MaintenanceConfig for ``serve``'s flags."""
    from aqueduct_spark.service.maintenance import MaintenanceConfig

    return MaintenanceConfig(
        enabled=args.maintenance,
        checkpoint_interval=args.checkpoint_interval,
        log_retention=dt.timedelta(hours=args.log_retention_hours),
        compact_min_files=args.compact_min_files,
        compact_target_bytes=args.compact_target_bytes,
        vacuum_retention=dt.timedelta(hours=args.vacuum_retention_hours),
        vacuum_interval=dt.timedelta(hours=args.vacuum_interval_hours),
    )


def add_parsers(
    sub: Any,
    client_options: Callable[[argparse.ArgumentParser], None],
    storage_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    """The ``compact``, ``vacuum``, ``restore`` and ``delete`` commands (``client_options`` and
    ``storage_options`` add the connection flags and ``--storage-option``)."""
    c = sub.add_parser("compact", help="rewrite a dataset's small files into large ones")
    c.add_argument("dataset")
    c.add_argument("--target-bytes", type=int, help="size of the files to write (default 128 MiB)")
    client_options(c)
    vac = sub.add_parser(
        "vacuum", help="delete files that versions within the retention do not need"
    )
    vac.add_argument("dataset")
    vac.add_argument(
        "--retention-hours",
        type=float,
        default=168.0,
        help="keep files removed less than this long ago (default %(default)s = 7 days)",
    )
    vac.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    vac.add_argument(
        "--root",
        default=os.environ.get("AQUEDUCT_ROOT"),
        help="open the service's data directory directly instead of asking the service "
        "(on its machine, e.g. while it is down; env AQUEDUCT_ROOT)",
    )
    storage_options(vac)  # with --root
    client_options(vac)
    r = sub.add_parser("restore", help="make a dataset's data what it was at an earlier version")
    r.add_argument("dataset")
    r.add_argument("--version", type=int, required=True, help="the version to go back to")
    client_options(r)
    d = sub.add_parser("delete", help="delete the rows of a dataset that match a predicate")
    d.add_argument("dataset")
    d.add_argument(
        "--where",
        required=True,
        metavar="PREDICATE",
        help="SQL condition on the columns, as for head --where, e.g. \"id < 100 AND s = 'x'\"",
    )
    client_options(d)


def _client(args: argparse.Namespace) -> Any:
    """The commands' client (imported here: the parser imports this module, and ``aqueduct
    --version`` must not wait for the client)."""
    from aqueduct_spark.cli.datasets import _client as client

    return client(args)


def cmd_compact(args: argparse.Namespace) -> int:
    r = _client(args).compact(args.dataset, target_bytes=args.target_bytes)
    if not r["committed"]:
        print(f"{args.dataset}: nothing to compact (version {r['version']})")
    else:
        print(
            f"{args.dataset}: version {r['version']} rewrote {r['files_removed']} files "
            f"into {r['files_added']}"
        )
    return 0


def cmd_vacuum(args: argparse.Namespace) -> int:
    if args.root:
        removed = _vacuum_root(args)
    else:
        removed = _client(args).vacuum(
            args.dataset, retention_hours=args.retention_hours, dry_run=args.dry_run
        )
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(removed)} files")
    for path in removed:
        print(f"  {path}")
    return 0


def _vacuum_root(args: argparse.Namespace) -> list[str]:
    """Vacuum by opening the store directly (``--root``): no service, no network."""
    if importlib.util.find_spec("deltalake") is None:
        raise MaintenanceError(
            "aqueduct vacuum --root opens the Delta tables itself, which needs Delta Lake: "
            "pip install 'aqueduct-spark[service]' (or leave out --root to ask the service)"
        )
    from aqueduct_spark.service.store import Store

    options = dict(kv.split("=", 1) for kv in args.storage_option)
    return Store(args.root, options or None).vacuum(
        args.dataset, retention=dt.timedelta(hours=args.retention_hours), dry_run=args.dry_run
    )


def cmd_restore(args: argparse.Namespace) -> int:
    r = _client(args).restore(args.dataset, args.version)
    print(
        f"{args.dataset}: version {r['version']} restores version {args.version} "
        f"({r['files_restored']} files back, {r['files_removed']} removed)"
    )
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    r = _client(args).delete(args.dataset, args.where)
    if not r["committed"]:
        print(f"{args.dataset}: no rows match; nothing deleted")
    else:
        print(f"{args.dataset}: version {r['version']} deleted {r['rows_deleted']:,} rows")
    return 0


COMMANDS = {
    "compact": cmd_compact,
    "vacuum": cmd_vacuum,
    "restore": cmd_restore,
    "delete": cmd_delete,
}
