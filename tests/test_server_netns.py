"""The namespace hosts' plumbing that the CephFS, the dCache over several hosts and the
embedded SLURM share (pytest_storagescale/servers/netns.py): a failed command, a holder
that made no namespace and a holder that never unshared are named; the bridge, a host
on it and this machine's link to it are made as the servers make them, and go with
their holders."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from pytest_storagescale.servers import netns
from pytest_storagescale.servers.netns import NetnsError

needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"),
    reason="network namespaces need root, unshare and nsenter")


def test_a_failed_ip_command_is_named_with_its_error():
    with pytest.raises(NetnsError, match=r"^'ip link show dev ssnone0' failed: .*ssnone0"):
        netns.ip("link", "show", "dev", "ssnone0")


def test_a_free_subnet_is_one_no_address_or_route_here_touches():
    subnet = netns.free_subnet()
    assert subnet.prefixlen == 24 and subnet.subnet_of(ipaddress.IPv4Network("10.0.0.0/8"))
    used = netns.ip("-4", "route", "show", "table", "all") + netns.ip("-4", "addr")
    assert str(subnet.network_address).rsplit(".", 1)[0] + "." not in used
    subnet6 = netns.free_subnet6()
    assert subnet6.prefixlen == 64 and subnet6.subnet_of(ipaddress.IPv6Network("fd00::/8"))


def test_a_holder_that_ends_before_unsharing_is_named(tmp_path):
    holder = subprocess.Popen(["sh", "-c", "exit 3"])
    with pytest.raises(NetnsError, match=r"^the holder of the network namespace core "
                       r"exited with code 3 before making it$"):
        netns.wait_unshared(holder, "core", timeout=30)


def test_a_holder_that_never_unshares_is_given_up_at_the_deadline():
    holder = subprocess.Popen(["sleep", "60"])
    try:
        began = time.monotonic()
        with pytest.raises(NetnsError, match=r"^the holder of the network namespace ns0 did "
                           r"not make it within 1 s$"):
            netns.wait_unshared(holder, "ns0", timeout=1)
        assert 1 <= time.monotonic() - began < 30
        assert holder.poll() is None  # the caller ends it (its log may be quoted first)
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_hold_ends_a_holder_that_made_no_namespace_and_keeps_its_output(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setattr(netns, "HOLDER", ("sh", "-c", "echo $$ > pid; exec sleep 60"))
    with pytest.raises(NetnsError, match="did not make it within 1 s"):
        netns.hold(tmp_path, "switch", timeout=1)
    pid = int((tmp_path / "pid").read_text())  # started in the folder given
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped
    monkeypatch.setattr(netns, "HOLDER", ("sh", "-c", "echo unshare: not permitted; exit 1"))
    with pytest.raises(NetnsError, match="exited with code 1 before making it"):
        netns.hold(tmp_path, "switch", timeout=30, log=tmp_path / "switch.out")
    assert (tmp_path / "switch.out").read_text() == "unshare: not permitted\n"


def test_resident_memory_is_summed_by_namespace():
    memory = netns.rss_by_namespace({"here": "/proc/self/ns/net",
                                     "gone": "/proc/999999999/ns/net"})
    assert memory["gone"] == 0
    assert memory["here"] >= int(open("/proc/self/statm").read().split()[1]) * os.sysconf(
        "SC_PAGE_SIZE")  # this process is in this namespace, with others


@needs_namespaces
@pytest.mark.integration
@pytest.mark.xdist_group("network_namespaces")
def test_a_host_on_the_bridge_reaches_this_machine_and_goes_with_its_holders(tmp_path):
    tag = f"sst{os.getpid() % 1000:03d}"
    subnet = netns.free_subnet()
    here, switch_address, host_address = (str(subnet.network_address + last)
                                          for last in (1, 254, 2))
    switch = netns.hold(tmp_path, "switch", timeout=30)
    host = netns.hold(tmp_path, "ns0", timeout=30)
    try:
        netns.make_bridge(switch.pid, f"{switch_address}/24")
        netns.link_to_bridge(switch.pid, f"{tag}h", f"{tag}s", f"{here}/24")
        netns.join_bridge(switch.pid, host.pid, f"{tag}p0", f"{tag}c0", f"{host_address}/24")
        inside = netns.ip("-br", "addr", netns=netns.handle(host.pid))
        assert f"{host_address}/24" in inside and f"{tag}c0" in inside, inside
        assert "lo " in inside and "DOWN" not in inside.split("lo ", 1)[1].split("\n")[0]
        bridge = netns.ip("-br", "link", "show", "master", netns.BRIDGE,
                          netns=netns.handle(switch.pid))
        assert f"{tag}p0" in bridge and f"{tag}s" in bridge, bridge
        with socket.create_server((here, 0)) as listener:  # reached over the bridge
            subprocess.run(["nsenter", f"--net={netns.handle(host.pid)}", sys.executable,
                            "-c", f"import socket; socket.create_connection(('{here}', "
                            f"{listener.getsockname()[1]}), timeout=10).close()"],
                           check=True, capture_output=True, timeout=60)
    finally:
        for holder in (host, switch):
            holder.kill()
            holder.wait(timeout=30)
    deadline = time.monotonic() + 30  # the kernel removes the veths with the namespaces
    while f"{tag}h" in netns.ip("-br", "link") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"{tag}h" not in netns.ip("-br", "link")
