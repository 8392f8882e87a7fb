"""The command line of ``aqueduct``: every command, option and environment variable
(``docs/cli.md`` is the reference, and a test parses its examples with this parser)."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from typing import Any, NoReturn

from aqueduct_core.host import usable_cores
from aqueduct_spark.cli import maintenance, staging
from aqueduct_spark.cli.arg_types import (
    key_value as _key_value,
)
from aqueduct_spark.cli.arg_types import (
    listen_transports as _listen_transports,
)
from aqueduct_spark.cli.arg_types import (
    port as _port,
)
from aqueduct_spark.cli.arg_types import (
    positive as _positive,
)
from aqueduct_spark.cli.arg_types import (
    seconds as _seconds,
)
from aqueduct_spark.protocol.headers import MAX_BATCH_BYTES

DEFAULT_URL = "quic://127.0.0.1:4433"
ENGINE_DEFAULTS = {
    "max_message_gap": 1 << 20,
    "max_early_bytes": 16 * 1024 * 1024,
    "max_pending_bytes": 256 * 1024 * 1024,
    "max_channels": 10_000,
    "max_pending_channels": 4096,
    "handshake_timeout": 10.0,
}
"""The engine limits ``serve`` has flags for, as ``EngineConfig`` has them (a test keeps them
equal): written here so that parsing a command line does not import the protocol engine."""
REQUEST_WINDOW = 256 * 1024
"""``serve --request-window``'s default, the service's (``service.admission.REQUEST_WINDOW``;
a test keeps them equal), written here for the same reason."""


class _Parser(argparse.ArgumentParser):
    """A usage error is one line that says where the options are, not the whole usage, and
    names the closest option or choice to a misspelt one (as the Spark options do)."""

    _argv: list[str] = []

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        prog = self.prog
        if message.startswith("unrecognized arguments: "):
            command = self._command()  # the top parser reports what a command did not know
            if command is not None:
                prog = command.prog
            options = [o for p in (self, command) if p for o in _option_strings(p)]
            words = message.removeprefix("unrecognized arguments: ").split()
            unknown = [w for w in words if w.startswith("-")] or words
            message = "unrecognized arguments: " + " ".join(
                w + _closest(w.split("=", 1)[0], options) for w in unknown
            )
        elif "invalid choice: " in message:
            wrong = message.split("invalid choice: ", 1)[1].split(" (choose from ", 1)
            if len(wrong) == 2:
                choices = [c.strip(" '") for c in wrong[1].rstrip(")").split(",")]
                message = message.replace(
                    f"invalid choice: {wrong[0]}",
                    f"invalid choice: {wrong[0]}{_closest(wrong[0].strip(chr(39)), choices)}",
                )
        self.exit(2, f"{prog}: {message} (see {prog} --help)\n")

    def _command(self) -> argparse.ArgumentParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = next((a for a in self._argv if a in action.choices), None)
                return None if chosen is None else action.choices[chosen]
        return None


def _option_strings(p: argparse.ArgumentParser) -> list[str]:
    return [o for a in p._actions for o in a.option_strings if o.startswith("--")]


def _closest(word: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("aqueduct-spark")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown (not installed)"


class _Version(argparse.Action):
    """``--version``, which reads the package metadata only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"aqueduct {_version()} (Python {sys.version.split()[0]})")
        parser.exit(0)


def _json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json", action="store_true", help="print JSON (for scripts) instead of a table"
    )


def _client_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument(
        "--url",
        default=os.environ.get("AQUEDUCT_URL", DEFAULT_URL),
        help="service address, quic://host:port (env AQUEDUCT_URL; default %(default)s)",
    )
    g.add_argument(
        "--token",
        default=os.environ.get("AQUEDUCT_TOKEN"),
        help="bearer token the service requires (env AQUEDUCT_TOKEN)",
    )
    trust = g.add_mutually_exclusive_group()
    trust.add_argument(
        "--cafile", help="CA certificate (PEM) that signed the service's certificate"
    )
    trust.add_argument(
        "--fingerprint",
        default=os.environ.get("AQUEDUCT_FINGERPRINT"),
        help="SHA-256 of the service certificate, as 'aqueduct serve' prints it "
        "(env AQUEDUCT_FINGERPRINT)",
    )
    trust.add_argument(
        "--insecure",
        action="store_true",
        help="do not verify the service certificate (local tests only)",
    )
    _backend_option(g)
    g.add_argument(
        "--transport",
        default="auto",
        choices=["auto", "quic", "tcp"],
        help="quic or tcp (TLS over TCP, where UDP is blocked) for everything, or auto: reads "
        "and writes over TCP, other requests over QUIC, each falling back to the other "
        "(env AQUEDUCT_TRANSPORT replaces auto; -v shows the one used)",
    )


def _backend_option(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "aioquic", "qh3"],
        help="QUIC library (default: qh3 when installed)",
    )


def _storage_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_key_value,
        help="object-store option passed to Delta Lake (repeatable)",
    )


def _file_format_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=["auto", "parquet", "csv"],
        default="auto",
        help="file format (default: from the file extension)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="aqueduct", description="Aqueduct dataset service and client commands.")
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    _talk_options(parser.add_mutually_exclusive_group())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="run the dataset service")
    s.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file with serve settings and tokens; flags given here win over it",
    )
    s.add_argument(
        "--root",
        default=os.environ.get("AQUEDUCT_ROOT", "./aqueduct-data"),
        help="directory (or object-store URI) holding the datasets (default %(default)s)",
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default %(default)s: this machine only)",
    )
    s.add_argument(
        "--port",
        type=_port,
        default=4433,
        help="UDP and TCP port (default %(default)s; 0: any free)",
    )
    s.add_argument(
        "--transport",
        default="quic,tcp",
        type=_listen_transports,
        help="what to listen on: quic (UDP), tcp (TLS over TCP) or both on the same port "
        "(default %(default)s)",
    )
    s.add_argument(
        "--token",
        default=os.environ.get("AQUEDUCT_TOKEN"),
        help="require this bearer token from clients (env AQUEDUCT_TOKEN)",
    )
    s.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="serve beyond loopback (--host) with no token at all; refused without it",
    )
    s.add_argument(
        "--web",
        action="store_true",
        help="also serve browsers: WebTransport on the UDP port, WebSocket on the TCP port "
        "(docs/protocol-profile.md sections 8 and 9)",
    )
    s.add_argument(
        "--web-origin",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="with --web: a page origin (https://host[:port]) whose browsers may connect; "
        "repeat for more; default: any (requests from programs carry none and always may)",
    )
    s.add_argument(
        "--console",
        action="store_true",
        help="serve the live console (a web page, implies --web) on --console-port",
    )
    s.add_argument(
        "--console-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="TCP port of the console (implies --console; default: any free one, printed at start)",
    )
    s.add_argument(
        "--console-host",
        default=None,
        metavar="HOST",
        help="address of the console's port (default: --host)",
    )
    s.add_argument(
        "--console-dir",
        default=None,
        metavar="DIR",
        help="the console's built files (default: clients/typescript/dist/console of this "
        "checkout when built, else a page saying how to build it)",
    )
    s.add_argument("--cert", help="certificate chain (PEM); default: a development certificate")
    s.add_argument("--key", help="private key (PEM) of --cert")
    s.add_argument(
        "--tls-suites",
        default=None,
        metavar="SUITES",
        help="TLS 1.3 cipher suites of TLS/TCP connections, in the service's order of "
        "preference, joined by ':'; 'openssl' keeps OpenSSL's (default "
        "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256)",
    )
    s.add_argument(
        "--workers",
        type=_workers,
        default="auto",
        help="service processes sharing the port: N, or auto (one per usable core when there "
        "are more than two, else 1; default auto)",
    )
    _observability_options(s)
    _storage_options(s)
    _backend_option(s)
    s.add_argument(
        "--packet-size",
        type=int,
        default=None,
        help="QUIC packet size (default: largest on loopback, else the route's MTU "
        "less IP and UDP headers)",
    )
    s.add_argument(
        "--max-requests",
        type=_positive,
        default=64,
        metavar="N",
        help="requests of one connection served at once; more wait (default %(default)s)",
    )
    s.add_argument(
        "--request-window",
        type=_positive,
        default=REQUEST_WINDOW,
        metavar="BYTES",
        help="bytes of requests one connection may send ahead of those being served (about "
        "60 small ones); more wait in the client, and a client that sends more anyway is "
        "disconnected (default %(default)s)",
    )
    s.add_argument(
        "--max-scans",
        type=_positive,
        default=16,
        metavar="N",
        help="scans one connection may have open; more are refused, to be retried "
        "(default %(default)s)",
    )
    s.add_argument(
        "--max-batch-bytes",
        type=_positive,
        default=MAX_BATCH_BYTES,
        metavar="BYTES",
        help="largest data message (one encoded Arrow batch; a compressed one counts at the "
        "size it decompresses to) a write may send; a row above it cannot be written. "
        "Clients have their own limit (Spark option maxBatchBytes) (default %(default)s)",
    )
    s.add_argument(
        "--compression",
        type=_compression,
        default="auto",
        metavar="SETTING",
        help="Arrow IPC body compression of scans whose client leaves it to the service (a "
        "client's own auto): auto compresses when the network, not the CPU, is the limit, "
        "measured per connection; none, lz4, zstd or zstd:LEVEL always. A client's fixed "
        "setting is always honoured; with none, writers are asked not to compress "
        "(default %(default)s)",
    )
    s.add_argument(
        "--no-pass-parquet",
        action="store_true",
        help="scans as Arrow only; by default a row group needing no filter, cast or filled "
        "column goes as stored Parquet to clients that decode it (Spark option decode)",
    )
    s.add_argument(
        "--max-message-gap",
        type=_positive,
        default=ENGINE_DEFAULTS["max_message_gap"],
        metavar="N",
        help="how far a peer's message number may run ahead of what was decided; beyond it "
        "the connection is closed (default %(default)s)",
    )
    s.add_argument(
        "--handshake-timeout",
        type=_seconds,
        default=ENGINE_DEFAULTS["handshake_timeout"],
        metavar="SECONDS",
        help="seconds a client has over TCP from its connect to finish TLS and send its "
        "SETTINGS, and on either transport after the handshake to send its connection "
        "headers; beyond either the connection is closed with code 4 (default %(default)s)",
    )
    s.add_argument(
        "--max-early-bytes",
        type=_positive,
        default=ENGINE_DEFAULTS["max_early_bytes"],
        metavar="BYTES",
        help="bytes a client may send before its connection headers (default %(default)s)",
    )
    s.add_argument(
        "--max-pending-bytes",
        type=_positive,
        default=ENGINE_DEFAULTS["max_pending_bytes"],
        metavar="BYTES",
        help="bytes one connection may hold in channels not attached yet and in unfinished "
        "messages no window covers (default %(default)s)",
    )
    s.add_argument(
        "--max-channels",
        type=_positive,
        default=ENGINE_DEFAULTS["max_channels"],
        metavar="N",
        help="live channels on one connection; a client that opens more is disconnected "
        "(default %(default)s)",
    )
    s.add_argument(
        "--max-pending-channels",
        type=_positive,
        default=ENGINE_DEFAULTS["max_pending_channels"],
        metavar="N",
        help="channels a client may create that are not attached yet (default %(default)s)",
    )
    staging.add_serve_options(s, _positive)
    maintenance.add_serve_options(s)

    c = sub.add_parser("cert", help="create a development CA and server certificate")
    c.add_argument(
        "--out", default="./aqueduct-tls", help="directory to write into (default %(default)s)"
    )
    c.add_argument(
        "--host",
        action="append",
        default=None,
        help="name or address the certificate is for (repeatable; default localhost, 127.0.0.1, ::1)",
    )
    c.add_argument("--days", type=int, default=365, help="validity in days (default %(default)s)")

    ls = sub.add_parser("ls", help="list datasets")
    _json_option(ls)
    _client_options(ls)
    d = sub.add_parser("describe", help="show a dataset's schema, version, size")
    d.add_argument("dataset")
    d.add_argument("--version", type=int, help="an older version (time travel)")
    _json_option(d)
    _client_options(d)
    h = sub.add_parser("head", help="print the first rows of a dataset")
    h.add_argument("dataset")
    h.add_argument("-n", "--rows", type=int, default=10, help="rows to print (default %(default)s)")
    _read_options(h)
    _client_options(h)
    cat = sub.add_parser("cat", help="print every row of a dataset")
    cat.add_argument("dataset")
    cat.add_argument(
        "--format",
        choices=["auto", "table", "csv", "json"],
        default="auto",
        help="table (aligned, for reading), csv (one header line) or json (an object a "
        "line); default auto: table on a terminal, csv into a pipe or file",
    )
    _read_options(cat)
    _client_options(cat)
    hist = sub.add_parser("history", help="list a dataset's versions")
    hist.add_argument("dataset")
    _json_option(hist)
    _client_options(hist)
    drop = sub.add_parser("drop", help="delete a dataset and all its versions")
    drop.add_argument("dataset")
    drop.add_argument("--if-exists", action="store_true", help="no error if it does not exist")
    _client_options(drop)
    imp = sub.add_parser("import", help="load Parquet or CSV files into a dataset")
    imp.add_argument("dataset")
    imp.add_argument("files", nargs="+", help="Parquet or CSV files")
    imp.add_argument(
        "--mode",
        choices=["append", "overwrite"],
        default="append",
        help="add to the dataset or replace it (default %(default)s)",
    )
    _file_format_option(imp)
    imp.add_argument(
        "--schema",
        metavar="COLUMN:TYPE,...",
        help="types of CSV columns, e.g. 'id:bigint,ts:timestamp,price:decimal(10,2)'; the "
        "others are inferred from every value of the files",
    )
    imp.add_argument(
        "--allow-strings",
        action="store_true",
        help="import a CSV column as text when some of its values are not numbers, times or "
        "booleans although most are (without it, the import fails at the first such value)",
    )
    imp.add_argument(
        "--partition-by",
        action="append",
        default=[],
        help="partition column when the dataset is created (repeatable)",
    )
    _client_options(imp)
    exp = sub.add_parser("export", help="write a dataset to a Parquet or CSV file")
    exp.add_argument("dataset")
    exp.add_argument("file")
    exp.add_argument("--force", action="store_true", help="replace FILE if it exists")
    _file_format_option(exp)
    _read_options(exp)
    _client_options(exp)
    st = sub.add_parser("status", help="show whether a service is up and how fast it answers")
    st.add_argument(
        "target", nargs="?", metavar="URL", help="service address (default: --url, AQUEDUCT_URL)"
    )
    st.add_argument("--json", action="store_true", help="print one JSON object")
    _client_options(st)
    maintenance.add_parsers(sub, _client_options, _storage_options)
    for command in sub.choices.values():  # -v and -q also after the command
        _talk_options(command.add_mutually_exclusive_group(), default=argparse.SUPPRESS)
    return parser


def _observability_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("logs and metrics (docs/operations.md#observability)")
    g.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=None,
        help="least severe log records shown (default info; debug with -v, warning with -q)",
    )
    g.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text: 'time LEVEL logger: message key=value ...'; json: one object per line "
        "(default %(default)s)",
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus /metrics and /health over HTTP on this TCP port (0: any "
        "free one; default: off). With --workers N, worker i uses PORT+i",
    )
    g.add_argument(
        "--metrics-host",
        default=None,
        metavar="HOST",
        help="address of the metrics port (default: --host)",
    )


def _talk_options(g: argparse._MutuallyExclusiveGroup, default: object = False) -> None:
    g.add_argument("-v", "--verbose", action="store_true", default=default, help="log more (DEBUG)")
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default,
        help="log warnings and errors only, no progress bars",
    )


def _compression(text: str) -> str:
    from aqueduct_spark.protocol.compression import Compression

    try:
        return str(Compression.parse(text, "--compression"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def auto_workers(cores: int | None = None) -> int:
    """``--workers auto``: one service process per core this process may run on, when there
    are more than two; else one. A process's event loop (TLS, the socket, the protocol) runs
    on one core whatever threads decode Parquet beside it, so a service read by many clients
    (a Spark job's tasks) uses the cores only through several processes; on two cores the
    clients and the service's decoding threads already contend for the second."""
    if cores is None:
        cores = usable_cores()
    return cores if cores > 2 else 1


def _workers(text: str) -> int:
    if str(text).strip().lower() == "auto":
        return auto_workers()
    try:
        return _positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected auto or a whole number of at least 1, got {text!r}"
        ) from None


def _read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--columns", help="comma-separated columns to read")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="CONDITION",
        help="SQL condition on the columns, e.g. \"ts >= '2026-01-01' AND city = 'Oslo'\" "
        "(repeatable, ANDed; literals take the column's type)",
    )
    p.add_argument("--version", type=int, help="read an older version (time travel)")
