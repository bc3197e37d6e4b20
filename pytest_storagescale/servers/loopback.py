"""Loopback only, for the servers that cannot be told: ``loopback.c``, a preload library
that turns a ``bind()`` to the wildcard address (``0.0.0.0``, ``::``) into one to
loopback (``127.0.0.1``; ``::ffff:127.0.0.1`` on a dual-stack socket, ``::1`` on an
IPv6-only one), named in ``LD_PRELOAD`` of the embedded XRootD daemons (``xrootd`` and
``cmsd``: ``xrd.port N`` binds ``*:N`` and XRootD 5.5.3 and 6.2.1 have no directive for
the address; their ``xrd.port ... if`` matches host names, it binds nothing), of
the embedded dCache's JVM (its pool movers: no dCache setting binds them), and of the
gfal2 driver's dcap movers (libdcap's callback socket: ``drivers/dcap_mover.py``).
It also binds a UDP socket to loopback before its first send to loopback (the kernel
would bind it to the wildcard address: xrootd's ``xrd.report`` socket), and
``STORAGESCALE_BIND_ADDRESS`` names another address to bind instead of loopback (the
cluster tests' xrootd, on an interface made for it: ``tests/netns.py``).

Debian packages no such library, so it is compiled from the package's own source with
``gcc`` (``make setup`` does it beforehand, else the first server start), named by a
hash of the source and the flags, into a folder no other user may write:
``/var/cache/pytest-storagescale/`` when the session is root (every user may read it:
xrootd drops root's rights for its own user, and the programs it starts, the copy
program of a third-party copy, load the library again as that user), else the user's
``$XDG_CACHE_HOME/pytest-storagescale/`` (default ``~/.cache``). Folders 0755, the file
0644; a folder or file another user may change (or one above it) is refused, never
loaded. A server that cannot have it does not start: it would listen on every
interface.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import EndpointError
from .site_paths import others_control

SOURCE = Path(__file__).with_name("loopback.c")
FLAGS = ("-O2", "-shared", "-fPIC", "-Wall", "-Werror")
LIBRARIES = ("-ldl",)
#: root's library folder: outside /root (mode 0700), so the server's own user reads it
ROOT_FOLDER = Path("/var/cache/pytest-storagescale")
#: the most one build may take (a loaded 2-core machine: about a second)
BUILD_TIMEOUT = 120.0
_INSTALL_HINT = "apt-get install gcc libc6-dev (make setup installs them)"


def folder() -> Path:
    """Where the library is (or will be) built: :data:`ROOT_FOLDER` for root, else the
    user's cache."""
    if os.geteuid() == 0:
        return ROOT_FOLDER
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-storagescale"


def library_path() -> Path:
    """The library of this source and these flags."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join(FLAGS + LIBRARIES).encode())
    return folder() / f"loopback-{digest.hexdigest()[:16]}.so"


def _compiler() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def _refuse_controlled(path: Path) -> None:
    """An :class:`EndpointError` when another user may change ``path`` or a folder above
    it: a library it could replace would run in a server started by this user."""
    if why := others_control(path):
        raise EndpointError(
            f"the loopback-only library {path} cannot be used: {why}, so another user "
            f"could change what the embedded servers load. Remove it (and make the folders "
            f"above it writable by their owner only); it is built again at the next start.")


def build() -> Path:
    """The built library (compiled now when missing); :class:`EndpointError` naming
    what is missing or who else may change it."""
    target = library_path()
    if target.exists():
        _refuse_controlled(target)
        return target
    compiler = _compiler()
    if compiler is None:
        raise EndpointError(f"the embedded servers listen on loopback only through a small "
                            f"library compiled here, and there is no C compiler: "
                            f"{_INSTALL_HINT}.")
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if target.parent == ROOT_FOLDER:  # read by the servers' own user (whatever the umask)
        target.parent.chmod(0o755)
    _refuse_controlled(target.parent)
    # compiled beside the target and renamed: a concurrent build never loads half a file
    fd, partial = tempfile.mkstemp(prefix=".loopback-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        try:
            done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", partial, *LIBRARIES],
                                  capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise EndpointError(f"the loopback-only library took over {BUILD_TIMEOUT:.0f} s "
                                f"to build") from None
        if done.returncode != 0:
            raise EndpointError(f"the loopback-only library did not build "
                                f"({_INSTALL_HINT}): {done.stderr.strip()[-600:]}")
        os.chmod(partial, 0o644)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def preloaded(environment: dict[str, str]) -> dict[str, str]:
    """``environment`` with the library first in ``LD_PRELOAD`` (by its absolute path;
    what was there already kept after it)."""
    library = str(build())
    earlier = [entry for entry in environment.get("LD_PRELOAD", "").replace(":", " ").split()
               if entry != library]
    return {**environment, "LD_PRELOAD": " ".join([library, *earlier])}


if __name__ == "__main__":  # python -m pytest_storagescale.servers.loopback (make setup)
    try:
        print(f"loopback-only library: {build()}")
    except EndpointError as exc:
        print(f"loopback-only library not built: {exc}")
        raise SystemExit(1) from None
