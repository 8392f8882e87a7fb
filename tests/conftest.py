"""Fixtures every test directory may use: an S3-compatible object store (SeaweedFS)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aqueduct_spark.testing import SeaweedS3, start_seaweed


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """SeaweedFS's S3 gateway on a free loopback port, its data in a temporary directory,
    killed when the session ends. Tests share it: give each its own root or dataset names."""
    store = start_seaweed(tmp_path_factory.mktemp("seaweed"))
    yield store
    store.stop()
