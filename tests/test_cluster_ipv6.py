"""Client hosts over IPv6 (issue 36): namespace hosts whose veths carry a unique local
address (fd00::/8) beside their IPv4 one, a Dask scheduler and workers that speak over
IPv6, and steps against one real embedded xrootd by its IPv6 and its IPv4 address in
one run.

Needs root (``ip netns``); skipped with the reason otherwise.
"""

from __future__ import annotations

import ipaddress
import time

import pytest
from netns import NamespaceCluster, bridge_xrootd, netns_unavailable, xrootd_logins

from pytest_storagescale.cluster import hosts as cluster_hosts
from pytest_storagescale.cluster.coordinator import run_cluster_step
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("network_namespaces")]


def test_a_step_over_ipv6_and_one_over_ipv4_in_one_run(tmp_path):
    why = netns_unavailable()
    if why is not None:
        pytest.skip(why)
    cluster = NamespaceCluster(2, tmp_path, ipv6=True)
    try:
        # one server a family: a bridge server listens on one address, never on all
        with bridge_xrootd(https=False, ipv6=True) as server6, \
                bridge_xrootd(https=False) as server4:
            cluster.start()
            assert cluster.address.startswith(f"tls://[{cluster.head6}]:")
            connection = cluster_hosts.connect(cluster.address)
            hosts = connection.hosts()
            v6 = sorted(str(ipaddress.ip_address(h.address6)) for h in cluster.hosts
                        if h.address6)
            assert sorted(h.address for h in hosts) == v6  # the workers speak IPv6
            seen: dict[str, dict[str, set[str]]] = {}
            for family, server in (("v6", server6), ("v4", server4)):
                url = f"root://{server.host}:{server.port}//storagescale"
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
                seen[family] = xrootd_logins(server.log_path.read_text(errors="replace")[since:])
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


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_the_http_driver_reaches_a_door_by_its_ipv6_address(tmp_path):
    """The HTTP driver's base URL kept the IPv6 host without brackets
    (``http://::1:port``), which libcurl cannot parse: every request failed."""
    import http.server
    import threading

    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    seen: list[tuple[str, str]] = []

    class Door(http.server.BaseHTTPRequestHandler):
        def do_PROPFIND(self):  # noqa: N802 - the method's name
            seen.append((self.command, self.headers.get("Host", "")))
            body = (b'<?xml version="1.0"?><d:multistatus xmlns:d="DAV:"><d:response>'
                    b"<d:href>/area</d:href><d:propstat><d:prop><d:resourcetype>"
                    b"<d:collection/></d:resourcetype></d:prop>"
                    b"<d:status>HTTP/1.1 200 OK</d:status></d:propstat></d:response>"
                    b"</d:multistatus>")
            self.send_response(207)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server6(http.server.ThreadingHTTPServer):
        address_family = __import__("socket").AF_INET6

    server = Server6(("::1", 0), Door)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://[::1]:{server.server_address[1]}/area"
        client = driver_spec(url, driver="http", writable_root="/area").connect(
            "functional-tests", timeout=10)
        try:
            assert client.stat("/area").is_dir
        finally:
            client.close()
    finally:
        server.shutdown()
        server.server_close()
    assert seen and seen[0][0] == "PROPFIND"
    assert seen[0][1] == f"[::1]:{server.server_address[1]}"


def test_the_srm_driver_sends_an_ipv6_host_in_brackets(tmp_path):
    """The SRM driver's own SOAP exchange wrote ``Host: fd00::1`` (RFC 7230 wants the
    URI's form, ``[fd00::1]``); over TLS to a door on ``::1`` it sends ``[::1]``."""
    import socket
    import ssl
    import threading

    from pytest_storagescale.drivers.srm import _exchange
    from pytest_storagescale.drivers.url import EndpointURL
    from pytest_storagescale.servers.credentials import ThrowawayCA

    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    authority = ThrowawayCA(tmp_path)
    host = authority.issue_host(tmp_path / "host.pem", tmp_path / "host.key", ips=("::1",))
    serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    serving.load_cert_chain(host.cert, host.key)
    listener = socket.socket(socket.AF_INET6)
    listener.bind(("::1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    received: list[bytes] = []

    def answer() -> None:
        raw, _ = listener.accept()
        with serving.wrap_socket(raw, server_side=True) as connection:
            data = b""
            while b"\r\n\r\n" not in data:
                data += connection.recv(4096)
            received.append(data)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    client = ssl.create_default_context(capath=str(authority.ca_dir))
    try:
        answer_bytes = _exchange(EndpointURL.parse(f"srm://[::1]:{port}/area"), client,
                                 "/srm/managerv2", b"<x/>", 10, False)
    finally:
        thread.join(timeout=10)
        listener.close()
    assert answer_bytes.endswith(b"ok")
    assert b"\r\nHost: [::1]\r\n" in received[0], received


def test_the_gfal2_driver_writes_ipv6_hosts_in_brackets():
    """gfal2's URLs (the davs prefix, the SRM SURL prefix) kept the IPv6 host bare
    (``srm://fd00::1:8443/...``), which gfal2 reads as another host and port."""
    pytest.importorskip("gfal2")
    for url, prefix in (
            ("davs://[fd00::1]:2880/area", "davs://[fd00::1]:2880"),
            ("srm://[fd00::1]:8443/area", "srm://[fd00::1]:8443/srm/managerv2?SFN=")):
        client = driver_spec(url, driver="gfal2", writable_root="/area").connect(
            "functional-tests", timeout=10)
        try:
            assert client._prefix == prefix
        finally:
            client.close()
