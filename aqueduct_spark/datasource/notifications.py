"""The streaming source's subscription to a dataset's new versions, which the service
pushes after each commit."""

from __future__ import annotations

import threading
from typing import Any


class Subscription:
    """Keeps ``latest`` current from the service's push channel (callbacks run on the
    client's loop thread)."""

    def __init__(self, client: Any, dataset: str) -> None:
        self.latest = -1
        self.alive = False
        self._cond = threading.Condition()
        self._future = client.subscribe(dataset, self._on_version, self._on_state)

    def _on_version(self, version: int) -> None:
        with self._cond:
            if version > self.latest:
                self.latest = version
                self._cond.notify_all()

    def _on_state(self, alive: bool) -> None:
        with self._cond:
            self.alive = alive
            self._cond.notify_all()

    def wait_newer(self, than: int, timeout: float) -> bool:
        """Wait until a version above ``than`` is known (or push stops); True if one is."""
        with self._cond:
            self._cond.wait_for(lambda: self.latest > than or not self.alive, timeout)
            return self.latest > than

    def close(self) -> None:
        self._future.cancel()
