"""``--storage-embedded-start-timeout``: how long the embedded server may take to start.

The embedded dCache waited a fixed 300 s for its doors; at load 35-54 on a 2-core
machine its frontend (the Tape REST API) listened later, and nothing could lengthen
the wait (docs/dcache-upgrade.md). The option (ini ``storage_embedded_start_timeout``,
``$STORAGESCALE_EMBEDDED_START_TIMEOUT``) is the server class's ``startup_timeout``,
for side B of a paired run too; a bad value is one paragraph and exit 4 before any
server starts; a start that ran out of time names the option. No real server here:
a registered kind records what it was given.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_storagescale.config import Settings, parse_start_timeout
from pytest_storagescale.errors import StorageScaleUsageError
from pytest_storagescale.servers.family import start_timeout_hint
from pytest_storagescale.session.endpoint import EndpointUnderTest

#: a kind that records the start deadline it was given, then fails as a dCache did at
#: load 45-54 (its doors not ready within it); and one whose class takes no deadline
KINDS = '''
import os
from pytest_storagescale.errors import EndpointError
from pytest_storagescale.servers.family import EmbeddedServer, register_server


@register_server
class SlowUp(EmbeddedServer):
    kind = "slowup"
    schemes = ("file",)
    logins = ("unix",)

    def __init__(self, *, login="unix", startup_timeout=300.0):
        super().__init__(login=login)
        self.startup_timeout = startup_timeout

    def start(self):
        with open(os.environ["STARTS_FILE"], "a") as starts:
            starts.write(f"{self.startup_timeout}\\n")
        raise EndpointError(f"the embedded slowup did not start: within "
                            f"{self.startup_timeout:.0f} s, the tape door did not answer")

    def stop(self):
        pass

    def url_for(self, scheme):
        return "file:///nowhere"


@register_server
class NoDeadline(EmbeddedServer):
    kind = "nodeadline"
    schemes = ("file",)
    logins = ("unix",)

    def start(self):
        with open(os.environ["STARTS_FILE"], "a") as starts:
            starts.write("start\\n")
        raise EndpointError("not reached")

    def stop(self):
        pass

    def url_for(self, scheme):
        return "file:///nowhere"
'''

TEST = "def test_it(storage_endpoint):\n    pass\n"


def test_the_option_is_a_duration() -> None:
    assert parse_start_timeout("15m") == 900.0
    assert parse_start_timeout("900") == 900.0
    assert parse_start_timeout(" 1h ") == 3600.0


@pytest.mark.parametrize("value, said", [
    ("soon", "'soon' is not a duration"),
    ("0", "'0' must be longer than zero"),
    ("-5s", "'-5s' is not a duration"),
    ("30d", "'30d' is not a duration"),
    ("9000h", "'9000h' is longer than 7 days"),
])
def test_a_bad_value_names_itself_and_the_fix(value: str, said: str) -> None:
    with pytest.raises(StorageScaleUsageError) as info:
        parse_start_timeout(value)
    text = str(info.value)
    assert text.startswith(f"--storage-embedded-start-timeout: {said}"), text
    assert "--storage-embedded-start-timeout 15m" in text and "\n" not in text, text


@pytest.mark.parametrize("where", ["option", "ini", "environment"])
def test_a_bad_value_is_one_paragraph_and_exit_4_before_any_start(pytester, monkeypatch,
                                                                  where) -> None:
    starts = pytester.path / "starts"
    monkeypatch.setenv("STARTS_FILE", str(starts))
    pytester.makeconftest(KINDS)
    pytester.makepyfile(test_it=TEST)
    arguments = ["-p", "no:cacheprovider", "--storage-embedded", "slowup"]
    if where == "option":
        arguments += ["--storage-embedded-start-timeout", "soon"]
    elif where == "ini":
        pytester.makeini("[pytest]\nstorage_embedded_start_timeout = soon\n")
    else:
        monkeypatch.setenv("STORAGESCALE_EMBEDDED_START_TIMEOUT", "soon")
    result = pytester.runpytest_subprocess(*arguments)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output[-2000:]
    assert output.count("--storage-embedded-start-timeout: 'soon' is not a duration") == 1
    assert "Traceback" not in output and not starts.exists(), output[-2000:]


def test_the_server_class_is_given_the_deadline_and_its_failure_names_the_option(
        pytester, monkeypatch) -> None:
    starts = pytester.path / "starts"
    monkeypatch.setenv("STARTS_FILE", str(starts))
    pytester.makeconftest(KINDS)
    pytester.makepyfile(test_it=TEST)
    given = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--storage-embedded",
                                          "slowup", "--storage-embedded-start-timeout", "15m")
    assert given.ret == pytest.ExitCode.USAGE_ERROR
    assert "within 900 s, the tape door did not answer" in given.stdout.str() + given.stderr.str()
    assert starts.read_text().split() == ["900.0"]  # one start, with the option's deadline
    starts.unlink()
    default = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--storage-embedded",
                                            "slowup")
    assert default.ret == pytest.ExitCode.USAGE_ERROR
    assert starts.read_text().split() == ["300.0"]  # the class's own deadline


def test_a_kind_without_a_deadline_is_refused_before_its_start(pytester, monkeypatch) -> None:
    starts = pytester.path / "starts"
    monkeypatch.setenv("STARTS_FILE", str(starts))
    pytester.makeconftest(KINDS)
    pytester.makepyfile(test_it=TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--storage-embedded",
                                           "nodeadline", "--storage-embedded-start-timeout",
                                           "10m")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output[-2000:]
    assert ("--storage-embedded-start-timeout: the embedded nodeadline takes no start "
            "deadline") in output and "Traceback" not in output
    assert not starts.exists()


def test_the_dcache_over_hosts_and_side_b_are_given_the_deadline() -> None:
    from pytest_storagescale.config import Setting
    from pytest_storagescale.paired import _settings_b
    from pytest_storagescale.servers.dcache_hosts import EmbeddedDCacheHosts

    settings = Settings.from_values({
        "storage_embedded": Setting("dcache", "--storage-embedded"),
        "storage_embedded_version": Setting("10.2.25", "--storage-embedded-version"),
        "storage_embedded_start_timeout": Setting(900.0, "--storage-embedded-start-timeout"),
        "storage_compare_with": Setting("11.2.5", "--storage-compare-with")})
    assert EndpointUnderTest(settings)._server_class() == {
        "options": {"startup_timeout": 900.0}}
    hosts = EndpointUnderTest(settings.with_value("embedded_hosts", 4, "test"))._server_class()
    assert hosts == {"server_class": EmbeddedDCacheHosts,
                     "options": {"hosts": 4, "startup_timeout": 900.0}}
    assert EmbeddedDCacheHosts(hosts=4, startup_timeout=900.0).startup_timeout == 900.0
    side_b = _settings_b(SimpleNamespace(settings=settings, endpoint=None))
    assert side_b.embedded_version == "11.2.5" and side_b.embedded_start_timeout == 900.0
    assert EndpointUnderTest(side_b)._server_class() == {"options": {"startup_timeout": 900.0}}
    unset = settings.with_value("embedded_start_timeout", None, "default")
    assert EndpointUnderTest(unset)._server_class() == {}  # the class's own deadline


def test_only_a_start_that_ran_out_of_time_names_the_option() -> None:
    hint = start_timeout_hint("within 300 s, the tape door did not answer (refused)")
    assert "--storage-embedded-start-timeout" in hint and "15m" in hint
    assert start_timeout_hint("its JVM exited with code 1") == ""


def test_zookeepers_wait_grows_with_the_deadline() -> None:
    """ZooKeeper's wait is part of the start's: 120 s of the default 300 (as before),
    more of a longer deadline (its failure names the option, which must help it)."""
    from pytest_storagescale.servers.dcache import zookeeper_wait_s

    assert zookeeper_wait_s(300.0) == 120.0
    assert zookeeper_wait_s(900.0) == 360.0
    assert zookeeper_wait_s(20.0) == 20.0
