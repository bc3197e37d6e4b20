"""A suite's own options (``pytest_storagescale_options``) are resolved as the plugin's
own: option > ``$STORAGESCALE_*`` > ini > default, with where each came from in the
header; a bad value is a usage error (exit 4) before any test; suites read them through
the ``storage_suite_options`` fixture or ``storage_view(config)`` (issue 33)."""

from __future__ import annotations

import pytest

CONFTEST = '''
import pytest
from pytest_storagescale import StorageScaleUsageError, storage_view


def _count(value):
    if not str(value).isdigit():
        raise StorageScaleUsageError(f"--storage-site-hosts {value!r}: a number, e.g. 4.")
    return int(value)


def pytest_storagescale_options():
    return {
        "storage_site_hosts": ("--storage-site-hosts", _count, 1, "client hosts"),
        "storage_site_mount": ("--storage-site-mount", None, None, "host B's mount"),
    }


def pytest_report_header(config):
    view = storage_view(config)
    return [f"view: {dict(view.suite_options)} embedded={view.is_embedded}"]
'''

SUITE = '''
def test_options(storage_suite_options):
    print("options:", dict(storage_suite_options))
'''


@pytest.fixture
def site(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_site=SUITE)
    for name in ("STORAGESCALE_SITE_HOSTS", "STORAGESCALE_SITE_MOUNT"):
        monkeypatch.delenv(name, raising=False)

    def run(*args: str, ini: str = ""):
        if ini:
            pytester.makeini(f"[pytest]\n{ini}\n")
        return pytester.runpytest_subprocess(
            "--storage-endpoint", "memory://store/area", "--storage-version", "1",
            "-p", "no:cacheprovider", "-p", "no:xdist", "-s", *args)
    return run


def test_option_then_environment_then_ini_then_default(site, monkeypatch):
    monkeypatch.setenv("STORAGESCALE_SITE_HOSTS", "3")
    outcome = site("--storage-site-hosts", "4", "--storage-site-mount", "file:///mnt/b",
                   ini="storage_site_hosts = 2\nstorage_site_mount = file:///mnt/ini")
    outcome.assert_outcomes(passed=1)
    out = outcome.stdout.str()
    assert "options: {'storage_site_hosts': 4, 'storage_site_mount': 'file:///mnt/b'}" in out
    assert "storage_site_hosts: 4 (from --storage-site-hosts)" in out
    assert "view: {'storage_site_hosts': 4, 'storage_site_mount': 'file:///mnt/b'}" in out

    outcome = site()  # the environment before the ini
    out = outcome.stdout.str()
    assert "storage_site_hosts: 3 (from $STORAGESCALE_SITE_HOSTS)" in out
    assert "storage_site_mount: file:///mnt/ini (from ini storage_site_mount)" in out

    monkeypatch.delenv("STORAGESCALE_SITE_HOSTS")
    out = site().stdout.str()
    assert "storage_site_hosts: 2 (from ini storage_site_hosts)" in out


def test_the_default_and_none_given(site):
    outcome = site()
    outcome.assert_outcomes(passed=1)
    out = outcome.stdout.str()
    assert "options: {'storage_site_hosts': 1, 'storage_site_mount': None}" in out
    assert "storage_site_hosts" not in out.split("options:")[0].split("view:")[0]


def test_a_bad_value_is_a_usage_error_before_any_test(site):
    outcome = site("--storage-site-hosts", "many")
    assert outcome.ret == 4
    assert "--storage-site-hosts 'many': a number, e.g. 4." in outcome.stderr.str()
    assert "Traceback" not in outcome.stderr.str() + outcome.stdout.str()


def test_a_password_in_a_suite_option_is_never_shown(site):
    """In the header (the suite's own prints are its own business: this one's test
    prints the value it was given)."""
    outcome = site("--storage-site-mount", "davs://user:s3cret@host/area")
    [line] = [line for line in outcome.stdout.lines
              if line.strip().startswith("storage_site_mount:")]
    assert line.strip() == "storage_site_mount: davs://host/area (from --storage-site-mount)"


def test_a_malformed_declaration_names_itself(pytester):
    pytester.makeconftest(
        "def pytest_storagescale_options():\n"
        "    return {'hosts': ('--hosts', None, None, 'x')}\n")
    pytester.makepyfile(test_site="def test_x():\n    pass\n")
    outcome = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    assert outcome.ret != 0
    assert "pytest_storagescale_options: 'hosts'" in outcome.stderr.str() + \
        outcome.stdout.str()
