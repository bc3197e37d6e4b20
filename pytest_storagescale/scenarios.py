"""Multi-step tests: several steps of one section whose last step is judged on
metrics derived from all of them. Each takes the test's
:class:`~pytest_storagescale.fixtures.StorageLoad` (``storage_load``).

- :func:`mixing` (seed 004): readers alone, writers alone, then both at once;
- :func:`repeat` (seed 001): the step ``tries`` times, for a mean and an error bar;
- :func:`recovery` (seed 000): probe, overload, probe until the rate is back.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from .records import StepRecord, Verdict

if TYPE_CHECKING:
    from .steps import Derive, Judge
    from .thresholds import SectionPlan


class StorageLoad(Protocol):
    """What a scenario asks of the test's load (the ``storage_load`` fixture's
    :class:`~pytest_storagescale.fixtures.StorageLoad`, which offers the scenarios as
    its methods: this module sits below it and names it only by this shape)."""

    @property
    def nodeid(self) -> str: ...

    def section_name(self, section: str | None) -> str: ...

    def section_plan(self, section: str) -> SectionPlan: ...

    def clients_for(self, clients: int | None) -> int: ...

    def run(self, section: str | None = None, clients: int | None = None, *,
            check: bool = True, label: str | None = None, judge: Judge = True,
            derive: Derive | None = None, side: str | None = None,
            **overrides: Any) -> StepRecord: ...


def _mb_s(step: StepRecord) -> float:
    return step.metric("mb_s")


def mixing(load: StorageLoad, section: str | None = None,
           clients: int | None = None) -> StepRecord:
    """Readers alone, writers alone, then both at once. The mixed step gets
    ``mix_ratio`` = (both sides' MB/s when mixed) / (each side's MB/s alone, summed);
    NaN (no rule passes) when the steps alone moved nothing."""
    section, clients = load.section_name(section), load.clients_for(clients)
    alone = [load.run(section, clients, side=side, label="alone", judge=False)
             for side in ("readers", "writers")]
    separate = sum(_mb_s(step) for step in alone)

    def derive(mixed: StepRecord) -> dict[str, float]:
        together = sum(side.mb_s for side in mixed.sides.values())
        ratio = together / separate if separate > 0 and not math.isnan(separate) else math.nan
        return {"mix_ratio": ratio}

    return load.run(section, clients, label="mixed", derive=derive)


def repeat(load: StorageLoad, section: str | None = None,
           clients: int | None = None) -> StepRecord:
    """Run the step ``tries`` times (the section's key), as seed 001 ran ``dd`` ten
    times for an error bar. The last try gets ``mb_s_mean``, ``mb_s_stddev``,
    ``rate_hz_mean`` and ``rate_hz_stddev`` over all tries and is judged."""
    section, clients = load.section_name(section), load.clients_for(clients)
    tries = load.section_plan(section).tries
    done: list[StepRecord] = []

    def derive(last: StepRecord) -> dict[str, float]:
        every = [*done, last]
        mb_s = [step.metric("mb_s") for step in every]
        rate = [step.metric("rate_hz") for step in every]
        return {"mb_s_mean": statistics.fmean(mb_s), "mb_s_stddev": statistics.pstdev(mb_s),
                "rate_hz_mean": statistics.fmean(rate),
                "rate_hz_stddev": statistics.pstdev(rate)}

    for attempt in range(1, tries + 1):
        last = attempt == tries
        step = load.run(section, clients, label=f"try {attempt}/{tries}", judge=last,
                        derive=derive if last else None)
        done.append(step)
    return step


def recovery(load: StorageLoad, section: str | None = None) -> StepRecord:
    """After an overload, does the storage come back by itself?

    A probe at the section's first concurrency (the rate before), an overload step at
    ``overload_clients`` for ``overload_duration``, then probes until the rate is back
    to ``recover_fraction`` of the rate before, or ``recover_within`` has passed. The
    last probe gets ``recovery_s`` (seconds from the overload's end to the probe's
    end; infinite when it never recovered) and is judged (``recovery_s <= 300``)."""
    section = load.section_name(section)
    plan = load.section_plan(section)
    if plan.recovery is None:
        raise pytest.UsageError(
            f"{load.nodeid}: [ops.{section}] has no recovery probe settings "
            f"(overload_clients, overload_duration, recover_fraction, recover_within)."
        )
    settings, probe_clients = plan.recovery, plan.clients[0]
    before = load.run(section, probe_clients, label="before", judge=False)
    load.run(section, settings.overload_clients, label="overload", judge=False,
             duration=settings.overload_duration)
    overload_end = time.time()
    target = before.metric("rate_hz") * settings.recover_fraction

    def recovered(step: StepRecord) -> bool:
        return step.metric("rate_hz") >= target and step.metric("failed") == 0

    def decide(step: StepRecord) -> bool:
        return recovered(step) or step.ended - overload_end >= settings.recover_within

    def derive(step: StepRecord) -> dict[str, float]:
        return {"recovery_s": (step.ended - overload_end) if recovered(step) else math.inf}

    probe = 0
    while True:  # bounded: every probe takes time, and recover_within ends it
        probe += 1
        step = load.run(section, probe_clients, label=f"probe {probe}", judge=decide,
                        derive=derive)
        if step.verdict is not Verdict.INFO:
            return step
