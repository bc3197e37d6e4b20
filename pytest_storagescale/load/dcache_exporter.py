"""dCache's own counters of a step from its Prometheus JMX exporter (11.1+).

dCache 11 ships the ``jmx_prometheus_javaagent`` jar and ``dcache.enable.prometheus.
exporter``: the domain's JVM then answers ``/metrics`` with what its JMX beans hold,
through the release's own rules (``etc/prometheus_exporter_config.yaml``). What those
rules export is the namespace's side, not the pools': PnfsManager's requests by
message type (``dcache_pnfsmanager_ops_<message>_updatenum_total``) and chimera's
calls by method (``dcache_pnfsmanager_messages_<method>_successful_total`` and
``_failed_total``), beside the agent's JVM figures (threads, heap, CPU, garbage
collection). Our own rule after the release's (:data:`SRM_RULES`) adds the SRM door's
requests by type (``dcache_srm_requests_<type>_successful_total``, ``_failed_total``),
which its JMX holds and the release's rules leave out. dCache keeps no mover or
per-door transfer counter in JMX: the pools' transfers are in billing
(:mod:`.dcache_billing`). 10.2 ships neither jar nor option: a step there says so
(:func:`no_exporter`), never a zero.

:class:`ExporterWatch` brackets a step's load as :class:`~.dcache_billing.
BillingWatch` does: one scrape when the clients start (after the set-up), one when
they are done (before the clean-up), each bounded (:data:`SCRAPE_DEADLINE_S` in all,
:data:`MAX_SCRAPE_BYTES`), parsed by prometheus_client's parser. The step keeps what
the counters rose by (:attr:`ExporterFigures.rose`) and a few gauges at the load's
end (:data:`GAUGES`); for an operation that makes exactly one chimera call of a kind
(:data:`COUNTERS`: a ``put`` creates one file on every door), or on the ``srm`` door
exactly one SRM request of a kind (:data:`SRM_COUNTERS`: a ``stat`` one ``srmLs``), it
compares that rise with its clients' operations (:func:`~.server_monitor.
exporter_disagreement`). The
exporter counts the whole domain, not the step's folder: load from outside the step
is seen as such, as XRootD's summary counters see it. Except a retry inside one
client operation (an upload that a client library or the door began again): a
``createfile`` beyond the clients' operations matched one for one by a failed
``createfile`` or a ``remove``, while billing counted no transfer beyond theirs, is
taken for one and said so in the step's record (:func:`retried_calls`,
:func:`~.server_monitor.exporter_retries`).

The password (the run's, basic authentication) goes only into the request's header:
no message, repr or record holds it.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

#: the most bytes of one scrape (11.2.5 answered some 60-120 kB)
MAX_SCRAPE_BYTES = 16 * 1024 * 1024
#: the most one scrape may take, connection to the last byte (s)
SCRAPE_DEADLINE_S = 30.0
#: bytes read per read call of the answer
CHUNK = 64 * 1024
#: the counters kept: dCache's namespace (PnfsManager's messages, chimera's calls) and
#: the JVM's (CPU, garbage collection, threads started); the exporter's own are not
KEPT_PREFIXES = ("dcache_", "jvm_", "process_")
#: the most counters one step keeps (the largest rises)
MAX_KEPT = 200
#: gauges kept at the load's end: the JVM's threads and heap, the process's files
GAUGES = ("jvm_threads_current", "jvm_threads_daemon", "jvm_threads_peak",
          'jvm_memory_used_bytes{area="heap"}', "process_open_fds",
          "process_resident_memory_bytes")
#: operation -> the chimera call whose count is the step's operations, one per
#: operation on every door (measured on 11.2.5, 10 of each through the WebDAV, xrootd
#: and dcap doors: 10 ``createfile`` per 10 puts, 10 ``mkdir`` per 10 mkdirs, 10
#: ``remove`` per 10 deletes; a stat, a get or an ls makes none of them). Both
#: outcomes count: a call that chimera refused is an operation that reached the
#: namespace
COUNTERS = {
    "put": "dcache_pnfsmanager_messages_createfile",
    "write": "dcache_pnfsmanager_messages_createfile",
    "flush": "dcache_pnfsmanager_messages_createfile",
    "tape_write": "dcache_pnfsmanager_messages_createfile",
    "mkdir": "dcache_pnfsmanager_messages_mkdir",
    "delete": "dcache_pnfsmanager_messages_remove",
}
#: the endings of a chimera call's two counters (prometheus_client keeps ``_total``)
OUTCOMES = ("_successful_total", "_failed_total")
#: the SRM door's request counters as :data:`SRM_RULES` name them: the request type
#: (``ls`` for ``SrmLsRequest``, ``preparetoput``, ``bringonline``...) between this
#: and an outcome of :data:`OUTCOMES`
SRM_PREFIX = "dcache_srm_requests_"
#: our own rules, after the release's: its rules export no SRM counter, though the
#: SRM door (``diskCacheV111.srm.SrmHandler``) registers one JMX bean per request type,
#: ``org.dcache.commons.stats:type=RequestCounter,family=srmv2,name=<request class>``
#: (created at the type's first request; attributes ``TotalRequests``, ``Failed``,
#: ``Successful``: ``Failed`` counts the answers whose status is a failure,
#: ``Successful`` the others and those not answered yet). One rule: every request type
#: the door was asked for, its successes and failures
SRM_RULES = (
    "# pytest-storagescale: the SRM door's requests by type (not in the release's rules)",
    "- pattern: 'org.dcache.commons.stats<type=RequestCounter, family=srmv2, "
    "name=Srm(\\w+)Request><>(Successful|Failed)'",
    f"  name: {SRM_PREFIX}$1_$2",
    '  help: "SRM door requests by type"',
    "  type: COUNTER",
)
#: operation -> the SRM request type whose count is the step's operations on the
#: ``srm`` door, one per operation through gfal2's SRM plugin (measured on 11.2.5, 7 of
#: each: a stat 1 ``srmLs``; a mkdir 1 ``srmMkdir`` (and 1 ``srmLs``, failed: is it
#: there?); a put 1 ``srmPrepareToPut`` (and 2 ``srmLs``, 1 ``srmPing``, 1
#: ``srmPutDone``, 1 ``srmRm`` failed); a get 1 ``srmPrepareToGet`` (and 2 ``srmLs``,
#: 1 ``srmPing``, 1 ``srmReleaseFiles``); a delete 1 ``srmRm``). Not here: an ls made
#: 2 ``srmLs`` (the folder's stat, then its listing); a delete step's repetition puts
#: its file first (``Delete.before``), and over ``srm`` that put makes an ``srmRm``
#: (failed) and a chimera ``remove`` of its own: 7 repetitions made 14 of each, so a
#: delete over ``srm`` is compared with neither (:data:`SRM_UNCOMPARED`)
SRM_COUNTERS = {
    "stat": SRM_PREFIX + "ls",
    "mkdir": SRM_PREFIX + "mkdir",
    "put": SRM_PREFIX + "preparetoput",
    "get": SRM_PREFIX + "preparetoget",
}

#: counter -> its requests per client login: a gfal2 SRM client logs in with a stat
#: of the door's path before the step's clock (``Gfal2Driver.connect``), one ``srmLs``
#: (measured through the plugin on 11.2.5: a 2-client stat step counted 33 srmLs for
#: 31 stats), within the load's scrapes when the client starts after the first
PER_LOGIN = {SRM_PREFIX + "ls": 1.0}

#: operations of :data:`COUNTERS` whose chimera call is not one a repetition over the
#: ``srm`` door (see :data:`SRM_COUNTERS`): compared with nothing there
SRM_UNCOMPARED = ("delete",)


#: a counter -> the two of :data:`COUNTERS`' whose rises show a call retried inside
#: one client operation: a ``createfile`` that failed (it made no file), and a
#: ``remove`` (a file created, then removed again). An upload retried by the client
#: library or the door makes more than one ``createfile`` call in one operation: the
#: gsiftp writers' step of 2026-11-29 (11.2.5, 70 puts through gfal2's GridFTP plug-in)
#: counted 71 ``createfile`` successful, 1 failed and 1 ``remove``, and billing 70
#: transfers (:func:`retried_calls`)
RETRY_TRACES = {
    "dcache_pnfsmanager_messages_createfile": (
        "dcache_pnfsmanager_messages_createfile_failed_total",
        "dcache_pnfsmanager_messages_remove_successful_total"),
}


def retried_calls(rose: dict[str, float], counter: str, clients_most: float,
                  clients_failed: float = 0.0) -> int:
    """How many of ``counter``'s calls over the load were retries inside the clients'
    operations (0: none, or not all of the excess can be): the calls beyond
    ``clients_most`` (the most the clients' operations may have made, one each: those
    finished and those given up), when each of them is matched one for one by a trace
    of :data:`RETRY_TRACES` (a failed call beyond the ``clients_failed`` operations that
    failed at the clients, which may have made one each; a ``remove``): then no file
    beyond the clients' remains. All or nothing: an excess a trace does not match is
    not a retry, and the whole excess stays compared (a file created from outside and
    not removed, :func:`~.server_monitor.exporter_disagreement`). Only the counters of
    :data:`RETRY_TRACES` (``createfile``): a step that removes files (``delete``) or
    makes folders is not read so."""
    traces = RETRY_TRACES.get(counter)
    if traces is None:
        return 0
    extra = counted(rose, counter) - clients_most
    if extra < 0.5:
        return 0
    failed, removed = traces
    matched = max(0.0, rose.get(failed, 0.0) - clients_failed) + rose.get(removed, 0.0)
    return round(extra) if extra <= matched else 0


def counter_for(operation: str, door: str = "") -> str:
    """The counter compared with a step's operations ("" none): on the ``srm`` door
    the SRM door's request type (:data:`SRM_COUNTERS`; none for
    :data:`SRM_UNCOMPARED`), else chimera's call (:data:`COUNTERS`)."""
    if door == "srm" and operation in SRM_COUNTERS:
        return SRM_COUNTERS[operation]
    if door == "srm" and operation in SRM_UNCOMPARED:
        return ""
    return COUNTERS.get(operation, "")


def with_rules(shipped: str, rules: tuple[str, ...] = SRM_RULES) -> str:
    """The release's exporter configuration (its text) with ``rules`` after its own,
    indented as its rules are (a ``rules:`` list added when it has none)."""
    import re

    text = shipped if shipped.endswith("\n") or not shipped else shipped + "\n"
    found = re.search(r"^( *)- pattern:", text, re.MULTILINE)
    if not re.search(r"^rules:", text, re.MULTILINE):
        text += "rules:\n"
    indent = found.group(1) if found else "  "
    return text + "".join(f"{indent}{line}\n" for line in rules)


class ScrapeError(Exception):
    """A scrape that gave no figures: the message names the URL and why (never the
    password)."""


@dataclass(frozen=True)
class Scrape:
    """One answer of the exporter: each sample's value by its name and labels
    (``name{label="v"}``), and the type of the family it belongs to."""

    samples: dict[str, float]
    kinds: dict[str, str]
    #: when it was taken (epoch s)
    taken: float = 0.0


def _sample_name(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def parse(text: str) -> Scrape:
    """The samples of an exposition in Prometheus' text format (prometheus_client's
    parser); a text it cannot read is a :class:`ScrapeError`."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, float] = {}
    kinds: dict[str, str] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_created"):  # a counter's creation time
                    continue
                name = _sample_name(sample.name, sample.labels)
                samples[name] = float(sample.value)
                kinds[name] = family.type
    except (ValueError, TypeError, IndexError) as exc:
        raise ScrapeError(f"not Prometheus' text format ({exc})") from None
    return Scrape(samples=samples, kinds=kinds, taken=time.time())


def scrape(url: str, user: str, password: str, deadline_s: float = SCRAPE_DEADLINE_S,
           max_bytes: int = MAX_SCRAPE_BYTES) -> Scrape:
    """One scrape of the exporter at ``url`` (HTTP basic authentication), at most
    ``max_bytes`` within ``deadline_s`` from the connection to the last byte; no proxy
    and no redirect (the header holds the password)."""
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # the password is for this URL alone: a 3xx is an error

    began = time.monotonic()
    secret = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {secret}"})
    # straight to the exporter: no proxy of the environment sees the password
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())
    chunks: list[bytes] = []
    size = 0
    try:
        with opener.open(request, timeout=max(0.1, deadline_s)) as answer:
            while True:
                if time.monotonic() - began > deadline_s:
                    raise ScrapeError(f"dCache's Prometheus exporter {url} did not answer "
                                      f"whole within {deadline_s:g} s ({size} bytes read)")
                # what has come (read1): a server that drips bytes is stopped by the
                # deadline, not by each of 64 kB reads' own timeout
                chunk = answer.read1(min(CHUNK, max_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    raise ScrapeError(f"dCache's Prometheus exporter {url} answered more "
                                      f"than {max_bytes} bytes: not read")
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"dCache's Prometheus exporter {url} answered {exc.code}"
                          ) from None
    except (OSError, urllib.error.URLError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ScrapeError(f"dCache's Prometheus exporter {url}: {reason}") from None
    try:
        return parse(b"".join(chunks).decode("utf-8", errors="replace"))
    except ScrapeError as exc:
        raise ScrapeError(f"dCache's Prometheus exporter {url} answered {exc}") from None


def cumulative(name: str, kind: str) -> bool:
    """A sample that only grows: a counter's, a summary's or histogram's count and sum
    (a ``_total`` sample whose ``# TYPE`` line named it otherwise, as some exporters
    write it, is a counter's)."""
    return kind in ("counter", "summary", "histogram") or name.split("{", 1)[0].endswith(
        "_total")


def rises(before: Scrape, after: Scrape, prefixes: tuple[str, ...] = KEPT_PREFIXES,
          most: int = MAX_KEPT) -> dict[str, float]:
    """What the counters (and the counts and sums of summaries and histograms) rose by
    between two scrapes: only those that rose, at most ``most`` (the largest rises); a
    counter gone or lower (a restarted JVM) is left out, one new since ``before`` rose
    from 0 (dCache makes a request type's counter at its first request: the SRM door's
    first ``srmLs`` makes ``SrmLsRequest``'s)."""
    rose = {name: value - before.samples.get(name, 0.0)
            for name, value in after.samples.items()
            if name.startswith(prefixes) and cumulative(name, after.kinds.get(name, ""))
            and value > before.samples.get(name, 0.0)}
    kept = sorted(rose, key=lambda name: (-rose[name], name))[:most]
    return {name: rose[name] for name in sorted(kept)}


def counted(rose: dict[str, float], counter: str) -> float:
    """The rise of a chimera call's counter, its successes and failures together."""
    return sum(rose.get(counter + ending, 0.0) for ending in OUTCOMES)


@dataclass(frozen=True)
class ExporterFigures:
    """A step's load as dCache's exporter counted it."""

    #: what each counter rose by over the load (only those that rose)
    rose: dict[str, float] = field(default_factory=dict)
    #: :data:`GAUGES` at the load's end
    gauges: dict[str, float] = field(default_factory=dict)
    #: the counter to compare with the step's operations ("" none) and its rise (None:
    #: not read, ``note`` says why)
    counter: str = ""
    operations: float | None = None
    #: why there are no figures ("" when there are)
    note: str = ""
    #: of ``operations``, the calls taken for retries inside the clients' operations
    #: (:func:`retried_calls`; set when the step is judged), and what matched them
    retried: int = 0
    retries: str = ""
    #: the scrapes' times (epoch s): the counters' interval
    began: float = 0.0
    ended: float = 0.0

    @property
    def namespace_requests(self) -> int:
        """PnfsManager's requests of every type over the load."""
        return int(sum(value for name, value in self.rose.items()
                       if name.startswith("dcache_pnfsmanager_ops_")
                       and name.endswith("_updatenum_total")))

    def to_json(self) -> dict[str, Any]:
        return {"rose": dict(self.rose), "gauges": dict(self.gauges),
                "counter": self.counter, "operations": self.operations,
                "namespace_requests": self.namespace_requests, "note": self.note,
                "retried": self.retried, "retries": self.retries,
                "began": self.began, "ended": self.ended}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExporterFigures:
        operations = data.get("operations")
        return cls(rose={str(k): float(v) for k, v in (data.get("rose") or {}).items()},
                   gauges={str(k): float(v) for k, v in (data.get("gauges") or {}).items()},
                   counter=str(data.get("counter") or ""),
                   operations=None if operations is None else float(operations),
                   note=str(data.get("note") or ""),
                   retried=int(data.get("retried") or 0),
                   retries=str(data.get("retries") or ""),
                   began=float(data.get("began") or 0.0),
                   ended=float(data.get("ended") or 0.0))


class ExporterWatch:
    """One step's load as the exporter saw it (see the module's doc). ``url`` ""
    (a release that ships no exporter): :meth:`finish` says so, ``note``."""

    def __init__(self, url: str, user: str, password: str, operation: str, *,
                 door: str = "", note: str = "", deadline_s: float = SCRAPE_DEADLINE_S) -> None:
        self.url = url
        self.user = user
        self._password = password
        self.operation = operation
        self.door = door
        #: the counter compared with the step's operations ("" none)
        self.counter = counter_for(operation, door) if url else ""
        self.deadline_s = deadline_s
        self._note = note
        self._before: Scrape | None = None
        self.figures: ExporterFigures | None = None

    def __repr__(self) -> str:  # never the password
        return (f"ExporterWatch({self.url!r}, operation={self.operation!r}, "
                f"door={self.door!r})")

    def start(self) -> None:
        """The counters when the clients start."""
        if not self.url:
            return
        try:
            self._before = scrape(self.url, self.user, self._password, self.deadline_s)
        except ScrapeError as exc:
            self._note = f"{exc} at the load's start: no exporter counters"

    def finish(self, wait: float | None = None) -> ExporterFigures:
        """The counters when the clients are done (``wait``: the most the scrape may
        take, after Ctrl-C or SIGTERM), and what they rose by."""
        if self._before is None:
            self.figures = ExporterFigures(
                counter=self.counter,
                note=self._note or "the exporter was not scraped at the load's start")
            return self.figures
        deadline = self.deadline_s if wait is None else min(wait, self.deadline_s)
        try:
            after = scrape(self.url, self.user, self._password, deadline)
        except ScrapeError as exc:
            self.figures = ExporterFigures(counter=self.counter, note=f"{exc} at the load's "
                                                                      f"end: no exporter counters")
            return self.figures
        rose = rises(self._before, after)
        gauges = {name: after.samples[name] for name in GAUGES if name in after.samples}
        self.figures = ExporterFigures(
            rose=rose, gauges=gauges, counter=self.counter,
            operations=counted(rose, self.counter) if self.counter else None,
            began=self._before.taken, ended=after.taken)
        return self.figures


def no_exporter(version: str) -> str:
    """What a step on a dCache without the exporter says instead of its figures."""
    return (f"dCache {version or '(version unknown)'} ships no Prometheus exporter (no "
            f"jmx_prometheus_javaagent jar, no dcache.enable.prometheus.exporter; 11.1 "
            f"and later have one): no exporter counters")
