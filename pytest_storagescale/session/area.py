"""This run's own directory on the storage: the only place the plugin writes.

Made on first use (never by reading a property), refused when it already exists (a
directory this run did not make is never used, so never deleted), and removed at the
end through a driver whose guard keeps every delete inside it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from ..errors import EndpointError, StorageError, StorageNotFound
from .endpoint import EndpointUnderTest

#: deadline of the set-up and clean-up requests when no hang timeout is set
SERVICE_TIMEOUT = 30.0


class RunArea:
    """``<endpoint path>/<run id>``. ``marker`` is a file in the session's shared folder
    that says some process (an xdist worker) made the directory; ``lock`` serialises
    the making across the session's processes."""

    def __init__(self, endpoint: EndpointUnderTest, run_id: str, marker: Path,
                 lock: Callable[[], AbstractContextManager]) -> None:
        self.endpoint = endpoint
        self._lock = lock
        self.run_id = run_id
        self.marker = marker
        self._ready = False
        self._unusable: str | None = None

    @property
    def path(self) -> str:
        return f"{self.endpoint.url.path.rstrip('/')}/{self.run_id}"

    @property
    def timeout(self) -> float:
        return self.endpoint.settings.hang_timeout or SERVICE_TIMEOUT

    def ensure(self) -> str:
        """Make the directory once; raise :class:`EndpointError` (one paragraph, asked
        once and answered for every test) when the storage refuses."""
        if self._unusable is not None:
            raise EndpointError(self._unusable)
        if not self._ready:
            with self._lock():
                if not self.marker.exists():
                    self._create()
        self._ready = True
        return self.path

    def _create(self) -> None:
        driver = self.endpoint.driver_spec(self.path).connect("admin", timeout=self.timeout)
        try:
            self._refuse_existing(driver)
            driver.mkdir(self.path)
        except StorageError as exc:
            self._unusable = self.endpoint.unusable(exc)
            raise EndpointError(self._unusable) from None
        finally:
            driver.close()
        self.marker.parent.mkdir(parents=True, exist_ok=True)
        self.marker.touch()

    def _refuse_existing(self, driver) -> None:
        try:
            driver.stat(self.path)
        except StorageNotFound:
            return
        self._unusable = (
            f"{self.endpoint.display}: this run's directory {self.path} already exists. The "
            f"plugin only uses (and deletes) a directory it made itself; remove it by hand or "
            f"rerun (each run picks a new name)."
        )
        raise EndpointError(self._unusable)

    @property
    def used(self) -> bool:
        return self._ready or self.marker.exists()

    def remove(self) -> str | None:
        """Remove the directory and what is in it; the storage's refusal as text."""
        if not self.used:
            return None
        from ..load.engine import cleanup_tree

        try:
            driver = self.endpoint.driver_spec(self.path).connect("cleanup", timeout=self.timeout)
        except StorageError as exc:
            return str(exc)
        try:
            return cleanup_tree(driver, self.path)
        finally:
            driver.close()
            self._ready = False
            self.marker.unlink(missing_ok=True)
