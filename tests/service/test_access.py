"""Tokens with rights: a read-only token reads and cannot write, a token sees and touches only
the datasets its globs cover, refusals are logged by the token's name and never with the
token. Real ``aqueduct serve`` with a TOML ``--config``, the Python client and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import ServiceProcess, start_service

from aqueduct_spark import protocol as P
from aqueduct_spark.service.access import AccessPolicy, Grant, grants_from_config

pytestmark = pytest.mark.quic

RW, RO, SALES = "rw-4f1c9a2e", "ro-7d3b0c55", "sales-19e0aa4b"
CONFIG = f"""
max_scans = 8

[[tokens]]
name = "etl"
token = "{RW}"
rights = "read-write"

[[tokens]]
name = "analysts"
token = "{RO}"
rights = "read"

[[tokens]]
name = "sales-team"
token = "{SALES}"
rights = "read-write"
datasets = ["sales_*"]
"""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, Path]]:
    here = tmp_path_factory.mktemp("access")
    config = here / "aqueduct.toml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    log = here / "service.log"
    svc = start_service(here / "root", args=["--config", str(config)], log=log)
    yield svc, log
    svc.stop()


def rows(n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(n), pa.int64())})


def test_a_read_only_token_reads_and_cannot_write(guarded: Any) -> None:
    svc, log = guarded
    svc.client(token=RW).overwrite("trips", rows(5))
    reader = svc.client(token=RO)
    assert reader.read("trips").num_rows == 5
    assert [d.name for d in reader.list()] == ["trips"]
    with pytest.raises(P.PermissionDenied, match="analysts may only read"):
        reader.append("trips", rows(1))
    with pytest.raises(P.PermissionDenied, match="read-write"):
        reader.drop("trips")
    with pytest.raises(P.PermissionDenied):
        reader.create("fresh", rows(0).schema)
    assert svc.client(token=RW).read("trips").num_rows == 5  # nothing was written
    text = log.read_text()
    assert "refused drop of trips from 127.0.0.1: analysts may only read" in text
    assert RO not in text and RW not in text  # names in the log, never tokens


def test_a_token_sees_and_touches_only_its_datasets(guarded: Any) -> None:
    svc, _ = guarded
    svc.client(token=RW).overwrite("other", rows(2))
    sales = svc.client(token=SALES)
    sales.overwrite("sales_2026", rows(3))
    assert sales.read("sales_2026").num_rows == 3
    names = {d.name for d in sales.list()}
    assert "sales_2026" in names and "other" not in names
    with pytest.raises(P.PermissionDenied, match=r"no rights on dataset 'other'.*sales_"):
        sales.read("other")
    with pytest.raises(P.PermissionDenied):
        sales.drop("other")


def test_an_unknown_token_is_refused_at_once(guarded: Any) -> None:
    svc, _ = guarded
    with pytest.raises(P.Unauthenticated, match="does not accept the token"):
        svc.client(token="not-a-token").list()
    with pytest.raises(P.Unauthenticated, match="requires a token"):
        svc.client(token=None).list()


def test_the_cli_with_a_read_only_token(guarded: Any) -> None:
    svc, _ = guarded
    svc.client(token=RW).overwrite("cli_ro", rows(4))
    env = {**os.environ, "AQUEDUCT_URL": svc.url, "AQUEDUCT_FINGERPRINT": svc.fingerprint}
    env["AQUEDUCT_TOKEN"] = RO
    cli = [sys.executable, "-m", "aqueduct_spark.cli"]
    listed = subprocess.run([*cli, "ls"], env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "cli_ro" in listed.stdout, listed.stderr
    dropped = subprocess.run(
        [*cli, "drop", "cli_ro"], env=env, capture_output=True, text=True, timeout=60
    )
    assert dropped.returncode == 1
    assert dropped.stderr.startswith("aqueduct drop: analysts may only read")
    assert "read-write" in dropped.stderr  # the fix: a token with read-write rights
    assert svc.client(token=RW).describe("cli_ro").rows == 4


# -- the rules alone ---------------------------------------------------------------------------


def test_reads_need_read_rights_and_everything_else_read_write() -> None:
    ro = Grant("t", "read", ("a*",), "ro")
    ro.check("scan", "abc")
    ro.check("list", None)
    ro.check("ping", None)  # the client's probe of an idle connection, for any token
    for op in ("create", "drop", "begin", "write", "commit", "abort", "compact", "delete"):
        with pytest.raises(P.PermissionDenied, match="may only read"):
            ro.check(op, "abc")
    with pytest.raises(P.PermissionDenied, match="no rights on dataset 'b'"):
        ro.check("describe", "b")
    with pytest.raises(P.PermissionDenied, match="the whole service"):
        ro.check("describe", None)  # a request naming no dataset needs every dataset


def test_the_reads_are_the_requests_served_before_the_handshake() -> None:
    """Both lists name the requests that only read: a new read joins both, or neither."""
    from aqueduct_spark.service.access import READ_OPS
    from aqueduct_spark.service.server import REPLAY_SAFE

    assert READ_OPS == REPLAY_SAFE


def test_authentication_finds_the_token_and_keeps_it_secret() -> None:
    policy = AccessPolicy.of("single", [Grant("other", "read", ("*",), "reader")])
    assert policy.authenticate(b"other").name == "reader"
    assert policy.authenticate(b"single").rights == "read-write"
    with pytest.raises(P.Unauthenticated):
        policy.authenticate(b"singl")
    assert "single" not in repr(policy) and "other" not in repr(policy)
    assert AccessPolicy().authenticate(None).rights == "read-write"  # no tokens: open


def test_configuration_mistakes_name_the_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"entry 1 \(token 1\): give exactly one of token"):
        grants_from_config([{"rights": "read"}], "f.toml")
    with pytest.raises(ValueError, match=r"entry 1: .*rights must be 'read' or 'read-write'"):
        grants_from_config([{"token": "x", "rights": "write"}], "f.toml")
    with pytest.raises(ValueError, match="unknown keys \\['dataset'\\]"):
        grants_from_config([{"token": "x", "dataset": "a"}], "f.toml")
    with pytest.raises(ValueError, match="'NO_SUCH_VAR', which is not set"):
        grants_from_config([{"token_env": "NO_SUCH_VAR"}], "f.toml")
    monkeypatch.setenv("THE_TOKEN", "from-env")
    (grant,) = grants_from_config([{"token_env": "THE_TOKEN", "datasets": "x"}], "f.toml")
    assert grant.token == "from-env" and grant.datasets == ("x",) and grant.rights == "read"
    with pytest.raises(ValueError, match="repeats a token"):
        AccessPolicy.of("same", [Grant("same")])
