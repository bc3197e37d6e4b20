"""Client hosts over IPv6 (issue 36): namespace hosts whose veths carry a unique local
address (fd00::/8) beside their IPv4 one, a Dask scheduler and workers that speak over
IPv6, and steps against one real embedded xrootd by its IPv6 and its IPv4 address in
one run.

Needs root (``ip netns``); skipped with the reason otherwise.
"""

from __future__ import annotations

import ipaddress
import re
import time

import pytest
from netns import NamespaceCluster, bridge_xrootd, netns_unavailable

from pytest_storagescale.cluster import hosts as cluster_hosts
from pytest_storagescale.cluster.coordinator import run_cluster_step
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("network_namespaces")]


def _logins(text: str) -> dict[str, set[str]]:
    """Distinct load-client logins (user.pid:fd) by the address the server saw, v4 or v6
    (XRootD writes ``user@[address]`` for IPv6 and mapped IPv4 addresses)."""
    logins: dict[str, set[str]] = {}
    for user, address in re.findall(r"XrootdXeq: (c\w+\.\d+:\d+)@\[?(?:::ffff:)?([\w.:]+?)\]? "
                                    r"\S+ \S+ login", text):
        logins.setdefault(str(ipaddress.ip_address(address)), set()).add(user)
    return logins


def test_a_step_over_ipv6_and_one_over_ipv4_in_one_run(tmp_path):
    why = netns_unavailable()
    if why is not None:
        pytest.skip(why)
    cluster = NamespaceCluster(2, tmp_path, ipv6=True)
    try:
        with bridge_xrootd(https=False) as server:
            cluster.start()
            assert cluster.address.startswith(f"tls://[{cluster.head6}]:")
            connection = cluster_hosts.connect(cluster.address)
            hosts = connection.hosts()
            v6 = sorted(str(ipaddress.ip_address(h.address6)) for h in cluster.hosts
                        if h.address6)
            assert sorted(h.address for h in hosts) == v6  # the workers speak IPv6
            seen: dict[str, dict[str, set[str]]] = {}
            for family, head in (("v6", f"[{cluster.head6}]"), ("v4", cluster.head)):
                url = f"root://{head}:{server.port}//storagescale"
                root = f"/storagescale/ipv6-{family}-{time.time_ns()}"
                driver_spec(url, writable_root=root).connect("functional-tests",
                                                              timeout=10).mkdir(root)
                since = len(server.log_path.read_bytes())
                result = run_cluster_step(cluster.address, StepPlan(
                    operation=get_operation("stat"), clients=6, duration=1.5, warmup=0.3,
                    hang_timeout=30.0, driver=driver_spec(url, writable_root=root),
                    workdir=f"{root}/step"))
                total = result.total
                assert total.failed == 0 and total.hung == 0 and result.lost == 0
                assert [h.clients for h in result.hosts] == [3, 3]
                assert all(h.succeeded > 0 for h in result.hosts)
                seen[family] = _logins(server.log_path.read_text(errors="replace")[since:])
    finally:
        cluster_hosts.disconnect()
        cluster.stop()
    assert cluster.leftovers() == []
    v4 = sorted(h.address for h in cluster.hosts)
    # each host's 3 clients logged in from its IPv6 address, then from its IPv4 one
    assert {a: len(u) for a, u in seen["v6"].items() if a in v6} == {a: 3 for a in v6}, seen
    assert {a: len(u) for a, u in seen["v4"].items() if a in v4} == {a: 3 for a in v4}, seen
    assert not set(seen["v6"]) & set(v4) and not set(seen["v4"]) & set(v6)


def test_an_ipv6_endpoint_keeps_its_brackets():
    """The XRootD driver builds its server URL from the endpoint's host: an IPv6
    address without brackets (root://::1:1094) was refused ("Operation not supported")."""
    from pytest_storagescale.drivers.url import EndpointURL

    endpoint = EndpointURL.parse("root://[fd00::1]:1094//storagescale/area")
    assert endpoint.host == "fd00::1" and endpoint.netloc_host == "[fd00::1]"
    assert endpoint.server == "root://[fd00::1]:1094"
    assert EndpointURL.parse("root://10.0.0.1:1094//a").netloc_host == "10.0.0.1"
