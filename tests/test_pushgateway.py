"""``--storage-pushgateway``: a run's steps pushed to a real Pushgateway (Debian's
prometheus-pushgateway) that a real Prometheus scrapes, both started here on loopback;
the last run's stat rate per version answered by Prometheus's HTTP API."""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
import time
import urllib.parse
from pathlib import Path

import pytest
from test_history import _run, _suite

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).parent.parent / "docs" / "examples" / "grafana-storagescale.json"


SCRIPT = Path(__file__).parent.parent / "scripts" / "history_demo.py"


@functools.cache
def _demo():
    """scripts/history_demo.py, whose Pushgateway and Prometheus these tests start too
    (one way to start them, the demo's)."""
    spec = importlib.util.spec_from_file_location("history_demo_monitoring", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    return _demo()._free_port()


def _get(url: str) -> bytes:
    return _demo()._get(url)


@pytest.fixture
def monitoring(tmp_path):
    """A Pushgateway and a Prometheus scraping it every second, on loopback, their data
    (the gateway's persistence file too: Debian's default is the shared
    /var/lib/prometheus) in the test's folder."""
    for command in ("prometheus", "prometheus-pushgateway"):
        if shutil.which(command) is None:
            pytest.skip(f"{command} is not installed (scripts/bootstrap.sh servers installs it)")
    with _demo().monitoring(tmp_path) as urls:
        yield urls


def _query(prometheus: str, query: str) -> list[dict]:
    answer = json.loads(_get(f"{prometheus}/api/v1/query?"
                             f"{urllib.parse.urlencode({'query': query})}"))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _label_values(prometheus: str, definition: str) -> list[str]:
    """Grafana's ``label_values(SELECTOR, LABEL)`` as Prometheus's HTTP API answers it
    (``/api/v1/label/LABEL/values?match[]=SELECTOR``, what Grafana itself asks)."""
    import re

    selector, label = re.fullmatch(r"label_values\((.*), (\w+)\)", definition).groups()
    answer = json.loads(_get(f"{prometheus}/api/v1/label/{label}/values?"
                             f"{urllib.parse.urlencode({'match[]': selector})}"))
    assert answer["status"] == "success", answer
    return answer["data"]


def test_prometheus_answers_the_last_runs_stat_rate_per_version(pytester, monitoring):
    """Two runs pushed (versions 1.0 and 2.0): Prometheus answers the stat rate per
    version; each variable and each panel query of the shipped Grafana dashboard
    (docs/examples/grafana-storagescale.json) returns series from this real Prometheus
    (Grafana itself is not run: it is not packaged in Debian)."""
    gateway, prometheus = monitoring
    _suite(pytester)
    for version in ("1.0", "2.0"):
        result = _run(pytester, version, f"--storage-pushgateway={gateway}",
                      f"--storage-results=r{version}.json")
        result.assert_outcomes(passed=2)
        result.stdout.fnmatch_lines([f"pushgateway: 2 steps pushed to {gateway}"])
    pushed = _get(f"{gateway}/metrics").decode()
    assert 'storagescale_step_verdict{clients="1",door="memory"' in pushed
    rates = {(step["clients"]): step["rate_hz"]
             for step in json.loads((pytester.path / "r2.0.json").read_text())["steps"]}
    query = 'storagescale_step_rate_hz{storage="xrootd",operation="stat",clients="1"}'
    deadline, found = time.monotonic() + 60, []
    while time.monotonic() < deadline and len(found) < 2:
        found = _query(prometheus, query)
        time.sleep(0.5)
    by_version = {item["metric"]["version"]: float(item["value"][1]) for item in found}
    assert set(by_version) == {"1.0", "2.0"}, found
    assert by_version["2.0"] == pytest.approx(rates[1]), (pushed, rates)  # as measured

    board = json.loads(DASHBOARD.read_text())
    variables = {item["name"]: item for item in board["templating"]["list"]}
    chosen = {"storage": "xrootd"}
    for name in ("storage", "operation", "clients"):  # in order: each uses the ones before
        definition = variables[name]["definition"].replace("$storage", chosen["storage"])
        values = _label_values(prometheus, definition)
        expected = {"storage": ["xrootd"], "operation": ["stat"], "clients": ["1", "2"]}[name]
        assert sorted(values) == expected, (name, definition, values)
    both = {(version, clients) for version in ("1.0", "2.0") for clients in ("1", "2")}
    answered: dict[str, set] = {}
    deadline = time.monotonic() + 60  # the last push scraped within a second or two
    for panel in board["panels"]:
        for target in panel["targets"]:
            # storage one value; operation and clients "All" (includeAll: a regex)
            query = (target["expr"].replace("$storage", "xrootd")
                     .replace("$operation", ".*").replace("$clients", ".*"))
            while True:
                answered[panel["title"]] = {
                    (item["metric"].get("version"), item["metric"].get("clients"))
                    for item in _query(prometheus, query)}
                if answered[panel["title"]] == both or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
    for title, series in answered.items():
        assert series == both, (title, series)  # each version at each client count
    assert len(answered) == len(board["panels"]) == 5


SEEN_BEFORE_THE_SECOND_STEP = """
import os
import urllib.request

def pytest_runtest_setup(item):
    if item.name.endswith("[c2]"):  # the 1-client step ended, the 2-client one not begun
        with urllib.request.urlopen(os.environ["H9_GATEWAY"] + "/metrics", timeout=10) as r:
            open("seen.txt", "w").write(r.read().decode())
"""


def test_each_step_is_pushed_when_it_ends(pytester, monitoring, monkeypatch):
    gateway, _ = monitoring
    _suite(pytester)
    pytester.makeconftest(SEEN_BEFORE_THE_SECOND_STEP)
    monkeypatch.setenv("H9_GATEWAY", gateway)
    result = _run(pytester, "1.0", f"--storage-pushgateway={gateway}")
    result.assert_outcomes(passed=2)
    seen = (pytester.path / "seen.txt").read_text()
    assert 'storagescale_step_rate_hz{clients="1",door="memory"' in seen, seen
    assert 'clients="2"' not in seen
    assert 'storagescale_step_rate_hz{clients="2",door="memory"' in _get(
        f"{gateway}/metrics").decode()


def test_an_unreachable_gateway_is_said_and_the_run_keeps_its_status(pytester):
    _suite(pytester)
    result = _run(pytester, "1.0", f"--storage-pushgateway=http://127.0.0.1:{_free_port()}")
    result.assert_outcomes(passed=2)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["storagescale: Pushgateway NOT pushed to http://127.0.0.1:*"])


@pytest.mark.parametrize("value", ["ftp://host", "127.0.0.1:9091", "http://"])
def test_a_bad_gateway_url_is_exit_4(pytester, value):
    _suite(pytester)
    result = _run(pytester, "1.0", f"--storage-pushgateway={value}")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--storage-pushgateway*not a Pushgateway URL*"])


def test_the_metrics_file_of_a_run(tmp_path: Path):
    """The registry as Prometheus's text format: labels and figures of each step."""
    from prometheus_client import generate_latest
    from test_history import _document

    from pytest_storagescale.history.prometheus import registry_of

    text = generate_latest(registry_of(_document(1, "10.2.1", 500.0, 0.02))).decode()
    labels = 'clients="50",door="root",operation="ls",storage="dcache",version="10.2.1"'
    assert f"storagescale_step_rate_hz{{{labels}}} 500.0" in text
    assert f"storagescale_step_p99_seconds{{{labels}}} 0.02" in text
    assert ('storagescale_step_verdict{clients="50",door="root",operation="ls",'
            'storage="dcache",verdict="pass",version="10.2.1"} 1.0') in text


def test_the_grafana_dashboard_queries_only_metrics_the_plugin_pushes():
    """docs/examples/grafana-storagescale.json: every metric its queries name is one
    registry_of makes (a renamed metric breaks this test, not a site's board)."""
    import re

    from test_history import _document

    from pytest_storagescale.history.prometheus import LABELS, registry_of

    board = json.loads((Path(__file__).parent.parent / "docs" / "examples" /
                        "grafana-storagescale.json").read_text())
    exported = {family.name for family in registry_of(_document(1, "1.0", 10.0, 0.1)).collect()}
    queries = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    queries += [item["query"]["query"] for item in board["templating"]["list"]
                if isinstance(item.get("query"), dict)]
    named = {name for query in queries for name in re.findall(r"storagescale_step_\w+", query)}
    assert named and named <= exported, named - exported
    for query in queries:
        for label in re.findall(r"(\w+)=~?\"", query):
            assert label in LABELS, (label, query)
