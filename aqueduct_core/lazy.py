"""Package front doors that import on first use.

A package's ``__init__`` lists what it re-exports as imports under ``if TYPE_CHECKING:``
(what readers and type checkers see) and, in the ``else`` branch, gets its module
``__getattr__`` and ``__dir__`` from :func:`attach`, which reads that same block and imports
each name the first time it is used. Importing one light module of a package
(``aqueduct_core.errors``, ``aqueduct_spark.client.urls``) then costs only that module: Spark
starts a fresh Python worker on the driver for each data-source call, and checking the
options there must not wait for pyarrow, the engine, asyncio or a QUIC library.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from typing import Any


def attach(package: str, source: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose ``__init__`` is the file ``source``."""
    where = _exports(package, source)

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if name in where:
            module, attr = where[name]
            found = importlib.import_module(module)
            value = getattr(found, attr) if hasattr(found, attr) else _submodule(module, attr)
        else:
            value = _submodule(package, name)
        setattr(sys.modules[package], name, value)  # once: later lookups find it directly
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__


def _submodule(package: str, name: str) -> Any:
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.{name}":
            raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None


def _exports(package: str, source: str) -> dict[str, tuple[str, str]]:
    """Name -> (module, attribute) of each ``from ... import`` under ``if TYPE_CHECKING:``."""
    with open(source, encoding="utf-8") as f:
        tree = ast.parse(f.read(), source)
    found: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for imp in node.body:
            if not isinstance(imp, ast.ImportFrom):
                continue
            if imp.level:
                parts = package.split(".")[: len(package.split(".")) - imp.level + 1]
                module = ".".join([*parts, imp.module] if imp.module else parts)
            else:
                module = imp.module or ""
            for alias in imp.names:
                found[alias.asname or alias.name] = (module, alias.name)
    if not found:
        raise ImportError(f"{source}: no imports under 'if TYPE_CHECKING:' to export")
    return found
