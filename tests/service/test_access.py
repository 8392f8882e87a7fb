"""Tokens with rights: a read-only token reads and cannot write, a token sees and touches only
the datasets its globs cover, refusals are logged by the token's name and never with the
token. One real ``aqueduct serve`` for the module, with a TOML ``--config``; the Python client
and the CLI.

The matrix (issue 27): a token limited to dataset globs reaches every dataset inside them and
none outside, stored in one file or in several, by batch read, scan of single splits or of a
plan's task, stream (subscribe, changes, the change feed), write and drop; through the Python
client and the CLI (``main()`` in this process). Spark's cases are in
``tests/spark/test_spark_access.py``. Then the attacks a client can make with a scan, whose
splits it sends itself: claiming one dataset and naming another's splits, naming another
dataset's file, naming a file that a write staged and no commit made visible."""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cbor2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ServiceProcess, start_service

from aqueduct_core.api import channel
from aqueduct_core.transport import ClientTLS
from aqueduct_spark import protocol as P
from aqueduct_spark.client import AsyncClient, ClientConfig
from aqueduct_spark.client.session import BULK
from aqueduct_spark.service.access import AccessPolicy, Grant, grants_from_config

pytestmark = pytest.mark.quic

RW, RO, SALES = "rw-4f1c9a2e", "ro-7d3b0c55", "sales-19e0aa4b"
READER, WRITER = "reader-2c94e7", "writer-8fa013"
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

[[tokens]]
name = "reader"
token = "{READER}"
rights = "read"
datasets = ["trips_*", "cities"]

[[tokens]]
name = "writer"
token = "{WRITER}"
rights = "read-write"
datasets = ["trips_*", "cities"]
"""
TOKENS = {"reader": READER, "writer": WRITER}
FILES = {"cities": 3, "trips_2026": 1, "trips": 3, "citizens": 1}
"""Each dataset and the files it is stored in: inside the globs (the issue's own ``cities``,
several files) and outside them, named to tempt a sloppy match (``trips`` is not
``trips_*``, ``citizens`` is not ``cities``)."""
INSIDE = ("cities", "trips_2026")


@dataclass
class Guarded:
    svc: ServiceProcess
    log: Path
    admin: Any
    """The etl token's client: read-write on every dataset."""
    clients: dict[str, Any]
    """The reader's and the writer's, limited to the globs."""


def part(name: str, i: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([i * 10 + k for k in range(3)], pa.int64()),
            "city": [f"{name}-{i}-{k}" for k in range(3)],
        }
    )


def make(admin: Any, name: str) -> None:
    """(Re)create ``name`` as one overwrite and appends: FILES[name] live files."""
    admin.overwrite(name, part(name, 0))
    for i in range(1, FILES[name]):
        admin.append(name, part(name, i))
    assert admin.describe(name).files == FILES[name]


def rows(table: pa.Table) -> list[tuple[int, str]]:
    return sorted(zip(table["id"].to_pylist(), table["city"].to_pylist(), strict=True))


def stored(name: str) -> list[tuple[int, str]]:
    """The rows make() stores in ``name``."""
    return sorted(r for i in range(FILES[name]) for r in rows(part(name, i)))


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    here = tmp_path_factory.mktemp("access")
    config = here / "aqueduct.toml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    log = here / "service.log"
    svc = start_service(here / "root", args=["--config", str(config)], log=log)
    admin = svc.client(token=RW)
    for name in FILES:
        make(admin, name)
    clients = {who: svc.client(token=token) for who, token in TOKENS.items()}
    yield Guarded(svc, log, admin, clients)
    for client in [admin, *clients.values()]:
        client.close()
    svc.stop()


def ids(n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(n), pa.int64())})


def test_a_read_only_token_reads_and_cannot_write(guarded: Guarded) -> None:
    svc, log = guarded.svc, guarded.log
    svc.client(token=RW).overwrite("kpis", ids(5))
    reader = svc.client(token=RO)
    assert reader.read("kpis").num_rows == 5
    assert {"kpis", *FILES} <= {d.name for d in reader.list()}  # it may read every one
    with pytest.raises(P.PermissionDenied, match="analysts may only read"):
        reader.append("kpis", ids(1))
    with pytest.raises(P.PermissionDenied, match="read-write"):
        reader.drop("kpis")
    with pytest.raises(P.PermissionDenied):
        reader.create("fresh", ids(0).schema)
    assert svc.client(token=RW).read("kpis").num_rows == 5  # nothing was written
    text = log.read_text()
    # One line per refusal, the request's access line (was two: a 'refused ...' line too)
    refusals = [x for x in text.splitlines() if "refused drop" in x or "op=drop dataset=kpis" in x]
    assert len(refusals) == 1, refusals
    assert "WARNING aqueduct.access: request peer=127.0.0.1:" in refusals[0]
    assert "user=analysts" in refusals[0] and "outcome=permission_denied" in refusals[0]
    assert RO not in text and RW not in text  # names in the log, never tokens


def test_a_token_sees_and_touches_only_its_datasets(guarded: Guarded) -> None:
    svc = guarded.svc
    svc.client(token=RW).overwrite("other", ids(2))
    sales = svc.client(token=SALES)
    sales.overwrite("sales_2026", ids(3))
    assert sales.read("sales_2026").num_rows == 3
    names = {d.name for d in sales.list()}
    assert "sales_2026" in names and "other" not in names
    with pytest.raises(P.PermissionDenied, match=r"no rights on dataset 'other'.*sales_"):
        sales.read("other")
    with pytest.raises(P.PermissionDenied):
        sales.drop("other")


def test_an_unknown_token_is_refused_at_once(guarded: Guarded) -> None:
    svc = guarded.svc
    with pytest.raises(P.Unauthenticated, match="does not accept the token"):
        svc.client(token="not-a-token").list()
    with pytest.raises(P.Unauthenticated, match="requires a token"):
        svc.client(token=None).list()


def test_the_cli_with_a_read_only_token(
    guarded: Guarded, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The token from the environment, as a user sets it (``main()`` in this process)."""
    from aqueduct_spark import cli

    svc = guarded.svc
    svc.client(token=RW).overwrite("cli_ro", ids(4))
    monkeypatch.setenv("AQUEDUCT_URL", svc.url)
    monkeypatch.setenv("AQUEDUCT_FINGERPRINT", svc.fingerprint)
    monkeypatch.setenv("AQUEDUCT_TOKEN", RO)
    assert cli.main(["ls"]) == 0
    assert "cli_ro" in capsys.readouterr().out
    assert cli.main(["drop", "cli_ro"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("aqueduct drop: analysts may only read")
    assert "read-write" in err  # the fix: a token with read-write rights
    assert svc.client(token=RW).describe("cli_ro").rows == 4


# -- the Python client -------------------------------------------------------------------------


def scan(client: Any, splits: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_batches(list(client.scan(splits, schema=schema)), schema=schema)


def stream(client: Any, name: str) -> list[pa.Table]:
    """What a stream does: hear the latest version, list what each version since the last
    overwrite added, and scan it as one task; and the same range's change feed."""
    notes: queue.Queue[int] = queue.Queue()
    subscription = client.subscribe(name, notes.put, lambda alive: None)
    try:
        while notes.empty():
            if subscription.done():
                subscription.result()  # raises what ended it
            time.sleep(0.01)
    finally:
        subscription.cancel()
    latest = notes.get()
    assert client.offsets(name)["latest"] == latest
    first = latest - (FILES[name] - 1)  # the overwrite make() began with
    found = client.changes(name, first, to_version=latest)
    splits = [s for v in found["versions"] for s in v["files"]]
    schema = client.describe(name).schema
    feed = client.feed(name, starting_version=first, change_feed=True)
    changed = [s for v in feed["versions"] for s in v["files"] if s["change_type"] == "insert"]
    changes = scan(client, changed, pa.schema([*schema, *P.CHANGE_FIELDS]))
    return [scan(client, splits, schema), changes.select(["id", "city"])]


def attempt(r: Guarded, client: Any, name: str, shape: str) -> list[pa.Table]:
    """Do ``shape`` on ``name``; the tables read (none for a write or drop)."""
    # A plan is a read of its own: a scan is checked on its own too, so a token outside the
    # dataset gets the splits from the admin, as if handed over by a job that may read it.
    planner = client if name in INSIDE else r.admin
    if shape == "read":
        return [client.read(name)]
    if shape == "scan task":
        plan = planner.plan(name)
        return [scan(client, task, plan.schema) for task in plan.task_splits()]
    if shape == "scan split":
        plan = planner.plan(name)
        return [pa.concat_tables(scan(client, s, plan.schema) for s in plan.splits)]
    if shape == "stream":
        return stream(client, name)
    if shape == "write":
        client.append(name, part(name, 9))
        return []
    assert shape == "drop"
    assert client.drop(name)
    return []


@pytest.mark.parametrize("shape", ["read", "scan task", "scan split", "stream", "write", "drop"])
@pytest.mark.parametrize("name", list(FILES))
@pytest.mark.parametrize("who", list(TOKENS))
def test_the_python_client(guarded: Guarded, who: str, name: str, shape: str) -> None:
    r = guarded
    client = r.clients[who]
    before = stored(name)
    writes = shape in ("write", "drop")
    if name in INSIDE and (who == "writer" or not writes):
        tables = attempt(r, client, name, shape)
        if shape == "write":
            assert rows(r.admin.read(name)) == sorted(before + rows(part(name, 9)))
        elif shape == "drop":
            assert name not in {d.name for d in r.admin.list()}
        for table in tables:
            assert rows(table) == before
        if writes:
            make(r.admin, name)
        return
    with pytest.raises(P.PermissionDenied) as refused:
        attempt(r, client, name, shape)
    message = refused.value.message
    if name in INSIDE:
        assert message.startswith(f"{who} may only read (datasets trips_*, cities), and ")
        assert "read-write rights" in message
    else:
        may = "read" if who == "reader" else "read and write"
        grant = f"{who} may {may} datasets trips_*, cities; "
        assert message.startswith(f"{who} has no rights on dataset {name!r}: {grant}")
        assert "add a glob matching it" in message
    if writes:
        assert rows(r.admin.read(name)) == before  # nothing changed


# -- the CLI -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["head", "history", "import", "drop"])
@pytest.mark.parametrize("name", list(FILES))
@pytest.mark.parametrize("who", list(TOKENS))
def test_the_cli(
    guarded: Guarded,
    who: str,
    name: str,
    command: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from aqueduct_spark import cli

    r = guarded
    before = stored(name)
    argv = [command, name]
    if command == "import":
        pq.write_table(part(name, 9), tmp_path / "more.parquet")
        argv += [str(tmp_path / "more.parquet"), "--mode", "append", "-q"]
    conn = ["--url", r.svc.url, "--fingerprint", r.svc.fingerprint, "--token", TOKENS[who]]
    status = cli.main([*argv, *conn])
    out, err = capsys.readouterr()
    writes = command in ("import", "drop")
    if name in INSIDE and (who == "writer" or not writes):
        assert status == 0, err
        if command == "head":
            assert f"{name}-0-0" in out
        elif command == "history":
            assert out.startswith("v0 ")
        elif command == "import":
            assert rows(r.admin.read(name)) == sorted(before + rows(part(name, 9)))
            make(r.admin, name)
        else:
            assert name not in {d.name for d in r.admin.list()}
            make(r.admin, name)
        return
    assert status == 1
    assert err.startswith(f"aqueduct {command}: {who} ")
    assert (f"no rights on dataset {name!r}" if name not in INSIDE else "may only read") in err
    if writes:
        assert rows(r.admin.read(name)) == before


# -- what the log says, and the error a missing file gets -------------------------------------


def test_the_access_line_names_the_dataset_of_a_scan(guarded: Guarded) -> None:
    r = guarded
    r.clients["reader"].read("cities")
    with pytest.raises(P.PermissionDenied):
        plan = r.admin.plan("trips")
        list(r.clients["reader"].scan(plan.splits, schema=plan.schema))
    wanted = [
        "user=reader op=scan dataset=cities rows=9 ",
        "user=reader op=scan dataset=trips rows=0 ",
        "outcome=permission_denied error=\"reader has no rights on dataset 'trips'",
    ]
    deadline = time.monotonic() + 10  # the access line follows the scan's last batch
    while True:
        text = r.log.read_text()
        if all(w in text for w in wanted) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [w for w in wanted if w not in text] == []
    assert "op=scan dataset=-" not in text
    assert READER not in text and WRITER not in text and RW not in text


def test_a_vacuumed_version_says_its_file_is_missing(guarded: Guarded) -> None:
    r = guarded
    name = "trips_vacuumed"
    r.admin.overwrite(name, part(name, 0))
    r.admin.append(name, part(name, 1))  # version 1: two files
    r.admin.overwrite(name, part(name, 2))
    assert r.admin.vacuum(name, retention_hours=0)
    with pytest.raises(P.DataLoss, match=r"data file '.*\.parquet' of dataset 'trips_vacuumed'"):
        r.clients["reader"].read(name, version=1)


# -- attacks: splits a client makes up ---------------------------------------------------------


async def raw_scan(r: Guarded, token: str, request: dict[str, Any]) -> tuple[int, Any]:
    """Send one scan request as given; the rows it delivered and the error it ended with."""
    client = AsyncClient(
        ClientConfig(r.svc.url, tls=ClientTLS(fingerprint=r.svc.fingerprint), token=token)
    )
    try:
        conn = await client._connection(BULK)  # as the client's own scans
        schema = pa.schema([("id", pa.int64()), ("city", pa.string())])
        out, data = channel(headers=[(P.H_SCHEMA, P.schema_to_bytes(schema))], codec="raw")
        await conn.entrypoint.send({"op": "scan", **request, "out": out})
        got, error = 0, None
        while error is None:
            try:
                delivery = await asyncio.wait_for(data.recv_message(), 30)
            except Exception:  # the end of the channel
                break
            header = P.find_header(delivery.headers, P.H_ERROR)
            if header is not None:
                error = P.error_from_wire(cbor2.loads(header))
            else:
                got += P.batch_from_payload(delivery.value, schema).num_rows
        return got, error
    finally:
        await client.close()


@pytest.mark.parametrize(
    "how", ["dataset field", "split and splits", "mixed splits", "one split, another dataset"]
)
def test_a_scan_cannot_claim_one_dataset_and_read_another(guarded: Guarded, how: str) -> None:
    r = guarded
    mine, theirs = r.admin.plan("cities").splits, r.admin.plan("trips").splits
    request = {
        "dataset field": {"dataset": "cities", "splits": theirs},
        "split and splits": {"split": mine[0], "splits": theirs},
        "mixed splits": {"splits": [mine[0], *theirs]},
        "one split, another dataset": {"dataset": "cities", "split": theirs[0]},
    }[how]
    got, error = asyncio.run(raw_scan(r, READER, request))
    assert got == 0
    assert isinstance(error, P.PermissionDenied | P.InvalidRequest), error
    assert "trips" in error.message or "not both" in error.message


def test_a_split_cannot_name_another_datasets_file(guarded: Guarded) -> None:
    r = guarded
    theirs = r.admin.plan("trips").splits[0]
    mine = r.admin.plan("cities").splits[0]
    for path in (theirs["path"], f"../trips/{theirs['path']}", "/" + theirs["path"]):
        got, error = asyncio.run(raw_scan(r, READER, {"split": {**mine, "path": path}}))
        assert got == 0
        assert isinstance(error, P.InvalidRequest), error
        assert repr(path) in error.message


def test_a_split_cannot_read_a_file_no_commit_made_visible(guarded: Guarded) -> None:
    """The writer stages rows in ``cities`` and has not committed them: the reader, who may
    read ``cities``, cannot read them by naming the staged file, as a plain split or as a
    change split."""
    r = guarded
    writer = r.clients["writer"]
    txn = writer.begin("cities", part("cities", 0).schema)
    task = writer.write_task(txn, part("staged", 7).to_batches())
    staged = task["staged"]
    try:
        base = r.admin.plan("cities").splits[0]
        forged = {**base, "path": staged[0]["path"], "rows": 3}
        change = {
            **forged,
            "change_type": "insert",
            "commit_version": base["version"],
            "commit_timestamp": r.admin.describe("cities").updated,
        }
        for request in ({"split": forged}, {"splits": [change]}):
            got, error = asyncio.run(raw_scan(r, READER, request))
            assert got == 0
            assert isinstance(error, P.InvalidRequest), error
            assert "not one of its files" in error.message
    finally:
        writer.abort(txn, [task])
    assert "staged" not in str(rows(r.admin.read("cities")))


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


def test_authorize_checks_every_dataset_a_request_names() -> None:
    from aqueduct_spark.service.access import authorize

    reader = Grant("t", "read", ("trips_*", "cities"), "reader")
    known = frozenset({"list", "describe", "scan", "drop"})
    split = {"dataset": "cities", "path": "a.parquet"}
    assert authorize(reader, {"op": "scan", "split": split}, known) is reader
    assert authorize(reader, {"op": "list"}, known) is reader
    refusals = [
        ({"op": "scan", "dataset": "cities", "splits": [{**split, "dataset": "trips"}]}, "trips"),
        ({"op": "scan", "splits": [split, {**split, "dataset": "trips"}]}, "trips"),
        ({"op": "describe", "dataset": "citizens"}, "citizens"),
    ]
    for req, refused in refusals:
        with pytest.raises(P.PermissionDenied, match=f"no rights on dataset '{refused}'"):
            authorize(reader, req, known)
    invalid = [
        ({"op": "scan", "splits": [split, {**split, "dataset": "trips_1"}]}, "one dataset"),
        ({"op": "scan", "split": split, "splits": [split]}, "not both"),
        ({"op": "scan"}, "names no split"),
        ({"op": "describe"}, "names no dataset"),
        ({"op": "describe", "dataset": ["cities"]}, "must be text"),
        ({"op": "frobnicate", "dataset": "cities"}, "unknown operation"),
    ]
    for req, message in invalid:
        with pytest.raises(P.InvalidRequest, match=message):
            authorize(reader, req, known)
    with pytest.raises(P.Unauthenticated):  # before anything else
        authorize(P.Unauthenticated("no token"), {"op": "frobnicate"}, known)
