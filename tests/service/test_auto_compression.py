"""``auto`` compression through a real service on a real path: two network namespaces joined
by a veth pair shaped to a slow link with ``tbf`` (``shared/design/real-paths.md``), the
service in one, clients in both. Needs root, as CI has; skipped with the reason otherwise.

Over the slow link the service measures that the network is the limit (the kernel's
``TCP_INFO``) and compresses the scan, and says so in its access line; a client on the
service's own host (no link: the CPU is the limit) gets the same scan uncompressed. Both read
every row. The policy's decisions over made-up numbers are in ``test_compression_policy``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_realpath import Link, require_root, spawn_in, stop, veth_link  # noqa: E402

_why_not = require_root("the auto compression test")
pytestmark = pytest.mark.skipif(_why_not is not None, reason=_why_not or "")

ROWS = 400_000  # ~15 MB of Arrow: 3 s at 40 Mbit/s uncompressed
RATE = "40mbit"

READ = """
import json, sys
from aqueduct_spark.client import Client
from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.transport import ClientTLS, TransportConfig
url, fingerprint = sys.argv[1:3]
# a 1 MiB window (16 MiB by default): the service cannot run seconds ahead of this slow link
transport = TransportConfig(transport="tcp", engine=EngineConfig(flow_window=1 << 20))
# decode=service: every row group as Arrow, which the codec is chosen for (row groups sent
# as stored Parquet are compressed as they are)
with Client(
    url, tls=ClientTLS(fingerprint=fingerprint), transport=transport, decode="service"
) as client:
    plan = client.plan("trips")
    rows = sum(b.num_rows for b in client.scan(plan.splits, schema=plan.schema, batch_rows=8192))
print(json.dumps({"rows": rows}))
"""


def make_dataset(root: Path) -> None:
    from aqueduct_spark.service.store import Store
    from benchmarks.common import sample_table

    store = Store(str(root))
    table = sample_table(ROWS)
    writer = store.open_stage("trips", uuid.uuid4().hex, "setup", table.schema)
    for batch in table.to_batches(max_chunksize=65536):
        writer.write(batch)
    store.commit("trips", "overwrite", table.schema, [], writer.close())


@pytest.fixture
def shaped(tmp_path: Path) -> Iterator[tuple[Link, dict[str, Any], Path]]:
    from aqueduct_core.transport import make_dev_certificates

    make_dataset(tmp_path / "root")
    log = tmp_path / "service.log"
    with veth_link(1500, prefix="aqz") as link:
        link.set_rate(RATE)
        tls = make_dev_certificates(tmp_path / "tls", ("localhost", link.server_ip))
        cmd = ["-m", "aqueduct_spark.cli", "serve", "--root", str(tmp_path / "root")]
        cmd += ["--host", link.server_ip, "--port", "0", "--allow-anonymous"]
        cmd += ["--cert", str(tls.cert_file), "--key", str(tls.key_file)]
        with open(log, "w") as stderr:
            service, banner = spawn_in(link.server_ns, cmd, "AQUEDUCT_READY ", stderr=stderr)
        try:
            yield link, json.loads(banner), log
        finally:
            stop(service)


def read_from(ns: str, info: dict[str, Any]) -> int:
    done = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", READ, info["url"], info["fingerprint"]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return int(json.loads(done.stdout.strip().splitlines()[-1])["rows"])


def scan_codecs(log: Path) -> list[dict[str, int]]:
    """Each scan's data messages by codec, from the service's access lines, in order."""
    found = []
    for line in log.read_text().splitlines():
        if "aqueduct.access" in line and " op=scan " in line:
            m = re.search(r" compression=(\S+)", line)
            assert m, f"a scan's access line without compression: {line}"
            found.append({c: int(n) for c, n in (x.split(":") for x in m.group(1).split(","))})
    return found


def test_auto_compresses_over_a_slow_link_and_not_on_the_same_host(
    shaped: tuple[Link, dict[str, Any], Path],
) -> None:
    link, info, log = shaped
    start = time.monotonic()
    assert read_from(link.client_ns, info) == ROWS
    slow = time.monotonic() - start
    assert read_from(link.server_ns, info) == ROWS  # the service's own host: no link
    time.sleep(0.5)  # the access line is written when the scan's task ends
    remote, local = scan_codecs(log)
    compressed = sum(n for c, n in remote.items() if c != "none")
    assert compressed > remote.get("none", 0), (
        f"over a {RATE} link most batches should go compressed: {remote} ({slow:.1f} s)"
    )
    assert set(local) == {"none"}, f"on the service's own host nothing pays: {local}"
