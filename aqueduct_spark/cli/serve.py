"""The commands that run on the service's machine: ``serve`` (one process, or several
sharing the port) and ``cert``. ``serve`` needs the ``service`` extra (Delta Lake); so does
``vacuum --root`` (:mod:`.maintenance`)."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import json
import multiprocessing
import os
import re
import shlex
import signal
import socket
import ssl
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aqueduct_core.engine import EngineConfig
from aqueduct_core.errors import AqueductError
from aqueduct_core.transport import ServerTLS, TransportConfig
from aqueduct_core.transport.tls import file_fingerprint, format_fingerprint, make_dev_certificates
from aqueduct_core.transport.web_config import WebSettings
from aqueduct_spark.cli.maintenance import maintenance_config
from aqueduct_spark.cli.staging import staging_config
from aqueduct_spark.service import startup
from aqueduct_spark.service.access import AccessPolicy
from aqueduct_spark.service.startup import StartupError, check_exposure, listen_error


class AqueductServeError(AqueductError):
    """``aqueduct serve`` could not start."""

    remedy = "install the service's dependencies: pip install 'aqueduct-spark[service]'"


def service_url(host: str, port: int) -> str:
    """The URL clients use: an IPv6 literal in brackets (``quic://[::1]:4433``)."""
    return f"quic://[{host}]:{port}" if ":" in host else f"quic://{host}:{port}"


_SERVICE_NEEDS = {"deltalake": "Delta Lake", "prometheus_client": "the Prometheus client"}


def _need_service(command: str, modules: tuple[str, ...] = ("deltalake",)) -> None:
    """Say what to install when the service's dependencies are missing (an executor-side
    install, ``aqueduct-spark[spark]``, has the client only)."""
    missing = [_SERVICE_NEEDS[m] for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise AqueductServeError(
            f"aqueduct {command} runs the dataset service, which needs {' and '.join(missing)}: "
            "pip install 'aqueduct-spark[service]'"
        )


def cmd_cert(args: argparse.Namespace) -> int:
    hosts = tuple(args.host or ("localhost", "127.0.0.1", "::1"))
    certs = make_dev_certificates(args.out, hosts, args.days)
    print(f"CA certificate:     {certs.ca_file}   (clients: --cafile)")
    print(f"server certificate: {certs.cert_file}   (aqueduct serve --cert)")
    print(f"server key:         {certs.key_file}   (aqueduct serve --key)")
    print(f"SHA-256 fingerprint: {format_fingerprint(certs.fingerprint)}")
    return 0


def _access(args: argparse.Namespace) -> AccessPolicy:
    try:
        return AccessPolicy.of(args.token or None, getattr(args, "tokens", ()))
    except ValueError as exc:
        raise StartupError(str(exc)) from None


def _check_certificate(cert: str, key: str) -> None:
    for flag, path in (("--cert", cert), ("--key", key)):
        if not Path(path).is_file():
            raise StartupError(f"{flag} {path}: no such file")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise StartupError(
            f"--cert {cert} and --key {key} cannot be loaded ({exc}): give a PEM certificate "
            "chain and its private key (aqueduct cert makes a pair)"
        ) from None


def dev_tls_dir(root: str) -> Path:
    """Where ``serve`` keeps the development certificate of ``root`` (without ``--cert``):
    ``<root>/.aqueduct-tls`` for a local root; for an object-store root (``s3://...``),
    which has no local directory, a directory of its own under the user's state directory,
    ``$XDG_STATE_HOME/aqueduct/tls/`` (``~/.local/state/aqueduct/tls/``), named after the
    root. Either way one root keeps one certificate, so its fingerprint survives restarts;
    never the working directory, which differs between starts and may be shared."""
    if "://" not in root or root.startswith("file://"):
        return Path(root.removeprefix("file://")) / ".aqueduct-tls"
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    readable = re.sub(r"[^0-9A-Za-z._-]+", "_", root).strip("_")[:80]
    digest = hashlib.sha256(root.encode()).hexdigest()[:12]  # roots differing in case or /
    return Path(state) / "aqueduct" / "tls" / f"{readable}-{digest}"


def cmd_serve(args: argparse.Namespace) -> int:
    claims: list[startup.PortClaim] = []
    try:
        return _serve(args, claims)
    finally:  # the service has stopped, or refused to start after its claim: the port is free
        for claim in claims:
            claim.release()


def _serve(args: argparse.Namespace, claims: list[startup.PortClaim]) -> int:
    _need_service("serve", ("deltalake", "prometheus_client"))
    if (args.cert is None) != (args.key is None):
        raise StartupError("give both --cert and --key, or neither (for a development certificate)")
    access = _access(args)
    if args.max_write_buffer_bytes < 2 * args.max_batch_bytes:
        raise StartupError(
            f"--max-write-buffer-bytes {args.max_write_buffer_bytes} is less than twice "
            f"--max-batch-bytes {args.max_batch_bytes}: a message of the largest size must fit "
            "beside what writes keep; raise --max-write-buffer-bytes or lower --max-batch-bytes"
        )
    check_exposure(args.host, args.port, access.requires_token, args.allow_anonymous)
    root = args.root
    options = dict(kv.split("=", 1) for kv in args.storage_option)
    startup.check_root(root, options or None)  # one clear line for a root it cannot use
    if args.cert:
        _check_certificate(args.cert, args.key)
        tls = ServerTLS(args.cert, args.key)
        ca = None
    else:
        tls_dir = dev_tls_dir(root)
        if not (tls_dir / "server.pem").exists():
            make_dev_certificates(tls_dir)
        tls = ServerTLS(str(tls_dir / "server.pem"), str(tls_dir / "server.key"))
        ca = tls_dir / "ca.pem"
    port = args.port
    if args.workers > 1 and port == 0:
        port = _free_port(args.host, _transports(args.transport))
    # a port another service has is refused, even by --workers' SO_REUSEPORT; held till exit
    if port:
        claims.append(startup.claim_port(args.host, port, _transports(args.transport)))
    spec = {
        "root": root,
        "host": args.host,
        "port": port,
        "access": access,
        "certfile": tls.certfile,
        "keyfile": tls.keyfile,
        "storage_options": options or None,
        "backend": args.backend,
        "packet_size": args.packet_size,
        "transport": args.transport,
        "max_requests": args.max_requests,
        "max_scans": args.max_scans,
        "request_window": args.request_window,
        "max_batch_bytes": args.max_batch_bytes,
        "max_write_buffer_bytes": args.max_write_buffer_bytes,
        "compression": args.compression,
        "pass_parquet": not args.no_pass_parquet,
        "engine": {
            "handshake_timeout": args.handshake_timeout,
            "max_message_gap": args.max_message_gap,
            "max_early_bytes": args.max_early_bytes,
            "max_pending_bytes": args.max_pending_bytes,
            "max_pending_channels": args.max_pending_channels,
            "max_channels": args.max_channels,
        },
        "web": args.web or _console_on(args),
        "web_origins": _web_origins(args),
        "console": _console_settings(args),
        "reuse_port": args.workers > 1,
        "maintenance": maintenance_config(args),
        "staging": staging_config(args),
        "log": _log_settings(args),
        "metrics": _metrics_settings(args),
    }
    fingerprint = format_fingerprint(file_fingerprint(tls.certfile))
    banner = {
        "url": service_url(args.host, port),
        "fingerprint": fingerprint,
        "cafile": str(ca) if ca else None,
        "workers": args.workers,
        "root": root,
        "token_required": access.requires_token,
        "webtransport_hashes": _webtransport_hashes(spec),
        "console": _console_url(spec["console"]),
    }
    if args.workers <= 1:
        _check_metrics_ports([spec["metrics"]] if spec["metrics"] else [])
        _configure_logging(spec["log"])
        _run(_serve_forever(spec, banner))
        return 0
    ctx = multiprocessing.get_context("spawn")  # deltalake must not be used across fork
    held = _hold_port(args.host, port, _transports(args.transport))
    ready = [ctx.Event() for _ in range(args.workers)]
    specs = _worker_specs(spec, args.workers)
    _check_metrics_ports([s["metrics"] for s in specs if s["metrics"]])
    procs = [
        ctx.Process(target=_worker, args=(s, ev), daemon=True)
        for s, ev in zip(specs, ready, strict=True)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + 60
    while not all(ev.is_set() for ev in ready):  # announce only once every worker listens
        if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
            for proc in procs:
                proc.terminate()
            if any(p.exitcode == 2 for p in procs):
                return 2  # a startup error, which the worker printed
            raise StartupError("a service worker failed to start; see the log above")
        time.sleep(0.05)
    for sock in held:  # every worker listens: the port is theirs now
        sock.close()
    _print_banner(banner)
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop["now"] and all(p.is_alive() for p in procs):
        time.sleep(0.5)
    died = not stop["now"]
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(10)
    if died:
        print(
            "aqueduct serve: a worker process exited unexpectedly; stopped the others",
            file=sys.stderr,
        )
        return 1
    return 0


def _console_on(args: argparse.Namespace) -> bool:
    return bool(args.console or args.console_port is not None)


def _console_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """Where the console listens; None: no console."""
    if not _console_on(args):
        if args.console_host or args.console_dir:
            raise StartupError("--console-host and --console-dir need --console")
        return None
    port = args.console_port or 0
    if args.workers > 1 and not port:
        raise StartupError(
            "--console with --workers needs --console-port: the workers share one port"
        )
    directory = args.console_dir
    if directory and not (Path(directory) / "index.html").is_file():
        raise StartupError(
            f"--console-dir {directory} holds no index.html: give the directory the console "
            "was built into (clients/typescript: npm run build writes dist/console)"
        )
    return {"host": args.console_host or args.host, "port": port, "dir": directory}


def _console_url(console: dict[str, Any] | None) -> str | None:
    if console is None:
        return None
    host = console["host"]
    here = ("[::1]" if ":" in host else "127.0.0.1") if host in ("0.0.0.0", "::") else host
    name = f"[{here}]" if ":" in here and not here.startswith("[") else here
    return f"https://{name}:{console['port']}/"


def _web_origins(args: argparse.Namespace) -> list[str] | None:
    """``--web-origin``: each an origin as browsers send it (scheme://host[:port])."""
    given = args.web_origin
    if given is None:
        return None
    if not (args.web or _console_on(args)):
        raise StartupError("--web-origin needs --web (or --console)")
    for origin in given:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path:
            raise StartupError(
                f"--web-origin {origin!r} is not an origin: give scheme, host and port as a "
                "browser sends them, e.g. https://app.example.com or http://localhost:8080"
            )
    return [o.lower() for o in given]


def _web_settings(spec: dict[str, Any]) -> WebSettings:
    """Browsers' transports: each where its own transport is served."""
    on, served = spec["web"], _transports(spec["transport"])
    origins = spec.get("web_origins")
    return WebSettings(
        webtransport=on and "quic" in served,
        websocket=on and "tcp" in served,
        origins=tuple(origins) if origins is not None else None,
    )


def _webtransport_hashes(spec: dict[str, Any]) -> list[str]:
    """The hashes a page pins (the certificates every worker derives alike, wt_cert.py)."""
    if not _web_settings(spec).webtransport:
        return []
    from aqueduct_core.transport.wt_cert import WebTransportCertificates

    return WebTransportCertificates(spec["keyfile"]).fingerprints()


def _print_banner(banner: dict[str, Any]) -> None:
    print(
        f"aqueduct: serving {banner['root']} on {banner['url']} "
        f"({banner['workers']} worker{'s' if banner['workers'] != 1 else ''})",
        flush=True,
    )
    print(f"aqueduct: certificate fingerprint {banner['fingerprint']}", flush=True)
    if banner["cafile"]:
        print(
            f"aqueduct: development CA {banner['cafile']} (clients: --cafile or --fingerprint)",
            flush=True,
        )
    if banner["console"]:
        url = banner["console"]
        local = url.replace("https://127.0.0.1", "http://localhost").replace(
            "https://[::1]", "http://localhost"
        )
        also = f" (on this machine also {local})" if local != url else ""
        print(f"aqueduct: console {url}{also}", flush=True)
    if banner["webtransport_hashes"]:
        print(
            "aqueduct: WebTransport certificate hashes (serverCertificateHashes, SHA-256): "
            + ", ".join(banner["webtransport_hashes"]),
            flush=True,
        )
    print("aqueduct: to use it from another shell:", flush=True)
    for line in _client_commands(banner):
        print(f"    {line}", flush=True)
    print("AQUEDUCT_READY " + json.dumps(banner), flush=True)


def _client_commands(banner: dict[str, Any]) -> list[str]:
    """Shell lines that point the CLI, the Python client and Spark at this service."""
    scheme, _, address = banner["url"].partition("://")
    host, _, port = address.rpartition(":")
    wildcard = host.strip("[]") in ("0.0.0.0", "::", "")
    here = ("[::1]" if ":" in host else "127.0.0.1") if wildcard else host
    url = f"{scheme}://{here}:{port}"
    lines = [
        f"export AQUEDUCT_URL={shlex.quote(url)} "
        f"AQUEDUCT_FINGERPRINT={shlex.quote(banner['fingerprint'])}"
    ]
    if banner["token_required"]:
        lines.append("export AQUEDUCT_TOKEN=...   # a token this service accepts")
    if wildcard:
        lines.append(
            f"# from other machines: AQUEDUCT_URL={scheme}://{socket.gethostname()}:{port}"
        )
    lines.append("aqueduct ls")
    return lines


def _worker(spec: dict[str, Any], ready: Any) -> None:
    _configure_logging(spec["log"])
    try:
        _run(_serve_forever(spec, None, ready))
    except StartupError as exc:
        print(f"aqueduct serve: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


def _log_settings(args: argparse.Namespace) -> dict[str, Any]:
    level = args.log_level or ("debug" if args.verbose else "warning" if args.quiet else "info")
    return {"level": level, "format": args.log_format}


def _configure_logging(settings: dict[str, Any]) -> None:
    from aqueduct_spark.service.observability import configure_logging

    configure_logging(settings["level"], settings["format"], settings.get("worker"))


def _metrics_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """Where the HTTP port for ``/metrics`` and ``/health`` listens; None: nowhere."""
    if args.metrics_port is None:
        if args.metrics_host is not None:
            raise ValueError("--metrics-host needs --metrics-port (the HTTP port to listen on)")
        return None
    if not 0 <= args.metrics_port <= 65535:
        raise ValueError(f"--metrics-port must be 0-65535, got {args.metrics_port}")
    return {"host": args.metrics_host or args.host, "port": args.metrics_port, "worker": None}


def _worker_specs(spec: dict[str, Any], workers: int) -> list[dict[str, Any]]:
    """One spec per worker: its number tags its log records, and it has its own metrics
    port, --metrics-port + its number (0, 1, ...), or with --metrics-port 0 a free one it
    binds itself (and logs)."""
    metrics = spec["metrics"]
    first = metrics["port"] if metrics else 0
    if first and first + workers - 1 > 65535:
        raise ValueError(f"--metrics-port {first} leaves no room for {workers} workers' ports")
    out = []
    for i in range(workers):
        own = {**spec, "log": {**spec["log"], "worker": i}}
        if metrics:
            own["metrics"] = {**metrics, "port": first + i if first else 0, "worker": i}
        out.append(own)
    return out


def _run(main: Any) -> None:
    """Run the service on uvloop when it is installed (about 20-60% more throughput)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


async def _serve_forever(
    spec: dict[str, Any], banner: dict[str, Any] | None, ready: Any = None
) -> None:
    from aqueduct_spark.protocol.compression import Compression
    from aqueduct_spark.service.server import ServiceConfig, start

    config = ServiceConfig(
        spec["root"],
        access=spec["access"],
        storage_options=spec["storage_options"],
        max_requests=spec["max_requests"],
        max_scans=spec["max_scans"],
        request_window=spec["request_window"],
        max_batch_bytes=spec["max_batch_bytes"],
        max_write_buffer_bytes=spec["max_write_buffer_bytes"],
        maintenance=spec["maintenance"],
        staging=spec["staging"],
        compression=Compression.parse(spec.get("compression", "auto")),
        pass_parquet=spec.get("pass_parquet", True),
    )
    transport = TransportConfig(
        backend=spec["backend"],
        packet_size=spec["packet_size"],
        transport=spec["transport"],
        engine=EngineConfig(**spec["engine"]),
        web=_web_settings(spec),
    )
    try:
        service, server = await start(
            config,
            spec["host"],
            spec["port"],
            tls=ServerTLS(spec["certfile"], spec["keyfile"]),
            transport=transport,
            reuse_port=spec["reuse_port"],
        )
    except OSError as exc:
        raise listen_error(exc, spec["host"], spec["port"]) from None
    http = None
    if spec["metrics"] is not None:
        http = await _start_metrics(service, server, spec["metrics"])
    console = spec["console"]
    if console is not None:
        console = {**console, "port": await _start_console(service, server, spec, console)}
    if banner is not None:
        banner = {
            **banner,
            "url": service_url(spec["host"], server.port),
            "console": _console_url(console),
        }
        _print_banner(banner)
    if ready is not None:
        ready.set()
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    if http is not None:
        await http.close()
    await server.close()


async def _start_console(
    service: Any, server: Any, spec: dict[str, Any], console: dict[str, Any]
) -> int:
    """Start the console's port; the port it listens on."""
    from aqueduct_spark.service.console import console_dir, start_console

    try:
        listener = await start_console(
            service,
            server,
            console["host"],
            console["port"],
            directory=console_dir(console["dir"]),
            tls=ServerTLS(spec["certfile"], spec["keyfile"]),
            reuse_port=spec["reuse_port"],
        )
    except OSError as exc:
        await server.close()
        raise StartupError(
            f"cannot listen for the console on {console['host']}:{console['port']}: "
            f"{exc.strerror or exc}; choose another --console-port (0: any free one)"
        ) from None
    return int(listener.server.sockets[0].getsockname()[1])


def _transports(choice: str) -> tuple[str, ...]:
    return ("quic", "tcp") if choice == "auto" else (choice,)


async def _start_metrics(service: Any, server: Any, metrics: dict[str, Any]) -> Any:
    from aqueduct_spark.service.health import start_http

    extra = {} if metrics["worker"] is None else {"worker": metrics["worker"]}
    try:
        return await start_http(service.observer, metrics["host"], metrics["port"], extra)
    except OSError as exc:  # taken since _check_metrics_ports looked
        await server.close()
        raise _metrics_port_error(metrics, exc) from None


def _check_metrics_ports(wanted: list[dict[str, Any]]) -> None:
    """Refuse, before anything starts, a metrics port that cannot be bound (one line)."""
    for metrics in wanted:
        if not metrics["port"]:
            continue
        family = socket.AF_INET6 if ":" in metrics["host"] else socket.AF_INET
        with socket.socket(family) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio binds
            try:
                probe.bind((metrics["host"], metrics["port"]))
            except OSError as exc:
                raise _metrics_port_error(metrics, exc) from None


def _metrics_port_error(metrics: dict[str, Any], exc: OSError) -> Exception:
    from aqueduct_spark.service.health import http_url
    from aqueduct_spark.service.startup import StartupError

    return StartupError(
        f"cannot listen for metrics on {http_url(metrics['host'], metrics['port'])}: "
        f"{exc.strerror or exc}; choose another --metrics-port (0: any free port) or "
        "--metrics-host"
    )


def _hold_port(host: str, port: int, transports: tuple[str, ...]) -> list[socket.socket]:
    """Sockets bound to ``port`` with SO_REUSEPORT, held until every worker listens: the
    workers (same user, SO_REUSEPORT too) join them, no other program can take the port.
    Without them, the seconds spawned workers take to start (20 s and more on a loaded
    machine) were a window in which any program's new socket could be given the port (an
    ephemeral port of a connection, a bind to port 0), and a worker then failed to bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    names = {n.strip() for t in transports for n in t.split(",")}
    kinds = {"UDP": socket.SOCK_DGRAM} if names & {"quic", "auto"} else {}
    if names & {"tcp", "auto"}:
        kinds["TCP"] = socket.SOCK_STREAM
    held: list[socket.socket] = []
    for proto, kind in kinds.items():
        sock = socket.socket(family, kind)
        held.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if kind == socket.SOCK_STREAM:  # as the workers' listeners (asyncio) set it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            for s in held:
                s.close()
            raise listen_error(exc, host, port, proto) from None
    return held


def _free_port(host: str, transports: tuple[str, ...]) -> int:
    """A port free for every transport: the workers of ``--port 0`` all need the same one,
    so the kernel cannot pick it for them. A UDP port that is free may be taken on TCP (by
    any connection's local end), so each candidate is tried on both."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(100):
        with socket.socket(family, socket.SOCK_DGRAM) as udp:
            udp.bind((host, 0))
            port = int(udp.getsockname()[1])
            if "tcp" not in transports:
                return port
            with socket.socket(family, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind((host, port))
                except OSError:
                    continue
                return port
    raise StartupError(f"found no port free for both UDP and TCP on {host}: give --port")
