"""Rule metrics: the measured ones, the core's derived ones, and a suite registering
its own before a thresholds file names it."""

from __future__ import annotations

import pytest

from pytest_storagescale import metrics
from pytest_storagescale.errors import StorageScaleUsageError, ThresholdsError
from pytest_storagescale.metrics import MEASURED, STEP_MEASURED, known_metrics, register_metric
from pytest_storagescale.thresholds import load_thresholds, parse_rule

CORE_DERIVED = ("mix_ratio", "recovery_s", "mb_s_mean", "mb_s_stddev", "rate_hz_mean",
                "rate_hz_stddev")


@pytest.fixture(autouse=True)
def registry():
    """Each test's registrations are undone afterwards."""
    with metrics.DERIVED.kept():
        yield


def test_measured_then_core_derived_metrics():
    assert MEASURED == ("rate_hz", "rate_per_min", "mb_s", "mbit_s", "succeeded", "failed",
                        "hung", "throttled", "redirects", "door_latency_s", "error_ratio",
                        "mean_s", "p50_s", "p90_s", "p99_s", "max_s", "offered_hz",
                        "achieved_hz", "dropped", "late")
    assert STEP_MEASURED == ("client_cpu", "lost", "server_cpu", "server_ops",
                             "server_threads", "server_connections")
    assert known_metrics() == (*MEASURED, *STEP_MEASURED, *CORE_DERIVED)
    assert "hot_ratio" not in known_metrics()  # the ceph suite's own
    assert "overload" in metrics.metric_description("recovery_s")
    assert metrics.metric_description("rate_hz") == ""


def test_unknown_metric_lists_the_known_and_the_hook():
    with pytest.raises(ThresholdsError) as info:
        parse_rule("hot_ratio <= 2", where="f.toml: [ops.hotfile.expect][0].rules[2]")
    assert str(info.value) == (
        "f.toml: [ops.hotfile.expect][0].rules[2]: unknown metric 'hot_ratio' in "
        "'hot_ratio <= 2'. Known metrics: " + ", ".join((*MEASURED, *STEP_MEASURED, *CORE_DERIVED))
        + ". A suite "
        "can register a derived metric with the pytest_storagescale_metrics hook."
    )


def test_a_registered_metric_is_accepted_by_rules():
    register_metric("hot_ratio", "same-file over distinct-file mean transfer time")
    rule = parse_rule("hot_ratio <= 2")
    assert (rule.metric, rule.comparison, rule.limit) == ("hot_ratio", "<=", 2.0)
    assert known_metrics()[-1] == "hot_ratio"
    assert parse_rule("readers.hot_ratio <= 2", sides=("readers",)).metric == "readers.hot_ratio"


HOT = """
[storage]
system = "ceph"
versions = ["*"]

[ops.hotfile]
op = "get"
clients = [5]
files = 1

[[ops.hotfile.expect]]
rules = ["failed == 0", "hot_ratio <= 2"]
"""


def test_a_file_naming_a_derived_metric_loads_once_it_is_registered(thresholds_dir):
    path = thresholds_dir(HOT, system="ceph")
    with pytest.raises(ThresholdsError,
                       match=r"\[ops.hotfile.expect\]\[0\].rules\[1\]: unknown metric 'hot_ratio'"):
        load_thresholds(path)
    register_metric("hot_ratio", "same-file over distinct-file mean transfer time")
    rules = load_thresholds(path).section("hotfile").rules_for(5)
    # the file's rules, then the defaults it does not override
    assert [r.text for r in rules] == ["failed == 0", "hot_ratio <= 2", "hung == 0",
                                       "lost == 0"]


def test_registering_again_with_the_same_description_is_harmless():
    register_metric("hot_ratio", "same-file over distinct-file")
    register_metric("hot_ratio", "same-file over distinct-file")
    assert known_metrics().count("hot_ratio") == 1


def test_another_description_is_refused_unless_replaced():
    register_metric("hot_ratio", "same-file over distinct-file")
    with pytest.raises(StorageScaleUsageError,
                       match=r"derived metric 'hot_ratio' is already registered "
                             r"\('same-file over distinct-file'\). Choose another name, or pass "
                             r"replace=True"):
        register_metric("hot_ratio", "something else")
    register_metric("hot_ratio", "something else", replace=True)
    assert metrics.metric_description("hot_ratio") == "something else"


@pytest.mark.parametrize(
    "name, message",
    [
        ("rate_hz", r"'rate_hz' is a measured metric of every step; choose another name"),
        ("readers.ratio", r"'readers.ratio' is not a derived metric name. Use letters, digits and "
                          r"underscores, starting with a letter, e.g. 'hot_ratio'"),
        ("2x", r"'2x' is not a derived metric name"),
        ("", r"'' is not a derived metric name"),
    ],
)
def test_bad_metric_names_are_refused(name, message):
    with pytest.raises(StorageScaleUsageError, match=message):
        register_metric(name, "d", replace=True)
