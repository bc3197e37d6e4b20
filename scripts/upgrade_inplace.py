"""The upgrades in place on the embedded servers (issue 34; ``make upgrade-inplace``):
the old release writes a seeded tree through its doors (``storagescale tree write``),
stops; the new release starts on the same data (XRootD 5.5.3 -> 6.2.1 on one data
directory; dCache 10.2.25 -> 11.2.5 on one PostgreSQL cluster and one set of pool
folders, its own ``bin/dcache database update`` migrating the schema) and verifies the
tree through every door (``storagescale tree verify``). Prints each verify's verdict
and the measured times; ``--corrupt`` flips one byte of one stored file between the two
releases (the verify must then name it ``corrupted``).

Around the tree, the storage's suite (``suites/xrootd``, ``suites/dcache``) runs twice
against the servers themselves (``--storage-endpoint`` and ``--storage-door`` of the
running server): on the old release after the tree is written, keeping its results
(``<workdir>/<server>-before.json``), and on the new release after the verify, judged
against that run (``--storage-baseline``: the gate, behaviour changes and relative
rules; ``<workdir>/<server>-after.json``). ``--no-suite`` leaves both out; ``--pytest-args``
adds arguments to both runs (``-k stat_scan``, ``--storage-thresholds FILE``).

Exit status: 0 when every verify found every file ok (with ``--corrupt``: when each
named the flipped file ``corrupted`` and nothing else) and every judged suite run
passed (its exit status 0), 1 otherwise, 4 on bad input."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_storagescale.cli import main as storagescale
from pytest_storagescale.tree import build_tree

#: the file flipped with --corrupt (a size no other file of the default tree has)
FLIPPED = "with space/a file with spaces.txt"
#: the checkout (the suites' folder), whatever the working directory
ROOT = Path(__file__).resolve().parent.parent
#: how long SIGINT gives a suite run to stop before its process group is killed
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class SuiteRuns:
    """How the suite runs around the upgrade: which suite (None: not run), the extra
    pytest arguments, each run's time bound and where the results go."""

    suite: str | None
    extra: tuple[str, ...] = ()
    timeout_s: float = 1800.0
    workdir: Path = Path("storagescale-results/inplace")

    def run(self, name: str, server: str, when: str, endpoint: str, doors: dict[str, str],
            options: dict[str, str]) -> tuple[int | None, str]:
        """One pytest run of the suite against the running server: ``when`` 'before'
        keeps its results, 'after' is judged against them. Its exit status (None: no
        answer within the time bound) and a line saying it."""
        results = self.workdir / f"{server}-{when}.json"
        baseline = self.workdir / f"{server}-before.json"
        results.unlink(missing_ok=True)
        # the endpoint through the environment, never the command line (which any local
        # user may read in /proc): the embedded dCache's WebDAV URL holds its password
        argv = [sys.executable, "-m", "pytest", str(ROOT / str(self.suite)),
                *(f"--storage-door={door}={url}" for door, url in doors.items()),
                *(f"--storage-driver-option={key}={value}" for key, value in options.items()),
                "--storage-results", str(results), "-p", "no:cacheprovider", "-q",
                *(["--storage-baseline", str(baseline)] if when == "after" else []),
                *self.extra]
        log = self.workdir / f"{server}-{when}.log"
        began = time.monotonic()
        code = _bounded(argv, log, self.timeout_s, {"STORAGESCALE_ENDPOINT": endpoint})
        took = time.monotonic() - began
        summary = _last_line(log)
        gate = _gate_said(log)
        status = f"none (stopped at {self.timeout_s:.0f} s)" if code is None else str(code)
        said = (f"{name}: the suite ({self.suite}) {when} the upgrade: exit status {status} "
                f"in {took:.0f} s: {summary}"
                + (f" ({'; '.join(gate)})" if gate else "")
                + (f"; judged against {baseline.name}" if when == "after" else
                   f"; results {results}"))
        return code, said


def _bounded(argv: list[str], log: Path, timeout: float,
             environment: dict[str, str]) -> int | None:
    """``argv`` with its output in ``log`` and ``environment`` added to this process's:
    its exit status, None when it gave none within ``timeout`` (then SIGINT, after a
    grace its process group killed)."""
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **environment})
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return None


def _gate_said(log: Path) -> list[str]:
    """What the run's gate said, short: its behaviour line, then how many steps the
    statistical gate found regressed and inconclusive (each in the log)."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()
             if line.startswith("gate:")]
    said = [line for line in lines if "behaviour change" in line][:1]
    steps = [line for line in lines if "behaviour change" not in line]
    counts = {word: sum(f": {word}" in line for line in steps)
              for word in ("regressed", "inconclusive")}
    if steps:
        said.append(f"steps: {counts['regressed']} regressed, {counts['inconclusive']} "
                    f"inconclusive (each in {log})")
    return said


def _last_line(log: Path) -> str:
    """pytest's summary line (``3 passed, 1 xfailed in 12.3s``) or the last line."""
    lines = [line.strip(" =") for line in log.read_text(errors="replace").splitlines()
             if line.strip()]
    return lines[-1] if lines else "no output"


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


def _judge_suite(name: str, code: int | None, said: str) -> bool:
    """The judged run's verdict: its exit status 0 (the gate passed), else not."""
    print(said, flush=True)
    good = code == 0
    print(f"{name}: the suite judged against the run before the upgrade "
          f"{'passed' if good else 'FAILED'}\n", flush=True)
    return good


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


def _xrootd(workdir: Path, seed: str, size: str, corrupt: bool, suite: SuiteRuns) -> bool:
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
            if not _before(name, suite, "xrootd", old.url, {"davs": old.https_url},
                           {"ca_dir": str(old.ca_dir)}):
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
            print(f"{name}: {new.version} started on the same data directory in "
                  f"{started:.1f} s, verified through root:// and davs:// in {verified:.1f} "
                  f"s:\n{out}", end="", flush=True)
            files_good = _judge(name, code, out, corrupt)
            suite_good = _after(name, suite, "xrootd", new.url, {"davs": new.https_url},
                                {"ca_dir": str(new.ca_dir)})
        return files_good and suite_good
    finally:
        shutil.rmtree(data, ignore_errors=True)


def _before(name: str, suite: SuiteRuns, server: str, endpoint: str, doors: dict[str, str],
            options: dict[str, str]) -> bool:
    """The suite on the old release, its results kept: False when it left no results
    file to judge the run after against (then nothing is judged)."""
    if suite.suite is None:
        return True
    code, said = suite.run(name, server, "before", endpoint, doors, options)
    print(said, flush=True)
    if not (suite.workdir / f"{server}-before.json").is_file():
        print(f"{name}: the suite before the upgrade wrote no results (exit status {code}): "
              f"nothing to judge the run after against; see "
              f"{suite.workdir / f'{server}-before.log'}\n", flush=True)
        return False
    return True


def _after(name: str, suite: SuiteRuns, server: str, endpoint: str, doors: dict[str, str],
           options: dict[str, str]) -> bool:
    """The suite on the new release, judged against the run before."""
    if suite.suite is None:
        return True
    return _judge_suite(name, *suite.run(name, server, "after", endpoint, doors, options))


def _suite_doors(server) -> tuple[str, dict[str, str], dict[str, str]]:
    """The embedded dCache's WebDAV door as the endpoint (its URL holds the door's
    password: passed in the environment only), its xrootd door beside it, its CA
    folder and proxy (the doors the tree goes through)."""
    options = {"ca_dir": str(server.ca_dir)}
    if server.proxy is not None:
        options["x509_proxy"] = str(server.proxy)
    return server.url_for("davs"), {"root": server.url_for("root")}, options


def _content(manifest: Path, doors: int) -> bytes:
    import json

    record = json.loads(manifest.read_text())
    tree = build_tree(record["tree"]["seed"], record["tree"]["size"], doors,
                      record["tree"].get("names") == "ascii")
    return next(entry.data for entry in tree.files if entry.path == FLIPPED)


def _dcache(workdir: Path, seed: str, size: str, corrupt: bool, suite: SuiteRuns,
            gridftp: bool = False) -> bool:
    from pytest_storagescale.servers.dcache import EmbeddedDCache, cached_releases

    # the xrootd door answers non-ASCII characters as '?', SRM refuses names with spaces
    # (docs/upgrade.md): the tree under ASCII names, written through WebDAV and xrootd;
    # the new release verifies it through its GridFTP door too (--no-gridftp: not; its
    # md5 answer is an error: asked only the types offered at write time), never
    # through SRM (the tree's names with spaces) nor dcap (gfal2's dcap plug-in lists
    # no directory)
    before, after, doors = "10.2.25", "11.2.5", ("davs", "root")
    verify_doors = (*doors, "gsiftp") if gridftp else doors
    name = f"dcache {before} -> {after}"
    missing = {before, after} - set(cached_releases())
    if missing:
        print(f"{name}: NOT RUN: {', '.join(sorted(missing))} not in the distribution cache "
              f"(make setup)")
        return False
    state = Path(tempfile.mkdtemp(prefix="storagescale-dcache-state-"))
    manifest = workdir / "dcache-tree.json"

    def door_arguments(server: EmbeddedDCache, schemes: tuple[str, ...] = doors) -> list[str]:
        return [*(server.url_for(scheme) for scheme in schemes), "-o",
                f"ca_dir={server.ca_dir}", "-o", f"x509_proxy={server.proxy}",
                "--timeout", "120"]
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
            if not _before(name, suite, "dcache", *_suite_doors(old)):
                return False
        if corrupt:
            _flip(state / "pools", _content(manifest, len(doors)))
        new = EmbeddedDCache(state_directory=state,
                             extra_doors=("gsiftp",) if gridftp else ())
        new.requested_version = after
        with new:
            code, out, verified = _tree("verify", *door_arguments(new, verify_doors),
                                        "--manifest",
                                        str(manifest))
            changes = ", ".join(f"{db} {a} -> {b}" for db, (a, b) in new.changesets.items())
            print(f"{name}: {new.version} started on the same database and pools in "
                  f"{new.start_seconds:.0f} s (its schema update: Liquibase change sets "
                  f"{changes}), verified through {', '.join(verify_doors)} in {verified:.1f} s:\n"
                  f"{out}", end="", flush=True)
            files_good = _judge(name, code, out, corrupt)
            suite_good = _after(name, suite, "dcache", *_suite_doors(new))
        return files_good and suite_good
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
    parser.add_argument("--gridftp", action=argparse.BooleanOptionalAction, default=True,
                        help="dcache: verify through the new release's GridFTP door too "
                        "(default; --no-gridftp leaves it out)")
    parser.add_argument("--no-suite", action="store_true",
                        help="check the files only: no suite run before and after")
    parser.add_argument("--pytest-args", default="",
                        help="more arguments for both suite runs (one string, split as "
                        "the shell does), e.g. '-k stat_scan --storage-scale 0.05'")
    parser.add_argument("--suite-timeout", type=float, default=1800.0,
                        help="seconds each suite run may take (default 1800)")
    arguments = parser.parse_args(argv)
    try:
        extra = tuple(shlex.split(arguments.pytest_args))
    except ValueError as exc:
        print(f"ERROR: --pytest-args {arguments.pytest_args!r}: {exc}; quote it as a shell "
              f"would.", file=sys.stderr)
        return 4
    if not arguments.suite_timeout > 0:
        print(f"ERROR: --suite-timeout {arguments.suite_timeout:g}: give seconds above 0.",
              file=sys.stderr)
        return 4
    arguments.workdir.mkdir(parents=True, exist_ok=True)
    for old in [*arguments.workdir.glob("*-tree.json"),  # this target's own files
                *arguments.workdir.glob("*-before.json"), *arguments.workdir.glob("*-after.json")]:
        old.unlink()
    flows = {"xrootd": _xrootd,
             "dcache": functools.partial(_dcache, gridftp=arguments.gridftp)}
    chosen = list(flows) if arguments.server == "all" else [arguments.server]
    good = [flows[name](arguments.workdir, arguments.seed, arguments.size, arguments.corrupt,
                        SuiteRuns(None if arguments.no_suite else f"suites/{name}", extra,
                                  arguments.suite_timeout, arguments.workdir))
            for name in chosen]
    return 0 if all(good) else 1


if __name__ == "__main__":
    sys.exit(main())
