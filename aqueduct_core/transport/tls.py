"""TLS for Aqueduct: always on, easy to get right.

For development, :func:`make_dev_certificates` creates a small CA and a server certificate
signed by it (EC P-256; the CA has CA:TRUE and signs, the leaf has the serverAuth usage and
names localhost, 127.0.0.1 and ::1). Both backends accept that shape; qh3 rejects a
self-signed server certificate. Clients then either verify against the CA file, or pin the
server certificate's SHA-256 fingerprint, or explicitly opt out of verification.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cryptography import x509

# cryptography is imported where certificates are made or read, not here: a client that
# pins a fingerprint never needs it, and importing it cost 0.1-0.2 s in every fresh process
# (Spark starts one per query to plan a read).


class PinMismatch(Exception):
    """The server's certificate does not have the pinned fingerprint (either transport)."""

    remedy = "use the fingerprint the service printed when it started (aqueduct serve's banner)"


class InsecureConnectionWarning(UserWarning):
    """A client connected without verifying the server's certificate."""

    remedy = "pin the service's fingerprint or give its CA file instead of insecure=True"


@dataclass(frozen=True)
class ClientTLS:
    """How a client checks the server. Exactly one of ``cafile`` (or ``cadata``),
    ``fingerprint`` or ``insecure=True``; with none, the system's trusted CAs are used."""

    cafile: str | None = None
    """PEM file of the CA(s) that signed the server certificate."""
    cadata: str | None = None
    """The same as PEM text: a CA read once where the file is and shipped to processes
    that do not have the file (Spark's executors)."""
    fingerprint: str | None = None
    """SHA-256 of the server certificate (hex, colons optional), as ``aqueduct serve`` and
    ``aqueduct cert`` print it."""
    insecure: bool = False
    """Do not verify the server at all (warns). Only for throwaway local tests."""
    server_name: str | None = None
    """Name to check in the certificate; defaults to the host connected to."""

    def __post_init__(self) -> None:
        chosen = [
            self.cafile is not None or self.cadata is not None,
            self.fingerprint is not None,
            self.insecure,
        ]
        if sum(chosen) > 1:
            raise ValueError("choose one of cafile, fingerprint or insecure, not several")
        if self.fingerprint is not None:
            normalize_fingerprint(self.fingerprint)


@dataclass(frozen=True)
class ServerTLS:
    """The server's certificate chain and key (PEM files)."""

    certfile: str
    keyfile: str


@dataclass(frozen=True)
class DevCertificates:
    """Files written by :func:`make_dev_certificates`."""

    directory: Path
    ca_file: Path
    cert_file: Path
    key_file: Path
    fingerprint: str

    @property
    def server_tls(self) -> ServerTLS:
        return ServerTLS(str(self.cert_file), str(self.key_file))

    def client_tls(self) -> ClientTLS:
        return ClientTLS(cafile=str(self.ca_file))


def normalize_fingerprint(value: str) -> str:
    hexdigits = value.replace(":", "").replace(" ", "").lower()
    if len(hexdigits) != 64 or any(c not in "0123456789abcdef" for c in hexdigits):
        raise ValueError(
            f"fingerprint must be a SHA-256 in hex (64 digits, colons optional), got {value!r}"
        )
    return hexdigits


def format_fingerprint(hexdigits: str) -> str:
    """``AB:CD:...`` form, as printed for people."""
    return ":".join(hexdigits[i : i + 2] for i in range(0, len(hexdigits), 2)).upper()


def certificate_fingerprint(cert: x509.Certificate | bytes) -> str:
    """SHA-256 over the DER encoding, as lowercase hex."""
    if isinstance(cert, bytes):
        return hashlib.sha256(cert).hexdigest()
    from cryptography.hazmat.primitives import serialization

    der = cert.public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()


def file_fingerprint(certfile: str | Path) -> str:
    """Fingerprint of the first certificate in a PEM file."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(Path(certfile).read_bytes())
    return certificate_fingerprint(cert)


def make_dev_certificates(
    directory: str | Path,
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "::1"),
    days: int = 365,
) -> DevCertificates:
    """Write ``ca.pem``, ``server.pem`` (leaf then CA) and ``server.key`` into ``directory``
    (created if needed; the key is readable by its owner only)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Aqueduct development CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(x509.SubjectAlternativeName(alt_names), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file, cert_file, key_file = out / "ca.pem", out / "server.pem", out / "server.key"
    ca_file.write_bytes(ca.public_bytes(pem))
    cert_file.write_bytes(leaf.public_bytes(pem) + ca.public_bytes(pem))
    key_file.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    os.chmod(key_file, 0o600)
    return DevCertificates(out, ca_file, cert_file, key_file, certificate_fingerprint(leaf))


def _key_usage(ca: bool) -> x509.KeyUsage:
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def warn_insecure(host: str) -> None:
    warnings.warn(
        f"connecting to {host} without verifying its certificate (insecure=True): anyone on "
        "the path can impersonate the server. Pin its fingerprint or give its CA file instead.",
        InsecureConnectionWarning,
        stacklevel=3,
    )


# -- 0-RTT: session tickets and address-validation tokens (profile §2.11) -----------------


class ClientSessions:
    """What a client keeps to resume a server's session with 0-RTT: the newest TLS session
    ticket and the newest address-validation token (QUIC NEW_TOKEN) per server.

    It lives in the memory of this process only, so a new process starts with a full
    handshake. A server is the backend, address, port, TLS server name, ALPN and the way its
    certificate was verified (CA file, pin or none): a ticket earned under one verification
    is never presented under another. A ticket is used once (taken when a connection
    starts; the server sends a new one on every connection) and only until the lifetime the
    server gave it (24 hours with both backends); a token is kept until a newer one
    replaces it. The least recently used servers are forgotten beyond ``max_servers``.
    """

    def __init__(self, max_servers: int = 256) -> None:
        self.max_servers = max_servers
        self._entries: OrderedDict[Hashable, list[Any]] = OrderedDict()
        self._lock = threading.Lock()  # clients of several event loops share the store

    def take_ticket(self, key: Hashable) -> Any:
        """The server's ticket, removed from the store, or None (none, or expired)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            ticket, entry[0] = entry[0], None
        return ticket if ticket is not None and ticket.is_valid else None

    def token(self, key: Hashable) -> bytes:
        with self._lock:
            entry = self._entries.get(key)
            return entry[1] if entry is not None else b""

    def ticket_received(self, key: Hashable, ticket: Any) -> None:
        self._put(key, 0, ticket)

    def token_received(self, key: Hashable, token: bytes) -> None:
        self._put(key, 1, bytes(token))

    def forget(self, key: Hashable | None = None) -> None:
        """Forget one server (or every server): the next connection is a full handshake."""
        with self._lock:
            if key is None:
                self._entries.clear()
            else:
                self._entries.pop(key, None)

    def _put(self, key: Hashable, slot: int, value: Any) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = [None, b""]
            entry[slot] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_servers:
                self._entries.popitem(last=False)


CLIENT_SESSIONS = ClientSessions()
"""The process-wide store :func:`aqueduct_core.transport.connect` uses."""


class ServerTickets:
    """The session tickets a server issued, each accepted once (profile §2.11).

    A ticket is removed when a client presents it, so a replayed ClientHello (and the 0-RTT
    data after it) finds no ticket, and the server falls back to a full handshake that
    discards the replayed early data. The store is in memory: tickets die with the server
    process, and each worker process of a ``reuse_port`` farm knows only its own. At most
    ``max_tickets`` are kept (the oldest are dropped).
    """

    def __init__(self, max_tickets: int = 10_000) -> None:
        self.max_tickets = max_tickets
        self._tickets: OrderedDict[bytes, Any] = OrderedDict()

    def add(self, ticket: Any) -> None:
        self._tickets[ticket.ticket] = ticket
        while len(self._tickets) > self.max_tickets:
            self._tickets.popitem(last=False)

    def pop(self, label: bytes) -> Any:
        ticket = self._tickets.pop(label, None)
        return ticket if ticket is not None and ticket.is_valid else None

    def __len__(self) -> int:
        return len(self._tickets)
