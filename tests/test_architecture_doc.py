"""docs/architecture.md names functions and modules in the order one batch meets them: every
such name must exist in the code, so the walk cannot drift from it silently."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
PACKAGES = {
    "aqueduct_core": ("errors", "wire", "engine", "api", "transport", "testing"),
    "aqueduct_spark": ("protocol", "client", "service", "datasource", "cli", "testing", "demo"),
}
DOTTED = re.compile(r"`([a-z_]+(?:\.[A-Za-z_]+)+)(?:\(|`)")


def _qualify(name: str) -> str | None:
    head = name.split(".")[0]
    if head in PACKAGES or head == "pyspark_aqueduct":
        return name
    for package, subpackages in PACKAGES.items():
        if head in subpackages:
            return f"{package}.{name}"
    return None  # a name of the walk's own context (a method of a class named before)


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_module_and_function_the_architecture_page_names_exists() -> None:
    names = {q for raw in DOTTED.findall(DOC.read_text()) if (q := _qualify(raw))}
    assert len(names) > 30, "the walk names the functions in order"
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"docs/architecture.md names what the code does not have: {missing}"
