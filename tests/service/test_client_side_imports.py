"""Executors never touch Delta files: the client side must import without deltalake, which
only the service needs (issue 16; the ``service`` extra). Nor does it parse conditions: the
service does, with sqlglot (the same extra)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CLIENT_SIDE = ("aqueduct_spark.protocol", "aqueduct_spark.client")
SERVICE_ONLY = ("deltalake", "sqlglot")


def test_the_client_side_does_not_import_deltalake() -> None:
    # A fresh interpreter: this one has deltalake loaded already by other tests.
    code = (
        "import sys\n"
        f"for name in {CLIENT_SIDE!r}:\n"
        "    __import__(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{SERVICE_ONLY!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", (
        f"importing {', '.join(CLIENT_SIDE)} pulled in service-only modules "
        f"{done.stdout.strip()}; keep Delta Lake and sqlglot inside aqueduct_spark/service"
    )


def test_only_the_service_imports_deltalake() -> None:
    """Read from the source (imports inside functions count too), so a Delta Lake import
    anywhere else, on a path the test above does not take, fails here."""
    root = Path(__file__).resolve().parents[2]
    service = root / "aqueduct_spark" / "service"
    found = []
    for package in ("aqueduct_core", "aqueduct_spark", "pyspark_aqueduct"):
        for path in sorted((root / package).rglob("*.py")):
            if service in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                if any(n.split(".")[0] in SERVICE_ONLY for n in names):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, f"deltalake or sqlglot imported outside aqueduct_spark/service: {found}"
