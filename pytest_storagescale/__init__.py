"""pytest-storagescale: storage scalability, regression and acceptance tests as pytest suites."""

from .errors import (
    StorageError,
    StorageNotFound,
    StoragePermissionDenied,
    StorageScaleUsageError,
    StorageTimeout,
    StorageUnreachable,
    ThresholdsError,
    UnsafePathError,
)

__all__ = [
    "StorageError",
    "StorageNotFound",
    "StoragePermissionDenied",
    "StorageScaleUsageError",
    "StorageTimeout",
    "StorageUnreachable",
    "ThresholdsError",
    "UnsafePathError",
]
