"""The upgrades in place on the embedded servers (issue 34; ``make upgrade-inplace``):
the old release writes a seeded tree through its doors (``storagescale tree write``),
stops; the new release starts on the same data (XRootD 5.5.3 -> 6.2.1 on one data
directory; dCache 10.2.25 -> 11.2.5 on one PostgreSQL cluster and one set of pool
folders, its own ``bin/dcache database update`` migrating the schema) and verifies the
tree through every door (``storagescale tree verify``). Prints each verify's verdict
and the measured times; ``--corrupt`` flips one byte of one stored file between the two
releases (the verify must then name it ``corrupted``).

Exit status: 0 when every verify found every file ok (with ``--corrupt``: when each
named the flipped file ``corrupted`` and nothing else), 1 otherwise, 4 on bad input."""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pytest_storagescale.cli import main as storagescale
from pytest_storagescale.tree import build_tree

#: the file flipped with --corrupt (a size no other file of the default tree has)
FLIPPED = "with space/a file with spaces.txt"


def _tree(*arguments: str) -> tuple[int, str, float]:
    """``storagescale tree ...``: its exit status, its output, its seconds."""
    began, out = time.monotonic(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = storagescale(["tree", *arguments])
    return code, out.getvalue(), time.monotonic() - began


def _flip(data_root: Path, content: bytes) -> Path:
    """One byte of the one stored file holding ``content`` flipped (size kept)."""
    found = [path for path in data_root.rglob("*") if path.is_file() and not path.is_symlink()
             and path.stat().st_size == len(content) and path.read_bytes() == content]
    if len(found) != 1:
        raise SystemExit(f"upgrade-inplace: {len(found)} stored files hold {FLIPPED!r} "
                         f"under {data_root}, not one: nothing flipped")
    flipped = bytearray(content)
    flipped[100] ^= 0x01
    found[0].write_bytes(bytes(flipped))
    return found[0]


def _judge(name: str, code: int, out: str, corrupt: bool) -> bool:
    bad = [line for line in out.splitlines()[1:] if line.strip()]
    if corrupt:
        good = code == 1 and len(bad) == 1 and bad[0].startswith(f"corrupted  {FLIPPED}:")
        want = f"only {FLIPPED!r} corrupted"
    else:
        good, want = code == 0, "every file ok"
    print(f"{name}: verdict {'as expected' if good else 'NOT as expected'} ({want} was "
          f"expected; verify's exit status {code})\n", flush=True)
    return good


def _xrootd(workdir: Path, seed: str, size: str, corrupt: bool) -> bool:
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD
    from pytest_storagescale.servers.xrootd_releases import BUILT_VERSION, built_prefix

    name = f"xrootd 5.5.3 -> {BUILT_VERSION}"
    if built_prefix() is None:
        print(f"{name}: NOT RUN: XRootD {BUILT_VERSION} is not built (make setup-upgrade)")
        return False
    data = Path(tempfile.mkdtemp(prefix="storagescale-inplace-"))
    manifest = workdir / "xrootd-tree.json"
    try:
        began = time.monotonic()
        with EmbeddedXRootD(data_directory=data) as old:
            started = time.monotonic() - began
            code, out, wrote = _tree("write", old.url, old.https_url, "--manifest",
                                     str(manifest), "--seed", seed, "--size", size,
                                     "-o", f"ca_dir={old.ca_dir}")
            print(f"{name}: {old.version} started in {started:.1f} s, tree written through "
                  f"root:// and davs:// in {wrote:.1f} s", flush=True)
            if code != 0:
                print(out)
                return False
        if corrupt:
            _flip(data, _content(manifest, 2))
        new = EmbeddedXRootD(data_directory=data)
        new.requested_version = BUILT_VERSION
        began = time.monotonic()
        with new:
            started = time.monotonic() - began
            code, out, verified = _tree("verify", new.url, new.https_url, "--manifest",
                                        str(manifest), "-o", f"ca_dir={new.ca_dir}")
        print(f"{name}: {new.version} started on the same data directory in {started:.1f} s, "
              f"verified through root:// and davs:// in {verified:.1f} s:\n{out}", end="")
        return _judge(name, code, out, corrupt)
    finally:
        shutil.rmtree(data, ignore_errors=True)


def _content(manifest: Path, doors: int) -> bytes:
    import json

    record = json.loads(manifest.read_text())
    tree = build_tree(record["tree"]["seed"], record["tree"]["size"], doors,
                      record["tree"].get("names") == "ascii")
    return next(entry.data for entry in tree.files if entry.path == FLIPPED)


def _dcache(workdir: Path, seed: str, size: str, corrupt: bool) -> bool:
    from pytest_storagescale.servers.dcache import EmbeddedDCache, cached_releases

    # the xrootd door answers non-ASCII characters as '?', SRM refuses names with spaces
    # (docs/upgrade.md): the tree under ASCII names, through WebDAV and xrootd
    before, after, doors = "10.2.25", "11.2.5", ("davs", "root")
    name = f"dcache {before} -> {after}"
    missing = {before, after} - set(cached_releases())
    if missing:
        print(f"{name}: NOT RUN: {', '.join(sorted(missing))} not in the distribution cache "
              f"(make setup)")
        return False
    state = Path(tempfile.mkdtemp(prefix="storagescale-dcache-state-"))
    manifest = workdir / "dcache-tree.json"

    def door_arguments(server: EmbeddedDCache) -> list[str]:
        return [*(server.url_for(scheme) for scheme in doors), "-o", f"ca_dir={server.ca_dir}",
                "-o", f"x509_proxy={server.proxy}", "--timeout", "120"]
    try:
        old = EmbeddedDCache(state_directory=state)
        old.requested_version = before
        with old:
            code, out, wrote = _tree("write", *door_arguments(old), "--manifest", str(manifest),
                                     "--seed", seed, "--size", size, "--ascii-names")
            print(f"{name}: {old.version} started in {old.start_seconds:.0f} s, tree written "
                  f"through {', '.join(doors)} in {wrote:.1f} s", flush=True)
            if code != 0:
                print(out)
                return False
        if corrupt:
            _flip(state / "pools", _content(manifest, len(doors)))
        new = EmbeddedDCache(state_directory=state)
        new.requested_version = after
        with new:
            code, out, verified = _tree("verify", *door_arguments(new), "--manifest",
                                        str(manifest))
            changes = ", ".join(f"{db} {a} -> {b}" for db, (a, b) in new.changesets.items())
            print(f"{name}: {new.version} started on the same database and pools in "
                  f"{new.start_seconds:.0f} s (its schema update: Liquibase change sets "
                  f"{changes}), verified through {', '.join(doors)} in {verified:.1f} s:\n"
                  f"{out}", end="")
        return _judge(name, code, out, corrupt)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=("all", "xrootd", "dcache"), default="all")
    parser.add_argument("--seed", default="1")
    parser.add_argument("--size", default="4MiB")
    parser.add_argument("--corrupt", action="store_true",
                        help=f"flip a byte of {FLIPPED!r} between the two releases")
    parser.add_argument("--workdir", type=Path, default=Path("storagescale-results/inplace"))
    arguments = parser.parse_args(argv)
    arguments.workdir.mkdir(parents=True, exist_ok=True)
    for old in arguments.workdir.glob("*-tree.json"):  # this target's own manifests
        old.unlink()
    flows = {"xrootd": _xrootd, "dcache": _dcache}
    chosen = list(flows) if arguments.server == "all" else [arguments.server]
    good = [flows[name](arguments.workdir, arguments.seed, arguments.size, arguments.corrupt)
            for name in chosen]
    return 0 if all(good) else 1


if __name__ == "__main__":
    sys.exit(main())
