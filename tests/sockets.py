"""What the kernel says about this test's TCP connections."""

from __future__ import annotations

from pathlib import Path


def connections_to(port: int) -> int:
    """Established TCP connections to ``port`` seen in this network namespace."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # the client may use mapped IPv6
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01":
                count += 1
    return count
