"""The embedded dCache's doors by name (issue 35): ``--storage-load-doors`` takes
``dcap`` and ``gsiftp`` beside ``davs``, ``root`` and ``srm``, and ``all`` is the five
(servers/dcache.py DEFAULT_EXTRA_DOORS: dcap's folders are listed through the xrootd
door, its data moved by the gfal2 driver's forked movers). The load tests of
suites/dcache are collected once per door, without a dCache start
(``--storage-version``)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SUITE = str(REPO / "suites" / "dcache" / "test_dcache_scalability.py")


def _collected(pytester, *options: str):
    return pytester.runpytest_subprocess(
        SUITE, "--co", "-q", "--storage-embedded=dcache", "--storage-version=11.2.5",
        "-k", "test_copy_out_scan", "-p", "no:cacheprovider", *options, timeout=300)


@pytest.mark.parametrize(("doors", "expected"), [
    ("all", ["davs", "root", "srm", "dcap", "gsiftp"]),
    ("root,gsiftp", ["root", "gsiftp"]),
    ("dcap", ["dcap"]),
])
def test_the_dcap_and_gridftp_doors_are_load_doors(pytester, doors, expected):
    result = _collected(pytester, f"--storage-load-doors={doors}")
    assert result.ret == 0, result.stdout.str()[-2000:]
    ids = [line for line in result.stdout.lines if "test_copy_out_scan[" in line]
    assert sorted({line.rpartition("-")[2].rstrip("]") for line in ids}) \
        == sorted(expected), ids


def test_an_unknown_door_names_the_five(pytester):
    result = _collected(pytester, "--storage-load-doors=nfs")
    result.stderr.fnmatch_lines(["*--storage-load-doors: unknown door 'nfs'. The doors of "
                                 "the embedded dcache: davs, root, srm, dcap, gsiftp.*"])
    assert result.ret == 4


@pytest.mark.parametrize(("url", "checksum", "listing"), [
    ("gsidcap://localhost:1/storagescale", False, False),
    ("dcap://localhost:1/storagescale", False, False),
    ("gsiftp://localhost:1/storagescale", True, True),
    ("root://localhost:1//storagescale", True, True),
])
def test_a_dcap_door_is_asked_for_no_checksum_and_no_listing(url, checksum, listing):
    """What the conformance checks ask of a door (``Door.has_checksum``,
    ``Door.has_listing``, from its driver class): dcap has no checksum request, and the
    gfal2 driver lists no dcap directory; the other doors do both."""
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.session.doors import Door

    door = Door("door", driver_spec(url), "/storagescale/run")
    assert (door.has_checksum, door.has_listing) == (checksum, listing)
