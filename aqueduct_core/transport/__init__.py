"""Aqueduct over QUIC (the only package that imports a QUIC library, aioquic or qh3) and
over TLS/TCP (:mod:`.mux`, :mod:`.tcp`); :mod:`.dial` chooses between them."""

from aqueduct_core.transport.config import TransportConfig
from aqueduct_core.transport.dial import connect, serve
from aqueduct_core.transport.endpoints import ConnectError, Handler, Refused, Server
from aqueduct_core.transport.tls import (
    ClientTLS,
    DevCertificates,
    InsecureConnectionWarning,
    ServerTLS,
    make_dev_certificates,
)

__all__ = [
    "ClientTLS",
    "ConnectError",
    "DevCertificates",
    "Handler",
    "InsecureConnectionWarning",
    "Refused",
    "Server",
    "ServerTLS",
    "TransportConfig",
    "connect",
    "make_dev_certificates",
    "serve",
]
