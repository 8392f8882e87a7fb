"""``serve --tls-suites`` (issue 28): the service's TLS/TCP connections use AES-128-GCM with a
client that offers OpenSSL's default order (AES-256-GCM first), and the setting changes
nothing where an administrator chose OpenSSL's configuration. The preferred order is set in
a fresh interpreter (OpenSSL reads its configuration once per process); OpenSSL's own order
is this process's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aqueduct_core.transport import tls_suites
from aqueduct_core.transport.tls import ClientTLS, DevCertificates, make_dev_certificates
from aqueduct_core.transport.tls_stream import TlsStream, client_context, server_context

# A real TLS 1.3 handshake over memory buffers, the service's server context against a
# default client's context: the cipher both ends agreed on.
HANDSHAKE = """
import sys
from aqueduct_core.transport import tls_suites
why = tls_suites.prefer(sys.argv[1])
from aqueduct_core.transport.tls import ClientTLS, ServerTLS
from aqueduct_core.transport.tls_stream import TlsStream, client_context, server_context
s = TlsStream(server_context(ServerTLS(sys.argv[2], sys.argv[3])), server_side=True)
c = TlsStream(client_context(ClientTLS(cafile=sys.argv[4]), "localhost"),
              server_side=False, server_hostname="localhost")
for _ in range(4):
    c.handshake(); s.receive(c.outgoing()); s.handshake(); c.receive(s.outgoing())
print(c.obj.cipher()[0], s.obj.cipher()[0], why, sep="|")
"""


def _handshake(certs: DevCertificates) -> tuple[str, str]:
    s = TlsStream(server_context(certs.server_tls), server_side=True)
    c = TlsStream(
        client_context(ClientTLS(cafile=str(certs.ca_file)), "localhost"),
        server_side=False,
        server_hostname="localhost",
    )
    for _ in range(4):
        c.handshake()
        s.receive(c.outgoing())
        s.handshake()
        c.receive(s.outgoing())
    return c.obj.cipher()[0], s.obj.cipher()[0]  # type: ignore[index]


def test_the_service_chooses_aes128_gcm_for_a_default_client(tmp_path: Path) -> None:
    certs = make_dev_certificates(tmp_path)
    files = [str(certs.cert_file), str(certs.key_file), str(certs.ca_file)]
    run = subprocess.run(
        [sys.executable, "-c", HANDSHAKE, tls_suites.DEFAULT, *files],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "OPENSSL_CONF"},
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    client, server, why = run.stdout.strip().split("|")
    assert (client, server, why) == ("TLS_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256", "None")
    # without it (this process), OpenSSL's own order: AES-256-GCM
    assert _handshake(certs) == ("TLS_AES_256_GCM_SHA384", "TLS_AES_256_GCM_SHA384")


def test_an_administrators_openssl_conf_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENSSL_CONF", "/etc/ssl/admin.cnf")
    assert "OPENSSL_CONF is set" in (tls_suites.prefer() or "")
    assert os.environ["OPENSSL_CONF"] == "/etc/ssl/admin.cnf"
    assert tls_suites.prefer("openssl") is None  # asked to change nothing


@pytest.mark.parametrize("bad", ["", "AES128", "TLS_AES_128_GCM_SHA256,TLS_AES_256_GCM_SHA384"])
def test_a_bad_suite_list_names_the_fix(bad: str) -> None:
    with pytest.raises(ValueError, match="joined by ':'"):
        tls_suites.check(bad)
    assert tls_suites.check("openssl") == "openssl"


def test_a_service_configured_by_file_prefers_aes128_gcm_too(tmp_path: Path) -> None:
    """``serve --config FILE`` loads the service (and ``ssl``) to read the file: the suites
    are set before that, from the flag or the file's ``tls_suites``."""
    config = tmp_path / "serve.toml"
    config.write_text('host = "0.0.0.0"\nport = 0\n')  # refused (no token): stops at once
    script = (
        "import sys\nfrom aqueduct_spark.cli import main\ncode = main(sys.argv[1:])\n"
        "from aqueduct_core.transport import tls_suites\nprint(code, tls_suites.current()[0])"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENSSL_CONF", "AQUEDUCT_TOKEN")}
    for extra, first in (([], "TLS_AES_128_GCM_SHA256"), (["--tls-suites", "openssl"], None)):
        run = subprocess.run(
            [
                sys.executable,
                "-c",
                script,
                "serve",
                "--root",
                str(tmp_path),
                "--config",
                str(config),
                *extra,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        code, got = run.stdout.split()
        assert code == "2" and "no token is set" in run.stderr, run.stderr
        assert got == (first or "TLS_AES_256_GCM_SHA384"), run.stderr
