"""Options are checked on the driver, once, with one error naming the option (issue 17,
item 5: a missing or relative cafile used to cost minutes of retries and end with "no
Aqueduct server answered")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from aqueduct_core.transport import TransportConfig
from aqueduct_spark.client import ClientConfig
from aqueduct_spark.datasource.options import OPTIONS, OptionError, parse
from aqueduct_spark.testing import ServiceProcess

URL = "quic://127.0.0.1:4433"


def test_a_missing_cafile_is_an_option_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "ca.pem"
    with pytest.raises(OptionError, match=r"option 'cafile'.*does not exist") as e:
        parse({"url": URL, "path": "d", "cafile": str(missing)})
    assert str(missing) in str(e.value)


def test_a_relative_cafile_is_an_option_error(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not checked here")
    with pytest.raises(OptionError, match=r"option 'cafile' must be an absolute path"):
        parse({"url": URL, "path": "d", "cafile": "ca.pem"})


def test_a_directory_is_not_a_cafile(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"option 'cafile'.*not a file"):
        parse({"url": URL, "path": "d", "cafile": str(tmp_path)})


def test_an_existing_absolute_cafile_is_read_on_the_driver(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    opts = parse({"url": URL, "path": "d", "cafile": str(ca)})
    ca.unlink()  # what executors see: the options carry the certificate, not the path
    assert opts.cafile == str(ca)
    assert opts.client_config().tls.cadata == "-----BEGIN CERTIFICATE-----\n"


def test_a_cafile_without_a_certificate_is_an_option_error(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    with pytest.raises(OptionError, match=r"option 'cafile'.*holds no PEM certificate"):
        parse({"url": URL, "path": "d", "cafile": str(key)})


def test_options_left_out_give_the_client_its_own_defaults() -> None:
    """The client's settings that are options too default as the client would by itself."""
    given = parse({"url": URL, "path": "d"}).client_config()
    own = ClientConfig(URL)
    assert (given.retries, given.timeout, given.connect_timeout, given.compression) == (
        own.retries,
        own.timeout,
        own.connect_timeout,
        own.compression,
    )
    t, own_t = given.transport, TransportConfig()
    assert (t.backend, t.transport, t.packet_size) == (own_t.backend, own_t.transport, None)
    assert (t.handshake_timeout, t.idle_timeout) == (own_t.handshake_timeout, own_t.idle_timeout)
    assert t.engine.flow_window == own_t.engine.flow_window


def test_every_documented_default_is_what_parse_gives() -> None:
    """An option written out with its documented default changes nothing."""
    plain = parse({"url": URL, "path": "d"})
    unset = (
        "(required)",
        "none",
        "auto",
        "latest",
        "all",
        "none (env `AQUEDUCT_TOKEN`)",
        "none (env `AQUEDUCT_FINGERPRINT`)",
    )
    for o in OPTIONS:
        if o.default not in unset:
            assert parse({"url": URL, "path": "d", o.name: o.default}) == plain, o.name


HEAVY = (
    "pyarrow",
    "asyncio",
    "ssl",
    "aqueduct_core.engine.connection",
    "aqueduct_spark.client.blocking",
    "aioquic",
    "qh3",
    "deltalake",
)


def test_options_are_checked_before_anything_heavy_is_imported(tmp_path: Path) -> None:
    """What Spark's driver worker does for each read or write, in a fresh interpreter:
    import the source (auto-registration imports ``pyspark_aqueduct``) and build it from
    the options. A bad option fails before pyarrow, asyncio, the engine, the client or a
    QUIC library is imported: those imports took 1.4 s of a worker's time on a loaded
    machine, paid again by every write in a new worker."""
    missing = tmp_path / "ca.pem"
    script = f"""
import sys
import pyspark.sql.datasource  # the worker has it already
from pyspark_aqueduct import DefaultSource
try:
    DefaultSource({{"url": "{URL}", "path": "d", "cafile": {str(missing)!r}}})
except Exception as exc:
    print(type(exc).__name__, exc)
print(sorted(m for m in {HEAVY!r} if m in sys.modules))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.splitlines()
    assert out[0].startswith("OptionError option 'cafile'"), out
    assert out[1] == "[]", f"imported before the option check: {out[1]}"


@pytest.mark.spark
def test_spark_fails_at_once_naming_the_option_before_any_task(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    """Issue 17's acceptance: a missing cafile fails in under 2 s, before any Spark task
    runs. Timed after a valid load, so that the figure is the check's, not the start of
    Spark's Python worker daemons: on a session's first read or write Spark starts one fresh
    interpreter per kind of driver-side worker (data-source lookup, then create or write),
    seconds each on a loaded machine. The check's own imports are bounded by
    test_options_are_checked_before_anything_heavy_is_imported."""
    sc = spark.sparkContext
    missing = str(tmp_path / "missing.pem")
    service.client().write("cafile_warmup", pa.table({"n": [1]}))
    spark.read.format("aqueduct").options(**service.options).load("cafile_warmup")
    sc.setJobGroup("missing-cafile", "a missing cafile")
    try:
        started = time.monotonic()
        with pytest.raises(Exception, match=r"option 'cafile'") as e:
            spark.read.format("aqueduct").options(url=service.url, cafile=missing).load("x")
        took = time.monotonic() - started
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    print(f"a missing cafile failed a read in {took:.2f} s (load {os.getloadavg()[0]:.1f})")
    assert "no Aqueduct server answered" not in str(e.value)
    # no hang on a connection (the error above names the option, not a server): a bound far
    # from what a loaded machine takes to plan (0.2-2 s), not a speed target
    assert took < 10.0
    assert sc.statusTracker().getJobIdsForGroup("missing-cafile") == []  # no task ran


@pytest.mark.spark
def test_executors_need_not_have_the_cafile(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    """The driver reads the CA file and ships it with the options: the read works after
    the file is gone, as on executors that never had it."""
    ca = tmp_path / "ca.pem"
    shutil.copy(service.root / ".aqueduct-tls" / "ca.pem", ca)
    service.client().write("ca_shipped", pa.table({"n": [1, 2, 3]}))
    df = spark.read.format("aqueduct").options(url=service.url, cafile=str(ca)).load("ca_shipped")
    ca.unlink()
    assert sorted(row.n for row in df.collect()) == [1, 2, 3]


def test_version_range_options() -> None:
    base = {"url": "quic://h:1", "path": "d"}
    assert not parse(base).version_range
    assert not parse({**base, "startingVersion": "latest"}).version_range
    for extra in (
        {"startingVersion": "3"},
        {"startingVersion": "earliest"},
        {"endingVersion": "4"},
        {"readChangeFeed": "true"},
        {"startingTimestamp": "2026-01-01T00:00:00Z"},
    ):
        assert parse({**base, **extra}).version_range, extra
    with pytest.raises(OptionError, match="versionAsOf/timestampAsOf read one version"):
        parse({**base, "versionAsOf": "1", "readChangeFeed": "true"})
    with pytest.raises(OptionError, match="endingVersion or endingTimestamp"):
        parse({**base, "endingVersion": "1", "endingTimestamp": "2026-01-01T00:00:00Z"})
    with pytest.raises(OptionError, match="skipChangeCommits"):
        parse({**base, "skipChangeCommits": "maybe"})
