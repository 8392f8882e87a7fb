"""The ``aqueduct`` command: run the dataset service and work with its datasets.

Every client command takes ``--url`` (or ``AQUEDUCT_URL``), ``--token`` (``AQUEDUCT_TOKEN``)
and one way to trust the server: ``--cafile``, ``--fingerprint`` (``AQUEDUCT_FINGERPRINT``)
or ``--insecure``. ``docs/cli.md`` is the reference.

The modules: ``arguments`` (the parser), ``serve`` (commands on the service's machine) and
``datasets`` (commands that are the service's client). This layer sits above both the client
and the service.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from aqueduct_core.errors import AqueductError
from aqueduct_spark.cli.arguments import build_parser
from aqueduct_spark.cli.datasets import (
    cmd_cat,
    cmd_describe,
    cmd_drop,
    cmd_export,
    cmd_head,
    cmd_history,
    cmd_import,
    cmd_ls,
)
from aqueduct_spark.cli.maintenance import COMMANDS as MAINTENANCE_COMMANDS
from aqueduct_spark.cli.serve import cmd_cert, cmd_serve
from aqueduct_spark.cli.status import cmd_status

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": cmd_serve,
    "cert": cmd_cert,
    "ls": cmd_ls,
    "describe": cmd_describe,
    "head": cmd_head,
    "cat": cmd_cat,
    "history": cmd_history,
    "drop": cmd_drop,
    "import": cmd_import,
    "export": cmd_export,
    **MAINTENANCE_COMMANDS,
    "status": cmd_status,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("quic").setLevel(logging.WARNING)
    try:
        return int(COMMANDS[args.command](args) or 0)
    except AqueductError as exc:
        print(f"aqueduct {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as exc:
        print(f"aqueduct {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
