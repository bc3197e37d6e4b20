"""The embedded CephFS's start on a starved machine: its network namespaces exist before
anything is put into them, and a start that gives up says what the daemon was doing.

Fresh-clone ``make test`` failed 3 times in 6 with "the monitor did not answer within
180 s" and an empty ``mon.a.out``: the holder of the daemons' namespace had not yet
unshared when ``ip link set lo up`` was sent into it (that command ran in this machine's
namespace), so the daemons' loopback stayed down, and a connection to their own bridge
address, which is delivered through the loopback, never reached the monitor.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from pytest_storagescale.errors import EndpointError
from pytest_storagescale.servers.ceph import EmbeddedCephGateway
from pytest_storagescale.servers.cephfs import EmbeddedCephFS

needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"),
    reason="network namespaces need root, unshare and nsenter")

#: a holder as a starved CPU runs it: ``unshare`` makes the namespace a second after
#: the spawn returned
LATE_HOLDER = ("sh", "-c", "sleep 1; exec unshare --net sleep infinity")


def _server(tmp_path, holder: tuple[str, ...]) -> EmbeddedCephFS:
    server = EmbeddedCephFS(hosts=1, startup_timeout=30)
    server.HOLDER = holder  # type: ignore[misc]
    server.directory = tmp_path
    (tmp_path / "log").mkdir()
    return server


def _netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


@needs_namespaces
def test_a_namespace_is_used_only_once_its_holder_made_it(tmp_path):
    """What the start does first with the daemons' namespace (loopback up), with a
    holder that unshares late: the loopback is up in the new namespace."""
    server = _server(tmp_path, LATE_HOLDER)
    own = _netns(os.getpid())
    holder = server._hold("switch")
    try:
        pid = holder.process.pid
        netns = f"/proc/{pid}/ns/net"
        subprocess.run(["nsenter", f"--net={netns}", "ip", "link", "set", "lo", "up"],
                       check=True, timeout=30)
        deadline = time.monotonic() + 30
        while _netns(pid) == own and time.monotonic() < deadline:  # (without the wait in
            time.sleep(0.1)  # _hold, the command above went to this namespace)
        assert _netns(pid) != own
        lo = subprocess.run(["nsenter", f"--net={netns}", "ip", "-br", "link", "show", "lo"],
                            capture_output=True, text=True, check=True, timeout=30).stdout
        assert lo.split()[1] in ("UP", "UNKNOWN"), lo  # loopback's state when up
    finally:
        holder.stop()


@needs_namespaces
def test_a_holder_that_ends_before_making_its_namespace_is_named(tmp_path):
    server = _server(tmp_path, ("sh", "-c", "echo unshare: not permitted >&2; exit 3"))
    with pytest.raises(EndpointError) as failure:
        server._hold("switch")
    text = str(failure.value)
    assert "namespace switch exited with code 3 before making it" in text
    assert "unshare: not permitted" in text  # its console output (switch.out)


@pytest.mark.skipif(not shutil.which("ceph"), reason="the ceph command (ceph-common)")
def test_a_monitor_that_does_not_answer_is_described(tmp_path):
    """The failure names the last probe's answer, the daemon's state from /proc, and both
    of its logs: its own (the ``.log`` file) and its console output (``.out``), which
    alone was quoted and is empty for a monitor that runs."""
    server = EmbeddedCephGateway(startup_timeout=3)
    server.directory = tmp_path  # no ceph.conf there: every 'ceph' probe fails
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "mon.a.log").write_text("mon.a@0(probing) e1 its own log line\n")
    mon = server._spawn("mon.a", ["sh", "-c", "echo its console line; exec sleep 60"])
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "log" / "mon.a.out").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(EndpointError) as failure:
            server._wait_for(server._mon_answers, "the monitor did not answer", "mon.a")
    finally:
        mon.stop()
    text = str(failure.value)
    assert "the monitor did not answer within 3 s; the last of " in text
    assert "probes: 'ceph -c " in text and "' failed: " in text  # the ceph command's error
    assert f"mon.a: pid {mon.process.pid} S (sleeping), in " in text
    assert "Log tail (mon.a.log):\nmon.a@0(probing) e1 its own log line" in text
    assert "Log tail (mon.a.out):\nits console line" in text


@needs_namespaces
def test_a_holder_gone_while_the_network_is_made_says_how_it_ended(tmp_path):
    """``ip link set <veth> netns <pid>`` answers "No such process" alone when the
    holder is gone (seen once on this machine under load, its cause not found): the
    error names the holder and how it ended."""
    server = _server(tmp_path, EmbeddedCephFS.HOLDER)
    holder = server._hold("host.ns0")
    assert server._holders_gone(EndpointError("other")).args == ("other",)  # none gone
    holder.process.kill()
    holder.process.wait(timeout=30)
    error = server._holders_gone(EndpointError(
        f"'ip link set x netns {holder.process.pid}' failed: RTNETLINK answers: No such "
        f"process."))
    assert (f"The holder of a namespace is gone: host.ns0 pid {holder.process.pid} exited "
            f"with code -9.") in str(error)
