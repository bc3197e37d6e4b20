"""The run id (the run's folder name on the storage and in the temporary directory)
carries 64 random bits: a co-tenant cannot make the next run's folders before it (a
folder that exists already stops the run). Its time stays readable."""

from __future__ import annotations

import re
import time

from pytest_storagescale.session import make_run_id
from pytest_storagescale.session.area import name_time


def test_the_run_id_has_64_random_bits_and_a_readable_time():
    before = time.time()
    ids = {make_run_id() for _ in range(1000)}
    assert len(ids) == 1000
    for run_id in ids:
        match = re.fullmatch(r"storagescale-run-(\d{8}-\d{6})-([0-9a-f]+)", run_id)
        assert match, run_id
        assert len(match.group(2)) * 4 >= 64, run_id
        named = name_time(run_id)
        assert named is not None and before - 2 <= named <= time.time() + 1
    # the random part takes every hex digit in every place (not a counter or a clock)
    suffixes = [run_id.rsplit("-", 1)[1] for run_id in ids]
    for place in range(16):
        assert len({suffix[place] for suffix in suffixes}) == 16
