"""TLS 1.3 over a TCP byte stream for Aqueduct over TCP, sans-IO: ciphertext in, ciphertext
out, plaintext read into the caller's buffer.

The TCP transport drives TLS itself (``ssl.SSLObject`` over two ``MemoryBIO``) instead of
handing the socket to asyncio's TLS layer, for two things the profile promises (§7,
"Connection") that asyncio's layer cannot do on Python 3.11:

* *Alerts reach the client.* When a handshake fails, asyncio closes the socket without
  sending the alert OpenSSL wrote (CPython gh-98078; uvloop does the same): a TLS 1.2
  client saw a bare TCP close instead of ``protocol_version``. Here whatever OpenSSL wrote
  is sent before the socket closes.
* *A wrong or missing ALPN is refused in the handshake* with the fatal
  ``no_application_protocol`` alert RFC 7301 §3.2 asks for. The stdlib's ALPN callback can
  only decline (OpenSSL then completes the handshake without ALPN), so the server decides
  after OpenSSL processed the ClientHello and before its first flight leaves: OpenSSL
  selects the ALPN while it processes the ClientHello (before a ServerHello or a
  HelloRetryRequest), so when nothing was selected the flight is discarded and the
  7-byte plaintext alert record (:data:`ALERT_NO_APPLICATION_PROTOCOL`, the same shape
  OpenSSL gives its own alerts at that stage) goes out instead.

The cost of driving TLS here is the same as asyncio's: one copy of the ciphertext into
the incoming BIO, plaintext decrypted straight into the caller's buffer, and one bytes
object of ciphertext per write.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterable
from typing import Any

from aqueduct_core.transport.mux_wire import ALPN
from aqueduct_core.transport.tls import ClientTLS, ServerTLS, warn_insecure
from aqueduct_core.transport.web_config import HTTP1_ALPN

ALERT_NO_APPLICATION_PROTOCOL = bytes.fromhex("15 0303 0002 02 78")
"""A TLSPlaintext record (RFC 8446 §5.1): content type alert (21), legacy record version
0x0303, length 2, then level fatal (2) and description no_application_protocol (120)."""


class AlpnRefused(ssl.SSLError):
    """The client did not offer ALPN ``aqueduct-tcp`` (server) or the server did not select
    it (client)."""

    remedy = "check that the address is an Aqueduct service's (aqueduct serve) and not another TLS server's"


def client_context(tls: ClientTLS, host: str, alpn: str = ALPN) -> ssl.SSLContext:
    """TLS 1.3 only, ALPN ``aqueduct-tcp`` (``http/1.1`` for WebSocket); verification as on
    QUIC (CA file, pin or none).

    With a pin (or ``insecure``) no CA is consulted, so the system's CA store is not loaded:
    parsing it cost 20-170 ms of CPU per connection here, paid by every Spark task."""
    if tls.fingerprint is not None or tls.insecure:
        if tls.insecure:
            warn_insecure(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the pin is checked after the handshake
    else:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if tls.cafile is not None or tls.cadata is not None:
            ctx.load_verify_locations(cafile=tls.cafile, cadata=tls.cadata)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols([alpn])
    return ctx


def server_context(tls: ServerTLS, alpns: tuple[str | None, ...] = (ALPN,)) -> ssl.SSLContext:
    """``alpns``: the protocols served, in the server's order of preference (``aqueduct-tcp``,
    and ``http/1.1`` where WebSocket is on; None: a client offering no ALPN is served too)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols([a for a in alpns if a is not None])
    ctx.load_cert_chain(tls.certfile, tls.keyfile)
    return ctx


class TlsStream:
    """One TLS connection's state. Feed it what TCP delivered (:meth:`receive`), advance
    the handshake (:meth:`handshake`), then :meth:`read_into` and :meth:`encrypt`; after
    every call, :meth:`outgoing` holds the bytes to send (alerts included)."""

    def __init__(
        self,
        ctx: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        alpns: tuple[str | None, ...] = (ALPN,),
    ) -> None:
        self.alpns = alpns
        """The ALPN protocols this end accepts (a client: the one it offered)."""
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )
        self.server_side = server_side
        self.established = False
        self.eof = False
        """The peer's close_notify arrived."""
        self._alert = b""
        self._gate = server_side  # the ALPN check before the server's first flight

    def receive(self, data: bytes | memoryview) -> None:
        self._in.write(data)

    def outgoing(self) -> bytes:
        """Ciphertext (or alerts) to send, in order."""
        if self._alert:
            alert, self._alert = self._alert, b""
            return alert
        return self._out.read()

    def handshake(self) -> bool:
        """Advance the handshake with the bytes received; True once it completed. Raises
        ``ssl.SSLError`` (:class:`AlpnRefused` for the ALPN) when it failed: the alert for
        the peer is then in :meth:`outgoing`."""
        if self.established:
            return True
        try:
            self.obj.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        if self._gate and self._out.pending:
            self._gate = False  # OpenSSL processed the ClientHello and chose (or not) ALPN
            if self.obj.selected_alpn_protocol() not in self.alpns:
                self._out.read()  # the ServerHello never leaves
                self._alert = ALERT_NO_APPLICATION_PROTOCOL
                raise AlpnRefused(
                    f"the client did not offer ALPN {' or '.join(map(repr, self.alpns))}: "
                    "use an Aqueduct client over TCP"
                )
        if done:
            got = self.obj.selected_alpn_protocol()
            if got not in self.alpns:  # a client whose server chose nothing (or a changed hello)
                self.close()
                raise AlpnRefused(
                    f"ALPN {self.alpns[0]!r} was not negotiated (got {got!r}): check that the "
                    "address is an Aqueduct service's (aqueduct serve), not another TLS server's"
                )
            self.established = True
        return done

    def read_into(self, buf: memoryview) -> int:
        """Decrypt what was received into ``buf``, as much as fits; the count. Sets
        :attr:`eof` at the peer's close_notify; raises ``ssl.SSLError`` on a bad record."""
        n, want = 0, len(buf)
        read: Any = self.obj.read  # read(len, buffer) -> int; typeshed knows only -> bytes
        try:
            while n < want:
                got = read(want - n, buf[n:])
                if not got:
                    break
                n += got
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            self.eof = True
        return n

    def encrypt(self, bufs: Iterable[bytes | memoryview]) -> bytes:
        """The ciphertext of ``bufs`` (one TLS record per buffer, at most 16 KiB each)."""
        write = self.obj.write
        for b in bufs:
            if len(b):
                write(b)
        return self._out.read()

    def close(self) -> None:
        """Queue our close_notify (nothing more is sent after it)."""
        # The peer's close_notify is not awaited (SSLWantReadError); before the handshake
        # completed there is none to send (SSLError).
        with contextlib.suppress(ssl.SSLError):
            self.obj.unwrap()


class _NoTls:
    def selected_alpn_protocol(self) -> str:
        return HTTP1_ALPN

    def getpeercert(self, binary_form: bool = False) -> None:
        return None


class PlainStream(TlsStream):
    """:class:`TlsStream`'s face over plain bytes: HTTP without TLS, where a port serves it
    (the console's, to loopback peers). The handshake is done at once, ALPN ``http/1.1``."""

    def __init__(self) -> None:  # no SSL object: nothing of TlsStream's own state is used
        self.obj = _NoTls()  # type: ignore[assignment]
        self.alpns = (HTTP1_ALPN,)
        self.server_side = True
        self.established = True
        self.eof = False
        self._pending = bytearray()

    def receive(self, data: bytes | memoryview) -> None:
        self._pending += data

    def outgoing(self) -> bytes:
        return b""

    def handshake(self) -> bool:
        return True

    def read_into(self, buf: memoryview) -> int:
        n = min(len(buf), len(self._pending))
        buf[:n] = self._pending[:n]
        del self._pending[:n]
        return n

    def encrypt(self, bufs: Iterable[bytes | memoryview]) -> bytes:
        return b"".join(bufs)

    def close(self) -> None:
        pass
