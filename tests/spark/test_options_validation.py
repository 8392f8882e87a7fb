"""Options are checked on the driver, once, with one error naming the option (issue 17,
item 5: a missing or relative cafile used to cost minutes of retries and end with "no
Aqueduct server answered")."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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


def test_an_existing_absolute_cafile_is_taken(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert parse({"url": URL, "path": "d", "cafile": str(ca)}).cafile == str(ca)


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


@pytest.mark.spark
def test_spark_fails_at_load_naming_the_option(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    started = time.monotonic()
    with pytest.raises(Exception, match=r"option 'cafile'") as e:
        spark.read.format("aqueduct").option("url", service.url).option(
            "cafile", str(tmp_path / "missing.pem")
        ).load("anything")
    assert "no Aqueduct server answered" not in str(e.value)
    assert time.monotonic() - started < 30  # no connection attempts, let alone retries


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
