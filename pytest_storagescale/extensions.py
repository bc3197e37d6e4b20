"""What a site's conftest or package adds through the hooks of :mod:`.hooks`:
operations, derived metrics and drivers, put into their registries as each plugin
or conftest is registered. The same object registered twice is fine (a conftest seen
by several pytest calls in one process); another object under a taken name is a
usage error naming the name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .drivers.registry import driver_class, driver_names, register_driver
from .errors import StorageScaleUsageError
from .load.operations import register_operation
from .metrics import register_metric


def register(plugin: object) -> None:
    """Register what ``plugin``'s ``pytest_storagescale_*`` hooks return."""
    where = getattr(plugin, "__file__", None) or type(plugin).__name__
    for hook, add in (("pytest_storagescale_operations", _operations),
                      ("pytest_storagescale_metrics", _metrics),
                      ("pytest_storagescale_drivers", _drivers)):
        implementation: Callable[[], Any] | None = getattr(plugin, hook, None)
        if callable(implementation):
            add(implementation() or (), where)


def _operations(operations: Any, where: str) -> None:
    for operation in operations:
        try:  # the registry takes a re-imported class's instance in its own place
            register_operation(operation)
        except StorageScaleUsageError as exc:
            raise StorageScaleUsageError(f"{where}: pytest_storagescale_operations: {exc}") \
                from None


def _metrics(metrics: Any, where: str) -> None:
    for name, description in dict(metrics).items():
        try:  # the same name and description again (a conftest seen twice) is fine
            register_metric(name, str(description))
        except StorageScaleUsageError as exc:
            raise StorageScaleUsageError(f"{where}: pytest_storagescale_metrics: {exc}") \
                from None


def _drivers(drivers: Any, where: str) -> None:
    for cls in drivers:
        name = getattr(cls, "name", None)
        if name in driver_names() and driver_class(name) is cls:
            continue
        _refuse_taken(name in driver_names(), "driver", name, where)
        register_driver(cls, name=name, schemes=tuple(getattr(cls, "schemes", ())))


def _refuse_taken(taken: bool, kind: str, name: str | None, where: str) -> None:
    if taken:
        raise StorageScaleUsageError(
            f"{where}: pytest_storagescale_{kind}s returns a {kind} named {name!r}, but "
            f"another {kind} already has that name. Give it another name (its class's "
            f"`name`)."
        )
