"""One registry shape for what the plugin finds by name: drivers, operations, derived
metrics, embedded server kinds.

A :class:`Registry` writes each rule once (as fsspec's ``registry.py`` does for its
file systems, with ``known_implementations`` and ``register_implementation``):

- a name must match the registry's pattern;
- a built-in may be a ``"module:attribute"`` string, imported the first time it is
  asked for, with an install hint when the import fails (the heavy client libraries
  are imported by the runs that use them);
- installed packages add theirs through an entry-point group, read once per process;
- a name is taken once: the same thing again (a class of the same module and name,
  as a conftest imported again) takes its place, anything else needs ``replace``;
- what a pytest session's hooks add goes into that session's :class:`Scope`, removed
  when the session ends (``plugin.pytest_unconfigure``), so the next session of the
  same process (pytester's in-process runs, a site's own tooling) starts from the
  built-ins, the entry points and the direct registrations only.
"""

from __future__ import annotations

import importlib
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from .errors import StorageScaleUsageError

__all__ = ["Registry", "RegistrationError", "Scope", "class_identity", "current_scope",
           "open_scope"]

T = TypeVar("T")


class RegistrationError(StorageScaleUsageError, ValueError):  # type: ignore[misc]
    """A refused registration: a usage error (one paragraph, exit 4), and a ValueError
    as ``register_driver`` raised before."""


class Scope:
    """What one pytest session's hooks add to every registry; :meth:`close` removes
    it. Scopes nest (a pytester session inside a session): the newest open one is the
    one lookups see, beside what is global."""

    def __init__(self, owner: str = "") -> None:
        self.owner = owner
        self.open = True

    def close(self) -> None:
        """Remove what this scope added, and close the scopes opened after it (sessions
        nested in this one that ended before unconfiguring: a conftest that failed)."""
        with _LOCK:
            if self not in _OPEN:
                return
            for scope in _OPEN[_OPEN.index(self):]:
                scope.open = False
                for registry in list(_REGISTRIES):
                    registry._layers.pop(scope, None)
            del _OPEN[_OPEN.index(self):]

    def __enter__(self) -> Scope:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Scope({self.owner!r}, {'open' if self.open else 'closed'})"


_LOCK = threading.RLock()
_OPEN: list[Scope] = []
_REGISTRIES: weakref.WeakSet[Registry[Any]] = weakref.WeakSet()


def open_scope(owner: str = "") -> Scope:
    """A new scope, the one lookups see until it is closed."""
    scope = Scope(owner)
    with _LOCK:
        _OPEN.append(scope)
    return scope


def current_scope() -> Scope | None:
    """The newest open scope (the running session's), if any."""
    return _OPEN[-1] if _OPEN else None


def class_identity(item: object) -> str:
    """``module:qualname`` of a class, or of an instance's class: what stays the same
    when a module is imported again."""
    cls = item if isinstance(item, type) else type(item)
    return f"{cls.__module__}:{cls.__qualname__}"


@dataclass(frozen=True)
class _Entry:
    value: Any  #: the item, or the ``module:attribute`` it is imported from
    lazy: bool = False
    install_hint: str = ""
    #: where it came from, when not a direct registration (an entry point)
    source: str = ""
    #: what the user of the registry keeps beside it (a driver's schemes)
    meta: Any = None


class Registry(Generic[T]):
    """Names -> items of one kind (``what``: "operation", "driver"...).

    ``adder`` names the public function in messages; ``pattern`` is what a name must
    match, ``name_hint`` says how to fix one that does not; ``name_attr``, the
    attribute an item declares its name in (``name``, ``kind``), read when no name
    is given and checked against an entry point's name; ``check(item)`` raises a
    :class:`RegistrationError` for an item that is not one; ``coerce`` turns what an
    entry point or a lazy target imports into an item (a class into its instance);
    ``identity`` is what makes two items the same (default: module and class name),
    and is shown when a name is taken; ``entry_points``, the group installed packages
    declare theirs in, each read lazily (``eager_entry_points``: every one imported
    at the first lookup, so that a broken package fails every lookup until fixed);
    ``import_guard``, a context the imports run in.
    """

    def __init__(
        self, what: str, *, adder: str, pattern: str = r"[A-Za-z_][\w-]*",
        name_hint: str = "Use letters, digits, _ and -.", name_attr: str | None = "name",
        check: Callable[[T], None] | None = None, coerce: Callable[[Any], T] | None = None,
        identity: Callable[[T], str] = class_identity, entry_points: str | None = None,
        eager_entry_points: bool = False, unknown_hint: str = "",
        import_guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        self.what, self.adder, self.name_attr = what, adder, name_attr
        self._pattern, self._name_hint = re.compile(pattern), name_hint
        self._check, self._coerce, self._identity = check, coerce, identity
        self.entry_points, self._eager = entry_points, eager_entry_points
        self._unknown_hint, self._import_guard = unknown_hint, import_guard
        self._global: dict[str, _Entry] = {}
        self._layers: dict[Scope, dict[str, _Entry]] = {}
        self._entry_points_read = entry_points is None
        _REGISTRIES.add(self)

    # -- adding ----------------------------------------------------------------------
    def add(self, item: T, *, name: str | None = None, replace: bool = False,
            scope: Scope | None = None, meta: Any = None) -> str:
        """Register ``item`` under ``name`` (default: its ``name_attr``), globally or in
        ``scope``; the name it got."""
        if self._check is not None:
            self._check(item)
        if name is None:
            name = getattr(item, self.name_attr, None) if self.name_attr else None
        self._check_name(name, item)
        assert isinstance(name, str)
        self._put(name, _Entry(item, meta=meta), replace=replace, scope=scope)
        return name

    def add_lazy(self, name: str, target: str, *, install_hint: str = "",
                 replace: bool = False, meta: Any = None) -> None:
        """Register ``"module:attribute"``, imported the first time ``name`` is asked
        for; ``install_hint`` says what to install when that import fails."""
        if ":" not in target:
            raise RegistrationError(
                f"{self.adder}: a lazy {self.what} is 'module:attribute', got {target!r}.")
        self._check_name(name, None)
        self._put(name, _Entry(target, lazy=True, install_hint=install_hint, meta=meta),
                  replace=replace, scope=None)

    def _check_name(self, name: object, item: object) -> None:
        if isinstance(name, str) and self._pattern.fullmatch(name):
            return
        owner = ""
        if item is not None and self.name_attr:
            cls = item if isinstance(item, type) else type(item)
            owner = f"{cls.__name__}.{self.name_attr} "
        article = "an" if self.what[0] in "aeiou" else "a"
        raise RegistrationError(
            f"{self.adder}: {owner}{name!r} is not {article} {self.what} name. "
            f"{self._name_hint}")

    def _put(self, name: str, entry: _Entry, *, replace: bool, scope: Scope | None) -> None:
        with _LOCK:
            if scope is not None and not scope.open:
                raise RegistrationError(f"{self.adder}: {scope!r} is closed.")
            known = self._find(name, scope)
            if known is not None and not replace and self._id(known) != self._id(entry):
                raise RegistrationError(
                    f"{self.adder}: {self.what} {name!r} is already registered "
                    f"({self._shown(known)}). Choose another name, or pass replace=True.")
            layer = self._global if scope is None else self._layers.setdefault(scope, {})
            layer[name] = entry

    def _id(self, entry: _Entry) -> str:
        return str(entry.value) if entry.lazy else self._identity(entry.value)

    def _shown(self, entry: _Entry) -> str:
        shown = self._id(entry)
        return shown.replace(":", ".") if entry.lazy or self._identity is class_identity \
            else shown

    # -- finding ---------------------------------------------------------------------
    def _find(self, name: str, scope: Scope | None = None) -> _Entry | None:
        scope = scope or current_scope()
        layer = self._layers.get(scope, {}) if scope is not None else {}
        return layer.get(name) or self._global.get(name)

    def _visible(self) -> dict[str, _Entry]:
        self._read_entry_points()
        scope = current_scope()
        return {**self._global, **(self._layers.get(scope, {}) if scope else {})}

    def names(self) -> tuple[str, ...]:
        """Every registered name: the built-ins first, then in registration order."""
        return tuple(self._visible())

    def __contains__(self, name: object) -> bool:
        return name in self._visible()

    def meta(self, name: str) -> Any:
        """What was registered beside ``name`` (``meta=``); None for an unknown name."""
        entry = self._visible().get(name)
        return None if entry is None else entry.meta

    def set_meta(self, name: str, meta: Any) -> None:
        """Replace what is kept beside ``name`` in the layer that holds it."""
        with _LOCK:
            scope = current_scope()
            for layer in (self._layers.get(scope, {}) if scope else {}, self._global):
                if name in layer:
                    layer[name] = replace(layer[name], meta=meta)
                    return

    def is_loaded(self, name: str) -> bool:
        """``name`` is registered and its item imported already."""
        entry = self._visible().get(name)
        return entry is not None and not entry.lazy

    def get(self, name: str) -> T:
        """The item ``name``, imported now if it was lazy; a usage error naming the
        known names for an unknown one, the install hint for a failed import."""
        entry = self._visible().get(name)
        if entry is None:
            hint = f" {self._unknown_hint}" if self._unknown_hint else ""
            raise StorageScaleUsageError(
                f"unknown {self.what} {name!r}. Known {self.what}s: "
                f"{', '.join(self.names())}.{hint}")
        if not entry.lazy:
            return entry.value  # type: ignore[no-any-return]
        item = self._load(name, entry)
        with _LOCK:
            for layer in (*self._layers.values(), self._global):
                if layer.get(name) is entry:
                    layer[name] = replace(entry, value=item, lazy=False)
        return item

    def _load(self, name: str, entry: _Entry) -> T:
        module_name, _, attribute = str(entry.value).partition(":")
        try:
            with self._import_guard():
                found = importlib.import_module(module_name)
                for part in attribute.split("."):
                    found = getattr(found, part)
        except Exception as exc:  # noqa: BLE001 - any import error, said with the fix
            raise StorageScaleUsageError(self._import_failed(name, entry, exc)) from None
        return self._loaded(name, entry.source or f"{self.what} {name!r}", found)

    def _import_failed(self, name: str, entry: _Entry, exc: Exception) -> str:
        if entry.source:  # a package's entry point
            return (f"{entry.source}: cannot load: {type(exc).__name__}: {exc}. Fix or "
                    f"uninstall that package.")
        if isinstance(exc, (ImportError, AttributeError)):
            needs = f"needs {entry.install_hint}" if entry.install_hint else "cannot be imported"
            return f"the {name} {self.what} {needs}. Import of {entry.value} failed: {exc}."
        return (f"the {name} {self.what} is installed but failed to start: "  # e.g. gfal2
                f"{type(exc).__name__}: {exc}. Import of {entry.value} raised it; check that "
                f"library's installation (and its plugins).")

    def _loaded(self, name: str, where: str, found: Any) -> T:
        try:
            item = self._coerce(found) if self._coerce is not None else found
            if self._check is not None:
                self._check(item)
        except StorageScaleUsageError as exc:
            raise StorageScaleUsageError(f"{where}: {exc}") from None
        declared = getattr(item, self.name_attr, name) if self.name_attr else name
        if declared != name:
            raise StorageScaleUsageError(
                f"{where}: names {declared!r}; name the entry point after the {self.what} "
                f"it gives.")
        return item

    # -- entry points ----------------------------------------------------------------
    def _read_entry_points(self) -> None:
        """Add what installed packages declare, once per process (a lookup that fails
        on a broken package is tried again by the next)."""
        if self._entry_points_read:
            return
        with _LOCK:
            if self._entry_points_read:
                return
            from importlib.metadata import entry_points  # ~10 ms: only when looked up

            added: dict[str, _Entry] = {}
            for point in entry_points(group=str(self.entry_points)):
                dist = getattr(point, "dist", None)
                source = (f"entry point {point.name} = {point.value!r} (group "
                          f"{self.entry_points}"
                          + (f", package {dist.name}" if dist is not None else "") + ")")
                known = self._global.get(point.name)
                entry = _Entry(point.value, lazy=True, source=source)
                if point.name in added:
                    continue  # one package seen twice (an editable install's two paths)
                if known is not None and self._id(known) != self._id(entry):
                    raise StorageScaleUsageError(
                        f"{source}: {self.what} {point.name!r} is already registered "
                        f"({self._shown(known)}). Name the entry point after another "
                        f"{self.what}, or uninstall that package.")
                if known is None:
                    added[point.name] = entry
            if self._eager:  # raises for a broken package: read again by the next lookup
                added = {name: replace(entry, value=self._load(name, entry), lazy=False)
                         for name, entry in added.items()}
            self._global.update(added)
            self._entry_points_read = True

    @contextmanager
    def kept(self) -> Iterator[None]:
        """What is registered now, restored at the end (tests that register)."""
        with _LOCK:
            saved = (dict(self._global), {s: dict(layer) for s, layer in self._layers.items()},
                     self._entry_points_read)
        try:
            yield
        finally:
            with _LOCK:
                self._global, self._entry_points_read = saved[0], saved[2]
                self._layers = {s: layer for s, layer in saved[1].items() if s.open}
