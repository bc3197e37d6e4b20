"""Streaming reads at scale: seed 004's Thumper tests scaled to the machine at hand.

BNL's Thumper runs: 150 clients each reading 5 random 1.4 GB files one after another
(350 MB/s for an hour), and 75 writers of 3 x 1.4 GB beside 75 readers of 4 x 1.4 GB.
Here:

- ``stream``: each client reads whole files picked at random among ``files`` of
  ``file_size``, one after another, for the step's duration. Beside the step's total
  MB/s, each client's own rate (its bytes over the seconds it spent reading) gives the
  spread: ``client_mb_s_min``, ``client_mb_s_mean``, ``client_mb_s_max`` and
  ``client_mb_s_cv`` (the standard deviation over the mean: 0 when every client got
  the same share).
- ``stream_mixed``: readers streaming as above (``readers`` side) beside writers of
  new ``file_size`` files (``writers``: ``put``), ``clients`` on each side.

The per-client figures come back through :meth:`Operation.observe` (each client's
bytes and seconds, one process at a time) and are joined by :func:`client_spread`, the
step's ``derive``.
"""

from __future__ import annotations

import math
import random
import statistics
import time

from pytest_storagescale import Get, Operation, Param, StepRecord

#: what ``observe`` names one client's bytes and reading seconds (``stream_bytes.c00012``)
BYTES, SECONDS = "stream_bytes.", "stream_read_s."
#: the derived metrics of a streaming step (registered by the suite's conftest)
METRICS = {
    "client_mb_s_min": "the slowest streaming client's own rate (MB/s: its bytes over "
                       "the seconds it spent reading)",
    "client_mb_s_mean": "the streaming clients' own rates, mean (MB/s)",
    "client_mb_s_max": "the fastest streaming client's own rate (MB/s)",
    "client_mb_s_cv": "the spread of the streaming clients' rates: standard deviation "
                      "over mean (0: every client got the same share)",
}


class Stream(Get):
    """Each client reads whole files picked at random, one after another (Thumper)."""

    name = "stream"
    parameters = {
        "file_size": Param("bytes", 100_000_000, description="size of each file read"),
        "files": Param("count", 10, description="files the clients pick from at random"),
    }

    def prepare(self, driver, workdir, params, clients):
        return super().prepare(driver, workdir, {**params, "to_disk": False}, clients)

    def run(self, driver, client, iteration, context):
        index = random.Random(client * 1_000_003 + iteration).randrange(context["files"])
        source = f"{context['workdir']}/file-{index:05d}"
        began = time.monotonic()
        moved = driver.get(source, None)
        spent = time.monotonic() - began
        if moved != context["file_size"]:
            raise ValueError(f"get {source}: {moved} bytes, expected {context['file_size']}")
        key = f"c{client:05d}"
        seen = context.setdefault("_per_client", {})
        done, seconds = seen.get(key, (0, 0.0))
        seen[key] = (done + moved, seconds + spent)
        return moved

    def walk(self, client, context):
        return None  # its random walk is run()'s

    def observe(self, context):
        seen = context.get("_per_client", {})
        return {**{BYTES + key: float(done) for key, (done, _) in seen.items()},
                **{SECONDS + key: spent for key, (_, spent) in seen.items()}}


class NewFiles(Operation):
    """A new ``file_size`` file per repetition (the Thumper writers)."""

    name = "stream_writes"
    parameters = {"file_size": Param("bytes", 100_000_000, description="size of each new file")}

    def run(self, driver, client, iteration, context):
        data = context.get("_data")
        if data is None:  # once per process: the same bytes each time, as a put step's
            data = context["_data"] = (bytes(range(251)) * (context["file_size"] // 251 + 1)
                                       )[:context["file_size"]]
        return driver.put(f"{context['workdir']}/c{client:05d}-{iteration:07d}", data)


class StreamMixed(Operation):
    """Streaming readers beside writers of new files, ``clients`` on each side."""

    name = "stream_mixed"
    sides = ("readers", "writers")
    parameters = Stream.parameters
    _sides = (("readers", Stream()), ("writers", NewFiles()))

    def groups(self, clients):
        return [(side, operation, clients) for side, operation in self._sides]

    def prepare(self, driver, workdir, params, clients):
        driver.mkdir(workdir)
        context = {"workdir": workdir}
        for side, operation in self._sides:
            own = {key: value for key, value in params.items() if key in operation.parameters}
            context[side] = operation.prepare(driver, f"{workdir}/{side}",
                                              {**operation.defaults, **own}, clients)
        return context


def client_spread(step: StepRecord) -> dict[str, float]:
    """The streaming clients' own rates (MB/s) joined from what each process observed:
    min, mean, max and their coefficient of variation; the per-client keys leave the
    record (one figure per client would fill the table's derived column)."""
    rates = []
    for key in [key for key in step.derived if key.startswith(BYTES)]:
        client = key[len(BYTES):]
        done = step.derived.pop(key)
        spent = step.derived.pop(SECONDS + client, 0.0)
        if spent > 0:
            rates.append(done / 1e6 / spent)
    for key in [key for key in step.derived if key.startswith(SECONDS)]:
        step.derived.pop(key)
    if not rates:
        return dict.fromkeys(METRICS, math.nan)
    mean = statistics.fmean(rates)
    return {"client_mb_s_min": min(rates), "client_mb_s_mean": mean,
            "client_mb_s_max": max(rates),
            "client_mb_s_cv": statistics.pstdev(rates) / mean if mean > 0 else math.nan}


OPERATIONS = (Stream(), NewFiles(), StreamMixed())
