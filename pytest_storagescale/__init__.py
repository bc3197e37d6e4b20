"""pytest-storagescale: storage scalability, regression and acceptance tests as pytest suites.

The public API is exactly what ``__all__`` names; everything else (modules and their
names) is internal and may change between releases. A suite or a site's conftest
imports from here only::

    from pytest_storagescale import Driver, Operation, Param, register_operation

The names are imported on first use (PEP 562, as pluggy and fsspec do): importing the
package imports nothing heavy. The fixtures a suite uses (``storage_endpoint``,
``storage_settings``, ``storage_doors``, ``storage_known_issues``,
``storage_embedded_server``, ``storage_thresholds``, ``storage_load``...) are
registered by the plugin (:mod:`pytest_storagescale.fixtures`). A hook that gets only
the ``config`` reads the session through ``storage_view(config)``, a frozen
:class:`SessionView`; the session object itself is not public. A conformance suite's
helpers (``remove_folder``, ``door_problem``, ``folder_name``, ``checksum_hint``) are in
:mod:`pytest_storagescale.conformance`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .drivers.base import CreatedPaths, Driver, StatInfo
    from .drivers.registry import driver_spec, register_driver
    from .drivers.spec import DriverSpec
    from .errors import (
        BadAnswer,
        EndpointError,
        HungClientsViolation,
        RedirectRefused,
        StepError,
        StorageCheckFailure,
        StorageError,
        StorageNotFound,
        StoragePermissionDenied,
        StorageScaleUsageError,
        StorageScaleWarning,
        StorageTimeout,
        StorageUnreachable,
        ThresholdsError,
        ThresholdViolation,
        UnsafePathError,
    )
    from .fixtures import SessionView, StorageEndpoint, StorageLoad, storage_view
    from .gate import GateSettings, GateVerdict, WindowSample, judge_pairs
    from .load.operations import Get, Operation, Param, Read, ReadV, register_operation
    from .metrics import register_metric
    from .records import RuleCheck, StepRecord, Verdict
    from .redact import redact_url
    from .servers.family import EmbeddedServer, embedded_class, register_server, start_embedded
    from .session.doors import Door
    from .thresholds import ThresholdSet, load_thresholds

#: public name -> the module (relative to this package) that defines it
_EXPORTS = {
    # drivers
    "Driver": "drivers.base", "StatInfo": "drivers.base", "CreatedPaths": "drivers.base",
    "DriverSpec": "drivers.spec", "register_driver": "drivers.registry",
    "driver_spec": "drivers.registry",
    # operations, their parameters, metrics
    "Operation": "load.operations", "Param": "load.operations",
    "register_operation": "load.operations", "register_metric": "metrics",
    # the built-in operations a suite's own subclass (XCache's reads through a cache)
    "Get": "load.operations", "Read": "load.operations", "ReadV": "load.operations",
    # a step's record and verdict, the thresholds file
    "StepRecord": "records", "Verdict": "records", "RuleCheck": "records",
    "ThresholdSet": "thresholds", "load_thresholds": "thresholds",
    # the paired gate's statistics, for a suite's own paired comparison (seed 004's
    # central flushing: tape windows against disk windows)
    "GateSettings": "gate", "GateVerdict": "gate", "WindowSample": "gate",
    "judge_pairs": "gate",
    # doors, the session's handles and, for hooks that get only the config, its view
    # (a conformance suite's helpers: pytest_storagescale.conformance)
    "Door": "session.doors", "StorageEndpoint": "fixtures", "StorageLoad": "fixtures",
    "SessionView": "fixtures", "storage_view": "fixtures", "redact_url": "redact",
    # embedded servers: a kind of one's own, or a second one (a TPC peer)
    "EmbeddedServer": "servers.family", "register_server": "servers.family",
    "start_embedded": "servers.family", "embedded_class": "servers.family",
    # errors
    "StorageError": "errors", "StorageNotFound": "errors",
    "StoragePermissionDenied": "errors", "StorageTimeout": "errors",
    "StorageUnreachable": "errors", "StorageScaleUsageError": "errors",
    "ThresholdsError": "errors", "EndpointError": "errors", "UnsafePathError": "errors",
    "StorageScaleWarning": "errors", "StepError": "errors", "BadAnswer": "errors",
    "RedirectRefused": "errors", "StorageCheckFailure": "errors",
    "ThresholdViolation": "errors", "HungClientsViolation": "errors",
}

__all__ = [
    "BadAnswer", "CreatedPaths", "Door", "Driver", "DriverSpec", "EmbeddedServer",
    "EndpointError", "GateSettings", "GateVerdict", "Get", "HungClientsViolation",
    "Operation", "Param", "Read", "ReadV",
    "RedirectRefused", "RuleCheck", "SessionView",
    "StatInfo", "StepError", "StepRecord", "StorageCheckFailure", "StorageEndpoint",
    "StorageError", "StorageLoad", "StorageNotFound", "StoragePermissionDenied",
    "StorageScaleUsageError", "StorageScaleWarning", "StorageTimeout",
    "StorageUnreachable", "ThresholdSet", "ThresholdViolation", "ThresholdsError",
    "UnsafePathError", "Verdict", "WindowSample", "driver_spec", "embedded_class",
    "judge_pairs", "load_thresholds",
    "redact_url", "register_driver", "register_metric", "register_operation",
    "register_server", "start_embedded", "storage_view",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
