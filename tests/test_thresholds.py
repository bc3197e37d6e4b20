"""Thresholds files: format, validation errors, version matching, rule evaluation."""

from __future__ import annotations

import re

import pytest

from pytest_storagescale.errors import StorageScaleUsageError, ThresholdsError
from pytest_storagescale.records import RuleCheck, all_passed, violations
from pytest_storagescale.thresholds import (
    RecoveryPlan,
    evaluate,
    load_thresholds,
    parse_rule,
    parse_selector,
    select_thresholds,
)

GOOD = """
[storage]
system = "dcache"
versions = ["9.2.*"]

[defaults]
duration = "20m"
warmup = "10s"
hang_timeout = "60s"

[ops.ls]
clients = [5, 50, 600]
duration = "40m"

[[ops.ls.expect]]
clients = "<=100"
rules = ["rate_hz >= 4", "failed == 0", "hung == 0"]

[[ops.ls.expect]]
clients = 600
rules = ["hung == 0", "error_ratio <= 0.2"]

[ops.get]
clients = [10]
file_size = "10MB"
"""


def test_good_file_loads(thresholds_dir):
    ts = load_thresholds(thresholds_dir(GOOD, system="dcache"))
    assert ts.system == "dcache" and ts.versions == ("9.2.*",)
    ls = ts.section("ls")
    assert ls.clients == (5, 50, 600)
    assert ls.duration == 2400 and ls.warmup == 10 and ls.hang_timeout == 60
    # the file's rules, then the defaults on a metric they do not name (hung, lost)
    assert [r.text for r in ls.rules_for(50)] == ["rate_hz >= 4", "failed == 0", "hung == 0",
                                                  "lost == 0"]
    assert [r.text for r in ls.rules_for(600)] == ["hung == 0", "error_ratio <= 0.2",
                                                   "lost == 0"]
    assert [r.text for r in ls.rules_for(200)] == ["hung == 0", "lost == 0"]
    assert ts.section("get").params["file_size"] == 10**7


@pytest.mark.parametrize(
    "change, message",
    [
        (("rate_hz >= 4", "rate >= 4"),
         r"\[ops.ls.expect\]\[0\].rules\[0\]: unknown metric 'rate' in 'rate >= 4'. Known metrics: rate_hz"),
        (("rate_hz >= 4", "rate_hz => 4"), r"cannot read rule 'rate_hz => 4'"),
        (('clients = "<=100"', 'clients = "about 100"'), r"cannot read client selector 'about 100'"),
        (('duration = "40m"', 'duration = "forty"'), r"\[ops.ls\].duration: 'forty' is not a duration"),
        (('duration = "40m"', 'durations = "40m"'), r"\[ops.ls\]: unknown key 'durations'. Valid keys:"),
        (("[ops.get]", "[ops.copy]"), r"unknown operation 'copy'. Known operations: stat, ls"),
        (("clients = [10]", "clients = []"), r"clients: must be a list of positive client counts"),
        (('file_size = "10MB"', 'file_size = "huge"'), r"file_size: 'huge' is not a size"),
        (('versions = ["9.2.*"]', 'versions = "9.2"'), r"versions: must be a list of version patterns"),
        (("[defaults]", "[default]"), r"top level: unknown key 'default'"),
        (('file_size = "10MB"', 'file_size = "10MB"\n[ops.readv]\nclients = [1]\nchunks = 64\n'
                                'file_size = "100kB"\nchunk_size = "4kB"'),
         r"\[ops.readv\]: 64 chunks of 4000 bytes do not fit in a 100000-byte file"),
        (('hang_timeout = "60s"', 'hang_timeout = "60s"\nretries = 3'), r"\[defaults\]: unknown key 'retries'"),
    ],
)
def test_bad_file_names_file_key_and_fix(thresholds_dir, change, message):
    path = thresholds_dir(GOOD.replace(*change), system="dcache")
    with pytest.raises(ThresholdsError, match=message) as info:
        load_thresholds(path)
    assert str(path) in str(info.value)


def test_bad_toml_syntax(thresholds_dir):
    path = thresholds_dir("[storage\nsystem=1")
    with pytest.raises(ThresholdsError, match="not valid TOML"):
        load_thresholds(path)


def test_missing_storage_table(thresholds_dir):
    with pytest.raises(ThresholdsError, match=r"missing \[storage\] table"):
        load_thresholds(thresholds_dir("[ops.stat]\nclients=[1]\n"))


def test_mixed_sides_in_rules(thresholds_dir):
    text = GOOD + '\n[ops.mixed]\nclients=[5]\n[[ops.mixed.expect]]\nrules=["readers.mb_s >= 1"]\n'
    ts = load_thresholds(thresholds_dir(text, system="dcache"))
    assert ts.section("mixed").rules_for(5)[0].metric == "readers.mb_s"
    # a side's rule on hung replaces the default on the whole step (a writer may hang)
    sided = text.replace('"readers.mb_s >= 1"', '"readers.mb_s >= 1", "writers.hung <= 2"')
    mixed = load_thresholds(thresholds_dir(sided, system="dcache", name="s.toml"))
    assert [r.text for r in mixed.section("mixed").rules_for(5)] == [
        "readers.mb_s >= 1", "writers.hung <= 2", "lost == 0"]
    bad = text.replace("readers.mb_s", "pilots.mb_s")
    with pytest.raises(ThresholdsError, match="unknown side 'pilots'.*Sides: readers, writers"):
        load_thresholds(thresholds_dir(bad, system="dcache", name="bad.toml"))
    with pytest.raises(ThresholdsError, match="unknown side 'readers'"):
        parse_rule("readers.mb_s >= 1", sides=())


def _versioned(thresholds_dir, name, versions):
    body = GOOD.replace('versions = ["9.2.*"]', f"versions = {versions}")
    return thresholds_dir(body, system="dcache", name=name)


def test_most_specific_pattern_wins(thresholds_dir):
    _versioned(thresholds_dir, "any.toml", '["*"]')
    _versioned(thresholds_dir, "9.x.toml", '["9.*"]')
    _versioned(thresholds_dir, "9.2.toml", '["9.2.*"]')
    root = thresholds_dir.root
    assert select_thresholds(root, "dcache", "9.2.5").path.name == "9.2.toml"
    assert select_thresholds(root, "dcache", "9.1.0").path.name == "9.x.toml"
    chosen = select_thresholds(root, "dcache", "10.0")
    assert chosen.path.name == "any.toml" and "pattern '*'" in chosen.reason


def test_no_matching_version_lists_files(thresholds_dir):
    _versioned(thresholds_dir, "9.2.toml", '["9.2.*"]')
    with pytest.raises(ThresholdsError, match=r"no thresholds file matches dcache version '8.2.1'.*9.2.toml: 9.2.\*"):
        select_thresholds(thresholds_dir.root, "dcache", "8.2.1")


def test_unknown_system_lists_known(thresholds_dir):
    _versioned(thresholds_dir, "9.2.toml", '["9.2.*"]')
    with pytest.raises(ThresholdsError, match="no thresholds folder for storage system 'eos'.*dcache"):
        select_thresholds(thresholds_dir.root, "eos", "5.0")


def test_equally_specific_patterns_are_an_error(thresholds_dir):
    _versioned(thresholds_dir, "a.toml", '["9.2.*"]')
    _versioned(thresholds_dir, "b.toml", '["9.*.1"]')
    with pytest.raises(ThresholdsError, match="equally specific"):
        select_thresholds(thresholds_dir.root, "dcache", "9.2.1")


@pytest.mark.parametrize(
    "selector, yes, no",
    [(50, [50], [49]), ([5, 50], [5, 50], [6]), ("<=100", [1, 100], [101]),
     (">=600", [600], [599]), ("100..400", [100, 400], [99, 401]), ("*", [1, 10**6], [])],
)
def test_selectors(selector, yes, no):
    chosen = parse_selector(selector, where="x")
    assert all(chosen(c) for c in yes) and not any(chosen(c) for c in no)


@pytest.mark.parametrize("selector", ["=<5", [], [1.5], True, "5-10"])
def test_bad_selectors(selector):
    with pytest.raises(ThresholdsError, match="cannot read client selector"):
        parse_selector(selector, where="x")


def test_evaluate_pass_and_fail():
    rules = [parse_rule(r) for r in ("rate_hz >= 4", "hung == 0", "p99_s < 1.5")]
    metrics = {"rate_hz": 4.6, "hung": 0, "p99_s": 1.2}
    checks = evaluate(rules, metrics.__getitem__)
    assert all(isinstance(check, RuleCheck) for check in checks)  # one record per concept
    assert all_passed(checks) and violations(checks) == []
    metrics.update(rate_hz=3.7, hung=2)
    checks = evaluate(rules, metrics.__getitem__)
    assert not all_passed(checks)
    assert violations(checks) == ["rate_hz >= 4 (observed 3.7)", "hung == 0 (observed 2)"]
    assert [check.passed for check in checks] == [False, False, True]


def _suite_conftest(system: str):
    """``suites/<system>/conftest.py`` imported as the plugin's run imports it (a module
    of the ``suites`` package, so its relative imports work), or None."""
    import importlib
    from pathlib import Path

    if not (Path(__file__).parent.parent / "suites" / system / "conftest.py").exists():
        return None
    return importlib.import_module(f"suites.{system}.conftest")


def test_shipped_thresholds_files_are_valid(monkeypatch):
    """Every file under thresholds/ loads (a broken shipped file is a release blocker),
    each with the core registries plus what its own suite's conftest registers (its
    operations and metrics, as at run time), and no other suite's."""
    from pathlib import Path

    from pytest_storagescale import extensions, hooks
    from pytest_storagescale.load import operations

    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent))
    files = sorted((Path(__file__).parent.parent / "thresholds").glob("*/*.toml"))
    assert files, "no thresholds files shipped"
    for path in files:
        # the registries as a run of this system's suite has them: in a session's scope,
        # through a plugin manager of its own, as pytest's
        manager = pytest.PytestPluginManager()
        conftest = _suite_conftest(path.parent.name)
        if conftest is not None:
            manager.add_hookspecs(hooks)
            manager.register(conftest)
            extensions.register(conftest, manager)
        try:
            ts = load_thresholds(path)
        finally:
            extensions.close(manager)
        assert ts.system == path.parent.name, f"{path}: system should be {path.parent.name}"
        assert ts.sections, f"{path}: no [ops.*] sections"
    assert "get_xcache" not in operations.operation_names()  # the ceph files needed their suite's


def test_suite_operations_stay_with_their_suite(thresholds_dir):
    """A file naming an operation no registry has is still refused, and so is the ceph
    suite's get_xcache in a file the ceph suite's conftest has not extended."""
    for op in ("get_xcache", "copy_fast"):
        path = thresholds_dir(f"""
[storage]
system = "dcache"
versions = ["*"]

[defaults]
duration = "1m"

[ops.x]
op = "{op}"
clients = [1]
""", system="dcache", name=f"{op}.toml")
        with pytest.raises(ThresholdsError, match=f"unknown op = '{op}'"):
            load_thresholds(path)


def test_a_file_given_is_used_as_is(thresholds_dir):
    path = _versioned(thresholds_dir, "9.2.toml", '["9.2.*"]')
    chosen = select_thresholds(path, "dcache", "1.0")  # whatever the version
    assert chosen.path == path
    assert chosen.reason == ("given by --storage-thresholds; its versions ['9.2.*'] do not "
                             "include 1.0")
    assert select_thresholds(path, "dcache", "9.2.1").reason == "given by --storage-thresholds"


# --- sections: count bound, tries, recovery ------------------------------------------

PLAN = """
[storage]
system = "dcache"
versions = ["*"]

[defaults]
duration = "20m"
warmup = "10s"
hang_timeout = "60s"

[ops.ls]
clients = [5, 50, 600]

[[ops.ls.expect]]
clients = "<=100"
rules = ["rate_hz >= 4", "hung == 0"]

[[ops.ls.expect]]
clients = 600
rules = ["error_ratio <= 0.2"]

[ops.copyout]
op = "get"
clients = [10, 20]
file_size = "10MB"
files = 10
to_disk = true
operations = 450
tries = 3

[ops.recovery]
op = "stat"
clients = [5]
duration = "30s"
warmup = 0
overload_clients = 200
overload_duration = "30s"
recover_fraction = 0.8
recover_within = "2m"

[ops.writes]
op = "write"
clients = [1]
sync = "direct"
"""


def test_section_plan_fields(thresholds_dir):
    ts = load_thresholds(thresholds_dir(PLAN, system="dcache"))
    assert list(ts.sections) == ["ls", "copyout", "recovery", "writes"] and ts.scale == 1
    copyout = ts.section("copyout")
    assert (copyout.name, copyout.operation, copyout.max_operations, copyout.tries) == (
        "copyout", "get", 450, 3)
    assert copyout.params == {"file_size": 10**7, "files": 10, "to_disk": True}
    assert copyout.recovery is None and ts.section("ls").max_operations == 0
    assert ts.section("recovery").recovery == RecoveryPlan(
        overload_clients=200, overload_duration=30.0, recover_fraction=0.8, recover_within=120.0)
    assert ts.section("recovery").warmup == 0 and ts.section("nope") is None


@pytest.mark.parametrize(
    "change, message",
    [
        (("operations = 450", "operations = -1"),
         r"\[ops.copyout\].operations: must be a whole number of operations \(the step ends when "
         r"that many were done\), e.g. operations = 450\."),
        (("tries = 3", "tries = 0"),
         r"\[ops.copyout\].tries: must be a whole number of repetitions, e.g. tries = 10\."),
        (("recover_within = \"2m\"", ""),
         r"\[ops.recovery\]: a recovery probe needs overload_clients, overload_duration, "
         r"recover_fraction, recover_within; missing recover_within\."),
        (("recover_fraction = 0.8", "recover_fraction = 80"),
         r"\[ops.recovery\].recover_fraction: 80 must be a fraction of the rate before"),
        (("overload_clients = 200", "overload_clients = true"),
         r"\[ops.recovery\].overload_clients: must be a client count, e.g. 600\."),
        (("overload_duration = \"30s\"", "overload_duration = \"soon\""),
         r"\[ops.recovery\].overload_duration: 'soon' is not a duration"),
        (('sync = "direct"', 'sync = "fast"'),
         r"\[ops.writes\].sync: unknown value 'fast'. Valid values: none, dsync, direct\."),
        (("tries = 3", "tries = 3\nexpect = 3"),
         r"\[ops.copyout\].expect: write expectations as \[\[ops.copyout.expect\]\] blocks"),
        (('op = "get"', 'op = "copy"'),
         r"\[ops.copyout\]: unknown op = 'copy'. Known operations: stat, ls.*A section with "
         r"another name says which it runs: op = \"get\"\."),
    ],
)
def test_bad_section_names_key_and_fix(thresholds_dir, change, message):
    path = thresholds_dir(PLAN.replace(*change), system="dcache")
    with pytest.raises(ThresholdsError, match=message) as info:
        load_thresholds(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "top, message",
    [
        ("defaults = 3", r"defaults: must be a table: \[defaults\] with duration, warmup, "
                         r"hang_timeout\."),
        ("ops = 3", r"ops: must be a table of \[ops.<op>\] sections\."),
        ("storage = 3", r"missing \[storage\] table. Add \[storage\] with system"),
    ],
)
def test_top_level_keys_must_be_tables(thresholds_dir, top, message):
    text = top + '\n' + ('' if top.startswith("storage") else '[storage]\nsystem = "x"\nversions = ["*"]\n')
    with pytest.raises(ThresholdsError, match=message):
        load_thresholds(thresholds_dir(text))


# --- scaling -----------------------------------------------------------------------

def test_scaled_plan_numbers(thresholds_dir):
    ts = load_thresholds(thresholds_dir(PLAN, system="dcache"))
    small = ts.scaled(0.1)
    assert small.scale == 0.1 and small.path == ts.path and small.reason == ts.reason
    ls = small.section("ls")
    assert ls.clients == (1, 5, 60)
    assert (ls.duration, ls.warmup, ls.hang_timeout) == (120.0, 1.0, 60.0)  # deadline kept
    copyout = small.section("copyout")
    assert copyout.clients == (1, 2)
    assert copyout.params == {"file_size": 10**6, "files": 1, "to_disk": True}
    assert (copyout.max_operations, copyout.tries) == (45, 3)
    assert small.section("recovery").recovery == RecoveryPlan(
        overload_clients=20, overload_duration=3.0, recover_fraction=0.8,
        recover_within=120.0)  # a deadline, like the rule that judges it: kept
    assert small.section("recovery").warmup == 0
    # the file is untouched
    assert ts.section("ls").clients == (5, 50, 600) and ts.scale == 1


def test_a_scaled_count_is_judged_by_the_rules_of_the_count_it_stands_for(thresholds_dir):
    ls = load_thresholds(thresholds_dir(PLAN, system="dcache")).section("ls")
    small = ls.scaled(0.1)
    assert small.judged_as == {1: 5, 5: 50, 60: 600}
    assert [r.text for r in small.rules_for(60)] == [  # not "<=100"
        "error_ratio <= 0.2", "hung == 0", "lost == 0"]
    assert [r.text for r in small.rules_for(5)] == ["rate_hz >= 4", "hung == 0", "lost == 0"]
    assert small.expectations == ls.expectations
    # scaling a scaled plan still maps back to the file's counts
    smaller = small.scaled(0.5)
    assert smaller.clients == (1, 3, 30) and smaller.judged_as == {1: 5, 3: 50, 30: 600}


def test_scaling_floors_and_uniqueness(thresholds_dir):
    text = PLAN.replace("clients = [5, 50, 600]", "clients = [1, 2, 3, 40, 41]").replace(
        "operations = 450", "operations = 3").replace('file_size = "10MB"', "file_size = 0")
    ts = load_thresholds(thresholds_dir(text, system="dcache"))
    small = ts.scaled(0.01)
    assert small.section("ls").clients == (1,)               # at least 1, once
    assert small.section("ls").duration == 12.0
    copyout = small.section("copyout")
    assert copyout.params["file_size"] == 0 and copyout.params["files"] == 1
    assert copyout.max_operations == 1
    recovery = small.section("recovery")
    assert recovery.duration == 1.0                          # 0.3 s raised to the floor
    assert recovery.recovery.overload_duration == 1.0
    assert recovery.recovery.recover_within == 120.0          # a deadline: kept
    assert recovery.recovery.overload_clients == 2
    assert ts.scaled(0.1).section("ls").clients == (1, 4)     # 0.1, 0.2, 0.3 -> 1; 4.1 -> 4
    short = load_thresholds(thresholds_dir(PLAN.replace('duration = "30s"', 'duration = "200ms"'),
                                           system="dcache", name="short.toml"))
    assert short.scaled(0.1).section("recovery").duration == 0.2  # never longer than unscaled


def test_a_count_bounded_sections_cap_shrinks_only_with_its_count(thresholds_dir):
    """The duration of a count-bounded section is the cap on its count: at a scale
    whose count floors at 1, that one operation keeps the time the file gave it (the
    tape's 8 flushes in 10 min: 75 s left at 0.1, not 60 s, shorter than one flush)."""
    ts = load_thresholds(thresholds_dir(PLAN.replace("operations = 450", "operations = 8"),
                                        system="dcache"))
    full = ts.section("copyout")
    assert full.duration == 1200.0 and full.max_operations == 8
    for factor, count in ((0.1, 1), (0.01, 1), (0.5, 4), (0.3, 2)):
        small = ts.scaled(factor).section("copyout")
        assert small.max_operations == count
        # its count's share of the cap, never less than the factor (2.4 rounds to 2)
        assert small.duration == pytest.approx(1200.0 * max(factor, count / 8))
    assert ts.scaled(0.1).section("ls").duration == 120.0  # time-bounded: the factor
    # the count's share is never less than the factor: 450 x 0.1 -> 45, 10 % of the cap
    assert load_thresholds(thresholds_dir(PLAN, system="dcache", name="b.toml")).scaled(
        0.1).section("copyout").duration == 120.0


def test_scaling_keeps_the_parameter_that_would_break_the_section(thresholds_dir):
    text = PLAN + '\n[ops.readv]\nclients = [1]\nfile_size = 6\nchunks = 3\nchunk_size = 2\n'
    ts = load_thresholds(thresholds_dir(text, system="dcache"))
    # 6 bytes * 0.9 = 5 bytes no longer hold 3 chunks of 2: the file keeps its size
    assert ts.scaled(0.9).section("readv").params == {"file_size": 6, "chunks": 3,
                                                       "chunk_size": 2}
    # direct I/O: a 6554-byte block is no multiple of 4096, the block keeps its size
    assert ts.scaled(0.1).section("writes").params == {
        "file_size": 10**7, "block_size": 65536, "sync": "direct"}


def test_factor_one_is_the_same_plan(thresholds_dir):
    ts = load_thresholds(thresholds_dir(PLAN, system="dcache"))
    assert ts.scaled(1) is ts and ts.section("ls").scaled(1.0) is ts.section("ls")


@pytest.mark.parametrize("factor", [0, -0.5, 1.5, float("nan"), "0.1", True, None])
def test_bad_scale_factor_is_named(thresholds_dir, factor):
    ts = load_thresholds(thresholds_dir(PLAN, system="dcache"))
    with pytest.raises(StorageScaleUsageError,
                       match=rf"--storage-scale: {re.escape(repr(factor))} is not a scale factor. "
                             rf"Give a number with 0 < factor <= 1, e.g. 0.1"):
        ts.scaled(factor, what="--storage-scale")
    with pytest.raises(StorageScaleUsageError, match=r"\[ops.ls\] scale factor: .* is not a"):
        ts.section("ls").scaled(factor)


@pytest.mark.parametrize("change, message", [
    (("clients = [5, 50, 600]", "clients = [5, 100000]"),
     "100000 clients from one host would measure the client host*at most 10000 per host"),
    (('duration = "30s"', 'duration = "99999999h"'), "'99999999h' is longer than 7 days*"),
])
def test_plans_one_host_cannot_run_are_refused(thresholds_dir, change, message):
    import fnmatch

    path = thresholds_dir(PLAN.replace(*change), system="dcache")
    with pytest.raises(ThresholdsError) as error:
        load_thresholds(path)
    assert fnmatch.fnmatch(str(error.value), f"*{message}*"), str(error.value)


def test_known_issues_of_another_system_are_read_without_its_rules(thresholds_dir):
    """The xrootd suite on the embedded Ceph gateway reads thresholds/ceph's
    [known_issues], whose rules name hot_ratio, a metric only the ceph suite registers:
    steps=False reads the issues and leaves the rules alone; a full load still refuses."""
    path = thresholds_dir("""
[storage]
system = "ceph"
versions = ["*"]

[ops.hotfile]
op = "read"
clients = [1]

[[ops.hotfile.expect]]
rules = ["hot_ratio <= 2"]

[known_issues]
"readv_overlapping[root]" = "the gateway merges the ranges"
""", system="ceph", name="default.toml")
    with pytest.raises(ThresholdsError, match="unknown metric 'hot_ratio'"):
        select_thresholds(path.parent.parent, "ceph", "16.2.11")
    issues = select_thresholds(path.parent.parent, "ceph", "16.2.11", steps=False)
    assert issues.known_issue("readv_overlapping", "root") == "the gateway merges the ranges"
    assert issues.known_issue("readv_overlapping", "davs") is None
    assert not issues.sections


def test_a_known_issue_may_name_a_load_door_through_another_client(thresholds_dir):
    """``check[DOOR+CLIENT]`` (suites/dcache/test_seed_clients.py's checks through
    dccp and globus-url-copy) is a known issue's door; a door name with a space or a
    slash is still refused, naming the form."""
    text = PLAN + """
[known_issues]
"md5_of_a_local_copy[gsiftp+globus-url-copy]" = "the door answers 500 to CKSM MD5"
"""
    issues = load_thresholds(thresholds_dir(text, system="dcache"))
    assert issues.known_issue("md5_of_a_local_copy", "gsiftp+globus-url-copy") \
        == "the door answers 500 to CKSM MD5"
    assert issues.known_issue("md5_of_a_local_copy", "gsiftp") is None
    for bad in ("ls[dcap dccp]", "ls[a/b]"):
        with pytest.raises(ThresholdsError, match=r"overwrite\[dcap\+dccp\]"):
            load_thresholds(thresholds_dir(PLAN + f'\n[known_issues]\n"{bad}" = "x"\n',
                                           system="dcache"))
