"""The one place where credentials are taken out of text.

Two means, applied together by :func:`redact_text`:

* **what the session holds**: every credential is registered when it becomes known
  (the settings are resolved, a driver is built, in every process and on every host,
  an embedded server mints a token): URL passwords, token values and the contents of
  token files, secret driver option values, the PEM blocks of proxies and keys. Each
  is replaced wherever it appears, also percent-, HTML- or JSON-escaped;
* **what a credential looks like**, for those the session never saw (a server's error
  page quoting a request): URL ``user:password@``, token query parameters,
  ``Authorization:`` headers, ``Bearer <token>``, ``"access_token": ...``, JWTs
  (``eyJ...``, whole or cut) and PEM blocks.

URL userinfo ends at the *last* ``@`` of the authority: Python's ``urlsplit`` splits
there, XRootD's ``XrdCl::URL`` at the first one, so the last removes what either takes
for a password. A ``/``, ``#``, ``?``, quote or space inside a password ends the
authority for every client library; such a URL (``user:pa/ss@host``: a "port" that is no
number) is redacted up to the last ``@`` before the next URL on its line: more than the
password, never less.

Every text that came from a server or a client library goes through :func:`redact_text`
before it is printed or stored: :class:`~pytest_storagescale.errors.StorageError`
messages, step records' error examples, failure messages and captured output
(:func:`redact_report`), the JSON results, the benchmark JSON, the HTML report and the
Allure files. Command lines go through :func:`redact_argv`.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote

#: ``scheme://``: where a URL starts
_SCHEME = re.compile(r"[A-Za-z][\w+.-]*://")
#: what ends a URL's authority for the client libraries (and for text around it)
_AUTHORITY_END = re.compile(r"[/?#\s'\"<>\\]")
_WHITESPACE = re.compile(r"\s")
#: what may follow a URL in a sentence without being part of it
_SENTENCE_END = ".,;:!)]}"

#: an authority without userinfo: a host (or ``[IPv6]``) and an optional numeric port
_PLAIN_AUTHORITY = re.compile(r"(?:\[[^\]]*\]?|[^:@]*)(?::\d*)?")
#: query parameters that carry a bearer token or an XRootD authorization
_SECRET_QUERY = re.compile(
    r"(?i)([?&](?:authz|access_token|bearer_token|token|xrd\.gsiusrpxy)=)[^&#\s]*")
#: credential-looking text a server or library may quote, each with the words (lower
#: case) without which it cannot match: checked first, as errors come by the thousand
_PATTERNS = (
    # Authorization: Bearer <x>  /  "Proxy-Authorization": "Basic <x>"
    (("authorization",),
     re.compile(r"(?i)(\b(?:proxy-|transferheader)?authorization\b[\"']?\s*[:=]\s*[\"']?)"
                r"((?:bearer|basic|negotiate|digest|token|aws4-hmac-sha256)\s+)?[^\s\"',;]+"),
     r"\1\2***"),
    (("cookie", "x-auth-token"),
     re.compile(r"(?i)(\b(?:x-auth-token|cookie|set-cookie)\b\s*:\s*)[^\s\"',;]+"), r"\1***"),
    (("bearer",), re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{12,}"), r"\1***"),
    # "access_token": "<x>", password=<x>
    (("_token", "secret", "passw"),
     re.compile(r"(?i)([\"']?\b(?:access_token|refresh_token|id_token|bearer_token|"
                r"client_secret|password|passwd)\b[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,;}]+"),
     r"\1***"),
    # a JWT (a WLCG or SciToken, an OIDC access token) none registered: three base64url
    # parts, the first two JSON objects ("eyJ"), whole or cut; also one whose header and
    # payload the registry took already (a cut token: its signature's rest)
    (("eyj", "***.***."),
     re.compile(r"(?:\beyJ[A-Za-z0-9_-]{6,}|\*\*\*)\.(?:eyJ[A-Za-z0-9_-]*|\*\*\*)"
                r"(?:\.[A-Za-z0-9_-]*)?"),
     "***"),
    # a PEM block (a private key, a proxy), cut or whole
    (("-----begin",),
     re.compile(r"(-----BEGIN ([A-Z0-9 ]+)-----).*?(?:-----END \2-----|\Z)", re.S),
     r"\1 *** -----END \2-----"),
)
_DRIVER_OPTION = "--storage-driver-option"
_OVERRIDE_INI = ("-o", "--override-ini")
#: ini keys whose values are credentials (the header and the argv show no value)
SECRET_INI_KEYS = ("storage_driver_options",)
#: driver options whose value is a path: the file's credential is registered instead
CREDENTIAL_FILE_OPTIONS = ("x509_proxy", "x509_user_key", "x509_user_cert")
#: driver options holding paths or settings, never secrets
_PLAIN_OPTIONS = ("ca_dir", "krb5ccname", "krb5_config", "security_protocol",
                  *CREDENTIAL_FILE_OPTIONS)
#: words in a driver option's key that make its value a secret
_SECRET_KEY_WORDS = re.compile(r"(?i)token|pass|secret|auth|cred|key|cookie")
#: environment variables holding a credential, and those naming a file holding one
_SECRET_ENVIRONMENT = ("BEARER_TOKEN",)
_CREDENTIAL_FILE_ENVIRONMENT = ("BEARER_TOKEN_FILE", "X509_USER_PROXY", "X509_USER_KEY")
#: shorter values are not registered: replacing them everywhere would garble text
MIN_SECRET_LENGTH = 4
_PEM_BODY = re.compile(r"-----BEGIN [A-Z0-9 ]+-----(.*?)-----END [A-Z0-9 ]+-----", re.S)
_MAX_CREDENTIAL_FILE = 1 << 20
_DATA_URI = re.compile(r"(data:[\w/+.-]+;base64,[A-Za-z0-9+/=]+)")


class SecretRegistry:
    """The credentials this process has seen: each value and its escaped forms."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()
        self._pattern: re.Pattern[str] | None = None
        #: counts the changes (a cached redaction is of one generation)
        self.generation = 0

    def add(self, value: str | None) -> None:
        value = (value or "").strip()
        if len(value) < MIN_SECRET_LENGTH:
            return
        forms = {value, quote(value, safe=""), html.escape(value), json.dumps(value)[1:-1]}
        with self._lock:
            if forms <= self._values:
                return
            self._values |= forms
            longest_first = sorted(self._values, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, longest_first)))
            self.generation += 1

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._pattern = None
            self.generation += 1

    def sub(self, text: str) -> str:
        pattern = self._pattern
        return pattern.sub("***", text) if pattern is not None else text


#: one per process: shard processes and cluster hosts register as they build drivers
SECRETS = SecretRegistry()
_FILES_READ: set[tuple[str, int, int]] = set()


def register_secret(value: str | None) -> None:
    """Never print ``value`` (a token, a password) from now on in this process; a JWT's
    signed parts are registered each too (a server may quote a cut token)."""
    SECRETS.add(value)
    for part in (value or "").strip().split("."):
        if len(part) >= 16:
            SECRETS.add(part)


def register_url(url: str | None) -> None:
    """Register the password of ``url``'s userinfo (as written, decoded, and as HTTP
    basic authentication sends it)."""
    if not url:
        return
    match = _SCHEME.search(url)
    if match is None:
        return
    userinfo = _userinfo_end(url, match.end(), len(url))
    if userinfo is None:
        return
    user, _, password = url[match.end():userinfo - 1].partition(":")
    for written in {password, unquote(password)}:
        register_secret(written)
    basic = f"{unquote(user)}:{unquote(password)}".encode()
    register_secret(base64.b64encode(basic).decode())


def register_file(path: str | os.PathLike[str] | None) -> None:
    """Register the credential a file holds: each PEM block's lines (a proxy, a key), or
    else its whole text (a token file). Unreadable files are left to the driver's own
    check, which names them."""
    if not path:
        return
    try:
        with open(path, "rb") as stream:
            status = os.fstat(stream.fileno())
            seen = (os.fspath(path), status.st_mtime_ns, status.st_size)
            if seen in _FILES_READ:  # every client's driver registers the same proxy
                return
            text = stream.read(_MAX_CREDENTIAL_FILE).decode("ascii", "replace")
    except OSError:
        return
    _FILES_READ.add(seen)
    blocks = _PEM_BODY.findall(text)
    for body in blocks:
        register_secret("".join(body.split()))
        for line in body.split():
            if len(line) >= 16:
                register_secret(line)
    if not blocks:
        register_secret(text)


def secret_option(key: str, secret_keys: Iterable[str] = ()) -> bool:
    """Whether a driver option's value is a credential: one of the driver's
    ``secret_options``, or a key that names one (``token``, ``password``, ``*_key``);
    never a path or a setting (``ca_dir``, ``krb5ccname``, ``x509_proxy``: a file's
    path, whose contents are registered instead)."""
    return key in set(secret_keys) or (key not in _PLAIN_OPTIONS
                                       and bool(_SECRET_KEY_WORDS.search(key)))


def register_driver_options(options: Mapping[str, str],
                            secret_keys: Iterable[str] = ()) -> None:
    """Register the credentials among driver options: the values of ``secret_keys``
    (a driver's ``secret_options``) and of keys that name one (``token``, ``password``,
    ``*_key``...), the files the credential-file options point at, and the credentials
    the client libraries take from the environment."""
    secret = set(secret_keys)
    for key, value in options.items():
        if key in CREDENTIAL_FILE_OPTIONS:
            register_file(str(value))
        elif secret_option(key, secret):
            register_secret(str(value))
    for variable in _SECRET_ENVIRONMENT:
        register_secret(os.environ.get(variable))
    for variable in _CREDENTIAL_FILE_ENVIRONMENT:
        register_file(os.environ.get(variable))


def _plain_authority(authority: str) -> bool:
    """Whether ``authority`` is a host and an optional numeric port, the punctuation of
    the sentence around it aside (``root://host:1094),`` keeps its port)."""
    return _PLAIN_AUTHORITY.fullmatch(authority.rstrip(_SENTENCE_END)) is not None


def _userinfo_end(text: str, start: int, stop: int) -> int | None:
    """Where the userinfo of the URL whose authority starts at ``start`` ends (just
    after its last ``@``), or None when it has none. ``stop``: the next URL or the end.

    An authority with an ``@``, or a "port" that is no number (``user:pa/ss@host``),
    has userinfo; since a ``/`` or ``#`` in a password ends the authority, it runs to
    the last ``@`` of the URL (and of the line, when a space or quote ended the
    authority: a space inside the password)."""
    end = _AUTHORITY_END.search(text, start, stop)
    authority = text[start:end.start() if end else stop]
    if "@" not in authority and _plain_authority(authority):
        return None
    line_end = text.find("\n", start, stop)
    limit = stop if line_end < 0 else line_end
    if end is not None and end.group() in "/?#\\":  # no space: the URL's own token
        token_end = _WHITESPACE.search(text, end.start(), limit)
        limit = token_end.start() if token_end else limit
    at = text.rfind("@", start, limit)
    return at + 1 if at >= 0 else None


def _strip_userinfo(text: str) -> str:
    urls = list(_SCHEME.finditer(text))
    if not urls:
        return text
    shown, position = [], 0
    for index, url in enumerate(urls):
        start = url.end()
        if start < position:
            continue
        stop = urls[index + 1].start() if index + 1 < len(urls) else len(text)
        cut = _userinfo_end(text, start, max(stop, start))
        if cut is not None:
            shown.append(text[position:start])
            position = cut
            continue
        # "user:pass" with no @ after it (a text cut, a URL split at a # or /):
        # whatever follows the colon may be a password, never a port
        end = _AUTHORITY_END.search(text, start, max(stop, start))
        authority = text[start:end.start() if end else max(stop, start)]
        if not _plain_authority(authority) and not authority.startswith("["):
            colon = start + authority.index(":") + 1
            shown.append(text[position:colon] + "***")
            position = colon + len(authority.partition(":")[2])
    shown.append(text[position:])
    return "".join(shown)


def redact_url(text: str) -> str:
    """``text`` without URL userinfo and with token query values as ``***``."""
    if "://" in text:
        text = _strip_userinfo(text)
    return _SECRET_QUERY.sub(r"\1***", text) if "=" in text else text


def redact_text(text: str) -> str:
    """``text`` (a server's answer, a library's message, a report) with every
    credential the session holds and every credential-looking part as ``***``."""
    if not text:
        return text
    if len(text) > _CACHED_LENGTH:
        return _redacted(text, SECRETS.generation)
    return _redacted_cached(text, SECRETS.generation)


def _redacted(text: str, generation: int) -> str:
    """:func:`redact_text` with the registry as it is at ``generation``."""
    text = redact_url(SECRETS.sub(text))
    lower = text.lower()
    for words, pattern, replacement in _PATTERNS:
        if any(word in lower for word in words):
            text = pattern.sub(replacement, text)
    return text


#: errors come by the thousand with the same few texts (the step's endpoint, a
#: status): each is redacted once per registry generation
_redacted_cached = functools.lru_cache(maxsize=4096)(_redacted)
_CACHED_LENGTH = 1000


def redact_html(page: str) -> str:
    """An HTML page redacted, its embedded images (``data:...;base64,``) left whole:
    a short secret could otherwise match inside one and break it."""
    parts = _DATA_URI.split(page)
    return "".join(part if index % 2 else redact_text(part) for index, part in enumerate(parts))


def redact_data(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings) with every string redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact_data(k): redact_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_data(v) for v in value]
    return value


def redact_exception(exc: BaseException | None) -> None:
    """Redact, in place, the message of ``exc`` and of the exceptions it was raised from
    or during: what every report of it (terminal, JUnit, Allure) is built from. An
    attribute an exception class does not let be set is left (its report's text is
    still redacted by :func:`redact_report`)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for name in ("msg", "message"):  # pytest.fail and the step outcomes; StorageError
            message = getattr(exc, name, None)
            if isinstance(message, str):
                _set(exc, name, redact_text(message))
        _set(exc, "args", tuple(redact_text(a) if isinstance(a, str) else a for a in exc.args))
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [redact_text(n) if isinstance(n, str) else n for n in notes]
        exc = exc.__cause__ or exc.__context__


def _set(exc: BaseException, name: str, value: Any) -> None:
    try:
        setattr(exc, name, value)
    except (AttributeError, TypeError):
        pass


def redact_report(report: Any) -> None:
    """Redact a test report's failure text and captured output (stdout, stderr, log)."""
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        report.longrepr = (*report.longrepr[:-1], redact_text(str(report.longrepr[-1])))
    elif report.longrepr is not None:
        text = str(report.longrepr)
        shown = redact_text(text)
        if shown != text:
            report.longrepr = shown
    report.sections = [(title, redact_text(content)) for title, content in report.sections]


def redact_option(item: str) -> str:
    """A driver option as ``key=***`` (the key only, when it is not key=value)."""
    key, sep, _ = item.partition("=")
    return f"{key}=***" if sep else "***"


def _redact_ini(item: str) -> str:
    """An ``-o name=value`` override: a credential setting's value hidden, URLs redacted."""
    name, sep, value = item.partition("=")
    if sep and name.strip() in SECRET_INI_KEYS:
        return f"{name}=***"
    return redact_text(item)


def _redact_arg(arg: str) -> str | None:
    """One argument's redacted form when it carries its own value, else None."""
    flags = ((_DRIVER_OPTION, redact_option), *((o, _redact_ini) for o in _OVERRIDE_INI))
    for flag, redact in flags:
        if arg.startswith(flag + "="):
            return f"{flag}={redact(arg[len(flag) + 1:])}"
    if arg.startswith("-o") and not arg.startswith("--") and len(arg) > 2:
        return f"-o{_redact_ini(arg[2:])}"  # -ostorage_driver_options=...
    return None


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with every driver option value and credential hidden: the
    option's own forms, the ini override ``-o``/``--override-ini``, URLs and every
    credential the session holds."""
    shown: list[str] = []
    next_value = None
    for arg in argv:
        if next_value is not None:
            shown.append(next_value(arg))
            next_value = None
        elif arg == _DRIVER_OPTION:
            shown.append(arg)
            next_value = redact_option
        elif arg in _OVERRIDE_INI:
            shown.append(arg)
            next_value = _redact_ini
        else:
            own = _redact_arg(arg)
            shown.append(own if own is not None else redact_text(arg))
    return shown
