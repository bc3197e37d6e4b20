"""Settings resolved once per session: option > environment > ini > default.

Every setting remembers where its value came from, so the pytest header can say
``storage_endpoint: root://... (from --storage-endpoint)``. Parsers raise
:class:`~pytest_storagescale.errors.StorageScaleUsageError` naming the value, what is
valid and how to fix it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import pytest

from .errors import StorageScaleUsageError
from .limits import check_clients
from .redact import (
    redact_option,
    redact_url,
    register_driver_options,
    register_file,
    register_url,
    secret_option,
)
from .shipped import shipped_thresholds
from .units import parse_duration

#: the embedded server's settings whose values are names the servers' registry knows
#: (``servers/family.py``: the kinds, logins and protocols registered): config parses
#: them as names only, and imports no server; the plugin checks the names given against
#: the registry once the settings are resolved (:meth:`Settings.check_choices`)
EMBEDDED_CHOICES = ("storage_embedded", "storage_embedded_login",
                    "storage_embedded_protocol")


def parse_name(value: str, *, what: str) -> str:
    """A name (lower-cased); which names exist is checked by :meth:`Settings.check_choices`."""
    return parse_text(value, what=what).lower()


def parse_clients(value: str, *, what: str = "--storage-clients") -> tuple[int, ...]:
    """Parse a comma-separated list of concurrencies such as ``5,50,200``."""
    items = [item.strip() for item in str(value).split(",") if item.strip()]
    try:
        clients = tuple(int(item) for item in items)
    except ValueError:
        clients = ()
    if not clients or any(c < 1 for c in clients):
        raise StorageScaleUsageError(
            f"{what}: {value!r} is not a list of client counts. Write positive whole "
            f"numbers separated by commas, e.g. --storage-clients 5,50,200."
        )
    for count in clients:
        check_clients(count, what=what)
    return clients


def parse_text(value: str, *, what: str) -> str:
    """A non-empty word, kept as written (surrounding blanks dropped)."""
    text = str(value).strip()
    if not text:
        raise StorageScaleUsageError(f"{what}: empty value. Give a value, or leave the "
                                     f"option out for its default.")
    return text


def parse_choice(value: str, choices: tuple[str, ...], *, what: str) -> str:
    """Accept one of ``choices`` (case-insensitive)."""
    normalized = str(value).strip().lower()
    if normalized not in choices:
        raise StorageScaleUsageError(
            f"{what}: unknown value {value!r}. Valid values: {', '.join(choices)}."
        )
    return normalized


def parse_baselines(value: str | list[str]) -> tuple[str, ...]:
    """Results files of earlier runs: the repeated ``--storage-baseline`` option's list,
    or one per line (or separated by spaces) in the environment or ini file."""
    parts = value if isinstance(value, list) else value.split()
    return tuple(part for part in (str(p).strip() for p in parts) if part)


def parse_executor(value: str) -> str:
    """One of the engine's executors (``threads``, ``processes``)."""
    from .load.executors import EXECUTORS  # light module: names and functions only

    return parse_choice(value, tuple(EXECUTORS), what="--storage-executor")


def parse_fraction(value: str | float, *, what: str) -> float:
    """A fraction in (0, 1]: ``0.9`` or ``90%``."""
    text = str(value).strip()
    try:
        fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        fraction = float("nan")
    if not 0 < fraction <= 1:
        raise StorageScaleUsageError(
            f"{what}: {value!r} is not a fraction of the client host's cores. Write a "
            f"number above 0 and at most 1, e.g. 0.9 or 90%."
        )
    return fraction


def parse_embedded_hosts(value: str | int) -> int:
    """``--storage-embedded-hosts``: a whole number of at least 1 (which counts a kind
    takes is its own check, at the start)."""
    try:
        hosts = int(str(value).strip())
    except ValueError:
        hosts = 0
    if hosts < 1:
        raise StorageScaleUsageError(
            f"--storage-embedded-hosts: {value!r} is not a number of hosts. Give a whole "
            f"number: 1 (the default), or 4 or more for the embedded dcache over several "
            f"hosts.")
    return hosts


def parse_start_timeout(value: str | float) -> float:
    """``--storage-embedded-start-timeout``: a duration (``15m``, ``900``)."""
    what = "--storage-embedded-start-timeout"
    try:
        return parse_duration(value, what=what)
    except StorageScaleUsageError as exc:
        raise StorageScaleUsageError(
            f"{exc} It is how long the embedded server may take to start before the run "
            f"stops (exit 4): give e.g. {what} 15m on a loaded machine, or leave it out "
            f"for the server's own deadline (dcache 300 s).") from None


def parse_driver(value: str) -> str:
    """``auto`` or a driver name; checked against the driver registry when the
    endpoint is first used (a site's conftest or package may register drivers)."""
    name = str(value).strip().lower()
    if not re.fullmatch(r"[a-z][a-z0-9_.-]*", name):
        raise StorageScaleUsageError(
            f"--storage-driver: {value!r} is not a driver name. Write auto (by URL scheme) "
            f"or a driver's name, e.g. xrootd, http, gfal2, local, memory."
        )
    return name


def parse_scale(value: str | float) -> float:
    """A plan scale in (0, 1]: ``0.05`` or ``5%``."""
    text = str(value).strip()
    try:
        scale = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        scale = float("nan")
    if not 0 < scale <= 1:
        raise StorageScaleUsageError(
            f"--storage-scale: {value!r} is not a plan scale. Write a fraction above 0 and "
            f"at most 1, e.g. 0.05 or 5% for a quick smoke run (1: the plan as written)."
        )
    return scale


def parse_flag(value: str | bool, *, what: str) -> bool:
    """A yes/no setting: the flag itself, or ``true``/``false`` (``1``/``0``,
    ``yes``/``no``) from the environment or the ini file."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise StorageScaleUsageError(
        f"{what}: {value!r} is not a yes/no value. Write true or false (1/0, yes/no)."
    )


def parse_driver_options(values: str | list[str] | tuple[str, ...]) -> dict[str, str]:
    """``key=value`` pairs (repeated option, or one per line in the ini file)."""
    items = values.splitlines() if isinstance(values, str) else list(values)
    options = {}
    for item in (i.strip() for i in items):
        if not item or item.startswith("#"):
            continue
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][\w.-]*", key.strip()):
            raise StorageScaleUsageError(
                f"--storage-driver-option: {redact_option(item)!r} is not key=value. Write "
                f"e.g. --storage-driver-option x509_proxy=/tmp/x509up_u1000 (one option per "
                f"flag; ini: storage_driver_options, one key=value per line)."
            )
        options[key.strip()] = value.strip()
    return options


def parse_doors(values: str | list[str] | tuple[str, ...]) -> dict[str, str]:
    """``NAME=URL`` doors of the storage besides ``--storage-endpoint`` (repeated
    option, or one per line in the ini file); the conformance suite runs over each."""
    items = values.splitlines() if isinstance(values, str) else list(values)
    doors = {}
    for item in (i.strip() for i in items):
        if not item or item.startswith("#"):
            continue
        name, sep, url = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z][\w.-]*", name.strip()) or "://" not in url:
            raise StorageScaleUsageError(
                f"--storage-door: {redact_url(item)!r} is not NAME=URL. Write e.g. "
                f"--storage-door davs=davs://host:2880/pnfs/test/storagescale (a name of "
                f"letters, digits, '.', '_' or '-'; ini: storage_doors, one per line)."
            )
        doors[name.strip()] = url.strip()
    return doors


#: ``--storage-load-doors all``: every door the storage offers
ALL_DOORS = "all"


def parse_load_doors(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """``all`` or door names separated by commas (checked against the storage's doors
    once the endpoint is known: :func:`.session.endpoint.load_door_names`)."""
    text = ",".join(value) if isinstance(value, (tuple, list)) else str(value)
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if names and all(re.fullmatch(r"[A-Za-z][\w.-]*(\+[a-z][a-z0-9_.-]*)?", n)
                     for n in names) and (ALL_DOORS not in names or len(names) == 1):
        return names
    raise StorageScaleUsageError(
        f"--storage-load-doors: {value!r} is not a list of door names. Write all, or the "
        f"doors' names separated by commas, e.g. --storage-load-doors root,davs (the "
        f"embedded server's doors, or the endpoint's scheme and the --storage-door names); "
        f"DOOR+CLIENT runs a door's steps through another client (driver), e.g. dcap+dccp."
    )


def parse_token_file(value: str, *, what: str) -> str:
    """A readable file holding a token (the path is kept: the token is read when used)."""
    path = Path(str(value)).expanduser()
    try:
        empty = not path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise StorageScaleUsageError(
            f"{what} {value}: cannot read it ({getattr(exc, 'strerror', None) or exc}). Give "
            f"a file holding one token (e.g. 'oidc-token <account> > FILE').") from None
    if empty:
        raise StorageScaleUsageError(f"{what} {value}: the file is empty. Give a file "
                                     f"holding one token.")
    return str(path)


def _parse_cluster(value: str) -> str:
    """A Dask scheduler address or cluster recipe (checked, kept as written)."""
    from .cluster.address import parse_cluster_address  # light: Dask is not imported

    return parse_cluster_address(value).text


@dataclass(frozen=True)
class Setting:
    """One resolved value and where it came from (for the header)."""

    value: Any
    source: str


# name -> (command-line flag, parser or None, default, help)
OPTIONS: dict[str, tuple[str, Callable[[str], Any] | None, Any, str]] = {
    "storage_endpoint": (
        "--storage-endpoint", None, None,
        "storage under test, e.g. root://host:1094//eos/test/storagescale; its path is "
        "the test area (a per-run directory is made under it). Default: start the "
        "embedded XRootD endpoint.",
    ),
    "storage_system": (
        "--storage-system", None, None,
        "storage system (xrootd, dcache, eos, gpfs, ceph, ...): which thresholds folder "
        "applies. Default: from the suite folder, else xrootd.",
    ),
    "storage_version": (
        "--storage-version", None, None,
        "storage version. Default: detected from the endpoint.",
    ),
    "storage_thresholds": (
        "--storage-thresholds", None, None,
        "thresholds file, or folder laid out as <system>/*.toml. Default: thresholds/ "
        "in the folder pytest is started from, else the thresholds shipped with the plugin.",
    ),
    "storage_clients": (
        "--storage-clients", parse_clients, None,
        "run only these concurrencies, e.g. 5,50 (overrides the thresholds file).",
    ),
    "storage_duration": (
        "--storage-duration", lambda v: parse_duration(v, what="--storage-duration"), None,
        "measured duration of every load step, e.g. 10s or 20m (overrides the file).",
    ),
    "storage_hang_timeout": (
        "--storage-hang-timeout",
        lambda v: parse_duration(v, what="--storage-hang-timeout"), None,
        "an operation running longer than this counts its client as hung (overrides "
        "the file).",
    ),
    "storage_results": (
        "--storage-results", None, None,
        "write JSON results to this file, each step within 2 s of its end.",
    ),
    "storage_report": (
        "--storage-report", None, None,
        "write a self-contained HTML report (table, scan plots, timelines, latency "
        "ECDFs) into this folder, for readers without Allure.",
    ),
    "storage_benchmark_json": (
        "--storage-benchmark-json", None, None,
        "also write the steps in pytest-benchmark's JSON format (for "
        "'pytest-benchmark compare').",
    ),
    "storage_history": (
        "--storage-history", lambda v: parse_history(v), None,
        "append the run (run info, verdicts, every step's figures and per-window "
        "samples) to this history: a SQLite file (made 0600) or a postgresql://USER:"
        "PASSWORD@HOST/DB URL; read it with 'storagescale history' (docs/history.md).",
    ),
    "storage_pushgateway": (
        "--storage-pushgateway", lambda v: parse_pushgateway(v), None,
        "push each step's figures (rate, p50/p99, failed, hung, throttled, dropped, "
        "verdict) as Prometheus metrics to this Pushgateway at the end of each step, e.g. "
        "http://127.0.0.1:9091 (docs/history.md).",
    ),
    "storage_openmetrics": (
        "--storage-openmetrics", None, None,
        "write each step's figures (the metrics --storage-pushgateway pushes) to this "
        "OpenMetrics text file at the session's end, e.g. for node_exporter's textfile "
        "collector (docs/history.md).",
    ),
    "storage_baseline": (
        "--storage-baseline", parse_baselines, None,
        "JSON results of an earlier run (e.g. the previous storage version) to compare "
        "each step with (the gate: docs/thresholds.md); repeatable: the runs are pooled, "
        "their spread is the site's noise (ini: one per line). Relative rules such as "
        "'rate_hz >= 0.9 * baseline' use the first.",
    ),
    "storage_accept": (
        "--storage-accept", lambda v: parse_accept(v), None,
        "the site's acceptance file (TOML, [[accept]] tables of test, from, to, reason): "
        "with --storage-baseline, a check whose outcome changed from the baseline's "
        "(passed -> xfailed, passed -> failed, a new error kind or throttling of a load "
        "step) fails the run unless this file lists the change with a reason.",
    ),
    "storage_compare_with": (
        "--storage-compare-with", lambda v: parse_compare_with(v), None,
        "paired comparison, both sides in one session: the second side B, a release of "
        "the embedded server (e.g. 6.2.1 beside the embedded 5.5.3) or the URL of a second "
        "storage's test area of the same kind (root://host:1095//data/test). Each closed-"
        "loop step is measured on both in alternating windows (A B B A) and judged B / A "
        "by the gate (docs/upgrade.md 'Paired: both versions in one run').",
    ),
    "storage_executor": (
        "--storage-executor", parse_executor, "auto",
        "how clients run: auto (default: threads while the clients fit in one process, "
        "else processes, each within the driver's clients per process), threads, or "
        "processes (spawned; hung ones killed).",
    ),
    "storage_client_cpu_limit": (
        "--storage-client-cpu-limit",
        lambda v: parse_fraction(v, what="--storage-client-cpu-limit"), 0.9,
        "a step whose client processes used more than this fraction of the client host's "
        "cores (metric client_cpu) measured the client host, not the storage: the table "
        "and the failure message say so. Default 0.9.",
    ),
    "storage_embedded": (
        "--storage-embedded", lambda v: parse_name(v, what="--storage-embedded"), None,
        "the server started on loopback when no --storage-endpoint is given (default "
        "xrootd). A suite's conftest may name the one that fits it.",
    ),
    "storage_embedded_version": (
        "--storage-embedded-version", lambda v: parse_text(v, what="--storage-embedded-version"),
        None,
        "which release of the embedded server to start, for kinds that offer several "
        "(e.g. dcache: 10.2.25, 11.2.5, or the path of a dcache-VERSION.tar.gz a site is "
        "about to deploy; xrootd: 5.5.3 or 6.2.1). Default: the kind's default release.",
    ),
    "storage_embedded_hosts": (
        "--storage-embedded-hosts", parse_embedded_hosts, 1,
        "on how many hosts the embedded server runs (dcache: 1, one domain, the default; "
        "4 or more: a core host with PostgreSQL and ZooKeeper, a door host and a pool host "
        "each for the rest, network namespaces on a private bridge, as root).",
    ),
    "storage_embedded_start_timeout": (
        "--storage-embedded-start-timeout", parse_start_timeout, None,
        "how long the embedded server may take to start, every door answering, e.g. 15m "
        "on a loaded machine (default: its kind's own: dcache 300 s, xrootd 120 s); a "
        "start that takes longer stops the run (exit 4) naming this option.",
    ),
    "storage_embedded_login": (
        "--storage-embedded-login", lambda v: parse_name(v, what="--storage-embedded-login"),
        "unix",
        "how clients log in to the embedded server: unix (default), krb5, gsi or token; "
        "the session makes the throwaway realm, certificates, proxy or token.",
    ),
    "storage_embedded_protocol": (
        "--storage-embedded-protocol",
        lambda v: parse_name(v, what="--storage-embedded-protocol"), None,
        "protocol the suites use on the embedded endpoint: root (xroot), davs/https "
        "(HTTPS/WebDAV, TLS verified against the session's throwaway CA) or gsiftp; "
        "default: the first the embedded server serves.",
    ),
    "storage_driver": (
        "--storage-driver", parse_driver, "auto",
        "client library: auto (by URL scheme), or a driver's name: xrootd, http, gfal2, local, "
        "memory, or one a site registered.",
    ),
    "storage_driver_options": (
        "--storage-driver-option", parse_driver_options, None,
        "key=value for the driver, repeatable: credentials and client settings, e.g. "
        "x509_proxy=PATH, token=..., krb5ccname=FILE, ca_dir=DIR. Values are never printed.",
    ),
    "storage_scale": (
        "--storage-scale", parse_scale, 1.0,
        "run every plan at this scale, e.g. 0.05: shorter steps, fewer clients, smaller "
        "files (a smoke run of a suite that normally takes hours); stated in the header "
        "and the results.",
    ),
    "storage_clean_stale": (
        "--storage-clean-stale", lambda v: parse_flag(v, what="storage_clean_stale"), None,
        "remove the run directories that killed runs left in the test area (only this "
        "user's, proved by the owner file's HMAC: see docs/guarantees.md) before the "
        "first test uses the storage.",
    ),
    "storage_doors": (
        "--storage-door", parse_doors, None,
        "NAME=URL: another door of the same storage (e.g. davs=davs://host:2880/path "
        "next to a root:// endpoint), repeatable; the conformance suite runs its checks "
        "through every door and across them.",
    ),
    "storage_load_doors": (
        "--storage-load-doors", parse_load_doors, None,
        "the doors the load steps run over: all, or door names separated by commas (e.g. "
        "root,davs: the embedded server's doors, or the endpoint's scheme and the "
        "--storage-door names); each load test runs once per door (test id [c10-davs]). "
        "DOOR+CLIENT: that door through the driver CLIENT (e.g. dcap+dccp, "
        "gsiftp+globus-url-copy: the seeds' own command-line clients). "
        "Default: the endpoint's own door only.",
    ),
    "storage_tpc_peer": (
        "--storage-tpc-peer", None, None,
        "URL of a second storage's writable area for the third-party-copy checks (root:// "
        "and/or davs://, repeatable; ini: one per line). Default: a second embedded xrootd "
        "when the storage under test is the embedded one; a remote storage without it "
        "skips them, saying so.",
    ),
    "storage_token_readonly": (
        "--storage-token-readonly",
        lambda v: parse_token_file(v, what="--storage-token-readonly"), None,
        "FILE holding a token with only storage.read:/ for the authorization checks of a "
        "remote storage (its write token is --storage-driver-option token); without it "
        "they skip. The embedded xrootd's token login mints its own.",
    ),
    "storage_token_expired": (
        "--storage-token-expired",
        lambda v: parse_token_file(v, what="--storage-token-expired"), None,
        "FILE holding an expired token of the storage's issuer, for the authorization "
        "check that it is refused (a remote storage; without it the check skips).",
    ),
    "storage_cluster": (
        "--storage-cluster", _parse_cluster, None,
        "run each step's clients on the hosts of a Dask cluster: a scheduler address "
        "(tcp://head:8786), local:N (N worker processes here), embedded-slurm:N (a SLURM "
        "cluster started for the run, N namespace hosts of this machine, root) or a "
        "dask-jobqueue recipe with its number of hosts (htcondor:20, slurm:20). Default: "
        "clients run here.",
    ),
    "storage_server_monitor": (
        "--storage-server-monitor", lambda v: _parse_listen_address(v), None,
        "host:port to listen on for a remote storage's XRootD summary monitoring (its "
        "servers' 'xrd.report HOST:PORT every 10s all sync'): each step then shows the "
        "requests the servers counted beside the clients' (server_ops); UDP, every "
        "sender counts: listen where only the servers reach. The embedded xrootd "
        "reports to a private Unix socket without it.",
    ),
}
def parse_accept(value: str) -> Any:
    """The acceptance file, read and checked now: a bad one is one usage error before
    any test (:func:`~.reporting.behaviour.load_acceptance`)."""
    from .reporting.behaviour import load_acceptance

    return load_acceptance(Path(parse_text(value, what="--storage-accept")).expanduser())


def parse_compare_with(value: str) -> str:
    """``--storage-compare-with``: a URL with a scheme and a path, or a release name
    (checked against the embedded server's releases once the session knows its kind:
    :func:`.paired.check_compare_with`)."""
    text = parse_text(value, what="--storage-compare-with")
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme) or "/" not in rest.strip("/"):
            raise StorageScaleUsageError(
                f"--storage-compare-with {text!r}: not a storage URL with a test-area path. "
                f"Give the second side's test area, e.g. root://127.0.0.1:1095//data/test, "
                f"or a release of the embedded server, e.g. 6.2.1.")
    elif not re.fullmatch(r"[0-9][0-9A-Za-z.+~_-]*", text) and not text.startswith("/"):
        raise StorageScaleUsageError(
            f"--storage-compare-with {text!r}: neither a storage URL nor a release. Give a "
            f"release of the embedded server (e.g. 6.2.1), an installation prefix, or the "
            f"URL of the second side's test area (e.g. root://127.0.0.1:1095//data/test).")
    return text


#: the history targets' URL schemes (:mod:`.history.store`); else a SQLite file's path
HISTORY_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg")


def parse_history(value: str) -> str:
    """``--storage-history``: a SQLite file's path or a URL of :data:`HISTORY_SCHEMES`
    (checked by its form; the database is opened at session start)."""
    text = parse_text(value, what="--storage-history")
    scheme, sep, rest = text.partition("://")
    if sep and (scheme.lower() not in HISTORY_SCHEMES or not rest.strip("/")):
        raise StorageScaleUsageError(
            f"--storage-history {redact_url(text)!r}: not a history this release keeps. "
            f"Give a SQLite file's path (e.g. --storage-history=history.sqlite), "
            f"sqlite:///PATH, or postgresql://USER:PASSWORD@HOST:PORT/DATABASE.")
    return text


def parse_pushgateway(value: str) -> str:
    """``--storage-pushgateway``: an http(s) URL of a Pushgateway (host, optional port)."""
    text = parse_text(value, what="--storage-pushgateway")
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise StorageScaleUsageError(
            f"--storage-pushgateway {redact_url(text)!r}: not a Pushgateway URL. Give "
            f"http://HOST:PORT or https://HOST:PORT, e.g. http://127.0.0.1:9091.")
    return text


def _parse_listen_address(value: str) -> str:
    from .load.server_monitor import parse_listen_address

    return parse_listen_address(value)


#: options given several times on the command line (their values are lists)
REPEATABLE = ("storage_driver_options", "storage_doors", "storage_tpc_peer",
              "storage_baseline")
#: options that are flags on the command line (no value)
FLAGS = ("storage_clean_stale",)
#: settings whose values are credentials or may hold them: the header shows no value
SECRET_SETTINGS = ("storage_driver_options",)
#: settings of the embedded server, which does not run when an endpoint is given
EMBEDDED_SETTINGS = ("storage_embedded", "storage_embedded_protocol",
                     "storage_embedded_login", "storage_embedded_version",
                     "storage_embedded_hosts", "storage_embedded_start_timeout")


def register_credentials(values: dict[str, Any]) -> None:
    """Every credential the settings hold (URL passwords, driver option secrets, token
    files) is taken out of every text this process prints or stores (redact.py)."""
    doors = values.get("storage_doors") or {}
    peers = values.get("storage_tpc_peer") or ()
    compared = values.get("storage_compare_with")
    for url in (values.get("storage_endpoint"), *doors.values(),
                *([compared] if compared and "://" in compared else []),
                *(peers.splitlines() if isinstance(peers, str) else peers)):
        register_url(str(url).strip() if url else None)
    register_url(values.get("storage_history"))
    register_url(values.get("storage_pushgateway"))
    register_driver_options(values.get("storage_driver_options") or {}, ("token",))
    for name in ("storage_token_readonly", "storage_token_expired"):
        register_file(values.get(name))


def _env_name(name: str) -> str:
    return name.upper().replace("STORAGE_", "STORAGESCALE_", 1)


def resolve_setting(config: pytest.Config, name: str,
                    entry: tuple[str, Callable[[str], Any] | None, Any, str] | None = None
                    ) -> Setting:
    """Resolve one setting: option > environment > ini > default (``entry``: a suite's
    own option, as :data:`OPTIONS` writes one; default: the plugin's ``name``)."""
    flag, parser, default, _ = entry or OPTIONS[name]
    candidates = (
        (config.getoption(name), flag),
        (os.environ.get(_env_name(name)) or None, f"${_env_name(name)}"),
        (config.getini(name) or None, f"ini {name}"),
    )
    for raw, source in candidates:
        if raw is not None and raw != []:
            return Setting(parser(raw) if parser else raw, source)
    return Setting(default, "default")


@dataclass(frozen=True)
class Settings:
    """All ``storage_*`` settings of a session, resolved and validated once: one typed
    field per option of :data:`OPTIONS` (the field is the option's name without
    ``storage_``), and where each value came from (``sources``, for the header)."""

    endpoint: str | None = None
    system: str | None = None
    version: str | None = None
    thresholds: str | None = None
    clients: tuple[int, ...] | None = None
    duration: float | None = None
    hang_timeout: float | None = None
    results: str | None = None
    report: str | None = None
    benchmark_json: str | None = None
    #: the history of runs (:mod:`.history`): a SQLite file or a database URL
    history: str | None = None
    #: the Pushgateway the steps' figures are pushed to (:mod:`.history.prometheus`)
    pushgateway: str | None = None
    #: the OpenMetrics text file of the steps' figures (:mod:`.history.prometheus`)
    openmetrics: str | None = None
    #: results files of earlier runs (``--storage-baseline``, repeatable)
    baseline: tuple[str, ...] | None = None
    #: the acceptance file, read and checked (:mod:`.reporting.behaviour`)
    accept: Any = None
    #: the second side of a paired comparison (:mod:`.paired`): a release or a URL
    compare_with: str | None = None
    executor: str = "auto"
    client_cpu_limit: float = 0.9
    embedded: str | None = None
    embedded_version: str | None = None
    embedded_hosts: int = 1
    #: the embedded server's start deadline in seconds (None: its kind's own)
    embedded_start_timeout: float | None = None
    embedded_login: str = "unix"
    embedded_protocol: str | None = None
    driver: str = "auto"
    driver_options: dict[str, str] | None = None
    scale: float = 1.0
    clean_stale: bool | None = None
    doors: dict[str, str] | None = None
    load_doors: tuple[str, ...] | None = None
    #: the command line's list, or the ini's lines
    tpc_peer: str | list[str] | None = None
    token_readonly: str | None = None
    token_expired: str | None = None
    cluster: str | None = None
    server_monitor: str | None = None
    #: where pytest was started: relative paths and the default thresholds/ are from here
    invocation_path: Path = Path(".")
    #: option name (``storage_endpoint``) -> where its value came from; "default" if absent
    sources: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        values = {name: resolve_setting(config, name) for name in OPTIONS}
        register_credentials({name: setting.value for name, setting in values.items()})
        return cls.from_values(values, Path(config.invocation_params.dir))

    @classmethod
    def from_values(cls, values: Mapping[str, Setting],
                    invocation_path: Path = Path(".")) -> Settings:
        """Settings of these resolved values (option name -> :class:`Setting`); the
        options not named keep their defaults."""
        unknown = set(values) - set(OPTIONS)
        if unknown:
            raise KeyError(f"not an option of OPTIONS: {', '.join(sorted(unknown))}")
        return cls(**{_field(name): setting.value for name, setting in values.items()},
                   invocation_path=invocation_path,
                   sources={name: setting.source for name, setting in values.items()})

    def with_value(self, name: str, value: Any, source: str) -> Settings:
        """These settings with ``storage_<name>`` set from ``source``."""
        return replace(self, **{name: value},
                       sources={**self.sources, f"storage_{name}": source})

    @property
    def values(self) -> dict[str, Setting]:
        """Option name -> its value and source, in the order of :data:`OPTIONS`."""
        return {name: Setting(getattr(self, _field(name)),
                              self.sources.get(name, "default")) for name in OPTIONS}

    def source(self, name: str) -> str:
        return self.sources.get(f"storage_{name}", "default")

    def check_choices(self, choices: Mapping[str, Callable[[], tuple[str, ...]]]) -> Settings:
        """These settings, once each setting named in ``choices`` that was given (not
        its default) is one of the names its callable returns (asked only then: the
        names of :data:`EMBEDDED_CHOICES` are the registered servers', which the plugin
        passes); a usage error naming the valid values otherwise."""
        for name, names in choices.items():
            if self.sources.get(name, "default") != "default":
                parse_choice(getattr(self, _field(name)), names(), what=OPTIONS[name][0])
        return self

    def thresholds_path(self) -> Path:
        """The thresholds file or folder: relative paths from where pytest was run."""
        return self.thresholds_origin()[0]

    def thresholds_origin(self) -> tuple[Path, str]:
        """The thresholds file or folder and why it is that one.

        Without ``--storage-thresholds``: ``thresholds/`` in the folder pytest was
        started from, else the folder shipped with the plugin. Never pytest's rootdir,
        which moves with any argument naming an existing path (``--storage-results
        out/r.json``, space form, made ``out/`` the rootdir once the file existed)."""
        if self.thresholds is not None:
            path = Path(self.thresholds).expanduser()
            path = path if path.is_absolute() else self.invocation_path / path
            return path, f"from {self.source('thresholds')}"
        here = self.invocation_path / "thresholds"
        if here.is_dir():
            return here, "thresholds/ of the folder pytest was started in"
        shipped = shipped_thresholds()
        if shipped is not None:
            return shipped, f"shipped with the plugin: no thresholds/ in {self.invocation_path}"
        return here, "thresholds/ of the folder pytest was started in (missing)"

    def _user_path(self, value: str | None) -> Path | None:
        if value is None:
            return None
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.invocation_path / path

    def results_path(self) -> Path | None:
        return self._user_path(self.results)

    def openmetrics_path(self) -> Path | None:
        return self._user_path(self.openmetrics)

    def benchmark_json_path(self) -> Path | None:
        return self._user_path(self.benchmark_json)

    def report_path(self) -> Path | None:
        return self._user_path(self.report)

    def baseline_path(self) -> Path | None:
        """The first baseline (the one relative rules read)."""
        paths = self.baseline_paths()
        return paths[0] if paths else None

    def baseline_paths(self) -> list[Path]:
        """Every baseline run's results file, in the order given."""
        return [path for value in self.baseline or () if (path := self._user_path(value))]

    def header_lines(self, *, verbose: bool = False,
                     secret_options: Iterable[str] = ()) -> list[str]:
        """``name: value (from source)`` for every setting given (``verbose``: the
        defaults too); the embedded server's settings only when no endpoint is given.
        Credentials are never shown: a driver option that is one (``secret_options``,
        :func:`~.redact.secret_option`) as ``key=***``, URLs without passwords."""
        lines = []
        for name, setting in self.values.items():
            if setting.source == "default" and (setting.value is None or not verbose):
                continue
            if self.endpoint is not None and name in EMBEDDED_SETTINGS:
                continue  # no embedded server runs
            shown = _shown(name, setting.value, tuple(secret_options))
            lines.append(f"{name}: {shown} (from {setting.source})")
        if self.thresholds is None:  # which folder, and why
            folder, why = self.thresholds_origin()
            lines.append(f"storage_thresholds: {folder} ({why})")
        return lines


def _shown(name: str, value: Any, secret_options: tuple[str, ...] = ()) -> str:
    if name in SECRET_SETTINGS and isinstance(value, dict):
        return ", ".join(f"{key}=***" if secret_option(key, secret_options) else
                         f"{key}={option}" for key, option in value.items())
    if name in ("storage_endpoint", "storage_history", "storage_pushgateway"):
        return redact_url(str(value))
    if name == "storage_doors" and isinstance(value, dict):
        return ", ".join(f"{door}={redact_url(url)}" for door, url in value.items())
    if name == "storage_tpc_peer":
        urls = value.splitlines() if isinstance(value, str) else value
        return ", ".join(redact_url(str(url).strip()) for url in urls if str(url).strip())
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)



def _field(name: str) -> str:
    """The :class:`Settings` field of the option ``name`` (``storage_endpoint``)."""
    return name.removeprefix("storage_")


#: an option without its typed field (or the reverse) is a programming error, said at once
_MISSING = {_field(name) for name in OPTIONS} ^ (
    {f.name for f in fields(Settings)} - {"invocation_path", "sources"})
if _MISSING:
    raise TypeError(f"config.OPTIONS and the fields of config.Settings differ: "
                    f"{', '.join(sorted(_MISSING))}. Give every option one typed field.")
