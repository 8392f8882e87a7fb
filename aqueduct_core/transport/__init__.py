"""Aqueduct over QUIC (the only package that imports a QUIC library, aioquic or qh3) and
over TLS/TCP (:mod:`.mux`, :mod:`.tcp`); :mod:`.dial` chooses between them."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
else:
    from aqueduct_core.lazy import attach

    __getattr__, __dir__ = attach(__name__, __file__)

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
