"""What a site's conftest or package adds through the hooks of :mod:`.hooks`:
operations, derived metrics and drivers, put into their registries when a plugin or
conftest implementing one of the hooks is registered, in the session's scope
(:class:`~pytest_storagescale.registry.Scope`): removed when the session ends
(the config's clean-up, after ``pytest_unconfigure``), so that the next session of the same
process (pytester's in-process runs) sees only its own. Each hook is dispatched
through the plugin manager's hook (``config.hook``: pluggy calls every implementation
and merges the answers), so what was registered before comes again: the same
operation, metric or driver again is fine; another one under a taken name is a
usage error naming the conftest or plugin that gives it."""

from __future__ import annotations

import weakref
from typing import Any

import pluggy

from .drivers.registry import register_driver
from .errors import StorageScaleUsageError
from .load.operations import register_operation
from .metrics import register_metric
from .registry import Scope, open_scope

#: each session's scope, by its plugin manager (one per pytest config)
_SCOPES: weakref.WeakKeyDictionary[pluggy.PluginManager, Scope] = weakref.WeakKeyDictionary()


def scope(manager: pluggy.PluginManager) -> Scope:
    """The scope of the session ``manager`` belongs to, opened at its first call (the
    plugin's own registration, before any conftest) and closed with the config (its
    clean-up runs after ``pytest_unconfigure``, and also when the session ended before
    it was configured: a conftest that failed to load)."""
    found = _SCOPES.get(manager)
    if found is None or not found.open:
        found = _SCOPES[manager] = open_scope(f"pytest session {id(manager):#x}")
        config = manager.get_plugin("pytestconfig")
        if config is not None:
            config.add_cleanup(found.close)
    return found


def close(manager: pluggy.PluginManager) -> None:
    """The session ends: what its hooks added leaves the registries."""
    found = _SCOPES.pop(manager, None)
    if found is not None:
        found.close()


def register(plugin: object, manager: pluggy.PluginManager) -> None:
    """Register what every implementation of each ``pytest_storagescale_*`` hook that
    ``plugin`` implements returns, in the session's scope."""
    into = scope(manager)
    for hook, add in (("pytest_storagescale_operations", _operations),
                      ("pytest_storagescale_metrics", _metrics),
                      ("pytest_storagescale_drivers", _drivers)):
        caller: pluggy.HookCaller | None = getattr(manager.hook, hook, None)
        if caller is None or not any(impl.plugin is plugin for impl in caller.get_hookimpls()):
            continue
        for answer in caller():
            try:
                add(answer, into)
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


def _operations(operations: Any, into: Scope) -> None:
    for operation in operations:
        try:
            register_operation(operation, scope=into)
        except StorageScaleUsageError as exc:
            raise _Taken("operation", getattr(operation, "name", None), str(exc)) from None


def _metrics(metrics: Any, into: Scope) -> None:
    for name, description in dict(metrics).items():
        try:  # the same name and description again is fine
            register_metric(name, str(description), scope=into)
        except StorageScaleUsageError as exc:
            raise _Taken("metric", name, str(exc)) from None


def _drivers(drivers: Any, into: Scope) -> None:
    for cls in drivers:
        name = getattr(cls, "name", None)
        try:
            register_driver(cls, name=name, scope=into)
        except StorageScaleUsageError as exc:
            raise _Taken("driver", name, str(exc)) from None
