"""A real ``aqueduct serve`` process on loopback, over real Delta tables in a temp root."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aqueduct_spark.testing import ServiceProcess, start_service

__all__ = ["ServiceProcess", "start_service"]


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("service-root"))
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def secured_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("secured-root"), token="s3cret-token")
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def web_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """``aqueduct serve --web``: WebTransport and WebSocket beside QUIC and TCP."""
    svc = start_service(tmp_path_factory.mktemp("web-root"), args=["--web"])
    yield svc
    svc.stop()
