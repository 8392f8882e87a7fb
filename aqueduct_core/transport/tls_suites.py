"""The TLS 1.3 cipher suites a service process prefers over TLS/TCP (``aqueduct serve
--tls-suites``).

OpenSSL 3's default order puts AES-256-GCM first, and a Python server context keeps its own
order (``OP_CIPHER_SERVER_PREFERENCE``), so every client got AES-256-GCM. AES-128-GCM is
what BoringSSL (gRPC, Chromium) and Go choose first: 10 AES rounds instead of 14, measured
here at 2.8 against 2.5 GB/s per core (``openssl speed -evp``), about 0.1 CPU s/GB less at
each end of a bulk read (issue 28). It is no weaker in practice: the connection's keys come
from an X25519 or P-256 exchange and the certificate is P-256, both about 128-bit strong,
so AES-256 adds no strength the key exchange has; AES-128-GCM is the suite every TLS 1.3
peer must implement (RFC 8446 §9.1). AES-256-GCM and ChaCha20-Poly1305 stay available.

Python 3.11's ``ssl`` has no ``set_ciphersuites``: the only public way to set TLS 1.3
suites is OpenSSL's configuration (``Ciphersuites`` in a ``system_default`` section), read
once, when OpenSSL first initializes. :func:`prefer` therefore runs before anything in the
process imports ``ssl`` (the CLI calls it first thing for ``serve``): it writes a small
configuration that includes the system's own file and adds the suites (in the user's
cache directory, ``~/.cache/aqueduct/openssl-<hash>.cnf``, one per content), and points
``OPENSSL_CONF`` at it (its ``--workers`` inherit it). It changes nothing when the administrator chose a configuration
(``OPENSSL_CONF`` set), when the system's configuration sets TLS defaults of its own
(``ssl_conf``), or when OpenSSL was initialized already; it says why instead. QUIC's TLS is
qh3's or aioquic's own, not OpenSSL's, and is not affected.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import zlib
from pathlib import Path

DEFAULT = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
"""``serve --tls-suites``' default: AES-128-GCM first, then OpenSSL's own two."""
OPENSSL = "openssl"
"""``--tls-suites openssl``: leave OpenSSL's configuration and order alone."""
SUITE = re.compile(r"^TLS_[A-Z0-9_]+$")


def check(suites: str) -> str:
    """``suites`` as given (``openssl``, or TLS 1.3 suite names joined by ``:``); raises
    ValueError naming the fix for anything else."""
    if suites == OPENSSL:
        return suites
    names = suites.split(":")
    if not names or not all(SUITE.match(n) for n in names):
        raise ValueError(
            f"--tls-suites {suites!r}: give TLS 1.3 suite names joined by ':' (e.g. {DEFAULT}) "
            f"or {OPENSSL!r} to keep OpenSSL's order"
        )
    return suites


def prefer(suites: str = DEFAULT) -> str | None:
    """Make ``suites`` this process's TLS 1.3 order (before ``ssl`` is imported). Returns
    None when it took effect, else why not (nothing changed then)."""
    if check(suites) == OPENSSL:
        return None
    if os.environ.get("OPENSSL_CONF"):
        return "OPENSSL_CONF is set: the TLS 1.3 suites are that configuration's"
    if "ssl" in sys.modules:
        return "OpenSSL was initialized before the suites could be set"
    import _ssl  # reading the default paths does not initialize OpenSSL's configuration

    system = Path(_ssl.get_default_verify_paths()[1]).parent / "openssl.cnf"
    text = system.read_text(errors="replace") if system.is_file() else ""
    if re.search(r"^\s*ssl_conf\s*=", text, re.M):
        return f"{system} sets its own TLS defaults (ssl_conf): the TLS 1.3 suites are its"
    init = re.search(r"^\s*openssl_conf\s*=\s*(\S+)", text, re.M)
    lines = [] if init else ["openssl_conf = aqueduct_init"]
    if text:
        lines.append(f".include {system}")
    lines += [
        f"[{init[1] if init else 'aqueduct_init'}]",
        "ssl_conf = aqueduct_ssl",
        "[aqueduct_ssl]",
        "system_default = aqueduct_tls",
        "[aqueduct_tls]",
        f"Ciphersuites = {suites}",
    ]
    try:
        path = _config_file("\n".join(lines) + "\n")
    except (OSError, RuntimeError) as exc:  # RuntimeError: no home directory
        return f"its OpenSSL configuration could not be written ({exc})"
    os.environ["OPENSSL_CONF"] = str(path)  # its ``--workers`` (spawned) read it too
    got = current()
    want = suites.split(":")
    if got[: len(want)] != want:
        return f"OpenSSL did not take the suites {suites} (it offers {':'.join(got)})"
    return None


def _config_file(text: str) -> Path:
    """``text`` in a file of this user's cache directory named after its content: written
    once, shared by every service process with the same configuration, never left behind
    per process (a killed one included), and in a directory only this user can write."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folder = Path(cache) / "aqueduct"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    # (not hashlib: importing it initializes OpenSSL, whose configuration is then read)
    path = folder / f"openssl-{zlib.crc32(text.encode()):08x}.cnf"
    if not path.is_file() or path.read_text() != text:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return path


def current() -> list[str]:
    """The TLS 1.3 suites a server context of this process offers, in its order."""
    import ssl

    names = [c["name"] for c in ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).get_ciphers()]
    return [n for n in names if SUITE.match(n)]
