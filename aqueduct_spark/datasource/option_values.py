"""The values of the ``aqueduct`` data source's options: how each kind (duration, size,
boolean, whole number, time, a file on the driver) is read from the text Spark passes, and
shown as a default; :class:`OptionError` for a value that cannot be read. :mod:`.options`
holds the options."""

from __future__ import annotations

import datetime as dt
import os
import re

from aqueduct_core.errors import AqueductError


class OptionError(AqueductError, ValueError):
    """An option of the aqueduct data source is missing or has a bad value."""

    remedy = (
        "use the option names and values listed in docs/spark-options.md (names are "
        "case-insensitive)"
    )


def duration_text(seconds: float) -> str:
    """``seconds`` as an option value (``10s``, ``500ms``): how a default is shown."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


def size_text(size: int) -> str:
    """``size`` bytes as an option value (``16MB``, ``1024``): how a default is shown."""
    for unit, scale in (("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def parse_duration(name: str, value: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*", value)
    if not m:
        raise OptionError(
            f"option {name!r} must be a duration like 500ms, 10s, 5m or 1h, got {value!r}"
        )
    number = float(m.group(1))
    return number * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def parse_size(name: str, value: str) -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)?\s*", value.lower())
    if not m:
        raise OptionError(f"option {name!r} must be a size like 64MB or 1048576, got {value!r}")
    unit = (m.group(2) or "").rstrip("b").rstrip("i")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[unit]
    size = int(float(m.group(1)) * scale)
    if size <= 0:
        raise OptionError(f"option {name!r} must be positive, got {value!r}")
    return size


def parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name!r} must be true or false, got {value!r}")


def parse_int(name: str, value: str, minimum: int = 0) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise OptionError(f"option {name!r} must be a whole number, got {value!r}") from None
    if n < minimum:
        raise OptionError(f"option {name!r} must be >= {minimum}, got {n}")
    return n


def parse_timestamp(name: str, value: str) -> dt.datetime:
    try:
        parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(
            f"option {name!r} must be an ISO 8601 time like 2026-01-31T12:00:00Z, got {value!r}"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def parse_file(name: str, value: str) -> str:
    """A file the driver reads: an absolute path (Spark's Python workers do not run in the
    application's directory) to a file that exists, checked before anything connects."""
    path = value.strip()
    if not os.path.isabs(path):
        raise OptionError(
            f"option {name!r} must be an absolute path (Spark's Python workers run in another "
            f"directory), got {value!r}"
        )
    if not os.path.exists(path):
        raise OptionError(f"option {name!r}: {path!r} does not exist (on the driver host)")
    if not os.path.isfile(path):
        raise OptionError(f"option {name!r}: {path!r} is not a file")
    return path


def parse_ca(name: str, value: str) -> tuple[str, str]:
    """The path and PEM text of a CA file, read on the driver before anything connects:
    the text travels to the executors with the options, so they need not have the file."""
    path = parse_file(name, value)
    try:
        with open(path, encoding="ascii") as f:
            pem = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(f"option {name!r}: cannot read {path!r} ({exc})") from None
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise OptionError(
            f"option {name!r}: {path!r} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            "; give the CA file the service printed, e.g. <root>/.aqueduct-tls/ca.pem"
        )
    return path, pem
