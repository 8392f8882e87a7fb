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
import os
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
from aqueduct_spark.service.startup import StartupError

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
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("quic").setLevel(logging.WARNING)
    try:
        if getattr(args, "config", None):  # the file's settings become the flags' defaults
            from aqueduct_spark.cli.config import load_config

            serve = _subcommand(parser, "serve")
            serve.set_defaults(**load_config(args.config, serve))
            args = parser.parse_args(argv)
        code = int(COMMANDS[args.command](args) or 0)
        sys.stdout.flush()  # here, so that a closed pipe is seen below, not at exit
        return code
    except BrokenPipeError:
        # The reader went away (`aqueduct cat ... | head`): it has what it wanted. Point
        # stdout at /dev/null so that the interpreter's last flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except StartupError as exc:
        print(f"aqueduct {args.command}: {exc}", file=sys.stderr)
        return 2
    except AqueductError as exc:
        print(f"aqueduct {args.command}: {exc}", file=sys.stderr)  # no class names
        return 1
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"aqueduct {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"aqueduct {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]  # type: ignore[no-any-return]
    raise LookupError(name)
