"""The documentation is true of the code, and stays true.

- every Spark option is in ``docs/spark-options.md``'s table with its default, and nothing else;
- every ``aqueduct`` subcommand and flag is in ``docs/cli.md``, and every flag, table row and
  example command there exists and parses;
- every error class a user can see has a ``### Name`` section in ``docs/troubleshooting.md``;
- the configuration tables of ``docs/core-api.md`` and ``docs/python-client.md`` give the
  real defaults;
- every relative link between the docs resolves, anchors included;
- the scripts in ``docs/examples/`` and the blocks marked ``<!-- run -->`` in the docs run to
  completion (``quic``: they use real QUIC on loopback).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUN_MARKER = "<!-- run -->"
"""Put this line right before a ```python block to have this test execute it."""

# -- Markdown helpers -------------------------------------------------------------------------


def read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def without_code(text: str) -> str:
    """The text with fenced code blocks removed (links and headings there are not real)."""
    return re.sub(r"^```.*?^```[ \t]*$", "", text, flags=re.M | re.S)


def cells(line: str) -> list[str]:
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner)]


def tables(text: str) -> Iterator[tuple[list[str], list[list[str]]]]:
    """Every Markdown table: (header cells, body rows)."""
    lines = without_code(text).splitlines()
    i = 0
    while i < len(lines) - 1:
        if lines[i].lstrip().startswith("|") and re.fullmatch(
            r"\s*\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*", lines[i + 1]
        ):
            header = cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(cells(lines[i]))
                i += 1
            yield header, rows
        else:
            i += 1


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def sections(text: str, level: int) -> dict[str, str]:
    """Heading text (of exactly ``level``) to the text up to the next heading of that level
    or above."""
    out: dict[str, str] = {}
    current: str | None = None
    body: list[str] = []
    for line in without_code(text).splitlines(keepends=True):
        m = re.match(r"^(#{1,6}) (.+?)\s*$", line)
        if m and len(m.group(1)) <= level:
            if current is not None:
                out[current] = "".join(body)
            current = m.group(2) if len(m.group(1)) == level else None
            body = []
        elif current is not None:
            body.append(line)
    if current is not None:
        out[current] = "".join(body)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6} (.+?)\s*$", without_code(text), flags=re.M)}


# -- (1) Spark options --------------------------------------------------------------------------


def test_spark_options_table_is_exactly_OPTIONS() -> None:
    from aqueduct_spark.datasource.options import OPTIONS

    found = [
        rows
        for header, rows in tables(read("spark-options.md"))
        if header == ["Option", "Default", "Applies to", "Meaning"]
    ]
    assert len(found) == 1, "spark-options.md needs exactly one option table"
    documented = {}
    for row in found[0]:
        assert len(row) == 4, row
        names = code_spans(row[0])
        assert len(names) == 1 and row[0] == f"`{names[0]}`", f"option cell {row[0]!r}"
        assert names[0] not in documented, f"{names[0]} is listed twice"
        documented[names[0]] = row
    assert list(documented) == [o.name for o in OPTIONS], "same options, in the same order"
    for o in OPTIONS:
        _, default, kind, meaning = documented[o.name]
        assert default == o.default, f"{o.name}: documented default {default!r}, code {o.default!r}"
        assert kind == o.kind, f"{o.name}: applies to {kind!r}, code says {o.kind!r}"
        assert meaning == o.meaning, f"{o.name}: meaning differs from OPTIONS"


def test_spark_options_mentioned_in_prose_exist() -> None:
    from aqueduct_spark.datasource.options import OPTIONS

    text = read("spark-options.md")
    known = {o.name for o in OPTIONS} | {"dataset"}
    for m in re.finditer(r'\.option\("([A-Za-z]+)"', text):
        spark_own = m.group(1) in ("checkpointLocation",)
        assert m.group(1) in known or spark_own, f".option({m.group(1)!r}) is not an option"


# -- (2) the aqueduct command ---------------------------------------------------------------------

CLI_ENV = ("AQUEDUCT_URL", "AQUEDUCT_TOKEN", "AQUEDUCT_FINGERPRINT", "AQUEDUCT_ROOT")


@pytest.fixture
def parser(monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The real parser, built without environment overrides of its defaults."""
    from aqueduct_spark.cli import build_parser

    for var in CLI_ENV:
        monkeypatch.delenv(var, raising=False)
    return build_parser()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def long_flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings if s.startswith("--")}


def test_every_command_and_flag_is_documented(parser: argparse.ArgumentParser) -> None:
    text = read("cli.md")
    heads = sections(text, 2)
    commands = subcommands(parser)
    documented = {
        h.strip("`").removeprefix("aqueduct ") for h in heads if h.startswith("`aqueduct ")
    }
    assert documented == set(commands), "one '## `aqueduct CMD`' section per subcommand"
    connection = heads["Connection options"]
    for name, sub in commands.items():
        body = heads[f"`aqueduct {name}`"]
        for flag, action in long_flags(sub).items():
            if flag == "--help" or action.default is argparse.SUPPRESS:
                continue  # -v and -q after the command: documented once, as global flags
            where = body + (connection if "--url" in long_flags(sub) else "")
            assert re.search(rf"`{re.escape(flag)}\b", where), f"aqueduct {name} {flag}"
    for flag in long_flags(parser):
        assert flag in text, f"global flag {flag}"


def test_every_documented_flag_exists(parser: argparse.ArgumentParser) -> None:
    text = read("cli.md")
    commands = subcommands(parser)
    every = set(long_flags(parser)).union(*(long_flags(s) for s in commands.values()))
    for flag in set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text)):
        assert flag in every, f"cli.md mentions {flag}, which no command has"
    heads = sections(text, 2)
    client_commands = [s for s in commands.values() if "--url" in long_flags(s)]
    for heading, body in heads.items():
        if heading == "Connection options":
            owners = client_commands
        elif heading.startswith("`aqueduct "):
            owners = [commands[heading.strip("`").removeprefix("aqueduct ")]]
        else:
            continue
        for header, rows in tables(body):
            if header[0] != "Flag":
                continue
            for row in rows:
                flags = [f for f in re.findall(r"--[a-z][a-z-]*", row[0])]
                assert flags, f"{heading}: a flag row without a --flag: {row}"
                for owner in owners:
                    actions = long_flags(owner)
                    for flag in flags:
                        assert flag in actions, f"{heading}: {flag} is not a flag of that command"
                        _check_default(heading, flag, actions[flag], row[1])


def _check_default(heading: str, flag: str, action: argparse.Action, cell: str) -> None:
    default = action.default
    if default in (None, False, [], argparse.SUPPRESS):
        return
    spans = code_spans(cell)
    if isinstance(default, int | float) and not isinstance(default, bool):
        assert any(_number(s) == default for s in spans), f"{heading} {flag}: default {default}"
    else:
        assert str(default) in spans, f"{heading} {flag}: default {default!r} not in {cell!r}"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def test_example_commands_parse(parser: argparse.ArgumentParser) -> None:
    """Every ``aqueduct ...`` line in a shell block of any doc is a valid command line."""
    seen = 0
    for path in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"^```sh\n(.*?)^```", path.read_text(), flags=re.M | re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if not words or words[0] != "aqueduct":
                    continue
                seen += 1
                try:
                    parser.parse_args(words[1:])
                except SystemExit:
                    pytest.fail(f"{path.name}: `{line.strip()}` does not parse")
    assert seen >= 10


def test_environment_variables_are_documented() -> None:
    import aqueduct_core.transport.config as transport_config
    from aqueduct_spark.cli import arguments, datasets, serve

    text = read("cli.md")
    modules = (arguments, datasets, serve, transport_config)
    sources = "".join(inspect.getsource(m) for m in modules)
    for var in set(re.findall(r"AQUEDUCT_[A-Z]+", sources)) - {"AQUEDUCT_READY"}:
        assert f"`{var}`" in text, f"cli.md does not document {var}"
    assert "AQUEDUCT_READY" in text


def test_ready_line_fields_are_documented() -> None:
    from aqueduct_spark.cli import serve

    source = inspect.getsource(serve)
    banner = re.search(r"banner = \{(.*?)\n    \}", source, flags=re.S)
    assert banner is not None
    text = read("cli.md")
    for key in re.findall(r'"(\w+)":', banner.group(1)):
        assert f"`{key}`" in text, f"AQUEDUCT_READY field {key} is not documented"


# -- (3) errors -------------------------------------------------------------------------------------

ERROR_MODULES = (
    "aqueduct_core.errors",
    "aqueduct_core.transport.endpoints",
    "aqueduct_core.transport.tls",
    "aqueduct_core.transport.quic",
    "aqueduct_core.transport.backends",
    "aqueduct_spark.protocol.errors",
    "aqueduct_spark.client.failures",
    "aqueduct_spark.datasource.options",
    "aqueduct_spark.datasource.option_values",
    "aqueduct_spark.datasource.stream_offsets",
)
"""Where the exceptions a user can see are defined (the service raises protocol's)."""

NON_CLASS_SECTIONS = {
    "UNSUPPORTED_DATA_SOURCE_SAVE_MODE": "spark",
    "DATA_SOURCE_PUSHDOWN_DISABLED": "spark",
    "DATA_SOURCE_NOT_FOUND": "spark",
    "The provided partitioning does not match": "",
    "Filters not pushed to the service": "",
    "ModuleNotFoundError on Spark workers": "",
    "Java is missing": "",
    "UDP blocked": "",
    "Certificate mismatch": "",
    "aqueduct import stops at a line of a CSV file": "",
    "query.stop() logs ERROR lines": "",
}
"""Troubleshooting sections that are not classes of ours; "spark": a Spark error condition."""


def user_visible_exceptions() -> dict[str, type]:
    out: dict[str, type] = {}
    for name in ERROR_MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ in ERROR_MODULES
                and not attr.startswith("_")
            ):
                out[attr] = value
    return out


def test_every_error_class_has_a_troubleshooting_section() -> None:
    headings = set(sections(read("troubleshooting.md"), 3))
    classes = user_visible_exceptions()
    assert {"ConnectError", "InsecureConnectionWarning", "OptionError", "DatasetError"} <= set(
        classes
    )
    missing = sorted(set(classes) - headings)
    assert not missing, f"troubleshooting.md has no '### Name' section for {missing}"
    unknown = sorted(headings - set(classes) - set(NON_CLASS_SECTIONS))
    assert not unknown, f"troubleshooting.md sections name nothing that exists: {unknown}"
    assert set(NON_CLASS_SECTIONS) <= headings, "a documented condition lost its section"


def spark_error_conditions() -> set[str]:
    """Error condition names of PySpark and of the Spark JVM it ships with."""
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None, (
        "pyspark is missing: install the spark extra (make test does: pip install -e '.[dev,spark,service]')"
    )
    home = Path(spec.origin).parent
    names = set(json.loads((home / "errors" / "error-conditions.json").read_text()))
    for jar in home.glob("jars/spark-common-utils_*.jar"):
        with zipfile.ZipFile(jar) as z:
            if "error/error-conditions.json" in z.namelist():
                names |= set(json.loads(z.read("error/error-conditions.json")))
    return names


def test_spark_error_conditions_exist() -> None:
    conditions = spark_error_conditions()
    for name, kind in NON_CLASS_SECTIONS.items():
        if kind == "spark":
            assert name in conditions, f"{name} is not a Spark error condition"


def test_status_code_table_matches_the_error_classes() -> None:
    from aqueduct_spark import protocol as P

    found = [rows for header, rows in tables(read("dataset-protocol.md")) if header[0] == "`code`"]
    assert len(found) == 1
    documented = {code_spans(r[0])[0]: code_spans(r[1])[0] for r in found[0]}
    assert documented == {code: cls.__name__ for code, cls in P.ERRORS.items()}


# -- configuration tables ------------------------------------------------------------------------


def config_defaults(doc: str, cls: type, namespace: dict[str, Any]) -> None:
    """The table of ``doc`` whose first column is exactly ``cls``'s fields, with defaults
    that evaluate to the real ones (cells without code are not checked)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    instance = cls(**({"url": "quic://x:1"} if "url" in fields else {}))
    for _, rows in tables(read(doc)):
        names = [code_spans(r[0])[0] if code_spans(r[0]) else r[0] for r in rows]
        if sorted(names) != sorted(fields):
            continue
        for name, row in zip(names, rows, strict=True):
            spans = code_spans(row[1])
            if not spans:
                continue
            value = eval(spans[0], {"__builtins__": {}}, namespace)
            assert value == getattr(instance, name), f"{cls.__name__}.{name}: {spans[0]}"
        return
    pytest.fail(f"{doc} has no table of exactly the fields of {cls.__name__}")


def test_transport_and_engine_tables_give_the_real_defaults() -> None:
    from aqueduct_core import ClientTLS, TransportConfig
    from aqueduct_core.engine import EngineConfig
    from aqueduct_core.wire.primitives import WireLimits

    namespace = {
        "EngineConfig": EngineConfig,
        "WireLimits": WireLimits,
        "TransportConfig": TransportConfig,
        "ClientTLS": ClientTLS,
        "None": None,
    }
    config_defaults("core-api.md", TransportConfig, namespace)
    config_defaults("core-api.md", EngineConfig, namespace)
    config_defaults("core-api.md", WireLimits, namespace)


def test_client_config_table_gives_the_real_defaults() -> None:
    from aqueduct_core import ClientTLS, TransportConfig
    from aqueduct_spark.client import ClientConfig

    namespace = {"TransportConfig": TransportConfig, "ClientTLS": ClientTLS, "None": None}
    config_defaults("python-client.md", ClientConfig, namespace)


# -- (4) links --------------------------------------------------------------------------------------

GENERATED = ("benchmarks",)
"""Docs written by the benchmark runner, not by hand: linked, but may not exist yet."""


def test_relative_links_resolve() -> None:
    checked = 0
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", without_code(text)):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists() and dest.name.startswith(GENERATED):
                continue
            assert dest.exists(), f"{path.name}: link to {target} does not resolve"
            if anchor and dest.suffix == ".md":
                assert anchor in anchors(dest.read_text(encoding="utf-8")), (
                    f"{path.name}: no heading for #{anchor} in {dest.name}"
                )
            checked += 1
    assert checked >= 30


def test_index_links_every_page() -> None:
    index = read("index.md")
    for path in sorted(DOCS.glob("*.md")):
        if path.name != "index.md":
            assert f"({path.name})" in index, f"index.md does not link {path.name}"


# -- (5) and (6) runnable code ------------------------------------------------------------------


def run_python(args: list[str], timeout: float = 60) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for var in (*CLI_ENV, "AQUEDUCT_BACKEND"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, "-W", "error", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


EXAMPLES = sorted((DOCS / "examples").glob("*.py"))


@pytest.mark.quic
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_script_runs(script: Path) -> None:
    run_python([str(script)])


def runnable_blocks(name: str) -> list[tuple[int, str]]:
    text = read(name)
    out = []
    pattern = re.escape(RUN_MARKER) + r"[ \t]*\n```python\n(.*?)^```"
    for m in re.finditer(pattern, text, flags=re.M | re.S):
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1)))
    return out


RUNNABLE = [
    (doc, *block) for doc in ("core-api.md", "python-client.md") for block in runnable_blocks(doc)
]


def test_docs_keep_their_runnable_blocks() -> None:
    per_doc = {
        doc: sum(1 for d, *_ in RUNNABLE if d == doc) for doc in ("core-api.md", "python-client.md")
    }
    assert per_doc["core-api.md"] >= 7 and per_doc["python-client.md"] >= 4, per_doc
    for doc in ("core-api.md", "python-client.md"):
        marked = read(doc).count(f"\n{RUN_MARKER}\n")
        assert marked == per_doc[doc], f"{doc}: a {RUN_MARKER} line is not before a python block"


@pytest.mark.quic
@pytest.mark.parametrize(
    ("doc", "line", "code"), RUNNABLE, ids=[f"{d}:{line}" for d, line, _ in RUNNABLE]
)
def test_runnable_block_runs(doc: str, line: int, code: str, tmp_path: Path) -> None:
    script = tmp_path / f"{Path(doc).stem}_{line}.py"
    script.write_text(code, encoding="utf-8")
    run_python([str(script)])


def test_the_client_reference_names_the_classes_the_client_returns() -> None:
    """python-client.md's "Returns" column names each method's class as ``repr`` shows it
    and as ``aqueduct_spark.client`` exports it (issue 27: it said DatasetDescription)."""
    import typing

    import aqueduct_spark.client as client_pkg
    from aqueduct_spark.client import Client

    checked = 0
    for header, rows in tables(read("python-client.md")):
        if header[:2] != ["Method", "Returns"]:
            continue
        for row in rows:
            method = re.match(r"`(\w+)\(", row[0])
            returned = code_spans(row[1])
            if method is None or not returned or not returned[0][0].isupper():
                continue
            hint = typing.get_type_hints(getattr(Client, method.group(1)))["return"]
            cls = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
            if cls is typing.Any or not isinstance(cls, type) or cls.__module__ == "pyarrow.lib":
                continue
            assert returned[0] == cls.__name__, (method.group(1), returned[0], cls)
            assert getattr(client_pkg, cls.__name__) is cls
            checked += 1
    assert checked >= 3  # describe, list, create at least
