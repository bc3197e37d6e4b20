"""dCache's Prometheus JMX exporter (11.1+: ``dcache.enable.prometheus.exporter``, the
``jmx_prometheus_javaagent`` jar in ``share/classes``) and a step's counters from it
(``load/dcache_exporter.py``).

Without a server: an exposition parsed by prometheus_client's parser, what the
counters rose by, the scrape's bounds (its size, its deadline, the password in no
message) against a loopback HTTP server that misbehaves on purpose, the comparison
with the clients' count, the record's JSON and the table's cell. On the tests' shared
dCache: the exporter is enabled on loopback with the release's own rules and basic
authentication; its namespace counters rise by what a client did; a step's watch puts
them beside the clients' count and says when they disagree. 10.2.25 ships neither the
jar nor the option: its step says "no exporter" (run these tests with
``STORAGESCALE_DCACHE_VERSION=10.2.25``)."""

from __future__ import annotations

import base64
import http.server
import secrets
import threading
import time
from types import SimpleNamespace

import pytest

from pytest_storagescale.load.dcache_exporter import (
    ExporterFigures,
    ExporterWatch,
    ScrapeError,
    counted,
    parse,
    rises,
    scrape,
)
from pytest_storagescale.load.server_monitor import exporter_disagreement
from pytest_storagescale.load.server_usage import ServerUsage

#: the exposition's shape as 11.2.5's exporter answers (names from a real scrape)
EXPOSITION = """\
# HELP dcache_pnfsmanager_ops_pnfscreateentrymessage_updatenum PnfsManager operations
# TYPE dcache_pnfsmanager_ops_pnfscreateentrymessage_updatenum counter
dcache_pnfsmanager_ops_pnfscreateentrymessage_updatenum_total {create}
# HELP dcache_pnfsmanager_ops_pnfsgetfileattributes_updatenum PnfsManager operations
# TYPE dcache_pnfsmanager_ops_pnfsgetfileattributes_updatenum counter
dcache_pnfsmanager_ops_pnfsgetfileattributes_updatenum_total {attributes}
# HELP dcache_pnfsmanager_messages_createfile_successful PnfsManager message counter
# TYPE dcache_pnfsmanager_messages_createfile_successful counter
dcache_pnfsmanager_messages_createfile_successful_total {create}
# HELP dcache_pnfsmanager_messages_createfile_failed PnfsManager message counter
# TYPE dcache_pnfsmanager_messages_createfile_failed counter
dcache_pnfsmanager_messages_createfile_failed_total {failed}
# HELP dcache_pnfsmanager_ops_pnfsgetfileattributes_averageexecutiontime ops
# TYPE dcache_pnfsmanager_ops_pnfsgetfileattributes_averageexecutiontime gauge
dcache_pnfsmanager_ops_pnfsgetfileattributes_averageexecutiontime 3.0
# HELP jvm_threads_current Current thread count of a JVM
# TYPE jvm_threads_current gauge
jvm_threads_current {threads}
# HELP jvm_memory_used_bytes Used bytes of a given JVM memory area.
# TYPE jvm_memory_used_bytes gauge
jvm_memory_used_bytes{{area="heap"}} 4.0E8
jvm_memory_used_bytes{{area="nonheap"}} 1.0E8
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds counter
process_cpu_seconds_total {cpu}
# HELP jvm_gc_collection_seconds Time spent in a given JVM garbage collector.
# TYPE jvm_gc_collection_seconds summary
jvm_gc_collection_seconds_count{{gc="G1 Young Generation"}} {gc}
jvm_gc_collection_seconds_sum{{gc="G1 Young Generation"}} 0.5
# HELP jmx_scrape_duration_seconds Time this JMX scrape took, in seconds.
# TYPE jmx_scrape_duration_seconds gauge
jmx_scrape_duration_seconds 0.2
"""


def _exposition(create: int = 100, attributes: int = 500, failed: int = 0,
                threads: int = 300, cpu: float = 40.0, gc: int = 10) -> str:
    return EXPOSITION.format(create=create, attributes=attributes, failed=failed,
                             threads=threads, cpu=cpu, gc=gc)


def test_what_the_counters_rose_by_is_kept_and_the_gauges_at_the_end():
    before = parse(_exposition())
    after = parse(_exposition(create=120, attributes=619, failed=1, threads=310, cpu=42.5,
                              gc=12))
    rose = rises(before, after)
    assert rose == {
        "dcache_pnfsmanager_ops_pnfscreateentrymessage_updatenum_total": 20.0,
        "dcache_pnfsmanager_ops_pnfsgetfileattributes_updatenum_total": 119.0,
        "dcache_pnfsmanager_messages_createfile_successful_total": 20.0,
        "dcache_pnfsmanager_messages_createfile_failed_total": 1.0,
        "process_cpu_seconds_total": 2.5,
        'jvm_gc_collection_seconds_count{gc="G1 Young Generation"}': 2.0,
    }, rose  # no gauge, nothing unchanged, not the exporter's own
    assert counted(rose, "dcache_pnfsmanager_messages_createfile") == 21.0
    assert after.samples['jvm_memory_used_bytes{area="heap"}'] == 4.0e8
    # a restarted JVM's lower counters are no negative rise
    assert rises(after, before) == {}
    assert len(rises(before, after, most=2)) == 2  # bounded: the largest rises
    with pytest.raises(ScrapeError, match="not Prometheus' text format"):
        parse("# TYPE x counter\nx_total not-a-number\n")


class _Exporter(http.server.BaseHTTPRequestHandler):
    """A loopback stand-in that misbehaves as asked (``mode``): the scrape's own
    bounds, which a healthy dCache never exercises."""

    mode = "ok"
    password = ""
    redirected = 0

    def do_GET(self):  # noqa: N802 - http.server's name
        expected = base64.b64encode(f"prometheus:{self.password}".encode()).decode()
        if self.headers.get("Authorization") != f"Basic {expected}":
            self.send_response(401)
            self.end_headers()
            return
        if self.mode == "redirect":
            type(self).redirected += 1
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        if self.mode == "ok":
            self.wfile.write(_exposition().encode())
        elif self.mode == "big":
            for _ in range(64):
                self.wfile.write(b"# " + b"x" * 65536 + b"\n")
        elif self.mode == "drip":
            for _ in range(100):
                self.wfile.write(b"#")
                self.wfile.flush()
                time.sleep(0.1)

    def log_message(self, *args):
        pass


@pytest.fixture
def exporter():
    _Exporter.password = secrets.token_hex(8)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics", _Exporter
    server.shutdown()
    server.server_close()


def test_a_scrape_is_bounded_in_size_and_time_and_names_no_password(exporter, monkeypatch):
    url, handler = exporter
    handler.mode = "ok"
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # the password never goes
    monkeypatch.setenv("no_proxy", "")  # through a proxy of the environment
    assert scrape(url, "prometheus", handler.password).samples["jvm_threads_current"] == 300
    said = []
    handler.mode, handler.redirected = "redirect", 0
    with pytest.raises(ScrapeError, match="answered 302") as moved:
        scrape(url, "prometheus", handler.password)
    assert handler.redirected == 1  # not followed: the header goes nowhere else
    said.append(str(moved.value))
    with pytest.raises(ScrapeError, match="answered 401") as refused:
        scrape(url, "prometheus", "not-the-password")
    said.append(str(refused.value))
    handler.mode = "big"
    with pytest.raises(ScrapeError, match="more than 1048576 bytes") as big:
        scrape(url, "prometheus", handler.password, max_bytes=1 << 20)
    said.append(str(big.value))
    handler.mode = "drip"
    began = time.monotonic()
    with pytest.raises(ScrapeError, match="whole within 1 s") as slow:
        scrape(url, "prometheus", handler.password, deadline_s=1)
    said.append(str(slow.value))
    assert time.monotonic() - began < 5  # the deadline, not the drip's 10 s
    for text in said:
        assert handler.password not in text and "not-the-password" not in text
        assert url in text
    watch = ExporterWatch(url, "prometheus", handler.password, "put")
    assert handler.password not in repr(watch)


def _usage(operations: float | None, counter: str = "dcache_pnfsmanager_messages_createfile",
           note: str = "") -> ServerUsage:
    return ServerUsage(source="embedded dcache", exporter=ExporterFigures(
        rose={f"{counter}_successful_total": operations or 0.0}, counter=counter,
        operations=operations, note=note))


def test_a_step_whose_exporter_count_disagrees_says_so_and_an_unread_one_is_unmeasured():
    """The clients made 10 puts; the exporter counted 10 files created (agree), 14
    (load from outside), 6 (never reached the namespace); a scrape that failed is a
    comparison not measured, never a zero."""
    assert exporter_disagreement(10, 0, _usage(10)) is None
    said = exporter_disagreement(10, 0, _usage(14))
    assert said is not None and "dCache's Prometheus exporter counted 14" in said
    assert "load from outside the plugin" in said and "'createfile'" in said
    said = exporter_disagreement(10, 0, _usage(6))
    assert said is not None and "never reached the server" in said
    assert exporter_disagreement(10, 4, _usage(13)) is None  # 4 given up: may have come
    failed = _usage(None, note="dCache's Prometheus exporter http://x answered 503")
    assert exporter_disagreement(10, 0, failed) is None
    assert failed.counts_unmeasured == ("dCache's exporter: dCache's Prometheus exporter "
                                        "http://x answered 503")
    assert ServerUsage(exporter=ExporterFigures()).counts_unmeasured == ""


def test_a_step_whose_exporter_count_disagrees_is_an_error_saying_so():
    """steps.counts_disagree (judge_step makes the step an ``error`` with its words)
    asks the exporter too when billing or XRootD's counters agree or are absent."""
    from pytest_storagescale.steps import counts_disagree

    record = SimpleNamespace(issued_operations=10, server=_usage(14),
                             total=SimpleNamespace(hung=0, clients=2, failed=0, throttled=0))
    said = counts_disagree(record)
    assert said is not None and said.startswith("dCache's Prometheus exporter counted 14")
    record.server = _usage(10)
    assert counts_disagree(record) is None


#: the writers' step of ``test_mixing_readers_and_writers[c1-gsiftp]`` on 11.2.5
#: (2026-11-29, ``--storage-load-doors all --storage-scale 0.05``): 70 puts through
#: gfal2's GridFTP plug-in (68 in the window, 1 warm-up, 1 drain), none failed; the
#: exporter's chimera calls that rose over the load, and billing's transfers of the
#: step's folder, as its record holds them
GSIFTP_RETRY_ROSE = {
    "dcache_pnfsmanager_messages_addinodelocation_successful_total": 71.0,
    "dcache_pnfsmanager_messages_createfile_failed_total": 1.0,
    "dcache_pnfsmanager_messages_createfile_successful_total": 71.0,
    "dcache_pnfsmanager_messages_find_successful_total": 145.0,
    "dcache_pnfsmanager_messages_path2inodes_failed_total": 70.0,
    "dcache_pnfsmanager_messages_remove_successful_total": 1.0,
    "dcache_pnfsmanager_messages_setinodeattributes_successful_total": 71.0,
    "dcache_pnfsmanager_ops_pnfscreateentrymessage_updatenum_total": 72.0,
    "dcache_pnfsmanager_ops_pnfsdeleteentrymessage_updatenum_total": 1.0,
    "dcache_pnfsmanager_ops_pnfsgetfileattributes_updatenum_total": 359.0,
}
GSIFTP_RETRY_BILLING = {"read": 0, "write": 70, "transfers": 70, "failed": 0,
                        "read_bytes": 0, "write_bytes": 35_000_000}


def _recorded(rose: dict[str, float] | None = None, billing: dict[str, int] | None = None,
              **changed: float) -> ServerUsage:
    """The gsiftp writers' step's server side (:data:`GSIFTP_RETRY_ROSE`), with
    ``changed`` counters (``createfile_successful=72``: chimera's ``createfile``
    successes) and billing's counts (None: as recorded; {}: no billing count)."""
    rose = dict(GSIFTP_RETRY_ROSE if rose is None else rose)
    for short, value in changed.items():
        name = f"dcache_pnfsmanager_messages_{short}_total"
        rose[name] = value
    counter = "dcache_pnfsmanager_messages_createfile"
    ops = dict(GSIFTP_RETRY_BILLING if billing is None else billing)
    return ServerUsage(source="embedded dcache", ops=ops,
                       counted="write" if ops else "", per_operation=1.0, per_login=0.0,
                       compare_with="write", exporter=ExporterFigures(
                           rose=rose, counter=counter, operations=counted(rose, counter)))


def test_an_upload_retried_inside_one_gsiftp_operation_is_no_load_from_outside():
    """The recorded step: 72 ``createfile`` (71 successful, 1 failed), 1 ``remove``,
    billing 70 transfers, for 70 puts none of which failed. One upload's file was
    created, removed and created again inside one client operation: 2 calls beyond
    the clients', each matched by a failed create or a remove, while billing counted
    no transfer beyond theirs. The step gets its verdict, and its record says how
    many calls were taken for retries (the table's cell too). Before: *dCache's
    Prometheus exporter counted 72 ... load from outside the plugin*, no verdict."""
    from pytest_storagescale.records import StepRecord
    from pytest_storagescale.reporting.table import exporter_part
    from pytest_storagescale.steps import counts_disagree

    usage = _recorded()
    assert usage.exporter is not None and usage.exporter.operations == 72
    assert exporter_disagreement(70, 0, usage, clients=1) is None
    record = SimpleNamespace(issued_operations=70, server=usage,
                             total=SimpleNamespace(hung=0, clients=1, failed=0, throttled=0))
    assert counts_disagree(record) is None
    figures = record.server.exporter
    assert figures.retried == 2 and figures.operations == 72, figures
    assert figures.retries == (
        "2 'createfile' call(s) beyond the clients' 70 operations taken for retries "
        "inside them (a client library's or the door's): 1 failed (the clients' failed "
        "operations 0), 1 file(s) removed again; billing counted 70 transfers")
    again = ServerUsage.from_json(record.server.to_json())
    assert again == record.server and again.to_json()["exporter"]["retried"] == 2
    step = StepRecord(step_id="main-045", test="t", section="mixed", operation="put",
                      clients=1, system="dcache", server=record.server)
    assert exporter_part(step) == "exporter 72 put, 2 retried (432 pnfs req)"


def test_creates_from_outside_still_disagree_beside_a_retry():
    """What stays load from outside: creates a failed create or a remove does not
    match one for one (the files remain), a transfer billing counted beyond the
    clients' (an outside writer in the step's folder, its file removed again), a
    failed create that is a client's own failed operation, no billing count to
    confirm the transfers, and an excess partly matched (all or nothing)."""
    from pytest_storagescale.load.server_monitor import exporter_retries

    outside = "load from outside the plugin"
    # 2 files created from outside, neither failed nor removed: 72 successful
    said = exporter_disagreement(70, 0, _recorded(
        createfile_successful=72, createfile_failed=0, remove_successful=0))
    assert said is not None and "counted 72" in said and outside in said, said
    # as recorded, but billing counted 71 transfers in the step's folder: one more
    # upload than the clients made, created and removed again by another client
    billed = dict(GSIFTP_RETRY_BILLING, write=71, transfers=71)
    said = exporter_disagreement(70, 0, _recorded(billing=billed))
    assert said is not None and "counted 72" in said, said
    assert exporter_retries(70, 0, _recorded(billing=billed)) == (0, "")
    # no billing count (not read, or none for the operation): nothing confirms it
    said = exporter_disagreement(70, 0, _recorded(billing={}))
    assert said is not None and "counted 72" in said, said
    # 3 beyond the clients', 2 matched: the whole excess stays compared (74)
    said = exporter_disagreement(70, 0, _recorded(createfile_successful=73))
    assert said is not None and "counted 74" in said, said
    # 10 puts, 1 failed at its client (its failed create), 1 file from outside: the
    # client's failed create is not a retry's trace
    ten = _recorded(createfile_successful=10, createfile_failed=1, remove_successful=0,
                    billing=dict(GSIFTP_RETRY_BILLING, write=10, transfers=10))
    said = exporter_disagreement(10, 0, ten, clients_failed=1)
    assert said is not None and "counted 11" in said and outside in said, said
    assert exporter_disagreement(10, 0, ten) is None  # a retry, had no client failed
    # a counter whose calls a step makes otherwise (remove: a delete step) is not read so
    removes = _recorded()
    removes = ServerUsage(ops=removes.ops, counted="write", per_login=0.0,
                          exporter=ExporterFigures(
                              rose=GSIFTP_RETRY_ROSE,
                              counter="dcache_pnfsmanager_messages_remove",
                              operations=3.0))
    assert exporter_retries(1, 0, removes) == (0, "")


def test_the_exporters_figures_go_into_the_json_and_the_table():
    from pytest_storagescale.records import StepRecord
    from pytest_storagescale.reporting.table import server_cell

    usage = ServerUsage(source="embedded dcache", ops={"write": 20, "transfers": 20},
                        counted="write", exporter=ExporterFigures(
                            rose={"dcache_pnfsmanager_ops_pnfscreateentrymessage_updatenum"
                                  "_total": 20.0,
                                  "dcache_pnfsmanager_ops_pnfsgetfileattributes_updatenum"
                                  "_total": 119.0,
                                  "dcache_pnfsmanager_messages_createfile_successful_total":
                                      20.0},
                            gauges={"jvm_threads_current": 310.0},
                            counter="dcache_pnfsmanager_messages_createfile",
                            operations=20.0))
    again = ServerUsage.from_json(usage.to_json())
    assert again == usage and again.exporter is not None
    assert usage.to_json()["exporter"]["namespace_requests"] == 139
    record = StepRecord(step_id="main-001", test="t", section="put", operation="put",
                        clients=2, system="dcache", server=usage)
    assert server_cell(record) == "20 put (20 req, 1/put), exporter 20 put (139 pnfs req)"
    record.server = ServerUsage(exporter=ExporterFigures(note="dCache 10.2.25 ships no "
                                                              "Prometheus exporter"))
    assert server_cell(record) == "no exporter"
    record.server = ServerUsage()  # not a dCache: nothing said of an exporter
    assert server_cell(record) == "-"


def _plan(operation: str, workdir: str = "/storagescale/run/step-1"):
    from pytest_storagescale.load.operations import get_operation

    return SimpleNamespace(operation=get_operation(operation), workdir=workdir)


def test_a_dcache_without_exporter_has_a_watch_that_says_so_and_another_server_none():
    from pytest_storagescale.steps import _exporter_watch

    watch = _exporter_watch(SimpleNamespace(prometheus_url="", version="10.2.25"),
                            _plan("put"))
    watch.start()
    figures = watch.finish()
    assert figures.operations is None and figures.rose == {} and figures.counter == ""
    assert "dCache 10.2.25 ships no Prometheus exporter" in figures.note
    assert ServerUsage(exporter=figures).counts_unmeasured == ""  # nothing to compare
    assert _exporter_watch(SimpleNamespace(), _plan("put")) is None  # an xrootd


#: the end of 11.2.5's shipped rules (etc/prometheus_exporter_config.yaml) as it is
SHIPPED = """
lowercaseOutputName: true
lowercaseOutputLabelNames: true

rules:

  # PnfsManager operations

  - pattern: 'org.dcache.commons.stats<type=RequestExecutionTimeGauge, family=PnfsManagerV3, name=(.*)><>UpdateNum'
    name: dcache_pnfsmanager_ops_$1_updatenum
    help: "PnfsManager operations execution metrics"
    type: COUNTER


# PnfsManager messages

  - pattern: 'org.dcache.commons.stats<type=RequestCounter, family=ChimeraNameSpaceProvider, name=(.*)\\(.*><>(Failed|Successful)'
    name: dcache_pnfsmanager_messages_$1_$2
    help: "PnfsManager message counter"
    type: COUNTER"""


def _exported(rule: dict, bean: str) -> str | None:
    """The name a jmx_exporter rule gives a bean's attribute (its pattern unanchored,
    ``$n`` its groups, lower-cased as the release's ``lowercaseOutputName``), None when
    it does not match."""
    import re

    found = re.search(rule["pattern"], bean)
    if found is None:
        return None
    return re.sub(r"\$(\d)", lambda m: found.group(int(m.group(1))), rule["name"]).lower()


def test_our_srm_rules_come_after_the_releases_and_export_the_srm_doors_counters():
    """The configuration is the release's rules unchanged, then ours: one rule that
    exports the SRM door's request counters (``family=srmv2``, one bean per request
    type: SrmHandler's RequestCounters) as ``dcache_srm_requests_<type>_<outcome>``;
    it names no chimera counter and no other attribute, and the release's rules name
    no SRM counter. The indentation follows the release's, a text without rules gets
    the list."""
    import yaml

    from pytest_storagescale.load.dcache_exporter import SRM_PREFIX, with_rules

    shipped = yaml.safe_load(SHIPPED)["rules"]
    config = yaml.safe_load(with_rules(SHIPPED))
    assert config["lowercaseOutputName"] is True
    assert config["rules"][:-1] == shipped and len(config["rules"]) == len(shipped) + 1
    ours = config["rules"][-1]
    assert ours["type"] == "COUNTER"
    beans = "org.dcache.commons.stats<type=RequestCounter, family={family}, name={name}><>{attr}: 7"
    for name, attribute, exported in (
            ("SrmLsRequest", "Successful", SRM_PREFIX + "ls_successful"),
            ("SrmLsRequest", "Failed", SRM_PREFIX + "ls_failed"),
            ("SrmPrepareToPutRequest", "Successful", SRM_PREFIX + "preparetoput_successful"),
            ("SrmStatusOfLsRequestRequest", "Failed", SRM_PREFIX + "statusoflsrequest_failed"),
            ("SrmBringOnlineRequest", "Successful", SRM_PREFIX + "bringonline_successful")):
        bean = beans.format(family="srmv2", name=name, attr=attribute)
        assert _exported(ours, bean) == exported, bean
        assert not any(_exported(rule, bean) for rule in shipped), bean  # not theirs
    for bean in (beans.format(family="srmv2", name="SrmLsRequest", attr="TotalRequests"),
                 beans.format(family="ChimeraNameSpaceProvider", name="createFile(x)",
                              attr="Successful"),
                 beans.format(family="diskCacheV111.srm.dcache.Storage",
                              name="listDirectory|x", attr="Successful")):
        assert _exported(ours, bean) is None, bean
    assert _exported(shipped[-1], beans.format(
        family="ChimeraNameSpaceProvider", name="createFile(x)", attr="Successful")) \
        == "dcache_pnfsmanager_messages_createfile_successful"
    deeper = yaml.safe_load(with_rules("rules:\n    - pattern: 'x'\n      name: y"))
    assert deeper["rules"][0] == {"pattern": "x", "name": "y"} and deeper["rules"][1] == ours
    assert yaml.safe_load(with_rules("lowercaseOutputName: true\n"))["rules"] == [ours]


def test_an_srm_step_compares_the_srm_doors_request_count_another_door_chimeras():
    """On the ``srm`` door a step's operation is compared with the SRM door's requests
    of its type (a stat: srmLs; a put: srmPrepareToPut...); on another door, or
    an operation without an SRM request of its own, with chimera's call as before. A
    request type's counter that appeared between the two scrapes (dCache makes it at
    the type's first request) rose from 0: before, such a step counted nothing."""
    from pytest_storagescale.load.dcache_exporter import counter_for

    assert counter_for("stat", "srm") == "dcache_srm_requests_ls"
    assert counter_for("ls", "srm") == ""  # 2 srmLs an ls: not one of a kind
    assert counter_for("put", "srm") == "dcache_srm_requests_preparetoput"
    assert counter_for("get", "srm") == "dcache_srm_requests_preparetoget"
    assert counter_for("mkdir", "srm") == "dcache_srm_requests_mkdir"
    # a delete's set-up put makes an srmRm and a chimera remove too: neither compared
    assert counter_for("delete", "srm") == ""
    assert counter_for("delete", "davs") == "dcache_pnfsmanager_messages_remove"
    assert counter_for("put", "davs") == "dcache_pnfsmanager_messages_createfile"
    assert counter_for("write", "srm") == "dcache_pnfsmanager_messages_createfile"
    assert counter_for("stat", "root") == "" and counter_for("stat") == ""
    watch = ExporterWatch("http://127.0.0.1:9/metrics", "prometheus", "pw", "stat",
                          door="srm")
    assert watch.counter == "dcache_srm_requests_ls" and "door='srm'" in repr(watch)
    assert ExporterWatch("", "", "", "stat", door="srm").counter == ""  # no exporter
    before = parse(_exposition())
    after = parse(_exposition() + (
        "# TYPE dcache_srm_requests_ls_successful counter\n"
        "dcache_srm_requests_ls_successful_total 9.0\n"
        "# TYPE dcache_srm_requests_ls_failed counter\n"
        "dcache_srm_requests_ls_failed_total 1.0\n"))
    rose = rises(before, after)
    assert counted(rose, "dcache_srm_requests_ls") == 10, rose


def test_an_srm_step_whose_srm_count_disagrees_says_it_was_the_srm_door():
    counter = "dcache_srm_requests_ls"
    assert exporter_disagreement(10, 0, _usage(10, counter)) is None
    said = exporter_disagreement(10, 0, _usage(13, counter))
    assert said is not None and said.startswith(
        "dCache's Prometheus exporter (the SRM door's requests) counted 13"), said
    assert "13 'ls' requests" in said and "load from outside the plugin" in said
    said = exporter_disagreement(10, 0, _usage(7, counter))
    assert said is not None and "never reached the server" in said


def test_an_srm_stat_steps_count_has_room_for_its_clients_login_stats():
    """A gfal2 SRM client logs in with a stat (one srmLs) before the step's clock,
    inside the load's scrapes: measured through the plugin, 2 clients, 31 stats, 33
    srmLs, which the step called load from outside before. Each client's login may add
    one srmLs, no more; a counter a login does not touch (srmPrepareToPut) gets none."""
    from pytest_storagescale.steps import counts_disagree

    ls, put = "dcache_srm_requests_ls", "dcache_srm_requests_preparetoput"
    assert exporter_disagreement(31, 0, _usage(33, ls), clients=2) is None
    assert exporter_disagreement(31, 0, _usage(31, ls), clients=2) is None
    said = exporter_disagreement(31, 0, _usage(35, ls), clients=2)
    assert said is not None and "load from outside the plugin" in said, said
    assert exporter_disagreement(31, 0, _usage(33, ls)) is not None  # no clients given
    assert exporter_disagreement(31, 0, _usage(33, put), clients=2) is not None
    record = SimpleNamespace(issued_operations=31, server=_usage(33, ls),
                             total=SimpleNamespace(hung=0, clients=2, failed=0, throttled=0))
    assert counts_disagree(record) is None
    record.total.clients = 1
    assert counts_disagree(record) is not None


# -- the tests' shared dCache ---------------------------------------------------------
def test_the_exporters_password_digest_reads_the_same_as_java_spells_it(tmp_path):
    """jmx_exporter compares the salted SHA-256 as ``BigInteger.toString(16)`` spells
    it (no leading zeros): the configuration's digest never begins with 0, so the right
    password is taken in either spelling (a digest beginning with 0, 1 start in 16,
    refused it: CI, 2026-11-29); each is the SHA-256 of ``salt:password``."""
    import hashlib
    import re

    from pytest_storagescale.servers.dcache import EmbeddedDCache

    home = tmp_path / "dist"
    (home / "share" / "classes").mkdir(parents=True)
    (home / "share" / "classes" / "jmx_prometheus_javaagent-0.20.0.jar").write_bytes(b"")
    (home / "etc").mkdir()
    (home / "etc" / "prometheus_exporter_config.yaml").write_text("rules:\n- pattern: x\n")
    server = EmbeddedDCache()
    server.home, server.directory, server.ports = home, tmp_path, {"prometheus": 10306}
    server.password = "a-password"
    seen = set()
    for _ in range(64):  # P(no digest of 64 begins with 0, unguarded) = (15/16)**64 = 1.6 %
        lines = server._prometheus_lines()
        text = (tmp_path / "prometheus-exporter.yaml").read_text()
        salt = re.search(r"salt: (\S+)", text).group(1)
        digest = re.search(r"passwordHash: (\S+)", text).group(1)
        assert digest == hashlib.sha256(f"{salt}:a-password".encode()).hexdigest()
        assert digest == format(int(digest, 16), "x")  # Java's spelling of it
        assert "rules:" in text and "a-password" not in text
        seen.add(salt)
    assert len(seen) == 64 and lines[0] == "dcache.enable.prometheus.exporter=true"


def test_the_exporter_answers_only_with_the_runs_password(embedded_dcache) -> None:
    from pytest_storagescale.servers.dcache import PROMETHEUS_USER

    server = embedded_dcache
    jars = sorted((server.home / "share" / "classes").glob("jmx_prometheus_javaagent-*"))
    if int(server.version.split(".")[0]) < 11:
        assert not jars and server.prometheus_url == ""  # 10.2 ships no exporter
        pytest.skip(f"dCache {server.version} ships no Prometheus exporter")
    assert jars and server.prometheus_url.startswith("http://127.0.0.1:")
    with pytest.raises(ScrapeError, match="answered 401"):
        scrape(server.prometheus_url, PROMETHEUS_USER, "not-the-password")
    samples = scrape(server.prometheus_url, PROMETHEUS_USER, server.password).samples
    assert any(name.startswith("jvm_") for name in samples)
    assert server.password not in (server.directory / "prometheus-exporter.yaml").read_text()


def _davs(server, root: str, name: str):
    from pytest_storagescale.drivers.registry import driver_spec

    options = {key: value for key, value in server.driver_options().items()
               if key != "security_protocol"}
    return driver_spec(server.url_for("davs"), driver="http", options=options,
                       writable_root=root).connect(name, timeout=60)


def test_the_exporters_namespace_counters_rise_by_a_clients_operations(embedded_dcache
                                                                       ) -> None:
    from pytest_storagescale.servers.dcache import PROMETHEUS_USER

    server = embedded_dcache
    if not server.prometheus_url:
        pytest.skip(f"dCache {server.version} ships no Prometheus exporter")
    client = _davs(server, "/storagescale", "prometheus")
    folder = f"/storagescale/prometheus-{int(time.time() * 1000)}"
    files = 20
    try:
        client.mkdir(folder)
        before = scrape(server.prometheus_url, PROMETHEUS_USER, server.password)
        for index in range(files):
            client.put(f"{folder}/f{index}", b"counted")
        after = scrape(server.prometheus_url, PROMETHEUS_USER, server.password)
    finally:
        client.remove_tree(folder)
        client.close()
    rose = rises(before, after)
    print(f"{files} WebDAV uploads: dCache's exporter counted {rose}")
    # measured (11.2.5): 20 uploads, PnfsCreateEntryMessage 20, chimera createFile 20
    # (and 119 PnfsGetFileAttributes, 139 id2inode: what a WebDAV upload costs)
    assert rose.get("dcache_pnfsmanager_ops_pnfscreateentrymessage_updatenum_total") \
        == files, rose
    assert rose.get("dcache_pnfsmanager_messages_createfile_successful_total") == files, rose


def test_a_steps_watch_puts_the_exporters_count_beside_the_clients(embedded_dcache):
    """A put step's watch as steps.server_watch makes it on the embedded dCache: 11.2.5's
    exporter counts the 10 files the clients created (and billing 10 writes in the
    step's folder); with 3 files created meanwhile by a client outside the step (in
    another folder) the exporter's count is 13 and the step says it measured load from
    outside (billing, which keeps the step's folder only, still counts 10). On 10.2.25
    the step says its dCache ships no exporter and compares nothing."""
    from pytest_storagescale.load.server_monitor import ServerWatch, disagreement
    from pytest_storagescale.reporting.table import server_cell
    from pytest_storagescale.steps import _billing_watch, _exporter_watch

    server = embedded_dcache
    run = f"/storagescale/exporter-{secrets.token_hex(4)}"
    step, outside = f"{run}/put-c1-main-001", f"{run}/outside"
    client = _davs(server, run, "exporter-step")
    try:
        for folder in (run, step, outside):
            client.mkdir(folder)
        seen = []
        for extra in (0, 3):
            plan = _plan("put", step)
            watch = ServerWatch(source="embedded dcache", operation="put",
                                billing=(billing := _billing_watch(server, plan)),
                                billing_counter=billing.counter,
                                exporter=_exporter_watch(server, plan))
            with watch.bracket():
                for index in range(10):
                    client.put(f"{step}/c{extra}-{index}", b"step")
                for index in range(extra):
                    client.put(f"{outside}/o{index}", b"outside")
            usage = watch.usage(time.time() - 1, time.time())
            seen.append(usage)
            assert (usage.ops["write"], usage.counted) == (10, "write"), usage
            assert disagreement(10, 0, usage, clients=1) is None  # billing: the folder's
        figures = [usage.exporter for usage in seen]
        print(f"dCache {server.version}: exporter {[f.to_json() for f in figures]}")
        if not server.prometheus_url:
            assert all("ships no Prometheus exporter" in f.note and f.operations is None
                       and not f.rose for f in figures), figures
            assert all(exporter_disagreement(10, 0, usage) is None for usage in seen)
            record = SimpleNamespace(server=seen[0], operation="put", server_saturated=False)
            assert "no exporter" in server_cell(record)
            return
        assert [f.operations for f in figures] == [10, 13], figures
        assert all(f.gauges.get("jvm_threads_current", 0) > 10 for f in figures), figures
        assert exporter_disagreement(10, 0, seen[0]) is None
        said = exporter_disagreement(10, 0, seen[1])
        assert said is not None and "dCache's Prometheus exporter counted 13" in said, said
        assert "load from outside the plugin" in said
    finally:
        client.remove_tree(run)
        client.close()


def _one_step_through_the_plugin(pytester, dcache_release: str, operation: str, *,
                                 plan: str = "", door: str | None = None):
    """A 2-client ``operation`` step (2 s after 0.5 s of warm-up; ``plan``: more lines
    of its thresholds section) through the plugin against a dCache of its own
    (``--storage-embedded dcache``), over ``door`` when one is named: the run, which
    passed, and the step's record from the results file."""
    import json

    (pytester.path / "thr" / "dcache").mkdir(parents=True)
    (pytester.path / "thr" / "dcache" / "t.toml").write_text(
        '[storage]\nsystem = "dcache"\nversions = ["*"]\n[defaults]\nduration = "2s"\n'
        f'warmup = "0.5s"\nhang_timeout = "60s"\n[ops.{operation}]\nclients = [2]\n'
        f'{plan}[[ops.{operation}.expect]]\nrules = ["failed == 0", "hung == 0"]\n')
    pytester.makepyfile(test_suite=f"""
        import pytest

        @pytest.mark.storagescale_system("dcache")
        @pytest.mark.storagescale_op("{operation}")
        def test_{operation}(storage_load, storage_clients):
            storage_load.run()
    """)
    results = pytester.path / "results.json"
    doors = [f"--storage-load-doors={door}"] if door else []
    result = pytester.runpytest_subprocess(
        "test_suite.py", "--storage-embedded=dcache",
        f"--storage-embedded-version={dcache_release}", *doors, "--storage-thresholds=thr",
        f"--storage-results={results}", "-p", "no:cacheprovider", timeout=1200)
    assert result.ret == 0, (result.stdout.str() + result.stderr.str())[-4000:]
    [step] = json.loads(results.read_text())["steps"]
    return result, step


@pytest.mark.integration
@pytest.mark.slow_server
def test_a_put_steps_record_has_the_exporters_count_through_the_plugin(pytester,
                                                                        dcache_release):
    """Through the plugin (``--storage-embedded dcache``: a dCache of its own): a
    2-client put step's JSON has ``server.exporter``; on 11.2.5 its count of the files
    created is the clients' operations (the step passed, so billing's and the
    exporter's checks agreed) and the table's server cell says ``exporter N put``; on
    10.2.25 the record says the release ships no exporter, with no count."""
    result, step = _one_step_through_the_plugin(pytester, dcache_release, "put",
                                                plan='file_size = "10kB"\n')
    exporter = step["server"]["exporter"]
    print(f"dCache {dcache_release}: {exporter}")
    row = "\n".join(line for line in result.stdout.lines if "exporter" in line)
    if dcache_release.startswith("10."):
        assert "ships no Prometheus exporter" in exporter["note"], exporter
        assert exporter["operations"] is None and exporter["rose"] == {}, exporter
        assert "no exporter" in row, row
        return
    sent = (step["warmup_operations"] + step["succeeded"] + step["failed"]
            + step["drain_operations"])
    assert exporter["counter"] == "dcache_pnfsmanager_messages_createfile", exporter
    assert exporter["operations"] == sent and exporter["note"] == "", (exporter, sent)
    assert step["server"]["ops"]["write"] == sent and step["verdict"] == "pass", step
    assert f"exporter {sent} put" in row, row


def test_the_dcache_over_hosts_says_its_exporter_is_out_of_reach_not_unmeasured():
    """Each domain's exporter of the dCache over hosts listens on 127.0.0.1 in its own
    host's namespace: a put step there says why it has no exporter counters, and the
    step's count check is not called unmeasured (its billing is still compared). Before,
    the step scraped this machine's 127.0.0.1 and warned 'exporter not read'."""
    from types import SimpleNamespace

    from pytest_storagescale.load.server_usage import ServerUsage
    from pytest_storagescale.servers.dcache_hosts import EmbeddedDCacheHosts
    from pytest_storagescale.steps import _exporter_watch

    server = EmbeddedDCacheHosts(hosts=4)  # not started: no namespace, no dCache
    assert server.prometheus_url == ""
    watch = _exporter_watch(server, SimpleNamespace(operation=SimpleNamespace(name="put")))
    assert watch is not None
    figures = watch.finish()
    assert figures.counter == "" and figures.operations is None
    assert "own host's network namespace" in figures.note
    assert "ships no Prometheus exporter" not in figures.note
    assert ServerUsage(exporter=figures).exporter_unmeasured == ""


# -- the SRM door's request counters (our rules after the release's) ------------------
def _srm(server, root: str, name: str):
    from pytest_storagescale.drivers.registry import driver_spec

    options = {key: value for key, value in server.driver_options().items()
               if key in ("ca_dir", "x509_proxy")}
    return driver_spec(server.url_for("srm"), driver="gfal2", writable_root=root,
                       options=options).connect(name, timeout=120)


def _srm_rises(server, action, times: int, also: tuple[str, ...] = ()
               ) -> dict[str, float]:
    """What the SRM door's counters (and the counters ``also`` begins) rose by over
    ``times`` calls of ``action``."""
    from pytest_storagescale.load.dcache_exporter import SRM_PREFIX
    from pytest_storagescale.servers.dcache import PROMETHEUS_USER

    before = scrape(server.prometheus_url, PROMETHEUS_USER, server.password)
    for index in range(times):
        action(index)
    after = scrape(server.prometheus_url, PROMETHEUS_USER, server.password)
    return {name: value for name, value in rises(before, after).items()
            if name.startswith((SRM_PREFIX, *also))}


def test_the_srm_doors_request_counters_rise_by_a_clients_requests(embedded_dcache):
    """Our rules export the SRM door's request counters (``family=srmv2``), which the
    release's rules do not: N stats through gfal2's SRM plugin raise the door's
    ``SrmLsRequest`` count by exactly N, and each operation of :data:`SRM_COUNTERS`
    raises its request type's by one an operation (its successes and failures). An
    ls, measured beside them, made 2 srmLs, and a delete step's repetition (a put, then
    the delete) 2 srmRm and 2 chimera removes: neither is compared."""
    from pytest_storagescale.load.dcache_exporter import SRM_COUNTERS, counter_for
    from pytest_storagescale.servers.dcache import AREA

    server = embedded_dcache
    if not server.prometheus_url:
        pytest.skip(f"dCache {server.version} ships no Prometheus exporter")
    root = f"{AREA}/srm-exporter-{secrets.token_hex(4)}"
    client = _srm(server, root, "srm-exporter")
    times = 7
    seen: dict[str, dict[str, float]] = {}
    try:
        client.mkdir(root)
        client.put(f"{root}/sample", b"sample")  # what the stats and gets ask for
        seen["stat"] = _srm_rises(server, lambda _: client.stat(f"{root}/sample"), times)
        seen["ls"] = _srm_rises(server, lambda _: client.ls(root), times)
        seen["mkdir"] = _srm_rises(server, lambda i: client.mkdir(f"{root}/d{i}"), times)
        seen["put"] = _srm_rises(server, lambda i: client.put(f"{root}/p{i}", b"put"), times)
        seen["get"] = _srm_rises(server, lambda _: client.get(f"{root}/sample"), times)
        seen["delete"] = _srm_rises(server, lambda i: client.delete(f"{root}/p{i}"), times)
        # a delete step's repetition: its file put (Delete.before), then deleted
        seen["put+delete"] = _srm_rises(server, lambda i: (
            client.put(f"{root}/q{i}", b""), client.delete(f"{root}/q{i}")), times,
            also=("dcache_pnfsmanager_messages_remove",))
    finally:
        client.remove_tree(root)
        client.close()
    print(f"dCache {server.version}, {times} of each through gfal2's SRM plugin: {seen}")
    assert counted(seen["stat"], "dcache_srm_requests_ls") == times, seen["stat"]
    for operation, counter in SRM_COUNTERS.items():
        assert counted(seen[operation], counter) == times, (operation, seen[operation])
    assert "ls" not in SRM_COUNTERS and counted(seen["ls"], "dcache_srm_requests_ls") \
        == 2 * times, seen["ls"]
    assert counted(seen["delete"], "dcache_srm_requests_rm") == times, seen["delete"]
    # a delete step over srm: 2 srmRm and 2 chimera removes a repetition (measured
    # 14 and 14 for 7): compared with neither
    assert counter_for("delete", "srm") == ""
    assert counted(seen["put+delete"], "dcache_srm_requests_rm") == 2 * times
    assert counted(seen["put+delete"], "dcache_pnfsmanager_messages_remove") \
        == 2 * times, seen["put+delete"]


def test_an_srm_steps_watch_compares_the_srm_doors_count_with_its_clients(embedded_dcache):
    """A stat step over the ``srm`` door as steps.server_watch makes it: its watch
    compares the SRM door's ``srmLs`` count with its clients' stats: 10 agree; with 3
    stats meanwhile from a client outside the step the door counted 13 and the step
    says it measured load from outside. Over another door the same step compares
    nothing of SRM (a stat makes no chimera call: no counter)."""
    from pytest_storagescale.servers.dcache import AREA
    from pytest_storagescale.steps import _exporter_watch

    server = embedded_dcache
    if not server.prometheus_url:
        pytest.skip(f"dCache {server.version} ships no Prometheus exporter")
    root = f"{AREA}/srm-step-{secrets.token_hex(4)}"
    client, outside = _srm(server, root, "srm-step"), _srm(server, root, "srm-outside")
    seen = []
    try:
        client.mkdir(root)
        client.put(f"{root}/f", b"stat me")
        for extra in (0, 3):
            watch = _exporter_watch(server, _plan("stat", root), "srm")
            assert watch.counter == "dcache_srm_requests_ls", watch.counter
            watch.start()
            for _ in range(10):
                client.stat(f"{root}/f")
            for _ in range(extra):
                outside.stat(root)
            seen.append(watch.finish())
        assert _exporter_watch(server, _plan("stat", root), "davs").counter == ""
    finally:
        client.remove_tree(root)
        client.close()
        outside.close()
    print(f"dCache {server.version}: SRM door over a stat step {[f.to_json() for f in seen]}")
    assert [f.operations for f in seen] == [10, 13], seen
    assert exporter_disagreement(10, 0, ServerUsage(exporter=seen[0])) is None
    said = exporter_disagreement(10, 0, ServerUsage(exporter=seen[1]))
    assert said is not None and "counted 13" in said and "SRM door" in said, said
    assert "load from outside the plugin" in said, said


@pytest.mark.integration
@pytest.mark.slow_server
def test_an_srm_stat_steps_record_has_the_srm_doors_count_through_the_plugin(
        pytester, dcache_release):
    """Through the plugin over the ``srm`` door (``--storage-load-doors srm``): a
    2-client stat step's exporter figures count the SRM door's ``srmLs`` requests, and
    on 11.2.5 that count is the clients' operations (warm-up, measured and drain) and
    at most their 2 logins' stats: the step passed, so the comparison agreed (before
    the logins were allowed for, it was an error: 33 counted for 31); on 10.2.25 the
    record says the release ships no exporter."""
    _, step = _one_step_through_the_plugin(pytester, dcache_release, "stat", door="srm")
    exporter = step["server"]["exporter"]
    print(f"dCache {dcache_release}, a stat step over srm: {exporter}")
    if dcache_release.startswith("10."):
        assert "ships no Prometheus exporter" in exporter["note"], exporter
        assert exporter["operations"] is None and exporter["rose"] == {}, exporter
        return
    sent = (step["warmup_operations"] + step["succeeded"] + step["failed"]
            + step.get("throttled", 0) + step["drain_operations"])
    assert step["door"] == "srm", step["door"]
    assert exporter["counter"] == "dcache_srm_requests_ls", exporter
    # each client's login stat (one srmLs) may fall within the scrapes: measured 20
    # srmLs for 18 stats of 2 clients (2026-11-29, load 14-21), 33 for 31
    assert sent > 0 and sent <= exporter["operations"] <= sent + 2, (exporter, sent)
    assert step["verdict"] == "pass", step
