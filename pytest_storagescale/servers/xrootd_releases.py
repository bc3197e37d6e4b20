"""Which XRootD the embedded xrootd runs (``--storage-embedded-version``).

- the installed one (Debian's ``xrootd``, 5.5.3 on Debian 12): the default;
- ``6.2.1``: built from PyPI's ``xrootd==6.2.1`` source distribution by
  ``scripts/build-xrootd6.sh`` (run by ``scripts/bootstrap.sh servers|all``) into
  ``$XDG_CACHE_HOME/pytest-storagescale/xrootd-6.2.1-<key>/`` (default ``~/.cache``),
  whose marker file ``.storagescale-built`` is written last (no marker: a broken or
  partial build, not used);
- a path: a site's own XRootD installation prefix (``bin/xrootd``, ``lib/`` or
  ``lib64/``), the release it is about to deploy.

A release from a prefix runs with ``LD_LIBRARY_PATH`` on its own library folder, its
plug-ins named by their full path (``lib/libXrdHttp-6.so``), so that Debian's 5.5.3
libraries, on the default search path, are never loaded beside it
(:func:`foreign_libraries` checks a running server's ``/proc/PID/maps``).

A prefix whose programs or libraries search for libraries where another user may put
one is refused (:func:`search_path_problems`): a RUNPATH or RPATH element that is
empty or relative (the working directory: a ``libz.so.1`` in the folder pytest was
started from would run as this user) or a folder that does not exist (a deleted build
tree, which anyone may create again). A 6.2.1 built by an older
``scripts/build-xrootd6.sh`` had ``[<build tree>/lib:]``; the script repairs it.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import EndpointError, StorageScaleUsageError
from .site_paths import control_problem, others_control

#: the release the project's set-up builds
BUILT_VERSION = "6.2.1"
#: the script that builds it (relative to the checkout)
BUILD_SCRIPT = "scripts/build-xrootd6.sh"
#: written last by the build: its presence means a whole build
MARKER = ".storagescale-built"
_VERSION = re.compile(r"v?(\d+(?:\.\d+)+)")


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/pytest-storagescale`` (default ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-storagescale"


def version_key(version: str) -> tuple[int, ...]:
    """``5.9.3`` -> ``(5, 9, 3)`` (the leading numbers; ``()`` for none)."""
    match = _VERSION.match(version or "")
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


@dataclass(frozen=True)
class XRootDRelease:
    """One XRootD installation: its ``xrootd`` binary, its library folder (None: the
    system's, found by the default search path) and the version ``xrootd -v`` says."""

    binary: str
    lib_dir: str | None
    version: str

    @property
    def major(self) -> int:
        key = version_key(self.version)
        return key[0] if key else 0

    def at_least(self, *version: int) -> bool:
        return version_key(self.version) >= version

    def tool(self, name: str) -> str:
        """A command of this installation (``xrdcp``): beside its ``xrootd``, else on PATH
        (the system's too: a client environment's ``xrdcp`` first on PATH,
        :data:`CLIENT_VARIABLE`, is the clients', not this server's)."""
        beside = Path(self.binary).with_name(name)
        if beside.is_file():
            return str(beside)
        return shutil.which(name) or name

    def plugin(self, name: str) -> str:
        """What a directive names for plug-in ``name`` (``libXrdHttp``): the system's
        short name (xrootd adds its major version and searches), or this prefix's file
        by its full path (``<lib>/libXrdHttp-6.so``)."""
        if self.lib_dir is not None:
            for candidate in (f"{name}-{self.major}.so", f"{name}.so"):
                path = Path(self.lib_dir) / candidate
                if path.is_file():
                    return str(path)
        return f"{name}.so"

    def copied_to(self, folder: Path) -> XRootDRelease:
        """This release for a server that starts as root and drops to another user:
        itself when every user may read its library folder and no other user may
        change its files (:func:`.site_paths.others_control`), else its libraries,
        ``xrootd`` and ``xrdcp`` copied into ``folder``, a new folder this user keeps
        (a cache under ``/root``, mode 0700, is out of reach of the user xrootd switches
        to before it loads its plug-ins). The copy is this user's, 0755 folders and no
        file writable by group or others: root runs ``xrootd`` and loads its libraries
        before it drops, so the server's user must not be able to change them."""
        if self.lib_dir is None:
            return self
        prefix = Path(self.binary).parent.parent
        if reachable_by_all(Path(self.lib_dir)) and not others_control(
                *release_files(prefix)):
            return self
        (folder / "bin").mkdir(parents=True)
        shutil.copytree(self.lib_dir, folder / "lib", symlinks=True)
        for name in ("xrootd", "xrdcp"):
            source = Path(self.binary).with_name(name)
            if source.is_file():
                shutil.copy2(source, folder / "bin" / name)
        for path in [folder, *folder.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else path.stat().st_mode & 0o755)
        return XRootDRelease(str(folder / "bin" / "xrootd"), str(folder / "lib"), self.version)

    def program(self, name: str, folder: Path) -> str:
        """A command of this installation that the server runs itself (``ofs.tpc``'s
        copy program, which is not handed ``LD_LIBRARY_PATH``): the system's from PATH,
        else a script in ``folder`` that runs this prefix's on its own libraries."""
        command = self.tool(name)
        if self.lib_dir is None:
            return command
        script = folder / f"{name}-{self.version}"
        write_own_file(script, f'#!/bin/sh\nLD_LIBRARY_PATH={shlex.quote(self.lib_dir)}'
                               f'"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec '
                               f'{shlex.quote(command)} "$@"\n', 0o755)
        return str(script)

    def environment(self) -> dict[str, str]:
        """What its processes need in their environment (``LD_LIBRARY_PATH``)."""
        if self.lib_dir is None:
            return {}
        earlier = os.environ.get("LD_LIBRARY_PATH")
        return {"LD_LIBRARY_PATH": self.lib_dir + (f":{earlier}" if earlier else "")}


def write_own_file(path: Path, text: str, mode: int = 0o644) -> Path:
    """``text`` into ``path`` as a file of this user with ``mode``: written to a new
    file beside it (``O_EXCL | O_NOFOLLOW``), then renamed over ``path``, so that a
    link found at ``path`` is replaced, never followed (root rewrites the embedded
    xrootd's configuration at each restart)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(descriptor, "w") as stream:
            stream.write(text)
            os.fchmod(stream.fileno(), mode)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def reachable_by_all(folder: Path) -> bool:
    """Whether any user may read ``folder`` (it and every folder above it searchable)."""
    import stat

    try:
        if not folder.stat().st_mode & stat.S_IROTH:
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH
                   for parent in [folder, *folder.resolve().parents])
    except OSError:
        return False


def system_binary() -> str | None:
    """The installed ``xrootd`` (PATH, else ``/usr/bin/xrootd``)."""
    return shutil.which("xrootd") or (
        "/usr/bin/xrootd" if os.access("/usr/bin/xrootd", os.X_OK) else None)


def version_of(binary: str, environment: dict[str, str] | None = None) -> str:
    """``xrootd -v`` of ``binary`` (``5.5.3``), with ``environment`` added; "unknown"
    when it says nothing readable."""
    try:
        result = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=30,
                                env={**os.environ, **(environment or {})})
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    for line in reversed((result.stdout + result.stderr).strip().splitlines()):
        match = _VERSION.fullmatch(line.strip())
        if match:
            return match.group(1)
    return "unknown"


def built_prefix(version: str = BUILT_VERSION) -> Path | None:
    """The newest whole build of ``version`` in the cache (None: not built)."""
    root = cache_root()
    if not root.is_dir():
        return None
    markers = sorted(root.glob(f"xrootd-{version}-*/{MARKER}"),
                     key=lambda path: path.stat().st_mtime)
    return markers[-1].parent if markers else None


def library_folder(prefix: Path) -> Path:
    """``lib64/`` when it holds the XRootD libraries, else ``lib/``."""
    lib64 = prefix / "lib64"
    return lib64 if any(lib64.glob("libXrdUtils.so*")) else prefix / "lib"


def prefix_problem(prefix: Path) -> str:
    """Why ``prefix`` is no XRootD installation ("" when it is one)."""
    if not prefix.is_dir():
        return f"{prefix} is not a folder"
    binary = prefix / "bin" / "xrootd"
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return f"{prefix} has no executable bin/xrootd"
    if not any(library_folder(prefix).glob("libXrdUtils.so*")):
        return f"{prefix} has no lib/libXrdUtils.so* (nor lib64/)"
    return ""


def release_files(prefix: Path) -> list[Path]:
    """What the server runs of an installation prefix: the folder, its programs, its
    library folder and the libraries in it."""
    lib = library_folder(prefix)
    return [prefix, prefix / "bin", *sorted((prefix / "bin").glob("xr*")), lib,
            *sorted(lib.glob("*.so*"))]


def _elf_files(prefix: Path) -> list[Path]:
    """The ELF files (programs, libraries, plug-ins) of ``prefix``'s ``bin/`` and library
    folder, links left out (their targets are among them)."""
    found = []
    for folder in (prefix / "bin", library_folder(prefix)):
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            if path.is_symlink() or not path.is_file():
                continue
            with path.open("rb") as file:
                if file.read(4) == b"\x7fELF":
                    found.append(path)
    return found


_SEARCH_PATH = re.compile(r"\((RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]$")


def search_path_problems(prefix: Path) -> list[str]:
    """Each library search path element (RUNPATH, RPATH) of ``prefix``'s ELF files that
    another user could fill: empty or relative (the working directory), or a folder
    that does not exist (``$ORIGIN`` is the file's folder). Read with ``readelf -d``."""
    readelf = shutil.which("readelf")
    if readelf is None:
        return [f"the library search paths of {prefix}'s programs cannot be checked: "
                f"readelf is missing (apt-get install binutils)"]
    problems = []
    for path in _elf_files(prefix):
        try:
            done = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True,
                                  timeout=30)
        except subprocess.TimeoutExpired:
            problems.append(f"{path}: readelf -d gave no answer within 30 s")
            continue
        for line in done.stdout.splitlines():
            match = _SEARCH_PATH.search(line.strip())
            if not match:
                continue
            for element in match.group(2).split(":"):
                if why := _element_problem(element, path.parent):
                    problems.append(f"{path}'s {match.group(1)} element '{element}' {why}")
    return problems


def _element_problem(element: str, origin: Path) -> str:
    """Why a search path element is a door ("" when it is not)."""
    if not element:
        return "is empty: the working directory"
    expanded = element.replace("${ORIGIN}", str(origin)).replace("$ORIGIN", str(origin))
    if not expanded.startswith("/"):
        return "is relative: a folder under the working directory"
    if not Path(expanded).is_dir():
        return "is a folder that does not exist (anyone who can create it could fill it)"
    return ""


def is_path(requested: str) -> bool:
    """Whether a ``--storage-embedded-version`` value names a folder, not a release."""
    return "/" in requested or requested.startswith(("~", "."))


def check_requested(requested: str, installed: str) -> str:
    """``requested`` as the server will use it (a prefix made absolute); a usage error
    naming the releases, the build command or what the folder lacks."""
    if is_path(requested):
        prefix = Path(requested).expanduser().resolve()
        problem = prefix_problem(prefix)
        if not problem and (controlled := control_problem(requested, release_files(prefix))):
            raise StorageScaleUsageError(controlled)
        if problem:
            raise StorageScaleUsageError(
                f"--storage-embedded-version {requested}: {problem}. Give the prefix of an "
                f"XRootD installation (the folder holding bin/xrootd and lib/), or one of "
                f"the releases {', '.join(offered(installed))}.")
        if doors := search_path_problems(prefix):
            raise StorageScaleUsageError(
                f"--storage-embedded-version {requested}: {_doors(doors)}. Set the "
                f"programs' and libraries' search path to the prefix's own library folder "
                f"('patchelf --set-rpath {library_folder(prefix)} FILE', or build with "
                f"CMAKE_INSTALL_RPATH set to it and install), or give another prefix.")
        return str(prefix)
    if requested == installed and installed:
        return requested
    if requested == BUILT_VERSION:
        built = built_prefix()
        if built is None:
            raise StorageScaleUsageError(
                f"--storage-embedded-version {requested}: XRootD {requested} is not built on "
                f"this machine (no {cache_root()}/xrootd-{requested}-*/{MARKER}). Build it "
                f"once with 'bash {BUILD_SCRIPT}' in the pytest-storagescale checkout "
                f"(15-30 minutes; 'make setup' runs it), or leave the option out for the "
                f"installed {installed or 'xrootd'}.")
        if unsafe := _checked_build(built, (built / MARKER).stat().st_mtime_ns):
            raise StorageScaleUsageError(
                f"--storage-embedded-version {requested}: the build in {built} cannot be "
                f"run safely (an older {BUILD_SCRIPT} left its build tree's search path in "
                f"it): {_doors(unsafe)}. Run 'bash {BUILD_SCRIPT}' in the "
                f"pytest-storagescale checkout once: it repairs the build in a few seconds "
                f"('make setup' runs it).")
        return requested
    raise StorageScaleUsageError(
        f"--storage-embedded-version {requested}: the embedded xrootd offers "
        f"{', '.join(offered(installed))}, or the path of an XRootD installation prefix "
        f"(a site's own build). Pick one of those, or leave the option out.")


@functools.cache
def _checked_build(prefix: Path, marked: int) -> tuple[str, ...]:
    """:func:`search_path_problems` of the built release, once per process and marker
    (``marked``: its mtime; a repair rewrites it)."""
    return tuple(search_path_problems(prefix))


def _doors(problems: list[str] | tuple[str, ...]) -> str:
    """The first problems, and how many more."""
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def offered(installed: str) -> tuple[str, ...]:
    """The releases by name: the installed one (the default) and the built one."""
    return tuple(dict.fromkeys(v for v in (installed, BUILT_VERSION) if v and v != "unknown"))


@functools.cache
def release(requested: str | None) -> XRootDRelease:
    """The installation ``requested`` names (as :func:`check_requested` gave it back;
    None: the installed one)."""
    if requested is None or (not is_path(requested) and requested != BUILT_VERSION):
        binary = system_binary()
        if binary is None:
            raise EndpointError("the embedded endpoint needs the xrootd binary, not found on "
                                "PATH: install xrootd-server (or run 'make setup').")
        return XRootDRelease(binary, None, version_of(binary))
    prefix = Path(requested) if is_path(requested) else built_prefix()
    if prefix is None:
        check_requested(requested, "")  # the usage error naming the build
        raise AssertionError("unreachable")
    lib_dir = str(library_folder(prefix))
    binary = str(prefix / "bin" / "xrootd")
    return XRootDRelease(binary, lib_dir,
                         version_of(binary, {"LD_LIBRARY_PATH": lib_dir}))


def foreign_libraries(pid: int, release_: XRootDRelease) -> list[str]:
    """The XRootD libraries a running server mapped from outside ``release_``'s library
    folder (``/proc/PID/maps``): empty when it runs on its own only."""
    if release_.lib_dir is None:
        return []
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return []
    mapped = {line.split()[-1] for line in maps.splitlines() if "/libXrd" in line}
    own = os.path.realpath(release_.lib_dir)
    return sorted(path for path in mapped if not os.path.realpath(path).startswith(own + "/"))


# -- the client release (STORAGESCALE_XROOTD_CLIENT) ------------------------------------
#
# The XRootD client of a run is the one whose Python bindings the process imports (the
# xrootd driver, the load clients, the tree) and whose tools (xrdcp, xrdfs) it runs.
# By default Debian's (python3-xrootd, 5.5.3); STORAGESCALE_XROOTD_CLIENT=6.2.1 names
# the client environment scripts/build-xrootd6.sh --client builds from the same sdist:
# its folder goes first on ``sys.path`` (the bindings load their own libraries and
# security plug-ins by RUNPATH $ORIGIN: no LD_LIBRARY_PATH) and its ``bin/`` first on
# PATH, before anything imports ``XRootD``. Children inherit it: the variable stays set
# (an xdist worker, a ``storagescale`` command, a subprocess), and spawned load
# processes get the parent's ``sys.path``. The server keeps its own release's tools
# (:meth:`XRootDRelease.tool` prefers the one beside its ``xrootd``).

#: the environment variable that names the client release of a run
CLIENT_VARIABLE = "STORAGESCALE_XROOTD_CLIENT"
#: the client environment's folders in the cache: ``xrootd-client-<version>-<key>``
CLIENT_PREFIX = "xrootd-client"


@dataclass(frozen=True)
class ClientRelease:
    """One XRootD client environment: its version, the folder of its Python bindings
    and of its tools (None: the system's, found on the default paths)."""

    version: str
    python_dir: str | None = None
    bin_dir: str | None = None


def client_prefix(version: str = BUILT_VERSION) -> Path | None:
    """The newest whole client environment of ``version`` in the cache (None: not built)."""
    root = cache_root()
    if not root.is_dir():
        return None
    markers = sorted(root.glob(f"{CLIENT_PREFIX}-{version}-*/{MARKER}"),
                     key=lambda path: path.stat().st_mtime)
    return markers[-1].parent if markers else None


def installed_client_version() -> str:
    """The version of the XRootD Python bindings on the default path (Debian's
    python3-xrootd), read from their metadata without importing them ("" when none)."""
    from importlib import metadata

    own = client_prefix()
    for found in metadata.distributions(name="xrootd"):
        location = str(found.locate_file(""))
        if own is None or not location.startswith(str(own) + "/"):
            return str(found.version)
    return ""


def client_release(requested: str | None) -> ClientRelease:
    """The client environment ``requested`` names (None or "": the installed one); a
    usage error naming the releases offered or the build command."""
    installed = installed_client_version()
    if not requested or requested in ("installed", installed):
        return ClientRelease(installed or "unknown")
    offered_here = ", ".join(dict.fromkeys(v for v in (installed, BUILT_VERSION) if v))
    if requested != BUILT_VERSION:
        raise StorageScaleUsageError(
            f"{CLIENT_VARIABLE}={requested}: the XRootD client releases offered are "
            f"{offered_here} (the installed bindings, or the client environment "
            f"'bash {BUILD_SCRIPT} --client' builds). Set one of those, or unset it for "
            f"the installed {installed or 'client'}.")
    prefix = client_prefix(requested)
    if prefix is None:
        raise StorageScaleUsageError(
            f"{CLIENT_VARIABLE}={requested}: the XRootD {requested} client environment is "
            f"not built on this machine (no {cache_root()}/{CLIENT_PREFIX}-{requested}-*/"
            f"{MARKER}). Build it once with 'bash {BUILD_SCRIPT} --client' in the "
            f"pytest-storagescale checkout (5-15 minutes; 'make setup' runs it), or unset "
            f"{CLIENT_VARIABLE} for the installed {installed or 'client'}.")
    return ClientRelease(requested, str(prefix / "python"), str(prefix / "bin"))


def use_client_release() -> ClientRelease:
    """Make this process use the client release :data:`CLIENT_VARIABLE` names (unset:
    the installed one, nothing changed): its bindings first on ``sys.path``, its tools
    first on PATH. Called before anything imports ``XRootD`` (the plugin's first hook,
    the ``storagescale`` command); a usage error when the bindings of another release
    were imported already, or the release is not offered."""
    import sys

    chosen = client_release(os.environ.get(CLIENT_VARIABLE, "").strip() or None)
    if chosen.python_dir is None:
        return chosen
    loaded = sys.modules.get("XRootD")
    where = str(getattr(loaded, "__file__", "") or "")
    if loaded is not None and not where.startswith(chosen.python_dir + "/"):
        raise StorageScaleUsageError(
            f"{CLIENT_VARIABLE}={chosen.version}: this process imported the XRootD "
            f"bindings from {where or 'elsewhere'} before the client release was chosen. "
            f"Set the variable before Python starts (in the shell or CI job), not in a "
            f"conftest or plugin.")
    if chosen.python_dir not in sys.path:
        sys.path.insert(0, chosen.python_dir)
    if chosen.bin_dir:
        path = os.environ.get("PATH", "")
        if path.split(os.pathsep)[:1] != [chosen.bin_dir]:
            os.environ["PATH"] = chosen.bin_dir + (os.pathsep + path if path else "")
    return chosen


def client_foreign_libraries(chosen: ClientRelease, pid: int | None = None) -> list[str]:
    """The XRootD libraries this process (or ``pid``) mapped from outside the chosen
    client environment's folder (``/proc/PID/maps``): empty when it runs on its own
    only (a ``libXrdCl.so.3`` of another release loaded first, by gfal2's xroot
    plug-in, would be shared under the same soname)."""
    if chosen.python_dir is None:
        return []
    release_ = XRootDRelease("", chosen.python_dir + "/pyxrootd", chosen.version)
    return foreign_libraries(pid or os.getpid(), release_)
