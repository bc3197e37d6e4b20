"""dCache's Prometheus JMX exporter (11.1+: ``dcache.enable.prometheus.exporter``, the
``jmx_prometheus_javaagent`` jar in ``share/classes``) on the tests' shared dCache:
enabled on loopback with the release's own rules and basic authentication; its
namespace counters rise by what a client did (``load/dcache_billing.py``:
``scrape_exporter``, ``exporter_counts``). 10.2.25 ships neither the jar nor the option:
the embedded dCache has no exporter there."""

from __future__ import annotations

import time

import pytest

from pytest_storagescale.errors import EndpointError
from pytest_storagescale.load.dcache_billing import exporter_counts, scrape_exporter


def test_the_exporter_answers_only_with_the_runs_password(embedded_dcache) -> None:
    from pytest_storagescale.servers.dcache import PROMETHEUS_USER

    server = embedded_dcache
    jars = sorted((server.home / "share" / "classes").glob("jmx_prometheus_javaagent-*"))
    if int(server.version.split(".")[0]) < 11:
        assert not jars and server.prometheus_url == ""  # 10.2 ships no exporter
        pytest.skip(f"dCache {server.version} ships no Prometheus exporter")
    assert jars and server.prometheus_url.startswith("http://127.0.0.1:")
    with pytest.raises(EndpointError, match="answered 401"):
        scrape_exporter(server.prometheus_url, PROMETHEUS_USER, "not-the-password")
    samples = scrape_exporter(server.prometheus_url, PROMETHEUS_USER, server.password)
    assert any(name.startswith("jvm_") for name in samples)
    assert server.password not in (server.directory / "prometheus-exporter.yaml").read_text()


def test_the_exporters_namespace_counters_rise_by_a_clients_operations(embedded_dcache
                                                                       ) -> None:
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.servers.dcache import PROMETHEUS_USER

    server = embedded_dcache
    if not server.prometheus_url:
        pytest.skip(f"dCache {server.version} ships no Prometheus exporter")
    options = {key: value for key, value in server.driver_options().items()
               if key != "security_protocol"}
    client = driver_spec(server.url_for("davs"), driver="http", options=options,
                         writable_root="/storagescale").connect("prometheus", timeout=60)
    folder = f"/storagescale/prometheus-{int(time.time() * 1000)}"
    files = 20
    try:
        client.mkdir(folder)
        before = scrape_exporter(server.prometheus_url, PROMETHEUS_USER, server.password)
        for index in range(files):
            client.put(f"{folder}/f{index}", b"counted")
        after = scrape_exporter(server.prometheus_url, PROMETHEUS_USER, server.password)
    finally:
        client.remove_tree(folder)
        client.close()
    counts = exporter_counts(before, after)
    print(f"{files} WebDAV uploads: dCache's exporter counted {counts}")
    # measured (11.2.5): 20 uploads, PnfsCreateEntryMessage 20, chimera createFile 20
    # (and 119 PnfsGetFileAttributes, 139 id2inode: what a WebDAV upload costs)
    assert counts.get("dcache_pnfsmanager_ops_pnfscreateentrymessage_updatenum_total") \
        == files, counts
    assert counts.get("dcache_pnfsmanager_messages_createfile_successful_total") == files, counts
