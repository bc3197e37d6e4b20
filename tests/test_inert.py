"""The plugin is inert until storage is used: a pytest run of the same environment
that gives no storage setting and collects no storage test imports no client library,
no report library and no throwaway-CA library, and leaves the XRootD client's
environment (``XRD_*``) as it was; a run that collects a storage test sets the XRootD
client up before any request, and says its endpoint after collection."""

from __future__ import annotations

import json
import os

import pytest

from pytest_storagescale.drivers.grid import XROOTD_CLIENT_DEFAULTS

#: what a run without storage must not import (allure: with allure-pytest disabled,
#: whose own plugin imports it)
HEAVY = ("XRootD", "gfal2", "pycurl", "cryptography", "matplotlib", "distributed", "dask",
         "allure", "scipy", "numpy")

#: at the session's end (the plugin's configuration and collection are done), in each
#: process (state.json; an xdist worker's state-gw0.json...): the heavy modules
#: imported, the XRD_* environment, whether this process ran an embedded server and,
#: where the bindings are installed and the run imported them, the XRootD client's
#: timeout resolution
CONFTEST = f"""
import json, os, sys
from pytest_storagescale.stash import storage_run_key

def pytest_sessionfinish(session):
    run = session.config.stash.get(storage_run_key, None)
    state = {{"imported": [name for name in {HEAVY!r} if name in sys.modules],
              "xrd": {{k: v for k, v in os.environ.items() if k.startswith("XRD_")}},
              "server": run is not None and run.endpoint.embedded_server is not None}}
    if "XRootD" in sys.modules:
        from XRootD import client
        state["resolution"] = client.EnvGetInt("TimeoutResolution")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    name = f"state-{{worker}}.json" if worker else "state.json"
    with open(os.path.join(str(session.config.rootpath), name), "w") as out:
        json.dump(state, out)
"""


@pytest.fixture
def plain_environment(monkeypatch):
    """No storage setting and no XRootD setting in the environment, but one XRD_ value
    of the user's own (left as it is)."""
    for name in list(os.environ):
        if name.startswith(("XRD_", "STORAGESCALE_")):
            monkeypatch.delenv(name)
    # the runs made here are no xdist workers, even when these tests run under -n
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("XRD_REQUESTTIMEOUT", "77")


def session_state(pytester, *args: str) -> tuple[pytest.RunResult, dict]:
    """The run's result and its main process's state (the xdist controller's)."""
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:allure_pytest",
                                           *args)
    return result, json.loads((pytester.path / "state.json").read_text())


def worker_states(pytester) -> list[dict]:
    """Each xdist worker's state (see :data:`CONFTEST`)."""
    return [json.loads(path.read_text()) for path in sorted(pytester.path.glob("state-gw*"))]


def test_a_run_without_storage_imports_no_client_library_nor_touches_the_environment(
        pytester, plain_environment):
    pytester.makepyfile(test_plain="def test_plain():\n    assert 1 + 1 == 2\n")
    result, state = session_state(pytester)
    result.assert_outcomes(passed=1)
    assert state["imported"] == []
    assert state["xrd"] == {"XRD_REQUESTTIMEOUT": "77"}
    assert "storagescale:" not in result.stdout.str()  # nothing to say: no header line


def test_an_xdist_run_without_storage_starts_no_server_nor_touches_the_environment(
        pytester, plain_environment):
    """pytest -n 2 and no storage setting or test: neither the controller nor a worker
    starts the embedded server, imports a client library or writes an XRD_* variable
    (the controller had started the xrootd for its workers at pytest_configure_node)."""
    pytester.makepyfile(test_plain="def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    result, controller = session_state(pytester, "-n", "2")
    result.assert_outcomes(passed=2)
    workers = worker_states(pytester)
    assert len(workers) == 2
    for state in (controller, *workers):
        assert state == {"imported": [], "xrd": {"XRD_REQUESTTIMEOUT": "77"}, "server": False}
    assert "storagescale:" not in result.stdout.str()


def test_an_xdist_worker_collecting_a_storage_test_gets_the_controllers_server(
        pytester, plain_environment):
    """pytest -n 2, no storage setting, a storage test: once the workers collected it
    the controller starts the embedded xrootd (only it) and says its endpoint, and the
    workers write through it (the URL and options handed over in the shared folder)."""
    pytester.makepyfile(test_storage="""
        def test_write(storage_client, storage_endpoint):
            storage_client.put(f"{storage_endpoint.run_dir}/a", b"x" * 10)
            assert storage_client.stat(f"{storage_endpoint.run_dir}/a").size == 10

        def test_plain():
            pass
    """)
    result, controller = session_state(pytester, "-n", "2")
    result.assert_outcomes(passed=2)
    assert controller["server"] is True
    assert [state["server"] for state in worker_states(pytester)] == [False, False]
    result.stdout.fnmatch_lines(["storagescale: endpoint root://127.0.0.1:*"])


def test_a_collected_storage_test_sets_the_xrootd_client_up_and_says_its_endpoint(
        pytester, plain_environment):
    """No setting given: the collected test needing the storage makes it used (here
    --collect-only: nothing is started, no request made), the XRootD settings are in
    the environment for the processes it starts, and the endpoint line comes after
    collection instead of in the header."""
    pytester.makepyfile(test_storage="def test_stat(storage_endpoint):\n    pass\n")
    result, state = session_state(pytester, "--collect-only")
    assert result.ret == 0, result.stdout.str()
    expected = {f"XRD_{name.upper()}": str(value)
                for name, value in XROOTD_CLIENT_DEFAULTS.items()}
    assert state["xrd"] == {**expected, "XRD_REQUESTTIMEOUT": "77"}
    if "resolution" in state:  # the bindings are installed: the library was told too
        assert state["resolution"] == XROOTD_CLIENT_DEFAULTS["TimeoutResolution"]
    result.stdout.fnmatch_lines(["collected 1 item",
                                 "storagescale: endpoint embedded xrootd (root://*"])


def test_a_storage_setting_makes_the_storage_used_from_the_start(pytester, plain_environment,
                                                                  tmp_path):
    """A storage setting (here the endpoint) and no storage test: the header says the
    endpoint before collection, as before."""
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result, state = session_state(pytester, f"--storage-endpoint=file://{tmp_path}")
    result.assert_outcomes(passed=1)
    assert state["xrd"]["XRD_TIMEOUTRESOLUTION"] == "1"
    result.stdout.fnmatch_lines(["storagescale: endpoint file://*", "collected 1 item"])


@pytest.mark.parametrize(("module", "option", "extra"), [
    ("matplotlib", "--storage-report=report", "report"),
    ("distributed", "--storage-cluster=local:1", "cluster"),
    ("pycurl", "--storage-endpoint=https://127.0.0.1:1/area", "http"),
    ("cryptography", "--storage-embedded=xrootd", "servers"),
    ("jwt", "--storage-embedded=dcache", "servers"),  # PyJWT: the dCache's token issuer
])
def test_a_missing_library_is_named_with_its_extra(pytester, tmp_path, module, option, extra):
    """The library an asked-for output or driver needs, hidden from the session: one
    usage error naming the extra that installs it, before any test runs."""
    pytester.makeconftest(f"import sys\nsys.modules[{module!r}] = None  # not installed\n")
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    endpoint = () if option.startswith(("--storage-endpoint", "--storage-embedded")) else (
        f"--storage-endpoint=file://{tmp_path}",)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *endpoint, option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"*pip install 'pytest-storagescale[[]{extra}[]]'*"])
    assert "Traceback" not in result.stderr.str()


def test_the_test_extra_holds_every_other_extra():
    """``make test`` installs ``.[test]``: every extra's library, so no test is skipped
    for a missing one; the base install is the three libraries every run loads, and
    scipy, which the gate against a baseline imports when it judges a step (a gate
    cannot be an extra that is missing: a run with --storage-baseline would have no
    verdict to give)."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    for name, requirements in extras.items():
        assert set(requirements) <= set(extras["test"]), name
    assert [r.split(">")[0] for r in project["project"]["dependencies"]] == [
        "pytest", "hdrhistogram", "psutil", "scipy"]
