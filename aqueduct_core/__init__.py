"""Aqueduct protocol."""

__version__ = "0.1.0"
