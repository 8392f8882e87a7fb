"""Checks ``aqueduct serve`` makes before it announces itself: the root is reachable and
writable, the port is not another service's, and a service other machines can reach has a
token (or was told explicitly to serve without one).

Raise :class:`StartupError` for any such mistake: ``aqueduct serve`` prints its message as
``aqueduct serve: <message>`` and exits with status 2, before anything listens.

:func:`check_root` writes a probe object under the root and deletes it, so a bucket that
does not exist, credentials the store refuses, an endpoint nobody answers on or a root the
service may not write fail at startup with one line that says which, instead of at the first
request.

:func:`claim_port` keeps a second service off a port: the ``--workers`` mode sets
SO_REUSEPORT on every socket, and the kernel lets any other socket with that option (of the
same user) join the port and silently take a share of the connections. The claim binds the
port without SO_REUSEPORT first (any listener there, ours or not, makes that fail), and holds
a lock keyed by host and port for the service's life, so two services starting at once
cannot both pass the check. The workers of one service bind after the claim; they share the
port as before.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import ipaddress
import logging
import os
import re
import socket
import tempfile
import uuid
from collections.abc import Iterable
from typing import IO

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

from aqueduct_core.errors import AqueductError

log = logging.getLogger("aqueduct.service")

PROBE_PREFIX = ".aqueduct-probe-"

# Fail fast: object_store's defaults retry an unreachable endpoint for minutes.
_PROBE_OPTIONS = {"max_retries": "2", "retry_timeout": "15s", "connect_timeout": "5s"}

_S3_CODES = {
    "NoSuchBucket": "the bucket does not exist: create it, or fix the root's bucket name",
    "InvalidAccessKeyId": "the store does not know the access key: check the credentials",
    "SignatureDoesNotMatch": "the store refused the secret key: check the credentials",
    "InvalidToken": "the store refused the session token: check the credentials",
    "ExpiredToken": "the credentials have expired: renew them",
    "AccessDenied": "the credentials may not write there: grant write access to the root",
}


class StartupError(AqueductError, ValueError):
    """The service cannot start as configured; the message is one line naming the fix."""

    remedy = "correct the setting the message names (aqueduct serve --help lists them)"


def check_root(root: str, storage_options: dict[str, str] | None = None) -> None:
    """Write and delete a probe under ``root`` (a directory or an object-store URI);
    :class:`StartupError` saying what is wrong if that fails."""
    if "://" not in root or root.startswith("file://"):
        _check_local(root.removeprefix("file://"))
        return
    from deltalake.fs import DeltaStorageHandler

    options = {**_PROBE_OPTIONS, **(storage_options or {})}
    probe = PROBE_PREFIX + uuid.uuid4().hex
    try:
        fs = pafs.PyFileSystem(DeltaStorageHandler(root.rstrip("/"), options=options))
    except Exception as exc:
        raise StartupError(f"cannot use the root {root}: {root_problem(exc)}") from exc
    try:
        with fs.open_output_stream(probe) as out, ipc.new_stream(out, pa.schema([])):
            pass  # written through Arrow's C++ stream (its Python write() fails here)
        fs.delete_file(probe)
    except Exception as exc:
        problem = root_problem(exc)
        if "(AccessDenied)" in problem and not _readable(fs):
            # stores answer a write to a missing bucket with AccessDenied too
            problem = (
                "the bucket does not exist, or the credentials may not use it: create it, "
                "or check the root's bucket name and the credentials (AccessDenied)"
            )
        raise StartupError(f"cannot write to the root {root}: {problem}") from exc


def _readable(fs: pafs.FileSystem) -> bool:
    try:
        fs.get_file_info(pafs.FileSelector("", allow_not_found=True))
        return True
    except Exception:
        return False


def root_problem(exc: BaseException) -> str:
    """What an object-store failure means, in one line."""
    text = str(exc)
    for code, meaning in _S3_CODES.items():
        if f"<Code>{code}</Code>" in text or code in text:
            return f"{meaning} ({code})"
    if "Connection refused" in text or "tcp connect error" in text:
        return "nothing answers at the store's endpoint: check AWS_ENDPOINT_URL and that it runs"
    if "dns error" in text or "failed to lookup address" in text:
        return "the store's endpoint host is unknown: check AWS_ENDPOINT_URL"
    if "lacked the necessary privileges" in text or "403" in text:
        return "the store refused the request (403): check the credentials and their rights"
    first = re.sub(r"\x1b\[[0-9;]*m", "", text).strip().splitlines()
    return first[0] if first else type(exc).__name__


def _check_local(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise StartupError(
            f"the root {path} is a file, not a directory: give a directory as --root (it is "
            "created if missing)"
        )
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StartupError(
            f"cannot write to the root {path}: {exc.strerror or exc}; give the service's "
            "user write access, or choose another --root"
        ) from exc


class PortClaim:
    """A claim on ``host:port`` (see the module docstring), held until :meth:`release` or
    the process exits."""

    def __init__(self, lock: IO[bytes] | None, host: str, port: int) -> None:
        self._lock = lock
        self.host = host
        self.port = port

    def release(self) -> None:
        with contextlib.suppress(ValueError):
            _HELD.remove(self)
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock.close()


_HELD: list[PortClaim] = []  # claims live as long as the process, whoever holds a reference


@atexit.register
def _release_held() -> None:
    """Close the lock files of the claims still held at exit (a claim taken in-process, as
    tests and notebooks do): closing them frees the port, and the interpreter's teardown
    would otherwise collect them with a ResourceWarning each."""
    for claim in list(_HELD):
        claim.release()


def _lock_path(host: str, port: int) -> str:
    key = re.sub(r"[^0-9A-Za-z.]", "_", host)
    return os.path.join(tempfile.gettempdir(), f"aqueduct-port-{key}-{port}.lock")


def claim_port(host: str, port: int, transports: Iterable[str] = ("quic", "tcp")) -> PortClaim:
    """Claim ``host:port`` for this service, or :class:`StartupError` naming the port if
    another service (an ``aqueduct serve`` or anything else) has it."""
    path = _lock_path(host, port)
    try:
        lock: IO[bytes] | None = open(path, "a+b")  # noqa: SIM115 (held for the service's life)
    except PermissionError:
        lock = None  # another user's lock file: their service cannot join ours anyway
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        assert lock is not None
        lock.close()
        raise StartupError(
            f"port {port} on {host} is already served by another aqueduct serve (it holds "
            f"{path}); stop it, or choose another --port"
        ) from exc
    try:
        for transport in transports:
            _probe_port(host, port, transport)
    except BaseException:
        if lock is not None:
            lock.close()
        raise
    claim = PortClaim(lock, host, port)
    _HELD.append(claim)
    return claim


def _probe_port(host: str, port: int, transport: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_DGRAM if transport == "quic" else socket.SOCK_STREAM
    proto = "UDP" if transport == "quic" else "TCP"
    with socket.socket(family, kind) as sock:
        if kind == socket.SOCK_STREAM:
            # ignores connections in TIME_WAIT only, never a listener
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError(
                    f"port {port} ({proto}) on {host} is already in use by another service; "
                    "stop it, or choose another --port"
                ) from exc
            raise StartupError(f"cannot listen on {host} port {port} ({proto}): {exc}") from exc


def is_loopback(host: str) -> bool:
    """Whether ``host`` reaches this machine only (``127.0.0.1``, ``::1``, ``localhost``,
    or a name that resolves to loopback addresses only)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False  # it will fail to bind anyway, and then says so
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_exposure(host: str, port: int, requires_token: bool, allow_anonymous: bool) -> None:
    """Refuse to serve beyond this machine with no token unless told so explicitly; when told,
    warn that anyone who reaches the port may do anything."""
    if requires_token or is_loopback(host):
        return
    if not allow_anonymous:
        raise StartupError(
            f"--host {host} accepts clients from other machines, and no token is set, so "
            f"anyone who can reach port {port} could read, write and drop every dataset: "
            "give --token (or [[tokens]] in the --config file), or --allow-anonymous "
            "(allow_anonymous = true) to serve without one"
        )
    log.warning(
        "serving on %s with no token (--allow-anonymous): anyone who can reach port %s can "
        "read, write and drop every dataset",
        host,
        port,
    )


def listen_error(exc: OSError, host: str, port: int, proto: str = "") -> StartupError:
    """The startup error for a failed bind: what is wrong with ``--host``/``--port``."""
    where = f"{proto} port {port}".strip() if proto else f"port {port}"
    if exc.errno == errno.EADDRINUSE:
        return StartupError(
            f"{where} on {host} is in use (another aqueduct serve?): stop that service, or "
            "choose another --port (0 picks a free one)"
        )
    if exc.errno == errno.EACCES:
        return StartupError(
            f"no permission to listen on {where} of {host}: ports below 1024 need privileges; "
            "choose --port 1024 or above"
        )
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return StartupError(
            f"--host {host} is not an address of this machine: give one of its addresses, "
            "127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
        )
    return StartupError(f"cannot listen on {host} {where}: {exc.strerror or exc}")


def warn_if_readable(path: str) -> None:
    """A configuration file that holds tokens should be readable by its owner only."""
    mode = os.stat(path).st_mode
    if mode & 0o077:
        log.warning(
            "%s holds tokens and other users may read it (mode %o): chmod 600 %s",
            path,
            mode & 0o777,
            path,
        )
