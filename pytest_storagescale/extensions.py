"""What a site's conftest or package adds through the hooks of :mod:`.hooks`:
operations, derived metrics and drivers, put into their registries when a plugin or
conftest implementing one of the hooks is registered. Each hook is dispatched through
the plugin manager's hook (``config.hook``: pluggy calls every implementation and
merges the answers), so what was registered before comes again: the same operation
class, metric or driver class again is fine (a conftest seen by several pytest calls
in one process); another one under a taken name is a usage error naming the conftest
or plugin that gives it."""

from __future__ import annotations

from typing import Any

import pluggy

from .drivers.registry import driver_class, driver_names, register_driver
from .errors import StorageScaleUsageError
from .load.operations import register_operation
from .metrics import register_metric


def register(plugin: object, manager: pluggy.PluginManager) -> None:
    """Register what every implementation of each ``pytest_storagescale_*`` hook that
    ``plugin`` implements returns."""
    for hook, add in (("pytest_storagescale_operations", _operations),
                      ("pytest_storagescale_metrics", _metrics),
                      ("pytest_storagescale_drivers", _drivers)):
        caller: pluggy.HookCaller | None = getattr(manager.hook, hook, None)
        if caller is None or not any(impl.plugin is plugin for impl in caller.get_hookimpls()):
            continue
        for answer in caller():
            try:
                add(answer)
            except _Taken as taken:
                raise StorageScaleUsageError(
                    f"{_giver(caller, taken.kind, taken.name)}: {hook}: {taken.message}"
                ) from None


class _Taken(Exception):
    """A name another operation, metric or driver already has (``message`` says so)."""

    def __init__(self, kind: str, name: Any, message: str) -> None:
        super().__init__(message)
        self.kind, self.name, self.message = kind, name, message


def _giver(caller: pluggy.HookCaller, kind: str, name: Any) -> str:
    """The conftest file or plugin whose implementation gives ``name`` (asked again:
    only when refusing it)."""
    for impl in caller.get_hookimpls():
        if name in _names(kind, impl.function() or ()):
            plugin = impl.plugin
            return getattr(plugin, "__file__", None) or type(plugin).__name__
    return caller.name


def _names(kind: str, answer: Any) -> list[Any]:
    if kind == "metric":
        return list(dict(answer))
    return [getattr(item, "name", None) for item in answer]


def _operations(operations: Any) -> None:
    for operation in operations:
        try:  # the registry takes a re-imported class's instance in its own place
            register_operation(operation)
        except StorageScaleUsageError as exc:
            raise _Taken("operation", getattr(operation, "name", None), str(exc)) from None


def _metrics(metrics: Any) -> None:
    for name, description in dict(metrics).items():
        try:  # the same name and description again (a conftest seen twice) is fine
            register_metric(name, str(description))
        except StorageScaleUsageError as exc:
            raise _Taken("metric", name, str(exc)) from None


def _drivers(drivers: Any) -> None:
    for cls in drivers:
        name = getattr(cls, "name", None)
        if name in driver_names() and driver_class(name) is cls:
            continue
        if name in driver_names():
            raise _Taken("driver", name, (
                f"driver {name!r}: another driver already has that name. Give it another "
                f"name (its class's `name`)."))
        try:
            register_driver(cls, name=name, schemes=tuple(getattr(cls, "schemes", ())))
        except StorageScaleUsageError as exc:
            raise _Taken("driver", name, str(exc)) from None
