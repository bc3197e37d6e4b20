"""What the tests check of an embedded dCache's processes: which they are (the JVM, the
PostgreSQL server and its backends), whether one is gone, and that a stop leaves none
of them and no directory (the session's shared dCache, ``embedded_dcache`` in
conftest.py, is checked so at its stop)."""

from __future__ import annotations

import time

import psutil


def dcache_processes(server) -> list[int]:
    """The domain's JVM, ZooKeeper's and the PostgreSQL server and backends of ``server``."""
    assert server.process is not None and server.database is not None
    assert server.zookeeper is not None
    leader = psutil.Process(server.database.process.pid)
    return [server.process.pid, server.zookeeper.pid, leader.pid,
            *(child.pid for child in leader.children(recursive=True))]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def stop_leaves_no_jvm_and_no_postgres(server) -> None:
    """What the start took (printed: docs/servers.md has the figures), then the stop
    leaves no JVM, no PostgreSQL process and no directory."""
    pids = dcache_processes(server)
    directory = server.directory
    ready = {door: round(seconds, 1) for door, seconds in server.door_seconds.items()}
    print(f"dCache {server.version}: set-up {server.setup_seconds:.1f} s, doors ready "
          f"{ready} s after the JVM started, all ready {server.start_seconds:.1f} s after "
          f"start(); at the stop: JVM RSS {server.rss_bytes() >> 20} MiB, ZooKeeper's JVM "
          f"{server.zookeeper_rss_bytes() >> 20} MiB, PostgreSQL RSS "
          f"{server.database_rss_bytes() >> 20} MiB")
    began = time.monotonic()
    server.stop()
    print(f"stopped in {time.monotonic() - began:.1f} s")
    assert [pid for pid in pids if not gone(pid)] == []
    assert directory is not None and not directory.exists()
