"""The error catalogue: every error a user can see says what happened and what to do, and
names nothing of the code's insides (issue 20, item 9).

The catalogue is the error classes themselves: each has ``remedy``, its usual fix, and
``str()`` shows the message followed by ``Fix: <remedy>`` unless the message says what to do
itself (``aqueduct_core.errors``). The rules checked here:

1. every error class has a remedy: one line that starts with an instruction and names nothing
   internal; ``docs/troubleshooting.md``'s catalogue table is exactly the classes' remedies;
2. ``str()`` adds the remedy once: not when the message says what to do, and not again after
   the error crossed the wire, was pickled (Spark ships errors so) or was wrapped;
3. every place in the source that raises one (found through the syntax tree) has a message
   that names nothing internal (a module path, a ``.py`` file, a dunder, ``self.``, a class of
   ours users never meet, a Python exception type, ``type(x).__name__``), and either says
   what to do itself or relies on its class's remedy; an ``InvalidRequest`` (whose remedy is
   only "correct the request") may rely on it only where no client of ours can send the
   request (``FOREIGN_ONLY``, a list that may only shrink);
4. end to end, through a real service: ``aqueduct`` and the Python client show a missing
   dataset, a wrong token and a version out of range as what happened and the fix, with no
   traceback and no class or module names.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import json
import pickle
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_docs import read, tables, user_visible_exceptions

from aqueduct_core.errors import FIX, AqueductError, says_what_to_do, with_remedy
from aqueduct_spark.testing import ServiceProcess, closed_port, start_service

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aqueduct_core", "aqueduct_spark")

NOT_FAILURES = {"EndOfChannel"}
"""Error classes that are not failures (the clean end of a channel): nothing to do."""
BASES = {"AqueductError", "DatasetError", "ChannelError", "ProtocolError"}
"""Base classes, never raised themselves: their remedy points to the guide."""
NEVER_SHOWN = {"Truncated", "Reload"}
"""Signals caught where they are raised (a parser's "need more bytes", a kept log tail's "load me
afresh")."""

# -- the classes and the places that raise them ----------------------------------------------


@functools.cache
def modules() -> tuple[tuple[str, Path, ast.Module], ...]:
    """Every module of the packages, parsed once for all the checks (parsing them all again
    for each cost seconds)."""
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            name = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
            out.append((name, relative, ast.parse(path.read_text(encoding="utf-8"))))
    return tuple(out)


@functools.cache
def error_classes() -> dict[str, type[BaseException]]:
    """Every exception (and warning) class the code defines, by name."""
    out: dict[str, type[BaseException]] = {}
    for module, _, tree in modules():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.bases:
                value = getattr(importlib.import_module(module), node.name, None)
                private = node.name.startswith("_") or node.name in NEVER_SHOWN
                if inspect.isclass(value) and issubclass(value, BaseException) and not private:
                    out[node.name] = value
    return out


@functools.cache
def public_names() -> frozenset[str]:
    """What users may name: everything in a module's ``__all__``."""
    names: set[str] = set()
    for module, _, tree in modules():
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names |= set(importlib.import_module(module).__all__)
    return frozenset(names)


@functools.cache
def internal_names() -> set[str]:
    """Names of classes of ours users never meet, and Python's exception types."""
    ours = {
        node.name
        for _, _, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    python = {
        name
        for name, value in vars(builtins).items()
        if inspect.isclass(value) and issubclass(value, BaseException)
    }
    return (ours - public_names() - set(error_classes())) | python


@dataclass(frozen=True)
class RaiseSite:
    where: str  # path:line
    cls: str
    text: str | None  # the message's literal text, "{}" for each value; None: not literal
    values: tuple[ast.expr, ...]  # the expressions formatted into it

    @property
    def path(self) -> str:
        return self.where.split(":")[0]


def literal(node: ast.expr) -> tuple[str, list[ast.expr]] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, []
    if isinstance(node, ast.JoinedStr):
        text, values = "", []
        for part in node.values:
            if isinstance(part, ast.Constant):
                text += str(part.value)
            else:
                assert isinstance(part, ast.FormattedValue)
                text += "{}"
                values.append(part.value)
        return text, values
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = literal(node.left), literal(node.right)
        if left is not None and right is not None:
            return left[0] + right[0], left[1] + right[1]
    if (  # f"...".rstrip()
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("rstrip", "strip")
    ):
        return literal(node.func.value)
    return None


@functools.cache
def raise_sites() -> tuple[RaiseSite, ...]:
    classes = set(error_classes())
    sites = []
    for _, path, tree in modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in classes:
                continue
            found = literal(node.args[0])
            text, values = found if found is not None else (None, [])
            sites.append(RaiseSite(f"{path}:{node.lineno}", name, text, tuple(values)))
    return tuple(sites)


# -- what counts as internal ------------------------------------------------------------------

INTERNAL_TEXT = (
    (r"\baqueduct_(core|spark)\b", "a module path"),
    (r"\w\.py\b", "a Python file"),
    (r"__\w+__", "a dunder name"),
    (r"\bself\.", "self."),
    (r"<\w+ object at 0x", "the repr of an object"),
)


def internal_in_text(text: str, names: set[str]) -> list[str]:
    found = [what for pattern, what in INTERNAL_TEXT if re.search(pattern, text)]
    found += [f"class {w}" for w in re.findall(r"\b[A-Z][A-Za-z]+\b", text) if w in names]
    return found


CALLER_TYPE = {
    ("aqueduct_core/api/codec.py", "cannot encode {} with the CBOR codec"),
    ("aqueduct_core/api/codec.py", "a raw channel sends bytes-like values"),
    ("aqueduct_spark/service/delta_types.py", "expected a pyarrow.Schema"),
    ("aqueduct_spark/service/staging.py", "expected a pyarrow.RecordBatch"),
    ("aqueduct_spark/service/predicates.py", "replaceWhere must be text"),
    ("aqueduct_spark/service/tables.py", "timestamp must be a datetime"),
    ("aqueduct_spark/service/scan.py", "filter must be a pyarrow.compute.Expression"),
}
"""Messages that name ``type(value).__name__`` of the caller's own value (``datetime``,
``list``): the type the caller must change, not one of ours."""


def internal_in_values(site: RaiseSite) -> list[str]:
    found = []
    for value in site.values:
        for node in ast.walk(value):
            if isinstance(node, ast.Attribute) and re.fullmatch(r"__\w+__", node.attr):
                found.append(f"{{{ast.unparse(value)}}}")
            elif isinstance(node, ast.Name) and node.id == "self" and value is node:
                found.append("{self}")
    caller_type = site.text is not None and any(
        site.path == p and site.text.startswith(t) for p, t in CALLER_TYPE
    )
    return [] if caller_type else found


# -- 1. every class has a remedy, and the guide lists them ------------------------------------


def test_every_error_class_has_a_remedy() -> None:
    names = internal_names()
    problems = []
    for name, cls in sorted(error_classes().items()):
        remedy = getattr(cls, "remedy", None)
        if name in NOT_FAILURES:
            assert remedy == "", f"{name} is not a failure: it needs no remedy"
            continue
        if not isinstance(remedy, str) or not remedy:
            problems.append(f"{name}: no remedy")
            continue
        inherited = next(c for c in cls.__mro__ if "remedy" in vars(c))
        if inherited.__name__ in BASES and name not in BASES:
            problems.append(f"{name}: only the generic remedy of {inherited.__name__}")
        if not re.match(r"[a-z]", remedy) or not says_what_to_do(remedy):
            problems.append(f"{name}: the remedy does not start with an instruction: {remedy!r}")
        if "\n" in remedy or remedy.endswith("."):
            problems.append(f"{name}: the remedy is one clause, no newline or final full stop")
        problems += [f"{name}: the remedy names {w}" for w in internal_in_text(remedy, names)]
    assert not problems, "\n".join(problems)


def test_the_guide_lists_every_remedy() -> None:
    found = [
        rows
        for header, rows in tables(read("troubleshooting.md"))
        if header == ["Error", "What to do, when the message does not say"]
    ]
    assert len(found) == 1, "troubleshooting.md needs exactly one error catalogue table"
    documented = {}
    for row in found[0]:
        name = re.fullmatch(r"\[`(\w+)`\]\(#(\w+)\)", row[0])
        assert name and name.group(2) == name.group(1).lower(), f"error cell {row[0]!r}"
        documented[name.group(1)] = row[1]
    classes = user_visible_exceptions()
    assert set(documented) == set(classes), "the table lists exactly the user-visible classes"
    for name, cls in classes.items():
        remedy = getattr(cls, "remedy", "") or "nothing: it is not a failure"
        assert documented[name] == remedy, f"{name}: the table says {documented[name]!r}"


# -- 2. str() adds the remedy once ---------------------------------------------------------------


def constructible() -> Iterator[type[AqueductError]]:
    for cls in error_classes().values():
        if issubclass(cls, AqueductError) and cls.remedy:
            try:
                cls("m")
            except TypeError:  # needs more than a message (Refused: a reason)
                continue
            yield cls


def test_str_is_the_message_then_the_remedy_once() -> None:
    from aqueduct_spark import protocol as P

    classes = list(constructible())
    assert P.DatasetNotFound in classes and len(classes) > 20
    for cls in classes:
        bare = cls("dataset 'x' does not exist")
        shown = f"dataset 'x' does not exist. {FIX} {cls.remedy}"
        assert str(bare) == shown, cls
        assert str(pickle.loads(pickle.dumps(bare))) == shown, f"{cls}: pickled"
        assert str(cls(str(bare))) == shown, f"{cls}: wrapped in its own class"
        assert str(P.InternalError(str(bare))).count(FIX) == 1, f"{cls}: wrapped"
        own = cls("dataset 'x' already exists; write with mode 'append'")
        assert str(own) == "dataset 'x' already exists; write with mode 'append'", cls
    for cls in P.ERRORS.values():
        sent = P.error_from_wire(P.error_to_wire(cls("version 9 is gone")))
        assert type(sent) is cls and str(sent) == f"version 9 is gone. {FIX} {cls.remedy}"


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ("dataset 'x' does not exist", False),
        ("version must be >= 0, got -1", False),
        ("option 'splitSize' must be a size like 64MB, got 'big'", False),
        ("dataset 'x' already exists; write with mode 'append' or 'overwrite'", True),
        ("unknown option 'splitsize2'. Did you mean splitSize?", True),
        ("invalid write mode 'x': use one of ['append']", True),
        ("nothing listens at H:P. Is the service running (aqueduct serve)?", True),
        ("a filter value 'why?' is not allowed", False),  # a question mark inside a value
        ("the files are gone (read them again from a backup)", True),
        ("could not connect: x. If this is a certificate problem, give the CA file", True),
        (f"dataset 'x' does not exist. {FIX} check the name", True),
    ],
)
def test_what_counts_as_saying_what_to_do(message: str, says: bool) -> None:
    assert says_what_to_do(message) is says
    assert (with_remedy(message, "do this") == message) is says


# -- 3. every place that raises one ------------------------------------------------------------

FOREIGN_ONLY = {
    ("aqueduct_spark/protocol/arrow.py", "not an Arrow IPC schema"),
    ("aqueduct_spark/protocol/arrow.py", "a data message is not an Arrow record batch"),
    ("aqueduct_spark/service/access.py", "field 'splits' of 'scan'"),
    ("aqueduct_spark/protocol/messages.py", "{} must be an integer"),
    ("aqueduct_spark/protocol/messages.py", "{} must be a map of its fields"),
    ("aqueduct_spark/protocol/messages.py", "{} is missing fields"),
    ("aqueduct_spark/protocol/messages.py", "staged must be a list of staged files"),
    ("aqueduct_spark/protocol/messages.py", "invalid partition value"),
    ("aqueduct_spark/protocol/messages.py", "invalid split"),
    ("aqueduct_spark/service/changes.py", "change_type must be"),
    ("aqueduct_spark/service/changes.py", "commit_timestamp must be"),
    ("aqueduct_spark/service/changes.py", "a change split without change_type"),
    ("aqueduct_spark/service/commits.py", "replaces must be a version"),
    ("aqueduct_spark/service/commits.py", "an overwrite of dataset {} cannot begin"),
    ("aqueduct_spark/service/operations.py", "request {} needs field"),
    ("aqueduct_spark/service/operations.py", "field {} of {} has the wrong type"),
    ("aqueduct_spark/service/scan.py", "invalid partition value {} for column"),
    ("aqueduct_spark/service/server.py", "a write channel needs the Arrow schema"),
    ("aqueduct_spark/service/server.py", "a request is a map"),
    ("aqueduct_spark/service/staging.py", "invalid data file path"),
    ("aqueduct_spark/service/staging.py", "{} is not the name of a file staged here"),
    ("aqueduct_spark/service/staging.py", "staged file {} is listed twice"),
    ("aqueduct_spark/service/staging.py", "staged file {} is not in the directory"),
    ("aqueduct_spark/service/staging.py", "staged file {} is not Parquet"),
    ("aqueduct_spark/service/staging.py", "the stage writer of task"),
    ("aqueduct_spark/service/staging.py", "expected a pyarrow.RecordBatch"),
    ("aqueduct_spark/service/tables.py", "timestamp must be a datetime"),
}
"""InvalidRequest raise sites whose message may rely on the generic remedy: checks of the
form of a request (or of a call into the service's store) that the CLI, the Python client and
Spark never fail, only a foreign client or a bug (path, start of the message). May only
shrink: a new check a user can meet says what to do."""


def test_raise_sites_name_nothing_internal() -> None:
    names = internal_names()
    sites = raise_sites()
    assert len(sites) > 250, "the raise sites were not found"
    problems = []
    for site in sites:
        found = internal_in_values(site)
        if site.text is not None:
            found += internal_in_text(site.text, names)
        problems += [f"{site.where} ({site.cls}) names {what}: {site.text!r}" for what in found]
    assert not problems, "\n".join(problems)


def test_raise_sites_say_what_to_do() -> None:
    classes = error_classes()
    problems = []
    relied = set()
    for site in raise_sites():
        cls = classes[site.cls]
        if site.text is None or site.cls in NOT_FAILURES or says_what_to_do(site.text):
            continue
        if not getattr(cls, "remedy", ""):
            problems.append(f"{site.where}: {site.cls} has no remedy for {site.text!r}")
        elif not issubclass(cls, AqueductError):  # nothing adds its remedy: say it here
            problems.append(f"{site.where}: say what to do in {site.text!r}")
        elif site.cls == "InvalidRequest":
            key = next(
                (k for k in FOREIGN_ONLY if site.path == k[0] and site.text.startswith(k[1])), None
            )
            if key is None:
                problems.append(f"{site.where}: say what to do in {site.text!r}")
            relied.add(key)
    assert not problems, "\n".join(problems)
    stale = FOREIGN_ONLY - relied
    assert not stale, f"strike these from FOREIGN_ONLY, they say what to do now: {stale}"


def test_the_checks_catch_a_bad_message() -> None:
    """The rules above can fail: a message of the old kind breaks each of them."""
    names = internal_names()
    bad = "Store.__init__ failed in aqueduct_spark.service.tables (tables.py): KeyError: self.x"
    found = internal_in_text(bad, names)
    assert {"a module path", "a Python file", "a dunder name", "self."} <= set(found)
    assert "class Store" in found and "class KeyError" in found
    assert not says_what_to_do("version must be >= 0, got -1")
    expression = ast.parse("type(e).__name__", mode="eval").body
    site = RaiseSite("x.py:1", "InternalError", "failed: {}", (expression,))
    assert internal_in_values(site) == ["{type(e).__name__}"]


# -- 4. end to end: what the command and the Python client show ------------------------------

TOKEN = "catalogue-token"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("catalogue"), token=TOKEN)
    try:
        with svc.client() as client:
            client.write("trips", pa.table({"id": [1, 2], "mode": ["bus", "tram"]}))
        yield svc
    finally:
        svc.stop()


@dataclass(frozen=True)
class Case:
    cli: tuple[str, ...]
    token: str | None
    call: Callable[[Any], Any]
    happened: str  # a regex of what happened
    fix: str  # a regex of what to do


CASES = {
    "missing dataset": Case(
        ("describe", "trps"),
        TOKEN,
        lambda c: c.describe("trps"),
        r"dataset 'trps' does not exist",
        r"Fix: check the name with aqueduct ls",
    ),
    "wrong token": Case(
        ("ls",),
        "not-the-token",
        lambda c: c.list(),
        r"this service does not accept the token",
        r"AQUEDUCT_TOKEN, aqueduct --token",
    ),
    "no token": Case(
        ("ls",),
        None,
        lambda c: c.list(),
        r"this service requires a token",
        r"AQUEDUCT_TOKEN, aqueduct --token",
    ),
    "version out of range": Case(
        ("head", "trips", "--version", "7"),
        TOKEN,
        lambda c: c.read("trips", version=7),
        r"dataset 'trips' has no version 7 \(the latest is 0",
        r"pick one from aqueduct history trips",
    ),
    "negative version": Case(
        ("head", "trips", "--version", "-1"),
        TOKEN,
        lambda c: c.read("trips", version=-1),
        r"version must be >= 0, got -1",
        r"pick one from aqueduct history trips",
    ),
}

SHOWN = re.compile(r"Traceback|File \"|object at 0x")
"""Signs of a traceback or of an object's repr in an error's text."""


def check_shown(text: str, case: Case) -> None:
    assert re.search(case.happened, text), f"does not say what happened: {text!r}"
    assert re.search(case.fix, text), f"does not say what to do: {text!r}"
    assert text.count(FIX) <= 1, f"the fix is there twice: {text!r}"
    assert SHOWN.search(text) is None, f"shows a traceback or a repr: {text!r}"
    classes = [w for w in re.findall(r"\b[A-Z]\w+\b", text) if w in error_classes()]
    internal = internal_in_text(text, internal_names()) + classes
    assert not internal, f"shows {internal}: {text!r}"


@pytest.mark.parametrize("name", CASES)
def test_the_command_shows_what_happened_and_the_fix(service: ServiceProcess, name: str) -> None:
    case = CASES[name]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(Path.home()),
        "AQUEDUCT_URL": service.url,
        "AQUEDUCT_FINGERPRINT": service.fingerprint,
    }
    if case.token:
        env["AQUEDUCT_TOKEN"] = case.token
    done = subprocess.run(
        [sys.executable, "-m", "aqueduct_spark.cli", *case.cli, "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 1, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, f"one line, no traceback: {done.stderr}"
    assert lines[0].startswith(f"aqueduct {case.cli[0]}: "), lines[0]
    check_shown(lines[0], case)


@pytest.mark.parametrize("name", CASES)
def test_the_python_client_shows_what_happened_and_the_fix(
    service: ServiceProcess, name: str
) -> None:
    case = CASES[name]
    with service.client(token=case.token) as client, pytest.raises(AqueductError) as caught:
        case.call(client)
    check_shown(str(caught.value), case)
    # nothing of the client's insides chained to it: the traceback ends with this error
    assert caught.value.__cause__ is None and caught.value.__context__ is None


def test_status_of_a_service_not_there_names_no_class() -> None:
    """``aqueduct status --json`` printed ``ServiceUnreachable: ...`` as the error."""
    url = f"tcp://127.0.0.1:{closed_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "aqueduct_spark.cli", "status", url, "--insecure", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    assert done.returncode == 1, done
    error = json.loads(done.stdout)["error"]
    case = Case((), None, lambda c: None, re.escape(url.removeprefix("tcp://")), r"aqueduct serve")
    check_shown(error, case)
