"""What one client host can run, checked before any load: the largest concurrency
and the longest time a plan may ask for, the open files a step needs against this
process's limit (raised to the hard limit first, as servers do), and the threads it
needs against the user's (``ulimit -u``, which counts every thread of the user)."""

from __future__ import annotations

import os
import resource

from .errors import StorageScaleUsageError

#: clients of one step from one host: beyond a few thousand connections the client
#: library, not the storage, is measured (XRootD's poller collapses at ~5,000)
MAX_CLIENTS = 10_000
#: the longest step, warm-up or timeout a plan may ask for (the seeds' longest
#: steps took 80 minutes)
MAX_DURATION_S = 7 * 24 * 3600.0
#: open files a process needs besides its clients (libraries, logs, pipes)
BASE_OPEN_FILES = 64
#: the most a soft limit is raised to when the hard limit is unlimited
_OPEN_FILES_CEILING = 1 << 20


def check_clients(clients: int, *, what: str) -> None:
    if clients > MAX_CLIENTS:
        raise StorageScaleUsageError(
            f"{what}: {clients} clients from one host would measure the client host, not "
            f"the storage: at most {MAX_CLIENTS} per host. Spread a larger scan over "
            f"several client hosts (one pytest run per host, or pytest-xdist on several)."
        )


def check_duration(seconds: float, *, what: str, value: object) -> None:
    if seconds > MAX_DURATION_S:
        raise StorageScaleUsageError(
            f"{what}: {value!r} is longer than 7 days ({MAX_DURATION_S:.0f} s); no step, "
            f"warm-up or timeout that long is meant. Write e.g. 20m or 2h."
        )


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit; return (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _OPEN_FILES_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # a container may refuse: the check below still names the limit
    return soft, hard


def check_open_files(clients: int, files_per_client: int, *, processes: int = 1) -> None:
    """Refuse a step whose clients need more open files than one process may have."""
    soft, hard = raise_open_files_limit()
    needed = BASE_OPEN_FILES + files_per_client * -(-clients // max(processes, 1))
    if soft != resource.RLIM_INFINITY and needed > soft:
        raise StorageScaleUsageError(
            f"a step of {clients} clients needs about {needed} open files per process "
            f"({files_per_client} per client), and this process may open {soft} (ulimit -n: "
            f"soft {soft}, hard {hard}). Raise the limit, e.g. 'ulimit -n {needed}' before "
            f"pytest (or nofile in /etc/security/limits.conf), or lower the clients."
        )


#: threads a client process runs besides one per client: Python's, the client
#: library's (XrdCl: event loops, workers, its task manager), the executor's
THREADS_PER_PROCESS = 32


def user_threads(uid: int | None = None) -> int:
    """Threads the user ``uid`` (default: this process's real user) runs now: what
    ``ulimit -u`` (RLIMIT_NPROC) counts."""
    import psutil

    uid = os.getuid() if uid is None else uid
    count = 0
    for process in psutil.process_iter(["uids", "num_threads"]):
        info = process.info
        if info["uids"] is not None and info["uids"].real == uid:
            count += info["num_threads"] or 0
    return count


def raise_threads_limit() -> tuple[int, int]:
    """Raise the soft limit on the user's threads to the hard one; (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # the check below still names the limit
    return soft, hard


def check_threads(clients: int, *, processes: int = 1) -> None:
    """Refuse a step whose clients need more threads than the user may still start:
    one per client, and :data:`THREADS_PER_PROCESS` per client process (the limit
    counts every thread of the user, the ones running now too; root has none)."""
    soft, hard = raise_threads_limit()
    if soft == resource.RLIM_INFINITY or os.getuid() == 0:
        return
    running = user_threads()
    needed = clients + THREADS_PER_PROCESS * max(processes, 1)
    if running + needed > soft:
        raise StorageScaleUsageError(
            f"a step of {clients} clients needs about {needed} threads (one per client and "
            f"about {THREADS_PER_PROCESS} per client process for the client library), and "
            f"this user may run {soft}, {running} of them running now (ulimit -u: soft "
            f"{soft}, hard {hard}; it counts every thread of the user). Raise the limit, "
            f"e.g. 'ulimit -u {running + needed}' before pytest (or nproc in "
            f"/etc/security/limits.conf), or lower the clients."
        )
