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
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from aqueduct_core.errors import AqueductError
from aqueduct_spark.cli.arguments import build_parser

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS: dict[str, str] = {
    "serve": "serve:cmd_serve",
    "cert": "serve:cmd_cert",
    "ls": "datasets:cmd_ls",
    "describe": "datasets:cmd_describe",
    "head": "datasets:cmd_head",
    "cat": "datasets:cmd_cat",
    "history": "datasets:cmd_history",
    "drop": "datasets:cmd_drop",
    "import": "datasets:cmd_import",
    "export": "datasets:cmd_export",
    "compact": "maintenance:cmd_compact",
    "vacuum": "maintenance:cmd_vacuum",
    "restore": "maintenance:cmd_restore",
    "delete": "maintenance:cmd_delete",
    "status": "status:cmd_status",
}
"""Each command's function, as ``module:function`` in this package: a command imports what
it needs when it runs, so ``--version``, ``--help`` and a usage error import neither the
client (pyarrow, the protocol engine) nor the service (``python -X importtime``)."""


def command(name: str) -> Callable[[argparse.Namespace], int]:
    module, function = COMMANDS[name].split(":")
    found: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(f"{__name__}.{module}"), function
    )
    return found


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("quic").setLevel(logging.WARNING)
    try:
        if args.command == "serve":  # before anything imports ssl (tls_suites says why)
            _tls_suites(
                args.tls_suites or _file_setting(getattr(args, "config", None), "tls_suites")
            )
        if getattr(args, "config", None):  # the file's settings become the flags' defaults
            from aqueduct_spark.cli.config import load_config

            serve = _subcommand(parser, "serve")
            serve.set_defaults(**load_config(args.config, serve))
            args = parser.parse_args(argv)
        code = int(command(args.command)(args) or 0)
        sys.stdout.flush()  # here, so that a closed pipe is seen below, not at exit
        return code
    except BrokenPipeError:
        # The reader went away (`aqueduct cat ... | head`): it has what it wanted. Point
        # stdout at /dev/null so that the interpreter's last flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except AqueductError as exc:
        print(f"aqueduct {args.command}: {exc}", file=sys.stderr)  # no class names
        return 2 if isinstance(exc, ValueError) else 1  # bad input: a setting, a file's data
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"aqueduct {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"aqueduct {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _file_setting(path: str | None, key: str) -> Any:
    """``key`` of the ``--config`` file at ``path``, read with tomllib alone (loading the
    whole file imports the service, and with it ``ssl``); None when absent or unreadable
    (:func:`~aqueduct_spark.cli.config.load_config` then says what is wrong)."""
    import tomllib

    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f).get(key)
    except (OSError, tomllib.TOMLDecodeError):
        return None


def _tls_suites(given: Any) -> None:
    from aqueduct_core.transport import tls_suites

    suites = tls_suites.check(given if isinstance(given, str) else tls_suites.DEFAULT)
    why = tls_suites.prefer(suites)
    if why is not None:
        logging.getLogger("aqueduct.service").info("--tls-suites %s not applied: %s", suites, why)


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]  # type: ignore[no-any-return]
    raise LookupError(name)
