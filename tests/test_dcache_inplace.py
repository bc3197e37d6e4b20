"""The dCache upgrade in place (issue 34): 10.2.25 writes two seeded trees (names of
ASCII only: the xrootd door answers each other character as '?') through its WebDAV and
xrootd doors, stops; 11.2.5 starts on the same PostgreSQL cluster and
the same pool folders (its own ``bin/dcache database update`` migrates the schema, as
dCache's upgrade notes say), and ``storagescale tree verify`` through every door finds
the first tree whole (exit 0) and names the one pool file flipped between the two
releases in the second ``corrupted`` (exit 1), nothing else. Two dCache starts."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from pytest_storagescale.cli import main
from pytest_storagescale.errors import EndpointError
from pytest_storagescale.servers.dcache import (
    DATABASES,
    STATE,
    EmbeddedDCache,
    cached_releases,
)
from pytest_storagescale.tree import build_tree

pytestmark = [pytest.mark.integration, pytest.mark.slow_server]
BEFORE, AFTER = "10.2.25", "11.2.5"
#: the doors the tree goes through (SRM: not its names with spaces, docs/upgrade.md)
DOORS = ("davs", "root")
#: neither release runs the tape's services nor the GridFTP door (the tree goes through
#: DOORS only; a kept state is the database and the pools, STATE, not the tape's
#: library): each start brings up the domain the upgrade is about, not more
LEAN = {"tape": None, "extra_doors": ()}
#: the file flipped on the pool between the two releases (a unique size in the tree)
FLIPPED = "with space/a file with spaces.txt"


def _tree(capsys, *arguments: str) -> tuple[int, str]:
    code = main(["tree", *arguments])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _door_arguments(server: EmbeddedDCache) -> list[str]:
    return [*(server.url_for(scheme) for scheme in DOORS),
            "-o", f"ca_dir={server.ca_dir}", "-o", f"x509_proxy={server.proxy}",
            "--timeout", "120"]


def _pool_file(state: Path, data: bytes) -> Path:
    """The one replica on the pools with exactly ``data`` (files are named by PNFS id)."""
    found = [path for path in (state / "pools").glob("pool*/data/*")
             if path.is_file() and path.stat().st_size == len(data)
             and path.read_bytes() == data]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def state():
    """The kept state's folder, on the file system of the servers' folders."""
    folder = Path(tempfile.mkdtemp(prefix="storagescale-dcache-state-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.long_running
def test_an_upgrade_in_place_keeps_every_file_and_names_a_corrupted_one(state, tmp_path,
                                                                         capsys):
    missing = {BEFORE, AFTER} - set(cached_releases())
    if missing:
        pytest.fail(f"dCache {', '.join(sorted(missing))} not in the distribution cache: "
                    "run 'make setup' (scripts/dcache-dist.sh)")
    whole, damaged = tmp_path / "whole.json", tmp_path / "damaged.json"
    old = EmbeddedDCache(state_directory=state, **LEAN)
    old.requested_version = BEFORE
    with old:
        assert old.version == BEFORE and not old.state_kept
        for manifest, seed in ((whole, "1"), (damaged, "2")):
            code, out = _tree(capsys, "write", *_door_arguments(old), "--manifest",
                              str(manifest), "--seed", seed, "--size", "2MiB",
                              "--ascii-names")
            assert code == 0, out
            with capsys.disabled():  # the measured times (docs/upgrade.md)
                print(f"{BEFORE} (started in {old.start_seconds:.0f} s): {out.strip()}")
    assert sorted(path.name for path in state.iterdir()) == sorted(STATE)  # given back
    record = json.loads(damaged.read_text())
    tree = build_tree(2, record["tree"]["size"], len(DOORS), ascii_names=True)
    data = next(f.data for f in tree.files if f.path == FLIPPED)
    replica = _pool_file(state, data)
    flipped = bytearray(data)
    flipped[100] ^= 0x01
    replica.write_bytes(bytes(flipped))

    new = EmbeddedDCache(state_directory=state, **LEAN)
    new.requested_version = AFTER
    began = time.monotonic()
    with new:
        assert new.version == AFTER and new.state_kept
        assert set(new.changesets) == set(DATABASES)
        # 11.0's migration (Liquibase 4) ran on the old schema: chimera gained change sets
        assert new.changesets["chimera"][1] > new.changesets["chimera"][0] > 0, new.changesets
        code, out = _tree(capsys, "verify", *_door_arguments(new), "--manifest", str(whole))
        with capsys.disabled():
            print(f"{AFTER} (started in {new.start_seconds:.0f} s, change sets "
                  f"{new.changesets}): {out.strip()}")
        assert code == 0, out
        assert f"through {len(DOORS)} door(s)" in out and " 0 ok" not in out
        code, out = _tree(capsys, "verify", *_door_arguments(new), "--manifest", str(damaged))
    assert code == 1, out
    bad = [line for line in out.splitlines()[1:] if line.strip()]
    assert len(bad) == 1 and bad[0].startswith(f"corrupted  {FLIPPED}: davs: content read back"), out
    assert "root: content read back" in bad[0]
    assert time.monotonic() - began < 900


def test_half_a_state_is_refused_and_left_as_it_is(state):
    """A state folder with the database but no pools (or the other way round) is not a
    dCache's state: one paragraph naming both, before any server runs on it, and the
    folder is left as it was."""
    (state / "postgres" / "data").mkdir(parents=True)
    (state / "postgres" / "data" / "PG_VERSION").write_text("15\n")
    server = EmbeddedDCache(state_directory=state)
    with pytest.raises(EndpointError, match=r"holds postgres/ but not pools/: a state is "
                                            r"both"):
        server.start()
    assert sorted(path.name for path in state.iterdir()) == ["postgres"]
    assert (state / "postgres" / "data" / "PG_VERSION").read_text() == "15\n"
    assert server.directory is None  # the server's own folder went
