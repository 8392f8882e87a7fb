"""Who may do what: the service's tokens, each with read or read-write rights on the datasets
its globs match (``docs/operations.md#tokens-and-rights``).

A connection presents at most one token, in its headers. :meth:`AccessPolicy.authenticate`
compares it with every token the service knows, in constant time (``hmac.compare_digest``,
and no early exit, so the time taken says nothing about which token, or how much of one,
matched). The :class:`Grant` it finds then decides each request: reads (:data:`READ_OPS`)
need read rights on the dataset, everything else needs read-write rights. A service with no
tokens at all lets every connection do everything (:data:`ANYONE`).

Tokens are secrets: they appear in no ``repr``, message or log line; a grant is named by its
``name`` ("token 2" when the configuration gives none).
"""

from __future__ import annotations

import fnmatch
import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aqueduct_spark import protocol as P
from aqueduct_spark.service.observability import touched

READ = "read"
READ_WRITE = "read-write"
RIGHTS = (READ, READ_WRITE)

READ_OPS = frozenset(
    {"ping", "status", "list", "describe", "plan", "scan", "offsets", "changes", "feed"}
    | {"subscribe"}
)
"""Requests that only read (the server's ``REPLAY_SAFE``, kept equal by a test); every other
operation (create, drop, begin, write, commit, abort, compact, vacuum, restore, delete and any
added later) needs read-write rights."""
DATASETLESS_OPS = frozenset({"ping", "status", "list"})
"""Requests that touch no dataset: every token may send them (``list`` answers with the
datasets the token covers, ``ping`` reads nothing, ``status`` the service's own counts). Every
other request names its dataset (a scan in its splits) and is checked against it."""


@dataclass(frozen=True)
class Grant:
    """One token and what its holder may do."""

    token: str = field(repr=False)
    rights: str = READ_WRITE
    """``read`` or ``read-write`` (which includes read)."""
    datasets: tuple[str, ...] = ("*",)
    """Globs (``fnmatch``, case-sensitive) of the dataset names the rights cover."""
    name: str = "token"
    """How logs and messages name the holder (never the token itself)."""

    def __post_init__(self) -> None:
        if self.rights not in RIGHTS:
            raise ValueError(
                f"{self.name}: rights must be 'read' or 'read-write', got {self.rights!r}"
            )
        if not self.token:
            raise ValueError(f"{self.name}: the token is empty; give a non-empty secret")
        if not self.datasets or not all(isinstance(g, str) and g for g in self.datasets):
            raise ValueError(
                f"{self.name}: datasets must be a list of non-empty globs, e.g. ['sales_*']"
            )

    def covers(self, dataset: str) -> bool:
        return any(fnmatch.fnmatchcase(dataset, glob) for glob in self.datasets)

    def may_read(self, dataset: str) -> bool:
        return self.covers(dataset)

    def check(self, op: str, dataset: str | None) -> None:
        """Raise :class:`~aqueduct_spark.protocol.PermissionDenied` unless this grant allows
        ``op`` on ``dataset`` (None: a request that names no dataset, such as ``list``)."""
        if op in DATASETLESS_OPS:
            return  # list is answered with the datasets this grant may read (may_read)
        what = "the whole service" if dataset is None else f"dataset {dataset!r}"
        details = {"operation": op} if dataset is None else {"operation": op, "dataset": dataset}
        covered = self.datasets == ("*",) if dataset is None else self.covers(dataset)
        globs = ", ".join(self.datasets)
        if not covered:
            may = "read" if self.rights == READ else "read and write"
            raise P.PermissionDenied(
                f"{self.name} has no rights on {what}: {self.name} may {may} datasets {globs}; "
                "use a token whose datasets include it, or ask the service's operator to add "
                f"a glob matching it to {self.name}'s datasets ([[tokens]] in its "
                "configuration file)",
                details,
            )
        if op not in READ_OPS and self.rights != READ_WRITE:
            raise P.PermissionDenied(
                f"{self.name} may only read (datasets {globs}), and {op!r} writes to {what}; "
                "use a token with read-write rights on it",
                details,
            )


def scan_splits(req: Mapping[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """The splits a ``scan`` request reads, and whether it gave them as a list (``splits``,
    a plan's task) rather than one ``split``. The service reads exactly these, and checks
    rights on exactly their datasets (:func:`datasets_named`)."""
    one, many = req.get("split"), req.get("splits")
    if one is not None and many is not None:
        raise P.InvalidRequest(
            "a scan gives 'split' (one split) or 'splits' (a plan's task), not both; "
            "send the splits of a plan's task as 'splits' alone"
        )
    if many is None:
        if not isinstance(one, dict):
            raise P.InvalidRequest(
                "request 'scan' names no split; send a plan's split as 'split', or the "
                "splits of one of its tasks as 'splits'"
            )
        return [one], False
    if not isinstance(many, list) or not many or not all(isinstance(d, dict) for d in many):
        raise P.InvalidRequest("field 'splits' of 'scan' must be a non-empty list of splits")
    return many, True


def datasets_named(req: Mapping[str, Any]) -> list[str]:
    """Every dataset a request names, once each: its ``dataset`` field, then (a scan) the
    dataset of each of its splits. Rights are checked on every one, so a request cannot
    claim one dataset and read another. A ``dataset`` that is not text is
    :class:`~aqueduct_spark.protocol.InvalidRequest`; so is a request that needs a dataset
    (every operation but :data:`DATASETLESS_OPS`) and names none."""
    op = req.get("op")
    names: list[Any] = [] if req.get("dataset") is None else [req["dataset"]]
    if op == "scan":
        names += [raw.get("dataset") for raw in scan_splits(req)[0]]
    bad = next((n for n in names if not isinstance(n, str)), ...)
    if bad is not ...:
        raise P.InvalidRequest(
            f"the dataset a request names must be text, got {bad!r}; send the dataset's name"
        )
    if not names and op not in DATASETLESS_OPS:
        raise P.InvalidRequest(
            f"request {op!r} names no dataset; give the dataset it works on in field 'dataset'"
        )
    return list(dict.fromkeys(names))


def authorize(
    grant: Grant | P.Unauthenticated, req: Mapping[str, Any], known: frozenset[str]
) -> Grant:
    """The grant that allows request ``req`` (its ``op`` one of ``known``), checked on every
    dataset it names (a scan: its splits' too; the access line shows the one checked). A
    refusal is raised; the request's access line logs it, at WARNING, with the client's
    address and the token's name, never the token (one line per refusal)."""
    op = req["op"]
    if isinstance(grant, P.Unauthenticated):
        raise P.Unauthenticated(grant.message)
    if op not in known:
        raise P.InvalidRequest(
            f"unknown operation {op!r}: the client is newer than this service; upgrade "
            "the service, or use a client of its version"
        )
    names = datasets_named(req)
    for dataset in names:
        touched(dataset)
        grant.check(op, dataset)
    if len(names) > 1:
        raise P.InvalidRequest(
            f"a {op} works on one dataset, and this one names {', '.join(map(repr, names))}; "
            "send one request per dataset, with the splits its plan gave"
        )
    return grant


ANYONE = Grant(token="-", rights=READ_WRITE, datasets=("*",), name="anonymous")
"""What every connection may do when the service has no tokens."""
_PASS_TOKEN = (
    "set the 'token' option (Spark), AQUEDUCT_TOKEN, aqueduct --token or "
    "Client(url, token=...) to a token the service accepts"
)
"""How a refused connection passes a token, in each client."""


@dataclass(frozen=True)
class AccessPolicy:
    """The tokens a service accepts. No grants: no authentication, everyone may do anything."""

    grants: tuple[Grant, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for grant in self.grants:
            if grant.token in seen:
                raise ValueError(
                    f"{grant.name} repeats a token given before it; each token needs one entry"
                )
            seen.add(grant.token)

    @property
    def requires_token(self) -> bool:
        return bool(self.grants)

    @classmethod
    def of(cls, token: str | None = None, grants: Iterable[Grant] = ()) -> AccessPolicy:
        """A policy from the single ``--token`` (read-write on every dataset) and more grants."""
        every = list(grants)
        if token:
            every.insert(0, Grant(token=token, name="the --token token"))
        return cls(tuple(every))

    def authenticate(self, presented: bytes | None) -> Grant:
        """The grant of the token a connection presented (:data:`ANYONE` when the service has
        no tokens). Every token is compared, in constant time. Raises
        :class:`~aqueduct_spark.protocol.Unauthenticated` for no token or an unknown one."""
        if not self.grants:
            return ANYONE
        if presented is None:
            raise P.Unauthenticated(
                f"this service requires a token, and this connection presented none: {_PASS_TOKEN}"
            )
        found = None
        for grant in self.grants:
            if hmac.compare_digest(presented, grant.token.encode()):
                found = grant
        if found is None:
            raise P.Unauthenticated(
                f"this service does not accept the token this connection presented: {_PASS_TOKEN}"
            )
        return found


def grants_from_config(entries: Any, source: str) -> list[Grant]:
    """The ``[[tokens]]`` tables of a configuration file, checked. Each has ``token`` (or
    ``token_env``, the name of an environment variable holding it), ``rights`` and
    ``datasets``, and optionally a ``name``. Errors name ``source`` and the entry."""
    if not isinstance(entries, list):
        raise ValueError(f"{source}: 'tokens' must be an array of tables ([[tokens]])")
    grants = []
    for i, entry in enumerate(entries, 1):
        where = f"{source}: [[tokens]] entry {i}"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be a table with token, rights and datasets")
        unknown = set(entry) - {"name", "token", "token_env", "rights", "datasets"}
        if unknown:
            raise ValueError(
                f"{where} has unknown keys {sorted(unknown)}; "
                "the keys are name, token (or token_env), rights and datasets"
            )
        name = entry.get("name", f"token {i}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: name must be non-empty text")
        token = _token_of(entry, f"{where} ({name})")
        rights = entry.get("rights", READ)
        datasets = entry.get("datasets", ["*"])
        if isinstance(datasets, str):
            datasets = [datasets]
        if not isinstance(datasets, list):
            raise ValueError(f"{where} ({name}): datasets must be a list of globs")
        try:
            grants.append(Grant(token, rights, tuple(datasets), name))
        except ValueError as exc:
            raise ValueError(f"{source}: [[tokens]] entry {i}: {exc}") from None
    return grants


def _token_of(entry: Mapping[str, Any], where: str) -> str:
    if ("token" in entry) == ("token_env" in entry):
        raise ValueError(f"{where}: give exactly one of token and token_env")
    if "token" in entry:
        token = entry["token"]
        if not isinstance(token, str) or not token:
            raise ValueError(f"{where}: token must be non-empty text")
        return token
    var = entry["token_env"]
    if not isinstance(var, str) or not os.environ.get(var):
        raise ValueError(
            f"{where}: token_env names the environment variable {var!r}, which is not set; "
            "set it to the token before starting the service"
        )
    return os.environ[var]
