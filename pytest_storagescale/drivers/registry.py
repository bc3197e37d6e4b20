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

import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import StorageScaleUsageError
from ..redact import redact_url
from ..registry import RegistrationError, Registry, Scope
from .base import Driver
from .grid import HTTP_SCHEMES, XROOTD_SCHEMES
from .spec import DriverSpec
from .url import split_url

ENTRY_POINT_GROUP = "pytest_storagescale.drivers"


@dataclass(frozen=True)
class _Schemes:
    """What the driver registry keeps beside a driver."""

    #: the URL schemes it serves under ``--storage-driver auto`` (an entry point's are
    #: read from its class the first time a scheme is unknown: None until then)
    schemes: tuple[str, ...] | None
    #: imported by :func:`start_early_drivers`, before a process holds many descriptors
    start_early: bool = False


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


def _check_driver(cls: object) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Driver)):
        raise RegistrationError(
            f"register_driver: {cls!r} is not a pytest_storagescale Driver subclass.")


#: the drivers by name (pytest_storagescale/registry.py), imported when first used
DRIVERS: Registry[type[Driver]] = Registry(
    "driver", adder="register_driver", check=_check_driver, entry_points=ENTRY_POINT_GROUP,
    import_guard=kept_signal_mask)


def register_driver(
    target: type[Driver] | str, *, name: str | None = None, schemes: tuple[str, ...] = (),
    install_hint: str = "", replace: bool = False, start_early: bool = False,
    scope: Scope | None = None,
) -> None:
    """Register a driver class, or a ``"module:Class"`` imported on first use.

    ``schemes`` are the URL schemes it serves when ``--storage-driver`` is ``auto``
    (default: a class's own ``schemes``); ``install_hint`` says what to install when
    the import fails. A name or scheme taken by another driver needs ``replace``.
    ``start_early``: a library that cannot start in a process holding descriptors
    above 1024 (``select()``); its module is imported before any step's clients.
    ``scope``: only there (what a session's ``pytest_storagescale_drivers`` gives).
    """
    if isinstance(target, str):
        if name is None:
            raise RegistrationError(f"register_driver: a lazy driver {target!r} needs name=.")
    else:
        _check_driver(target)
        name = name or target.name
        schemes = schemes or target.schemes
    owners = _scheme_owners()
    taken = {s: owners[s] for s in schemes if owners.get(s, name) != name}
    if taken and not replace:
        raise RegistrationError(
            f"register_driver: schemes already served by other drivers: {taken}; pass "
            f"replace=True.")
    meta = _Schemes(tuple(schemes), start_early)
    if isinstance(target, str):
        DRIVERS.add_lazy(name, target, install_hint=install_hint, replace=replace, meta=meta)
    else:
        DRIVERS.add(target, name=name, replace=replace, scope=scope, meta=meta)


def _scheme_owners() -> dict[str, str]:
    """scheme -> the driver serving it under auto (a later registration, made with
    ``replace``, takes a scheme from an earlier one)."""
    owners: dict[str, str] = {}
    for name in DRIVERS.names():
        meta = DRIVERS.meta(name)
        for scheme in meta.schemes if meta is not None and meta.schemes else ():
            owners[scheme] = name
    return owners


def driver_names() -> tuple[str, ...]:
    """Every registered driver name (entry-point plugins included)."""
    return DRIVERS.names()


def known_schemes() -> tuple[str, ...]:
    """Every URL scheme some driver serves under ``--storage-driver auto``."""
    _claim_plugin_schemes()
    return tuple(_scheme_owners())


def driver_class(name: str) -> type[Driver]:
    """The driver class registered as ``name``, imported now if it was lazy."""
    return DRIVERS.get(name)


def start_early_drivers() -> None:
    """Import the drivers registered with ``start_early`` that are installed. Called
    at every step by the processes that outlive one (the engine's, a cluster host's),
    so their first step starts them while they hold few descriptors: after a step of
    1,000 XRootD clients, gfal2's Globus plugins would abort the process ("bit out of
    range 0 - FD_SETSIZE on fd_set") when first started."""
    for name in DRIVERS.names():
        meta = DRIVERS.meta(name)
        if meta is not None and meta.start_early and not DRIVERS.is_loaded(name):
            try:
                driver_class(name)
            except StorageScaleUsageError:  # not installed or broken: said when asked for
                DRIVERS.set_meta(name, _Schemes(meta.schemes, start_early=False))


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
    owners = _scheme_owners()
    if scheme not in owners:
        _claim_plugin_schemes()
        owners = _scheme_owners()
    if scheme not in owners:
        raise StorageScaleUsageError(
            f"--storage-endpoint {redact_url(url)}: no driver serves "
            f"{scheme or '(no scheme)'}://. Known schemes: "
            f"{', '.join(s + '://' for s in owners)}. Example: "
            f"root://host:1094//eos/test/storagescale."
        )
    return driver_class(owners[scheme])


def _cannot_speak(cls: type[Driver], scheme: str) -> str:
    owner = _scheme_owners().get(scheme)
    instead = (
        f"use --storage-driver auto ({scheme}:// is served by the {owner} driver) or "
        if owner else ""
    )
    return (
        f"--storage-driver {cls.name} cannot speak {scheme}://: the {cls.name} driver "
        f"speaks {', '.join(s + '://' for s in cls.schemes)}. To fix it, {instead}give an "
        f"endpoint URL with one of those schemes."
    )


def _claim_plugin_schemes() -> None:
    """Import entry-point drivers to learn their schemes (those no driver serves yet)."""
    for name in DRIVERS.names():
        if DRIVERS.meta(name) is not None:
            continue
        DRIVERS.set_meta(name, _Schemes(()))
        try:
            cls = driver_class(name)
        except StorageScaleUsageError:
            continue  # reported when the driver is asked for by name
        owners = _scheme_owners()
        DRIVERS.set_meta(name, _Schemes(tuple(s for s in cls.schemes if s not in owners)))


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
    "pytest_storagescale.drivers.gfal2:Gfal2Driver", name="gfal2",
    schemes=("srm", "gsiftp", "dcap", "gsidcap"),
    install_hint="gfal2-python: 'apt-get install python3-gfal2 gfal2-plugin-http "
    "gfal2-plugin-xrootd gfal2-plugin-file' (then a venv with --system-site-packages)",
    start_early=True,
)
register_driver("pytest_storagescale.drivers.local:LocalDriver", name="local", schemes=("file",))
register_driver("pytest_storagescale.drivers.memory:MemoryDriver", name="memory",
                schemes=("memory",))
# the seeds' own command-line clients, one process per load request (drivers/commands.py):
# never chosen by a scheme; named by --storage-driver, or by a load door DOOR+CLIENT
register_driver("pytest_storagescale.drivers.commands:DccpDriver", name="dccp", schemes=(),
                install_hint="the driver's module ships with the plugin; dccp itself: "
                "'apt-get install dcap dcap-tunnel-gsi'")
register_driver("pytest_storagescale.drivers.commands:GlobusUrlCopyDriver",
                name="globus-url-copy", schemes=(),
                install_hint="the driver's module ships with the plugin; globus-url-copy "
                "itself: 'apt-get install globus-gass-copy-progs'")
