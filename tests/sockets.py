"""What the kernel says about this test's TCP connections."""

from __future__ import annotations

from pathlib import Path


def connections_to(port: int) -> int:
    """Established TCP connections to ``port`` seen in this network namespace."""
    return len(connection_ends(port))


def connection_ends(port: int) -> set[str]:
    """The local ends (``address:port`` in the kernel's hex) of the established TCP
    connections to ``port``: which connections are new, whatever others closed."""
    ends = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # the client may use mapped IPv6
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01":
                ends.add(fields[1])
    return ends
