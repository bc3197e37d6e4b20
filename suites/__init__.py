"""The acceptance suites, one subpackage per storage system.

In this checkout they run as ``pytest suites/<system>``; the wheel installs them as
the package ``storagescale_suites`` (with ``thresholds/`` inside it), so an installed
plugin runs them as ``pytest --pyargs storagescale_suites.<system>``.
"""
