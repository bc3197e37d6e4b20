"""The ceph suite's own derived metric, which its thresholds rules name.

``hot_ratio`` belongs to this suite (seed 002's hot-file problem), not to the core:
a suite in a site's own repository adds its metrics the same way.
"""

from __future__ import annotations


def pytest_storagescale_metrics() -> dict[str, str]:
    """``hot_ratio``, computed by ``test_hot_file_against_distinct_files``."""
    return {
        "hot_ratio": "mean transfer time when every client copies one file, over the mean "
        "when each copies its own (seed 002: ~13)",
    }
