"""Which failures can heal: the one classification every retry loop of the client uses.

A failure is one of four kinds (:class:`Kind`):

- ``PERMANENT``: it cannot heal, so it is never retried and fails at once with a message
  naming the problem and the fix. A host name that does not resolve, a certificate that is
  not trusted or not the pinned one (:class:`CannotConnect`), a wrong or missing token
  (``Unauthenticated``), a request the service calls malformed (``InvalidRequest``), a
  protocol violation, and any service error whose class says ``permanent = True``. (A bad
  URL never gets this far: it is refused when the client is made.)
- ``TRANSIENT``: the connection failed (lost, refused, timed out): a new connection may
  work, as when the service restarts.
- ``UNREACHABLE``: connecting was tried again and again for ``connect_timeout`` and the
  service never answered (:class:`ServiceUnreachable`: nothing listens there, or nothing
  gets through). A request fails now, naming the URL and ``aqueduct serve``; only a watcher
  (a subscription) keeps trying.
- ``WAIT``: the service refused for now and said how long to wait (``Unavailable`` with a
  ``retry_after`` detail).
- ``OTHER``: any other answer of the service (``DatasetNotFound``, ``Conflict``, ...) or
  error. Asking again asks the same question; only a watcher (a subscription, waiting for
  a dataset to appear) retries these.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import re
import socket
import ssl
from collections.abc import Iterator

from aqueduct_core.errors import ConnectionLost, ProtocolError
from aqueduct_core.transport import ConnectError
from aqueduct_spark import protocol as P
from aqueduct_spark.client.urls import Endpoint


class CannotConnect(ConnectError):
    """Connecting cannot succeed as configured: the host name does not resolve, or the
    service's certificate is not trusted or is not the pinned one. Never retried: the
    message names what to change (the URL, the fingerprint or the CA file). It is not a
    service that is down or unreachable for now (that is ``ConnectionLost``)."""

    remedy = "correct the URL, the fingerprint or the CA file, as the message says"


class ServiceUnreachable(ConnectError):
    """No connection could be opened within ``connect_timeout`` (the attempts and pauses
    included): nothing listens at the address, or nothing gets through to it. The message
    names the URL, what each address answered, and how to start a service
    (``aqueduct serve``). It may heal (a service starting), but the client already waited
    as long as it was told to, so requests do not retry it."""

    remedy = (
        "start the service (aqueduct serve) or correct the URL; if it runs, check that a "
        "firewall lets UDP and TCP through to its port"
    )


class Kind(enum.Enum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    UNREACHABLE = "unreachable"
    WAIT = "wait"
    OTHER = "other"


PERMANENT_ANSWERS: tuple[type[P.DatasetError], ...] = (P.Unauthenticated, P.InvalidRequest)
"""Service answers that asking again cannot change, whatever the request."""


def classify(exc: BaseException) -> Kind:
    """What kind of failure ``exc`` is (see the module's docstring)."""
    if isinstance(exc, CannotConnect | ProtocolError):
        return Kind.PERMANENT
    if isinstance(exc, ServiceUnreachable):
        return Kind.UNREACHABLE
    if isinstance(exc, P.DatasetError):
        marked = getattr(exc, "permanent", None)
        if marked is True or (marked is None and isinstance(exc, PERMANENT_ANSWERS)):
            return Kind.PERMANENT
        return Kind.WAIT if retry_after(exc) is not None else Kind.OTHER
    if isinstance(exc, ssl.SSLCertVerificationError):
        return Kind.PERMANENT
    if isinstance(exc, ConnectionLost | ConnectionError | OSError | asyncio.TimeoutError):
        return Kind.TRANSIENT
    return Kind.OTHER


def retry_after(exc: BaseException) -> float | None:
    """Seconds to wait when the service refused a request for now (``UNAVAILABLE`` with a
    ``retry_after`` detail: a per-connection limit was reached); None for other errors."""
    if isinstance(exc, P.Unavailable):
        after = exc.details.get("retry_after")
        if isinstance(after, int | float) and not isinstance(after, bool) and after >= 0:
            return float(after)
    return None


# -- why a connection attempt failed -------------------------------------------------------

_TLS_ALERT = re.compile(r"\(code (\d+)[:)]")
"""QUIC reports a TLS failure as CRYPTO_ERROR, close code 0x100 plus the TLS alert (0x100 to
0x1ff); TLS/TCP raises ``ssl.SSLCertVerificationError``. The transport's race of QUIC and
TCP keeps only the messages, so both are recognised by their text too."""
_PIN_MARKERS = ("not the pinned", "Fingerprints did not match", "pin mismatch")
_VERIFY_MARKERS = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed")
_NAME_ERRORS = {
    getattr(socket, name)
    for name in ("EAI_NONAME", "EAI_NODATA", "EAI_FAIL", "EAI_ADDRFAMILY")
    if hasattr(socket, name)
}
"""getaddrinfo errors that say the name has no address (EAI_AGAIN, a DNS server that did not
answer in time, can heal, so it is not among them)."""
RESOLVE_TIMEOUT = 5.0


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def certificate_problem(exc: BaseException) -> str | None:
    """What is wrong with the service's certificate, if that is why connecting failed."""
    for link in _chain(exc):
        text = str(link)
        if any(marker in text for marker in _PIN_MARKERS):
            return (
                "its certificate does not have the pinned fingerprint (the fingerprint is "
                "wrong, or the service has a new certificate). Fix: use the fingerprint the "
                "service printed when it started (aqueduct serve's ready line)"
            )
        alert = _TLS_ALERT.search(text)
        if (
            isinstance(link, ssl.SSLCertVerificationError)
            or any(marker in text for marker in _VERIFY_MARKERS)
            or (alert is not None and 0x100 <= int(alert.group(1)) <= 0x1FF)
        ):
            return (
                f"the TLS handshake failed ({_tls_detail(link)}). Fix: pin the service's "
                "fingerprint (printed by aqueduct serve when it starts) or give its CA file "
                "(<root>/.aqueduct-tls/ca.pem for a development certificate); with a CA file, "
                "connect by a name the certificate holds"
            )
    return None


def _tls_detail(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    text = str(exc)
    # "... connection closed (code 298: unable to get local issuer certificate). If ..."
    found = re.search(r"\(code \d+: ([^)]*)\)", text)
    return found.group(1) if found else text


async def unresolvable(host: str, port: int) -> str | None:
    """Why ``host`` has no address, if the resolver says it has none (None if it resolves,
    is an IP literal, or the resolver could not say in time)."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.getaddrinfo(host, port), RESOLVE_TIMEOUT)
    except socket.gaierror as exc:
        if exc.errno in _NAME_ERRORS:
            return (
                f"the host name {host!r} does not resolve ({exc.strerror}). "
                "Fix: check the host in the URL"
            )
    except (OSError, TimeoutError):
        pass
    return None


async def connect_problem(endpoint: Endpoint, exc: BaseException) -> str | None:
    """Why connecting to ``endpoint`` cannot succeed as configured, if that is why it
    failed with ``exc``; None when the failure may heal (the service may come back)."""
    return certificate_problem(exc) or await unresolvable(endpoint.host, endpoint.port)
