"""Argument types of the ``aqueduct`` command line: each checks one value and says what was
expected (argparse prints it beside the option's name)."""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return value


def key_value(text: str) -> str:
    if "=" not in text or text.startswith("="):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


def listen_transports(text: str) -> str:
    names = {n.strip().lower() for n in text.split(",") if n.strip()}
    if not names or not names <= {"quic", "tcp"}:
        raise argparse.ArgumentTypeError(f"expected quic, tcp or quic,tcp, got {text!r}")
    return "auto" if names == {"quic", "tcp"} else names.pop()
