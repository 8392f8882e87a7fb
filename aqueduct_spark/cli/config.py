"""``aqueduct serve --config FILE``: every ``serve`` setting from a TOML file.

A setting is a ``serve`` flag with ``_`` for ``-`` (``max_requests = 64`` is
``--max-requests 64``); ``storage_options`` is a table and ``[[tokens]]`` are the tokens with
their rights (:func:`aqueduct_spark.service.access.grants_from_config`). Values are checked
as the flags are, and errors name the file and the setting. The file's settings become the
flags' defaults, so a flag given on the command line wins over the file, and the file wins
over environment variables (``AQUEDUCT_ROOT``, ``AQUEDUCT_TOKEN``).
"""

from __future__ import annotations

import argparse
import tomllib
from typing import Any

from aqueduct_spark.service.access import grants_from_config
from aqueduct_spark.service.startup import StartupError, warn_if_readable

NOT_SETTINGS = {"help", "config", "verbose", "quiet"}
"""Flags of ``serve`` a file cannot set."""
RENAMED = {"storage_option": "storage_options"}
"""Settings named otherwise than their flag (a table, where the flag is repeated)."""


def serve_settings(serve: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The settings a configuration file may give, by name: every ``serve`` flag."""
    settings = {}
    for action in serve._actions:
        if action.option_strings and action.dest not in NOT_SETTINGS:
            settings[RENAMED.get(action.dest, action.dest)] = action
    return settings


def load_config(path: str, serve: argparse.ArgumentParser) -> dict[str, Any]:
    """The settings of the file at ``path`` as ``serve``'s defaults (``tokens``: the grants)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise StartupError(f"--config {path}: no such file") from None
    except OSError as exc:
        raise StartupError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise StartupError(f"--config {path} is not valid TOML: {exc}") from None
    settings = serve_settings(serve)
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "tokens":
            try:
                values["tokens"] = grants_from_config(value, path)
            except ValueError as exc:
                raise StartupError(str(exc)) from None
            continue
        action = settings.get(key)
        if action is None:
            raise StartupError(
                f"{path}: unknown setting {key!r}; the settings are "
                f"{', '.join(sorted(settings))} and [[tokens]]"
            )
        values[action.dest] = _value(action, key, value, path)
    if values.get("tokens") or values.get("token"):
        warn_if_readable(path)
    return values


def _value(action: argparse.Action, key: str, value: Any, path: str) -> Any:
    """``value`` checked (and converted) as the flag's own parser would."""
    where = f"{path}: {key}"
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise StartupError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(action, argparse._AppendAction):  # storage_options: a table of text
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise StartupError(f'{where} must be a table of text values, e.g. {{ KEY = "value" }}')
        return [f"{k}={v}" for k, v in value.items()]
    if isinstance(value, dict | list | bool):
        raise StartupError(f"{where} must be a single value, got {value!r}")
    text = str(value)
    try:
        converted = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError) as exc:
        if action.type is int:
            raise StartupError(f"{where} must be a whole number, got {value!r}") from None
        raise StartupError(f"{where}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise StartupError(f"{where} must be one of {choices}, got {value!r}")
    return converted
