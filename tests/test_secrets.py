"""No secret printed or recorded: a URL password and a token given as a driver option
appear in no output of a run (terminal, results JSON, HTML report, Allure files, JUnit
XML, pytest-benchmark JSON, captured output), nor in usage errors (issues 7 and 8); in
any variant (issue 22): a password holding ``@``, a space, ``/`` or ``#``, the ini
override ``-o``, a server's error page quoting the request's ``Authorization`` header,
a token the embedded server minted."""

from __future__ import annotations

import pytest
from hostile_http import HostileDoor, Reply, Request

from pytest_storagescale.errors import StorageError
from pytest_storagescale.redact import (
    redact_argv,
    redact_exception,
    redact_text,
    redact_url,
    register_driver_options,
    register_secret,
)

PASSWORD, TOKEN = "S3cr3tPW", "T0kenS3cret"
#: a password the client libraries split differently (``@``, a space): each piece is
#: long enough to be found by chance in no output (a PNG, base64 plots)
PIECES = ("K7pQw2Zx", "M4nRt8Vb", "J2hLs9Cd")
HARD_PASSWORD = f"{PIECES[0]}@{PIECES[1]} {PIECES[2]}"

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


@pytest.mark.parametrize("separator", ["@", " ", "/", "#", "@/#"])
@pytest.mark.parametrize("template", [
    "root://alice:{}@h:1094//area",
    "davs://alice:{}@[::1]:2880/area?x=1",
    "copy root://alice:{}@h//a to root://bob:{}@h2//b: refused",
])
def test_url_userinfo_ends_at_the_last_at_sign_before_the_host(separator, template):
    """``user:pass@word@host``: XrdCl splits at the first ``@``, urlsplit at the last;
    the last removes what either takes for a password. A ``/``, ``#`` or space in a
    password ends the authority for every library: redacted to the ``@`` before the host."""
    password = separator.join(PIECES)
    text = template.format(password, password)
    shown = redact_url(text)
    assert not any(piece in shown for piece in PIECES), shown
    assert shown == template.format("", "").replace("alice:@", "").replace("bob:@", "")


def test_a_url_without_userinfo_is_left_whole():
    for url in ("root://h//store/user@cern/x", "root://[::1]:1094//a", "file:///tmp/x@y",
                "root://[::1//area"):
        assert redact_url(url) == url
    # user:pass with no @ after it (a URL split at its # or /): never a port, maybe a secret
    assert redact_url(f"davs://alice:{PIECES[0]}//store") == "davs://alice:***//store"
    assert redact_url("http://h:abc/x") == "http://h:***/x"


def test_argv_hides_the_ini_override_forms():
    """``-o storage_driver_options=...`` (all its spellings) and ``-o
    storage_endpoint=`` with a password: no value in ``run.client.argv``."""
    url = f"root://alice:{HARD_PASSWORD}@h//a"
    argv = ["-o", f"storage_driver_options=token={TOKEN}",
            f"-ostorage_driver_options=token={TOKEN}",
            f"--override-ini=storage_driver_options=token={TOKEN}",
            "--override-ini", f"storage_driver_options=token={TOKEN}",
            "-o", f"storage_endpoint={url}", f"--override-ini=storage_endpoint={url}",
            f"--storage-endpoint={url}", "-p", "no:cacheprovider"]
    shown = redact_argv(argv)
    assert not any(secret in " ".join(shown) for secret in (TOKEN, *PIECES)), shown
    assert shown[:6] == ["-o", "storage_driver_options=***", "-ostorage_driver_options=***",
                         "--override-ini=storage_driver_options=***", "--override-ini",
                         "storage_driver_options=***"]
    assert shown[6:] == ["-o", "storage_endpoint=root://h//a",
                         "--override-ini=storage_endpoint=root://h//a",
                         "--storage-endpoint=root://h//a", "-p", "no:cacheprovider"]


KEY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"


@pytest.mark.parametrize("page", [
    "GET /a HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer {token}\r\nAccept: */*",
    '{{"headers": {{"Authorization": "Bearer {token}"}}}}',
    "denied: token {token} is not valid for /a",                  # no pattern: the registry
    "denied: token {quoted} is not valid for /a",                 # percent-encoded
    "proxy -----BEGIN RSA PRIVATE KEY-----\n" + KEY + "\n-----END RSA PRIVATE KEY----- bad",
    "proxy -----BEGIN PRIVATE KEY----- " + KEY,                   # cut by the server
    "https://h/a?access_token={token}&x=1 and access_token={token}",
])
def test_text_from_a_server_holds_no_credential(page, tmp_path):
    token = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJzc3VzZXIifQ.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"
    site = "s3cr3t/v@lue+"
    register_driver_options({"token": token, "site_password": site})
    page = page.format(token=token, quoted=site.replace("/", "%2F").replace("@", "%40")
                       .replace("+", "%2B"))
    shown = redact_text(page)
    for secret in (token, *token.split("."), site, KEY[:40], "s3cr3t%2Fv%40lue%2B"):
        assert secret not in shown, shown
    error = StorageError(page, driver="http", endpoint="davs://h", operation="stat", path="/a",
                         native_status=f"HTTP 403 {page}")
    assert token not in str(error) and KEY[:40] not in str(error)


def test_the_credential_files_are_registered(tmp_path, monkeypatch):
    """A proxy's PEM blocks (its key included) and a token file's content."""
    proxy, token_file = tmp_path / "proxy.pem", tmp_path / "token"
    lines = ["QmFzZTY0TGluZU9mQVByb3h5S2V5QmxvY2tOdW1iZXJPbmU0", "U2Vjb25kTGluZU9mVGhlS2V5Ng"]
    proxy.write_text("-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(lines)
                     + "\n-----END RSA PRIVATE KEY-----\n")
    token_file.write_text("TokenFromTheFile1234\n")
    monkeypatch.setenv("BEARER_TOKEN_FILE", str(token_file))
    register_driver_options({"x509_proxy": str(proxy), "ca_dir": "/etc/grid-security"})
    shown = redact_text(f"line {lines[1]} of {lines[0]} with TokenFromTheFile1234 in "
                        f"/etc/grid-security")
    assert shown == "line *** of *** with *** in /etc/grid-security"


def test_an_exception_is_redacted_in_place_with_its_chain():
    """What the reports are built from: the exception, its cause and context, its
    notes; an attribute its class will not let be set is left, never an error."""
    register_secret(TOKEN)

    class ReadOnly(Exception):
        @property
        def message(self) -> str:
            return f"refused {TOKEN}"

    try:
        try:
            raise KeyError(f"Authorization: Bearer {TOKEN}")
        except KeyError as cause:
            error = ReadOnly(f"refused {TOKEN}")
            error.add_note(f"token {TOKEN}")
            raise error from cause
    except ReadOnly as caught:
        redact_exception(caught)
        assert caught.args == ("refused ***",) and caught.__notes__ == ["token ***"]
        assert caught.__cause__.args == ("Authorization: Bearer ***",)


def _suite(pytester, suite: str, plan: str = PLAN) -> None:
    """The suite's test file and its thresholds folder ``thr``."""
    folder = pytester.path / "thr" / "xrootd"
    folder.mkdir(parents=True)
    (folder / "t.toml").write_text(plan)
    pytester.makepyfile(test_suite=suite)


def _outputs(pytester, result) -> dict[str, str]:
    """Every output of a run: the terminal and every file it wrote (not the suite)."""
    outputs = {"stdout": result.stdout.str(), "stderr": result.stderr.str()}
    files = [p for p in pytester.path.rglob("*") if p.is_file() and p.suffix != ".py"
             and p.name != "minted"]
    outputs.update({str(p): p.read_text(errors="replace") for p in files})
    return outputs


def _assert_no_secret(outputs: dict[str, str], secrets) -> None:
    for where, text in outputs.items():
        for secret in secrets:
            assert secret not in text, f"{secret!r} is in {where}"


#: every output of a run, asked for
OUTPUT_ARGS = ("--storage-results=r.json", "--storage-report=report",
               "--storage-benchmark-json=bench.json", "--alluredir=allure",
               "--junitxml=junit.xml", "-p", "no:cacheprovider", "-v", "-rA")


def _assert_every_output_written(outputs: dict[str, str]) -> None:
    names = {where.rsplit("/", 1)[-1] for where in outputs}
    assert {"r.json", "index.html", "bench.json", "junit.xml"} <= names
    assert any("/allure/" in where for where in outputs)


@pytest.mark.integration
@pytest.mark.parametrize("how", ["options", "ini override", "override-ini", "-n 2"])
def test_no_output_of_a_run_holds_a_secret(pytester, embedded_xrootd, how):
    """Each variant through every output: a password with ``@`` and a space, a token
    given as ``--storage-driver-option``, ``-o`` or ``--override-ini``; under xdist
    (the workers' reports and steps, the controller's files)."""
    _suite(pytester, SUITE)
    password = PASSWORD if how == "options" else HARD_PASSWORD
    url = embedded_xrootd.url.replace("root://", f"root://alice:{password}@")
    given = {
        "options": [f"--storage-endpoint={url}", "--storage-driver-option", f"token={TOKEN}"],
        "ini override": ["-o", f"storage_endpoint={url}",
                         "-o", f"storage_driver_options=token={TOKEN}"],
        "override-ini": [f"--override-ini=storage_endpoint={url}",
                         f"--override-ini=storage_driver_options=token={TOKEN}"],
        "-n 2": ["-n", "2", f"--storage-endpoint={url}",
                 f"--storage-driver-option=token={TOKEN}"],
    }[how]
    result = pytester.runpytest_subprocess(*given, "--storage-thresholds=thr", *OUTPUT_ARGS)
    # the rate rule cannot hold: the failure message and the table are printed too
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*storage_driver_options: token=[*][*][*] *"])
    outputs = _outputs(pytester, result)
    _assert_every_output_written(outputs)
    _assert_no_secret(outputs, (TOKEN, password, *(PIECES if how != "options" else ())))


@pytest.mark.parametrize("args", [
    [f"--storage-endpoint=root://alice:{PASSWORD}@h:x//area"],       # bad port
    [f"--storage-endpoint=root://alice:{PASSWORD}@h:1094"],          # no test area
    [f"--storage-endpoint=gopher://alice:{PASSWORD}@h/area"],        # unknown scheme
    ["--storage-driver-option", TOKEN],                              # a bare token pasted
    ["--storage-endpoint=memory://h/area", "--storage-driver-option", f"tokn={TOKEN}"],
    # a / or # in the password: no client library reads this URL (urlsplit takes the
    # text before the / for the host and port); its display still shows no piece of it
    [f"--storage-endpoint=root://alice:{'/'.join(PIECES)}@h:1094//area"],
    [f"--storage-endpoint=davs://alice:{'#'.join(PIECES)}@h/area"],
    ["-o", f"storage_endpoint=root://alice:{PIECES[0]}/{PIECES[1]}@h"],
])
def test_usage_errors_name_no_secret(pytester, args):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert "ERROR:" in text
    _assert_no_secret({"the terminal": text}, (PASSWORD, TOKEN, *PIECES))


def _echo_the_request(request: Request) -> Reply | None:
    """A read of a path naming ``hostile`` or the stat step's target: a 403 page that
    quotes the request, its ``Authorization`` header first (as some servers' error pages
    do); anything else goes through to the real door."""
    if request.method not in ("PROPFIND", "HEAD", "GET") or not (
            "hostile" in request.path or "stat-target" in request.path):
        return None
    headers = "\n".join(f"{name}: {value}" for name, value in request.headers.items())
    page = (f"<html><body><h1>403 Forbidden</h1><p>refused: Authorization: "
            f"{request.headers.get('authorization', '')}</p><pre>{request.method} "
            f"{request.path}\n{headers}</pre></body></html>")
    return Reply(403, {"Content-Type": "text/html"}, page.encode())


@pytest.fixture
def echoing_door(embedded_xrootd, tmp_path):
    """The embedded xrootd's davs door behind :func:`_echo_the_request`, as the URL of
    the test area."""
    with HostileDoor(embedded_xrootd.authority, tmp_path,
                     f"https://127.0.0.1:{embedded_xrootd.http_port}",
                     embedded_xrootd.ca_dir, _echo_the_request) as door:
        yield door.url(embedded_xrootd.https_url.rsplit(str(embedded_xrootd.http_port), 1)[1])


HOSTILE_PLAN = PLAN.replace('"rate_hz >= 1000000000"', '"rate_hz >= 0"')
HOSTILE_SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()

def test_refused(storage_client, storage_test_dir):
    storage_client.stat(f"{storage_test_dir}/hostile")
"""


@pytest.mark.integration
def test_a_server_quoting_the_request_leaks_no_credential(pytester, embedded_xrootd,
                                                          echoing_door):
    """The door's 403 page quotes the ``Authorization`` header (the token, or the basic
    login of the URL's password): the failure message, the step's error example and
    every output show ``***``, never the credential."""
    _suite(pytester, HOSTILE_SUITE, HOSTILE_PLAN)
    url = echoing_door.replace("davs://", f"davs://alice:{HARD_PASSWORD}@")
    result = pytester.runpytest_subprocess(
        f"--storage-endpoint={url}", "--storage-driver-option", f"token={TOKEN}",
        "--storage-driver-option", f"ca_dir={embedded_xrootd.ca_dir}",
        "--storage-thresholds=thr", *OUTPUT_ARGS)
    result.assert_outcomes(failed=2)  # the step's stats and the functional stat: 403
    outputs = _outputs(pytester, result)
    _assert_every_output_written(outputs)
    _assert_no_secret(outputs, (TOKEN, HARD_PASSWORD, *PIECES))
    # the page was quoted, redacted: in the failure, the JUnit XML and the step's example
    for where in ("stdout", str(pytester.path / "junit.xml"), str(pytester.path / "r.json")):
        assert "Authorization: Bearer ***" in outputs[where], where


MINTED_SUITE = SUITE + """
import pathlib

def test_quoted(storage_endpoint):
    token = storage_endpoint.driver_spec.options["token"]
    pathlib.Path("minted").write_text(token)
    print(f"the door said: {token} is refused")
    raise RuntimeError(f"the door said: {token} is refused")
"""


@pytest.mark.integration
@pytest.mark.slow_server
def test_a_token_the_embedded_server_minted_is_in_no_output(pytester):
    """The embedded xrootd's token login: the token it mints is registered, so a
    library's message or captured output quoting it bare (no ``Bearer``, no header:
    nothing a pattern could find) shows ``***`` in every output."""
    _suite(pytester, MINTED_SUITE)
    result = pytester.runpytest_subprocess("--storage-embedded-login", "token",
                                           "--storage-thresholds=thr", *OUTPUT_ARGS)
    result.assert_outcomes(passed=1, failed=2)
    token = (pytester.path / "minted").read_text()
    assert token.count(".") == 2  # a JWT: its signed parts are registered each too
    outputs = _outputs(pytester, result)
    _assert_every_output_written(outputs)
    _assert_no_secret(outputs, (token, *token.split(".")[1:]))
    result.stdout.fnmatch_lines(["*RuntimeError: the door said: [*][*][*] is refused*"])


@pytest.mark.integration
def test_a_collection_error_quoting_a_credential_shows_none(pytester, embedded_xrootd):
    """A module whose import fails with a message quoting the session's token (a
    library's error at import time): the collection error shows ``***``."""
    pytester.makepyfile(test_broken=f'raise RuntimeError("refused: " + {TOKEN[:5]!r} + '
                                    f'{TOKEN[5:]!r})')
    result = pytester.runpytest_subprocess(
        f"--storage-endpoint={embedded_xrootd.url}", "--storage-driver-option",
        f"token={TOKEN}", "--junitxml=junit.xml", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*RuntimeError: refused: [*][*][*]*"])
    _assert_no_secret(_outputs(pytester, result), (TOKEN,))
