"""Fixtures every test directory may use: an S3-compatible object store (SeaweedFS); and how
``make test`` shares the tests between its two pytest-xdist workers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from aqueduct_spark.testing import SeaweedS3, start_seaweed


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs ``-n 2 --dist loadscope``: a scope runs whole on one worker. Here a
    scope is a module (its module fixtures start once, on one worker), except that all of
    tests/spark is one scope: one worker starts a Spark session (a JVM of 2.5 GB, seconds of
    CPU), not both. xdist hands out the largest scopes first; Spark's goes before any, as
    the longest (about half the suite's time) must start at once.

    Not ``--dist loadgroup`` with ``xdist_group`` marks: on pytest 9.2 it silently stops
    grouping (xdist marks a group by rewriting node ids, which pytest no longer reads;
    pytest-xdist issue 1386)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    SPARK = "tests/spark"

    class SparkTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return SPARK if module.startswith(SPARK + "/") else module

        def _assign_work_unit(self, node: Any) -> None:
            if SPARK in self.workqueue:
                self.workqueue.move_to_end(SPARK, last=False)
            super()._assign_work_unit(node)

    return SparkTogether(config, log)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """SeaweedFS's S3 gateway on a free loopback port, its data in a temporary directory,
    killed when the session ends. Tests share it: give each its own root or dataset names."""
    store = start_seaweed(tmp_path_factory.mktemp("seaweed"))
    yield store
    store.stop()
