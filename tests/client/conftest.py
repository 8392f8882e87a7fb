"""A real ``aqueduct serve`` process for the client's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aqueduct_spark.testing import ServiceProcess, start_service


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("client-root"))
    yield svc
    svc.stop()
