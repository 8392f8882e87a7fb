"""The layer map, held by a test: imports point down only, and no import circle exists.

Read statically from the source (every ``import``, also those inside functions and under
``TYPE_CHECKING``), so a new upward import or circle fails here before anyone runs it.
Run alone (``pytest tests/test_layers.py``) it prints the map it checks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("aqueduct_core", "aqueduct_spark", "pyspark_aqueduct")

# Bottom first. A module may import from its own layer and from any layer below it, never
# from one above. Layers sharing a rank (written as a tuple) are siblings that must not
# import each other. The first matching prefix names a module's layer (longest first).
LAYERS: list[tuple[str, ...]] = [
    ("aqueduct_core.lazy", "aqueduct_core.host"),  # front doors' imports; the host's cores
    ("aqueduct_core.errors",),
    ("aqueduct_core.wire",),
    ("aqueduct_core.engine",),
    ("aqueduct_core.api",),
    ("aqueduct_core.transport",),
    ("aqueduct_core",),  # the package's front door: re-exports only
    ("aqueduct_core.testing",),
    ("aqueduct_spark.protocol",),
    ("aqueduct_spark.client", "aqueduct_spark.service"),
    ("aqueduct_spark.datasource",),
    ("aqueduct_spark.cli",),
    ("aqueduct_spark.testing",),
    ("aqueduct_spark.demo", "aqueduct_spark"),
    ("pyspark_aqueduct",),
]

# Known violations, allowed while being mended: the test fails on any violation not listed
# here, and on any entry listed that no longer occurs (so a list only shrinks). Issue 16
# emptied them; keep them empty.
KNOWN_UPWARD: set[str] = set()
KNOWN_CIRCLES: set[str] = set()

MAX_LINES = 600  # a module a newcomer can read in one sitting
KNOWN_LARGE: set[str] = set()  # as above


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            # "from package import module" names a module; otherwise the package itself
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                for alias in node.names
            ]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: set(_imports(name, path, known)) for name, path in found.items()}


def layer_of(module: str) -> tuple[int, str]:
    best: tuple[int, int, str] | None = None  # (prefix length, rank, prefix)
    for rank, group in enumerate(LAYERS):
        for prefix in group:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), rank, prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS in {__file__}"
    return best[1], best[2]


def layer_map() -> str:
    lines = [
        "Layer map, bottom first; a layer imports only from itself and the layers listed before it:"
    ]
    for rank, group in enumerate(LAYERS):
        lines.append(f"  {rank:2d}  {'  |  '.join(group)}")
    return "\n".join(lines)


def upward_imports() -> list[str]:
    bad = []
    for module, targets in sorted(graph().items()):
        rank, prefix = layer_of(module)
        for target in sorted(targets):
            trank, tprefix = layer_of(target)
            if trank > rank or (trank == rank and tprefix != prefix):
                bad.append(f"{module} imports {target} (layer {prefix} -> {tprefix})")
    return bad


def circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    g = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(g[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_layer_map_is_printed_and_every_module_has_a_layer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with capsys.disabled():  # shown even without -s: the map is this file's documentation
        print("\n" + layer_map())
    for module in modules():
        layer_of(module)


def _check(kind: str, found: set[str], known: set[str]) -> None:
    new, mended = sorted(found - known), sorted(known - found)
    assert not new, f"{kind}:\n  " + "\n  ".join(new)
    assert not mended, f"mended, so remove from KNOWN in {__file__}:\n  " + "\n  ".join(mended)


def test_imports_point_down_only() -> None:
    _check("imports against the layer map", set(upward_imports()), KNOWN_UPWARD)


def test_no_import_circle() -> None:
    _check("import circles", {" <-> ".join(c) for c in circles()}, KNOWN_CIRCLES)


def test_no_module_over_600_lines() -> None:
    found = {
        name for name, path in modules().items() if len(path.read_text().splitlines()) > MAX_LINES
    }
    _check(f"modules over {MAX_LINES} lines", found, KNOWN_LARGE)
