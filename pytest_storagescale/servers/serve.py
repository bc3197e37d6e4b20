"""``python -m pytest_storagescale.servers.serve KIND``: one embedded server, started once
and kept running until Ctrl-C or SIGTERM, for the suites to be pointed at as one's own
door (a site's first trial of ``suites/dcache`` against a real dCache on this host,
without touching production, and without paying its minute of start-up per run).

It starts the server as ``--storage-embedded KIND`` would (same release choice, same
private folder, loopback only), then writes what a run needs to reach it, as the
settings' ``STORAGESCALE_*`` variables, to an env file only this user may read (mode
0600, in a new 0700 folder; the WebDAV door's password is in the endpoint's URL): its
main door as ``STORAGESCALE_ENDPOINT``, every door as ``STORAGESCALE_DOORS``, the CA
folder and proxy as ``STORAGESCALE_DRIVER_OPTIONS``. It prints the doors without
credentials and the command to run; the env file goes when the server stops::

    .venv/bin/python -m pytest_storagescale.servers.serve dcache
    . /tmp/storagescale-door-XXXX/door.env && .venv/bin/pytest suites/dcache

Bad input (an unknown kind, login or version, no dCache distribution) is one paragraph
on stderr, exit status 4, as pytest's usage errors.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from ..errors import StorageScaleUsageError
from ..redact import redact_url

#: the module's command, as its help and messages write it
COMMAND = "python -m pytest_storagescale.servers.serve"
#: the env file's name in its private folder
ENV_NAME = "door.env"
#: how often the waiting process looks whether the server is still alive (s)
WATCH_EVERY = 2.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise StorageScaleUsageError(f"{self.prog}: {message}. See '{self.prog} --help'.")


def parser() -> argparse.ArgumentParser:
    from .family import embedded_kinds

    serve = _Parser(prog=COMMAND, description=(
        "Start one embedded server and keep it running until Ctrl-C or SIGTERM; write "
        "the STORAGESCALE_* settings that point the suites at it to a private env file."))
    serve.add_argument("kind", choices=embedded_kinds(), help="the server's kind")
    serve.add_argument("--login", default="unix",
                       help="the login its doors require (as --storage-embedded-login)")
    serve.add_argument("--version", dest="version", default=None,
                       help="its release (as --storage-embedded-version: a version or a "
                            "dcache-VERSION.tar.gz path)")
    return serve


def environment(server) -> dict[str, str]:
    """The settings that point a run at ``server``'s doors (its main door first)."""
    doors = {scheme: server.url_for(scheme) for scheme in server.schemes}
    options = server.driver_options()
    return {
        "STORAGESCALE_ENDPOINT": server.url,
        "STORAGESCALE_DOORS": "\n".join(f"{name}={url}" for name, url in doors.items()),
        **({"STORAGESCALE_DRIVER_OPTIONS": "\n".join(
            f"{key}={value}" for key, value in options.items())} if options else {}),
    }


def write_env(values: dict[str, str]) -> Path:
    """``values`` as ``export NAME='value'`` lines in a new file only this user may
    read (0600 from its first byte, in a new 0700 folder)."""
    folder = Path(tempfile.mkdtemp(prefix="storagescale-door-"))
    path = folder / ENV_NAME
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as env:
        env.writelines(f"export {name}={shlex.quote(value)}\n" for name, value in values.items())
    return path


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass


def wait_until_stopped(alive: Callable[[], str]) -> str:
    """Block until SIGINT or SIGTERM (""), or until ``alive`` says why the server died.
    Both are unblocked first: a process inherits its parent's signal mask, and a parent
    that made a gfal2 context had them blocked (a served xrootd ignored SIGTERM)."""
    stop = threading.Event()
    previous = {number: signal.signal(number, lambda *_: stop.set())
                for number in (signal.SIGINT, signal.SIGTERM)}
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        while not stop.wait(WATCH_EVERY):
            if why := alive():
                return why
        return ""
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for number, handler in previous.items():
            signal.signal(number, handler)


def serve(arguments: argparse.Namespace, out=sys.stdout) -> int:
    from .family import start_embedded

    server = start_embedded(arguments.kind, arguments.login, arguments.version)
    env = None
    try:
        env = write_env(environment(server))
        doors = ", ".join(redact_url(server.url_for(scheme)) for scheme in server.schemes)
        print(f"{server.describe()} runs: {doors}", file=out)
        print(f"settings (credentials inside, mode 0600): {env}", file=out)
        print(f"point a suite at it as at any door: . {env} && .venv/bin/pytest suites/...",
              file=out)
        print("Ctrl-C or SIGTERM stops it.", file=out, flush=True)
        why = wait_until_stopped(server.exit_note)
        if why:
            print(why, file=sys.stderr)
            return 1
        return 0
    finally:
        if env is not None:
            _remove(env)
        server.stop()


def main(argv: list[str] | None = None) -> int:
    try:
        return serve(parser().parse_args(argv))
    except StorageScaleUsageError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 4


if __name__ == "__main__":
    sys.exit(main())
