"""The certificate a browser pins for WebTransport, and serving it to ``h3`` connections only.

A browser accepts a self-signed certificate for WebTransport only when the page names its
SHA-256 (``serverCertificateHashes``), and only an ECDSA P-256 certificate valid for at most
14 days (the W3C WebTransport spec; Chromium enforces both). The service's own certificate
(a development CA's leaf valid for a year, or the operator's) does not qualify and must not
change: native clients pin its fingerprint. So connections that negotiate ALPN ``h3`` are
served a second certificate, and every other connection keeps the service's.

**One certificate per period, the same in every process.** The certificate of period ``p``
(``PERIOD`` = 6 days since the Unix epoch) is derived from the service's private key and
``p`` alone: its key by HKDF-SHA256 over the service key, its serial likewise, and it is
signed with deterministic ECDSA (RFC 6979). So the workers of ``aqueduct serve --workers``,
and a restarted service, all present byte-identical certificates, with no file to share and
no coordination: a page pins the hash whichever process answers. The certificate of period
``p`` is valid from one day before ``p`` starts to 12 days after (13 days), and is presented
during ``p`` only; :func:`fingerprints` gives the hashes of ``p`` and ``p + 1``, so a hash a
page fetched stays good for at least 6 days, across the switch.

**Choosing it per connection.** The TLS library picks the certificate from the connection's
configuration, one per server; :func:`install_aioquic_hook` lets aioquic's server handshake
look at the ClientHello's ALPN list first: when the protocol the server will negotiate (its
own preference order, as aioquic's ``negotiate`` does) has a certificate of its own on the
connection, that one is used, before the signature algorithm is chosen from its key.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import NameOID

PERIOD = 6 * 86400
"""Seconds each WebTransport certificate is presented (periods count from the Unix epoch)."""
LEAD = 86400
"""Seconds a certificate is valid before its period starts (clock skew between the ends)."""
LIFETIME = 13 * 86400
"""Seconds from notBefore to notAfter: browsers accept at most 14 days."""

_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551

Selected = tuple[Any, list[Any], Any]
"""certificate, chain, private key, as the TLS library holds them."""


def period_of(now: float) -> int:
    return int(now // PERIOD)


def _derive(secret: bytes, label: bytes, length: int) -> bytes:
    return HKDF(hashes.SHA256(), length, salt=b"aqueduct-webtransport-cert", info=label).derive(
        secret
    )


def _service_secret(keyfile: str | Path) -> bytes:
    key = serialization.load_pem_private_key(Path(keyfile).read_bytes(), password=None)
    return key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def period_certificate(
    secret: bytes, period: int
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The WebTransport certificate of ``period``, derived from ``secret`` (the service
    key's DER): the same bytes every time."""
    label = b"period %d" % period
    scalar = int.from_bytes(_derive(secret, b"key " + label, 48), "big") % (_P256_ORDER - 1) + 1
    key = ec.derive_private_key(scalar, ec.SECP256R1())
    serial = int.from_bytes(_derive(secret, b"serial " + label, 16), "big") >> 1 or 1
    start = dt.datetime.fromtimestamp(period * PERIOD - LEAD, dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Aqueduct WebTransport")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(seconds=LIFETIME))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256(), ecdsa_deterministic=True)
    )
    return cert, key


def digest(cert: x509.Certificate) -> str:
    """The SHA-256 of the certificate's DER, lowercase hex (what a page pins)."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


class WebTransportCertificates:
    """The WebTransport certificates of one service key, made once per period."""

    def __init__(self, keyfile: str | Path, clock: Callable[[], float] = time.time) -> None:
        self._secret = _service_secret(keyfile)
        self._clock = clock
        self._made: dict[int, tuple[x509.Certificate, ec.EllipticCurvePrivateKey]] = {}

    def for_period(self, period: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        made = self._made.get(period)
        if made is None:
            made = period_certificate(self._secret, period)
            self._made = {p: c for p, c in self._made.items() if p >= period - 1}
            self._made[period] = made
        return made

    def current(self) -> Selected:
        cert, key = self.for_period(period_of(self._clock()))
        return cert, [], key

    def fingerprints(self) -> list[str]:
        """Hashes (hex) of the certificate presented now and of the next one: a page that
        pins both connects for at least one more period."""
        p = period_of(self._clock())
        return [digest(self.for_period(p)[0]), digest(self.for_period(p + 1)[0])]


# -- choosing the certificate by ALPN (aioquic) ---------------------------------------------

ATTR = "_aqueduct_alpn_certificates"
"""On an aioquic QuicConnection (and the TLS context it makes): a dict of ALPN protocol to a
callable returning the :data:`Selected` certificate for it."""


def install_aioquic_hook() -> None:
    """Patch aioquic's server handshake to take the certificate of the ALPN it will
    negotiate, where the connection has one (idempotent). Raises RuntimeError naming the
    moved part if the library's internals changed."""
    tls: Any = importlib.import_module("aioquic.tls")
    connection: Any = importlib.import_module("aioquic.quic.connection")
    if getattr(tls.Context, "_aqueduct_alpn_hook", False):
        return
    handle_hello = getattr(tls.Context, "_server_handle_hello", None)
    initialize = getattr(connection.QuicConnection, "_initialize", None)
    if handle_hello is None or initialize is None or not hasattr(tls, "pull_client_hello"):
        raise RuntimeError(
            "this aioquic version is not one Aqueduct's WebTransport supports (its server "
            "handshake moved); install the version aqueduct-spark pins"
        )

    def _initialize(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = initialize(self, *args, **kwargs)
        certs = getattr(self, ATTR, None)
        if certs is not None and self.tls is not None:
            setattr(self.tls, ATTR, certs)
        return result

    def _server_handle_hello(self: Any, input_buf: Any, *args: Any) -> Any:
        certs = getattr(self, ATTR, None)
        if certs:
            start = input_buf.tell()
            try:
                offered = tls.pull_client_hello(input_buf).alpn_protocols or []
            except Exception:  # the library's own parse, below, reports it
                offered = []
            input_buf.seek(start)
            chosen = next((p for p in self._alpn_protocols or [] if p in offered), None)
            select = certs.get(chosen)
            if select is not None:
                self.certificate, self.certificate_chain, self.certificate_private_key = select()
        return handle_hello(self, input_buf, *args)

    connection.QuicConnection._initialize = _initialize
    tls.Context._server_handle_hello = _server_handle_hello
    tls.Context._aqueduct_alpn_hook = True
