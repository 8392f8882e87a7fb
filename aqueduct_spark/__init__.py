"""Aqueduct for Spark."""
