"""No secret printed or recorded: a URL password and a token given as a driver option
appear in no output of a run (terminal, results JSON, HTML report, Allure files, JUnit
XML, pytest-benchmark JSON), nor in usage errors (issues 7 and 8)."""

from __future__ import annotations

import pytest

from pytest_storagescale.redact import redact_argv, redact_url

PASSWORD, TOKEN = "S3cr3tPW", "T0kenS3cret"

PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "1s"
hang_timeout = "10s"

[ops.stat]
clients = [2]

[[ops.stat.expect]]
rules = ["failed == 0", "rate_hz >= 1000000000"]
"""

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()

def test_round_trip(storage_client, storage_test_dir):
    storage_client.put(f"{storage_test_dir}/f", b"x")
    assert storage_client.stat(f"{storage_test_dir}/f").size == 1
"""


def test_redaction_rules():
    assert redact_url(f"root://alice:{PASSWORD}@h:1094//area") == "root://h:1094//area"
    assert redact_url(f"davs://h/area?authz={TOKEN}&x=1") == "davs://h/area?authz=***&x=1"
    assert redact_url(f"https://h/f?access_token={TOKEN}") == "https://h/f?access_token=***"
    assert redact_argv(["--storage-driver-option", f"token={TOKEN}",
                        f"--storage-driver-option=x509_proxy={TOKEN}",
                        f"--storage-endpoint=root://u:{PASSWORD}@h//a"]) == [
        "--storage-driver-option", "token=***", "--storage-driver-option=x509_proxy=***",
        "--storage-endpoint=root://h//a"]


@pytest.mark.integration
def test_no_output_of_a_run_holds_a_secret(pytester, embedded_xrootd):
    folder = pytester.path / "thr" / "xrootd"
    folder.mkdir(parents=True)
    (folder / "t.toml").write_text(PLAN)
    pytester.makepyfile(test_suite=SUITE)
    url = embedded_xrootd.url.replace("root://", f"root://alice:{PASSWORD}@")
    result = pytester.runpytest_subprocess(
        f"--storage-endpoint={url}", "--storage-driver-option", f"token={TOKEN}",
        "--storage-thresholds=thr", "--storage-results=r.json", "--storage-report=report",
        "--storage-benchmark-json=bench.json", "--alluredir=allure", "--junitxml=junit.xml",
        "-p", "no:cacheprovider", "-v",
    )
    # the rate rule cannot hold: the failure message and the table are printed too
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*storage_driver_options: token=[*][*][*] *"])
    outputs = {"stdout": result.stdout.str(), "stderr": result.stderr.str()}
    files = [p for p in pytester.path.rglob("*") if p.is_file() and p.suffix != ".py"]
    assert {"r.json", "index.html", "bench.json", "junit.xml"} <= {p.name for p in files}
    assert any(p.parent.name == "allure" for p in files)
    outputs.update({str(p): p.read_text(errors="replace") for p in files})
    for where, text in outputs.items():
        assert PASSWORD not in text, f"the URL password is in {where}"
        assert TOKEN not in text, f"the token is in {where}"


@pytest.mark.parametrize("args", [
    [f"--storage-endpoint=root://alice:{PASSWORD}@h:x//area"],       # bad port
    [f"--storage-endpoint=root://alice:{PASSWORD}@h:1094"],          # no test area
    [f"--storage-endpoint=gopher://alice:{PASSWORD}@h/area"],        # unknown scheme
    ["--storage-driver-option", TOKEN],                              # a bare token pasted
    ["--storage-endpoint=memory://h/area", "--storage-driver-option", f"tokn={TOKEN}"],
])
def test_usage_errors_name_no_secret(pytester, args):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert "ERROR:" in text and PASSWORD not in text and TOKEN not in text
