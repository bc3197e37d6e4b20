"""The embedded redirector's times: cluster start (until the manager locates the test
area on both data servers), locate latency through the manager (cached and refreshed)
and a new file's open, time for the manager to report a stopped data server's file
(refreshed locate, stat, open) and for a restarted one to be named again.

Each round starts a fresh cluster; medians over the rounds. Usage::

    .venv/bin/python benchmarks/bench_redirector.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from XRootD import client
from XRootD.client.flags import OpenFlags

from pytest_storagescale.servers.redirector import EmbeddedXRootDCluster, located

AREA = "/storagescale"


def _timed(function, *args, **kwargs) -> tuple[float, object]:
    started = time.monotonic()
    try:
        answer = function(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the answer is what is measured
        answer = exc
    return time.monotonic() - started, answer


def one_round(files: int = 4) -> dict[str, float]:
    started = time.monotonic()
    cluster = EmbeddedXRootDCluster().start()
    times = {"start": time.monotonic() - started}
    try:
        fs = client.FileSystem(cluster.server)
        opens, cached, refreshed = [], [], []
        for index in range(files):
            path = f"{AREA}/bench-{index}.dat"
            handle = client.File()
            seconds, _ = _timed(handle.open, f"{cluster.server}/{path}",
                                OpenFlags.DELETE | OpenFlags.MAKEPATH, timeout=30)
            opens.append(seconds)
            handle.write(b"x" * 1000, timeout=30)
            handle.close(timeout=30)
            cached.append(_timed(located, cluster.server, path, refresh=False)[0])
            refreshed.append(_timed(located, cluster.server, path, refresh=True)[0])
        times.update(open_new=statistics.median(opens), locate_cached=statistics.median(cached),
                     locate_refresh=statistics.median(refreshed))
        path = f"{AREA}/bench-0.dat"
        (holder,) = cluster.holders(path)
        cluster.stop_data_server(holder)
        times["gone_locate"], answer = _timed(located, cluster.server, path, timeout=60)
        assert isinstance(answer, Exception), f"the stopped server's file still located: {answer}"
        times["gone_stat"], _ = _timed(fs.stat, path, timeout=60)
        times["back"] = cluster.start_data_server(holder)
    finally:
        cluster.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    results = []
    for number in range(rounds):
        load = os.getloadavg()[0]
        results.append(one_round())
        print(f"round {number + 1} (load {load:.1f}): "
              + ", ".join(f"{key} {value:.3f} s" for key, value in results[-1].items()))
    print("median: " + ", ".join(f"{key} {statistics.median(r[key] for r in results):.3f} s"
                                 for key in results[0]))


if __name__ == "__main__":
    main()
