"""The driver registry: names -> driver classes, imported only when used.

Like fsspec's ``known_implementations``, a driver is registered by name as a class
or as a lazy ``"module:Class"`` target with an install hint, so the heavy client
libraries (XRootD, gfal2) are imported by the runs that use them, and a missing
one gives the command that installs it instead of an ImportError. A package adds
its own driver with :func:`register_driver`, or without code through the entry
point group ``pytest_storagescale.drivers`` (``name = "module:Class"``; its
schemes come from the class's ``schemes``).

:func:`driver_spec` turns an endpoint URL, ``--storage-driver`` and the driver
options into the :class:`~pytest_storagescale.drivers.spec.DriverSpec` everything
else builds clients from.
"""

from __future__ import annotations

import importlib
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import StorageScaleUsageError
from ..redact import redact_url
from .base import Driver
from .grid import HTTP_SCHEMES, XROOTD_SCHEMES
from .spec import DriverSpec
from .url import split_url

ENTRY_POINT_GROUP = "pytest_storagescale.drivers"


@dataclass
class _Entry:
    target: type[Driver] | str
    install_hint: str
    #: a plugin's schemes are read from its class the first time a scheme is unknown
    schemes_unread: bool = False
    #: imported by :func:`start_early_drivers`, before a process holds many descriptors
    start_early: bool = False


_DRIVERS: dict[str, _Entry] = {}
#: which driver serves a scheme under ``--storage-driver auto``
_SCHEMES: dict[str, str] = {}
_entry_points_lock = threading.Lock()
_entry_points_read = False


def register_driver(
    target: type[Driver] | str, *, name: str | None = None, schemes: tuple[str, ...] = (),
    install_hint: str = "", replace: bool = False, start_early: bool = False,
) -> None:
    """Register a driver class, or a ``"module:Class"`` imported on first use.

    ``schemes`` are the URL schemes it serves when ``--storage-driver`` is ``auto``
    (default: a class's own ``schemes``); ``install_hint`` says what to install when
    the import fails. A name or scheme taken by another driver needs ``replace``.
    ``start_early``: a library that cannot start in a process holding descriptors
    above 1024 (``select()``); its module is imported before any step's clients.
    """
    if isinstance(target, str):
        if name is None or ":" not in target:
            raise ValueError(f"a lazy driver target needs name= and 'module:Class', got {target!r}")
    else:
        name = name or target.name
        schemes = schemes or target.schemes
    if name in _DRIVERS and not replace:
        raise ValueError(f"driver {name!r} is registered already; pass replace=True")
    taken = {s: _SCHEMES[s] for s in schemes if _SCHEMES.get(s, name) != name}
    if taken and not replace:
        raise ValueError(f"schemes already served by other drivers: {taken}; pass replace=True")
    _DRIVERS[name] = _Entry(target, install_hint, start_early=start_early)
    for scheme in schemes:
        _SCHEMES[scheme] = name


def driver_names() -> tuple[str, ...]:
    """Every registered driver name (entry-point plugins included)."""
    _read_entry_points()
    return tuple(_DRIVERS)


def known_schemes() -> tuple[str, ...]:
    """Every URL scheme some driver serves under ``--storage-driver auto``."""
    _read_entry_points()
    _claim_plugin_schemes()
    return tuple(_SCHEMES)


def driver_class(name: str) -> type[Driver]:
    """The driver class registered as ``name``, imported now if it was lazy."""
    _read_entry_points()
    entry = _DRIVERS.get(name)
    if entry is None:
        raise StorageScaleUsageError(
            f"unknown driver {name!r}. Known drivers: {', '.join(_DRIVERS)}."
        )
    if isinstance(entry.target, str):
        entry.target = _import(name, entry)
    return entry.target


def start_early_drivers() -> None:
    """Import the drivers registered with ``start_early`` that are installed. Called
    at every step by the processes that outlive one (the engine's, a cluster host's),
    so their first step starts them while they hold few descriptors: after a step of
    1,000 XRootD clients, gfal2's Globus plugins would abort the process ("bit out of
    range 0 - FD_SETSIZE on fd_set") when first started."""
    for name, entry in list(_DRIVERS.items()):
        if entry.start_early and isinstance(entry.target, str):
            try:
                driver_class(name)
            except StorageScaleUsageError:
                entry.start_early = False  # not installed or broken: said when asked for


@contextmanager
def kept_signal_mask() -> Iterator[None]:
    """The calling thread's signal mask as it was before the block: importing gfal2
    (its Globus plugins) leaves every asynchronous signal blocked in the importing
    thread, pytest's main thread, so that Ctrl-C and SIGTERM reached only the threads
    started before it, and none of a client process spawned after it, which inherits
    the mask (issue 31: an interrupted step kept nothing it measured)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _import(name: str, entry: _Entry) -> type[Driver]:
    module_name, _, class_name = str(entry.target).partition(":")
    try:
        with kept_signal_mask():
            cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        needs = f"needs {entry.install_hint}" if entry.install_hint else "cannot be imported"
        raise StorageScaleUsageError(
            f"the {name} driver {needs}. Import of {entry.target} failed: {exc}."
        ) from None
    except Exception as exc:  # noqa: BLE001 - e.g. gfal2 failing to start its plugins
        raise StorageScaleUsageError(
            f"the {name} driver is installed but its client library failed to start: "
            f"{type(exc).__name__}: {exc}. Import of {entry.target} raised it; check that "
            f"library's installation (and its plugins)."
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, Driver)):
        raise StorageScaleUsageError(
            f"driver {name!r}: {entry.target} is not a pytest_storagescale Driver subclass."
        )
    return cls


def driver_spec(
    url: str, *, driver: str = "auto", options: Mapping[str, str] | None = None,
    writable_root: str | None = None,
) -> DriverSpec:
    """The driver for ``url`` (by scheme, or ``driver`` when not ``auto``) with its
    options checked; raises :class:`StorageScaleUsageError` naming the fix."""
    scheme = split_url(url).scheme.lower()  # a malformed host is one paragraph too
    cls = _class_for(scheme, url) if driver == "auto" else driver_class(driver)
    if scheme not in cls.schemes:
        raise StorageScaleUsageError(_cannot_speak(cls, scheme))
    clean = {key: str(value) for key, value in (options or {}).items() if value is not None}
    unknown = sorted(set(clean) - set(cls.option_names))
    if unknown:
        names = ", ".join(repr(key) for key in unknown)
        raise StorageScaleUsageError(
            f"driver option{'s' if len(unknown) > 1 else ''} {names} not known to the "
            f"{cls.name} driver. Valid options: {', '.join(cls.option_names)}."
        )
    cls.check_options(clean)
    spec = DriverSpec(cls, url, writable_root, clean)
    spec.endpoint  # noqa: B018 - a bad URL is reported now, not by the first client
    return spec


def scheme_driver(scheme: str) -> type[Driver]:
    """The driver class that serves ``scheme`` (``root``, ``davs``...), without a URL; a
    usage error naming the known schemes for one no driver serves."""
    return _class_for(scheme, f"{scheme}://")


def _class_for(scheme: str, url: str) -> type[Driver]:
    _read_entry_points()
    if scheme not in _SCHEMES:
        _claim_plugin_schemes()
    if scheme not in _SCHEMES:
        raise StorageScaleUsageError(
            f"--storage-endpoint {redact_url(url)}: no driver serves "
            f"{scheme or '(no scheme)'}://. Known schemes: "
            f"{', '.join(s + '://' for s in _SCHEMES)}. Example: "
            f"root://host:1094//eos/test/storagescale."
        )
    return driver_class(_SCHEMES[scheme])


def _cannot_speak(cls: type[Driver], scheme: str) -> str:
    owner = _SCHEMES.get(scheme)
    instead = (
        f"use --storage-driver auto ({scheme}:// is served by the {owner} driver) or "
        if owner else ""
    )
    return (
        f"--storage-driver {cls.name} cannot speak {scheme}://: the {cls.name} driver "
        f"speaks {', '.join(s + '://' for s in cls.schemes)}. To fix it, {instead}give an "
        f"endpoint URL with one of those schemes."
    )


def _read_entry_points() -> None:
    """Register the drivers of the entry-point group, once per process."""
    global _entry_points_read
    if _entry_points_read:
        return
    with _entry_points_lock:
        if _entry_points_read:
            return
        from importlib.metadata import entry_points  # ~10 ms: only when a driver is needed

        for point in entry_points(group=ENTRY_POINT_GROUP):
            if point.name not in _DRIVERS:  # built-ins and explicit registrations win
                _DRIVERS[point.name] = _Entry(
                    point.value, f"the package that declares it (entry point "
                    f"{ENTRY_POINT_GROUP}: {point.name} = {point.value})", schemes_unread=True,
                )
        _entry_points_read = True


def _claim_plugin_schemes() -> None:
    """Import entry-point drivers to learn their schemes (those no driver serves yet)."""
    for name, entry in list(_DRIVERS.items()):
        if not entry.schemes_unread:
            continue
        entry.schemes_unread = False
        try:
            cls = driver_class(name)
        except StorageScaleUsageError:
            continue  # reported when the driver is asked for by name
        for scheme in cls.schemes:
            _SCHEMES.setdefault(scheme, name)


#: the plugin's name on PyPI
DISTRIBUTION = "pytest-storagescale"


def extra_hint(extra: str) -> str:
    """The command that installs the optional dependencies ``extra`` (pyproject.toml's
    ``[project.optional-dependencies]``), named wherever one is missing."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"

register_driver(
    "pytest_storagescale.drivers.xrootd:XRootDDriver", name="xrootd",
    schemes=XROOTD_SCHEMES,
    install_hint=f"the XRootD Python bindings: {extra_hint('xrootd')} (on Debian "
    "'apt-get install python3-xrootd', then a venv with --system-site-packages)",
)
register_driver(
    "pytest_storagescale.drivers.http:HTTPDriver", name="http", schemes=HTTP_SCHEMES,
    install_hint=f"pycurl: {extra_hint('http')} (on Debian 'apt-get install python3-pycurl', "
    "then a venv with --system-site-packages)",
)
# gfal2 speaks davs:// too (--storage-driver gfal2: what gfal-* users feel); under auto
# the http driver serves the HTTP doors
register_driver(
    "pytest_storagescale.drivers.gfal2:Gfal2Driver", name="gfal2", schemes=("srm", "gsiftp"),
    install_hint="gfal2-python: 'apt-get install python3-gfal2 gfal2-plugin-http "
    "gfal2-plugin-xrootd gfal2-plugin-file' (then a venv with --system-site-packages)",
    start_early=True,
)
register_driver("pytest_storagescale.drivers.local:LocalDriver", name="local", schemes=("file",))
register_driver("pytest_storagescale.drivers.memory:MemoryDriver", name="memory",
                schemes=("memory",))
