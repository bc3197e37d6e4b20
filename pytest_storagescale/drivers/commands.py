"""The seeds' own command-line clients as drivers: ``dccp`` over ``dcap://`` and
``gsidcap://``, ``globus-url-copy`` over ``gsiftp://`` (issue 35, seed 004: BNL's
batch jobs copied files with ``dccp`` through dcap doors and with ``globus-url-copy``
through GridFTP doors, one tool run per file).

A load client of these drivers runs **one tool process per request**, as those jobs
did, each bounded (:mod:`.bounded`: a deadline, the client's timeout, that kills its
process group; killed with its parent; stdout and stderr bounded; an environment
given whole: the CA folder and the proxy by path, ``LANG=C``, the user's
``GLOBUS_*``/``X509_*`` settings, never a bearer token). It makes only what the tool
makes:

========================  ===========================================================
``dccp``                  ``put`` (``dccp -A local URL``), ``get`` (``dccp -A URL
                          local``; into memory: to a private temporary file, its size)
``globus-url-copy``       ``put``, ``get`` (the same), ``ls`` (``globus-url-copy -list
                          URL/``: the namespace scan)
========================  ===========================================================

Any other request of a load client (a stat, a checksum...) is refused before anything
is sent (``unsupported``): its step would measure another client. A service
connection (a step's set-up and clean-up, the run directory's checks) makes
everything through the ``gfal2`` driver of the same URL and options (for dcap: its
movers, and its listing through the door ``listing_door`` names), so the files a
copy-out step reads are written through the same door by gfal2, and what the run made
is removed as through any door.

A check of what a tool itself does (``suites/dcache/test_seed_clients.py``: overwrite,
checksums, a partial copy...) runs it on any connection with its own options:
:meth:`CommandDriver.copy_in` / :meth:`~CommandDriver.copy_out`,
:meth:`GlobusUrlCopyDriver.copy_within` (between two URLs of the door) and
:meth:`~GlobusUrlCopyDriver.listing`, bounded the same way, a copy in guarded and
recorded as made.

libdcap (``dccp``'s library) listens on every interface at a process's first open
(:mod:`.dcap_mover`), and a GridFTP client may listen for a data connection: both
tools run with the loopback-only preload library (``servers/loopback.py``), where any
such socket is bound to loopback. A URL with a password is refused: a tool's command
line is readable by every local user (``/proc/PID/cmdline``).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from ..errors import (
    BadAnswer,
    EndpointError,
    StorageError,
    StorageNotFound,
    StoragePermissionDenied,
    StorageScaleUsageError,
    StorageTimeout,
    StorageUnreachable,
)
from .base import Driver, StatInfo
from .bounded import STDOUT_LIMIT, CommandKilled, Finished, missing_launcher, run_bounded
from .url import EndpointURL, split_url

#: the driver option naming the door a dcap client's service connections list through
#: (the gfal2 driver's ``listing_door``, set by the session)
LISTING_DOOR = "listing_door"
#: the environment variables of the user's kept for a tool (paths and settings, never a
#: credential's value): Globus's and the grid's
KEPT_PREFIXES = ("GLOBUS_", "X509_")
KEPT_NAMES = ("PATH", "HOME", "TMPDIR")
#: how many characters of a tool's stderr an error quotes (its last lines)
QUOTED = 600

#: ``dccp -d 2``'s line naming the adler32 it sends with its close (decimal)
SENT_CHECKSUM = re.compile(rb"File checksum is: (\d+)")
#: a ``CKSM ALGORITHM OFFSET LENGTH PATH`` command in ``globus-url-copy -dbg``'s output
CKSM_COMMAND = re.compile(r"^CKSM (\S+) \S+ \S+ (.+?)\s*$")
#: an FTP reply line (its code, then a space: the last line of a reply)
FTP_REPLY = re.compile(r"^\d{3} ")

#: stderr text -> (error class, exception): the first match wins
_FAILURES: tuple[tuple[re.Pattern[str], str, type[StorageError]], ...] = (
    (re.compile(r"no such file|not found|does not exist|file not exist|\b550\b.*no such",
                re.I), "not_found", StorageNotFound),
    (re.compile(r"\b530\b|authenticat|gss|credential|proxy", re.I), "auth",
     StoragePermissionDenied),
    (re.compile(r"permission denied|access denied|not authori[sz]ed|\b553\b", re.I),
     "permission", StoragePermissionDenied),
    (re.compile(r"timed? ?out", re.I), "timeout", StorageTimeout),
    (re.compile(r"connection refused|unable to connect|no route to host|"
                r"failed to create a control line|host unreachable", re.I),
     "unreachable", StorageUnreachable),
)


class CommandDriver(Driver):
    """A command-line client: one bounded process per load request (module doc)."""

    #: the tool's name (looked up in ``PATH``) and the Debian packages that have it
    tool: ClassVar[str] = ""
    packages: ClassVar[str] = ""
    #: the requests a load client makes through the tool
    tool_requests: ClassVar[tuple[str, ...]] = ("put", "get")
    option_names: ClassVar[tuple[str, ...]] = ("ca_dir", "x509_proxy")
    #: its environment is built for each tool run (:meth:`tool_environment`); nothing is
    #: put into this process's
    option_environment: ClassVar[Mapping[str, str]] = {}
    #: its load clients run in client processes: a Ctrl-C or SIGTERM ends them at once,
    #: and their tools with them (``setpriv --pdeathsig``)
    isolate_clients = True
    #: a client's open files while a tool runs: its two pipes and the process's pidfd
    files_per_client = 4

    @classmethod
    def protocol_of(cls, scheme: str) -> str:
        return "dcap" if scheme in ("dcap", "gsidcap") else scheme

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        """The tool and ``setpriv`` are installed; a proxy given is valid."""
        from .credentials import check_credentials

        missing = missing_launcher()
        if shutil.which(cls.tool) is None:
            missing = f"{cls.tool} is not installed"
        if missing:
            raise StorageScaleUsageError(
                f"the {cls.name} driver runs {cls.tool} for each request, and {missing}. "
                f"Install it: apt-get install {cls.packages} util-linux (make setup, "
                f"scripts/bootstrap.sh, installs them).")
        check_credentials(options)

    @classmethod
    def parse_endpoint(cls, url: str) -> EndpointURL:
        """A URL with a password is refused: the tool's command line would show it to
        every local user."""
        if split_url(url).password is not None:
            raise EndpointError(
                f"the {cls.name} driver passes the URL on {cls.tool}'s command line, which "
                f"every local user can read: give the URL without user:password and log in "
                f"with a proxy (--storage-driver-option x509_proxy=PATH).")
        return super().parse_endpoint(url)

    @classmethod
    def request_line(cls, options: Mapping[str, str]) -> str | None:
        return (f"requests: each load request ({', '.join(cls.tool_requests)}) one {cls.tool} "
                f"process, bounded by the client's timeout; set-up and clean-up through "
                f"gfal2 over the same door")

    def __init__(self, endpoint: EndpointURL, **kwargs: Any) -> None:
        super().__init__(endpoint, **kwargs)
        self._lock = threading.Lock()
        self._gfal2: Driver | None = None
        self._folder: str | None = None
        self._staged: dict[int, tuple[bytes, str]] = {}
        self._environment: dict[str, str] | None = None

    # -- who makes a request ------------------------------------------------------
    @property
    def is_load_client(self) -> bool:
        """A load client (the engine gave it its step's stop): only the tool's requests."""
        return self.halted is not None

    def _service(self) -> Driver:
        """The gfal2 client of the same URL that serves a service connection."""
        with self._lock:
            if self._gfal2 is None:
                from .gfal2 import Gfal2Driver

                options = {key: value for key, value in self.options.items()
                           if key in Gfal2Driver.option_names}
                self._gfal2 = Gfal2Driver(self.endpoint, client_id=self.client_id,
                                          timeout=self.timeout,
                                          writable_root=self.writable_root, options=options)
            return self._gfal2

    def _through_service(self, operation: str, path: str) -> Driver:
        """The service client for ``operation``; refused for a load client."""
        if self.is_load_client:
            raise StorageError(
                f"{self.tool} makes no {operation} request: a load client of the {self.name} "
                f"driver makes only what {self.tool} makes "
                f"({', '.join(self.tool_requests)}), else its step would measure another "
                f"client", driver=self.name, endpoint=self.endpoint.server,
                operation=operation, path=path, error_class="unsupported")
        return self._service()

    # -- the tool -------------------------------------------------------------------
    def tool_environment(self) -> dict[str, str]:
        """The tool's whole environment (module doc), with the loopback-only library."""
        if self._environment is None:
            from ..servers.loopback import preloaded

            kept = {key: value for key, value in os.environ.items()
                    if key in KEPT_NAMES or key.startswith(KEPT_PREFIXES)}
            environment = {**kept, "LANG": "C", "LC_ALL": "C"}
            if self.options.get("ca_dir"):
                environment["X509_CERT_DIR"] = self.options["ca_dir"]
            if self.options.get("x509_proxy"):
                environment["X509_USER_PROXY"] = self.options["x509_proxy"]
            self._environment = preloaded(environment)
        return self._environment

    def _tool_url(self, path: str) -> str:
        return self.url_of(self.endpoint, path)

    def run_tool(self, operation: str, path: str, arguments: list[str], *,
                 stdout_limit: int | None = None, check: bool = True) -> Finished:
        """``tool arguments`` run bounded by this client's timeout; a failure or a kill
        as the :class:`StorageError` of ``operation`` on ``path`` (``check`` False: a
        non-zero exit is returned, a kill still raised)."""
        try:
            environment = self.tool_environment()
        except EndpointError as exc:  # the loopback-only library could not be built
            raise StorageError(f"{self.tool} is not run without the loopback-only library "
                               f"(it may listen on every interface): {exc}",
                               driver=self.name, endpoint=self.endpoint.server,
                               operation=operation, path=path,
                               error_class="client_missing") from None
        try:
            done = run_bounded([self.tool, *arguments], environment=environment,
                               deadline_s=self.timeout,
                               stdout_limit=stdout_limit or STDOUT_LIMIT)
        except CommandKilled as killed:
            raise self._killed(operation, path, killed) from None
        except OSError as exc:
            raise StorageError(f"{self.tool} could not be started: {exc}", driver=self.name,
                               endpoint=self.endpoint.server, operation=operation, path=path,
                               error_class="client_missing") from None
        if check and done.returncode != 0:
            raise self.failure(operation, path, done)
        return done

    def _killed(self, operation: str, path: str, killed: CommandKilled) -> StorageError:
        said = _tail(killed.stderr)
        fields = dict(driver=self.name, endpoint=self.endpoint.server, operation=operation,
                      path=path, native_status=f"{self.tool} killed: {killed.reason}")
        message = f"{self.tool} {killed.detail}" + (f"; it said: {said}" if said else "")
        if killed.reason == "deadline":
            return StorageTimeout(message, error_class="timeout", **fields)
        return BadAnswer(message, error_class="bad_answer", **fields)

    def failure(self, operation: str, path: str, done: Finished) -> StorageError:
        """The error a tool's non-zero exit says (its stderr's words, else its status)."""
        said = _tail(done.stderr) or _tail(done.stdout)
        status = (f"{self.tool} exit status {done.returncode}" if done.returncode >= 0
                  else f"{self.tool} killed by signal {-done.returncode}")
        fields = dict(driver=self.name, endpoint=self.endpoint.server, operation=operation,
                      path=path, native_status=status)
        message = f"{self.tool} failed ({status}): {said or 'it said nothing'}"
        for pattern, error_class, cls in _FAILURES:
            if pattern.search(said):
                return cls(message, error_class=error_class, **fields)
        return StorageError(message, error_class=f"exit_{done.returncode}", **fields)

    def _private_folder(self) -> str:
        """This client's folder for staged uploads and copies into memory (mode 0700)."""
        with self._lock:
            if self._folder is None:
                self._folder = tempfile.mkdtemp(prefix=f"storagescale-{self.name}-")
            return self._folder

    def staged(self, data: bytes) -> str:
        """A local file holding ``data``, written once per data object (a load step
        uploads the same payload again and again)."""
        folder = self._private_folder()
        with self._lock:
            found = self._staged.get(id(data))
            if found is None:
                local = os.path.join(folder, f"put-{len(self._staged)}")
                with open(local, "wb") as stream:
                    stream.write(data)
                # kept referenced: its id is not given to another object meanwhile
                found = self._staged[id(data)] = (data, local)
            return found[1]

    # -- what the tool makes (a load client), else the service's ------------------
    def _put(self, path: str, data: bytes) -> int:
        if not self.is_load_client:
            return self._service()._put(path, data)
        local = self.staged(data)
        self.run_tool("put", path, self.copy_in_arguments(local, path))
        return len(data)

    def _get(self, path: str, local_path: str | None) -> int:
        if not self.is_load_client:
            return self._service()._get(path, local_path)
        target = os.path.abspath(local_path) if local_path else os.path.join(
            self._private_folder(), f"get-{threading.get_ident()}")
        try:
            os.unlink(target)  # a copy out never appends to, nor refuses, a file there
        except FileNotFoundError:
            pass
        self.run_tool("get", path, self.copy_out_arguments(path, target))
        try:
            return os.path.getsize(target)
        except FileNotFoundError:
            raise BadAnswer(f"{self.tool} ended with status 0 and wrote no file",
                            driver=self.name, endpoint=self.endpoint.server,
                            operation="get", path=path, error_class="bad_answer") from None
        finally:
            if not local_path:
                _unlink(target)

    # -- the tool itself, for a check of what it does (suites/dcache/test_seed_clients.py)
    def copy_in(self, local: str, path: str, *options: str, check: bool = True) -> Finished:
        """``tool OPTIONS LOCAL URL`` on any connection of this driver, guarded as a put
        (``path`` inside the run's directory) and recorded as made (its clean-up removes
        it through the service connection); what the tool said. A non-zero exit is the
        :class:`StorageError` of its words (:meth:`failure`), or returned unless
        ``check``."""
        self._guard("put", path)
        self._made(path, "file")  # a refused or half-done copy may leave it too
        return self.run_tool("put", path, [*options, *self.copy_in_arguments(local, path)],
                             check=check)

    def copy_out(self, path: str, local: str, *options: str,
                 check: bool = True) -> Finished:
        """``tool OPTIONS URL LOCAL`` on any connection of this driver; what the tool said
        (a non-zero exit: its :class:`StorageError`, or returned unless ``check``)."""
        return self.run_tool("get", path, [*options, *self.copy_out_arguments(path, local)],
                             check=check)

    def copy_in_arguments(self, local: str, path: str) -> list[str]:
        raise NotImplementedError

    def copy_out_arguments(self, path: str, local: str) -> list[str]:
        raise NotImplementedError

    def _ls(self, path: str) -> list[str]:
        return self._through_service("ls", path)._ls(path)

    def _stat(self, path: str) -> StatInfo:
        return self._through_service("stat", path)._stat(path)

    def _mkdir(self, path: str) -> None:
        self._through_service("mkdir", path)._mkdir(path)

    def _mkdir_exclusive(self, path: str) -> None:
        self._through_service("mkdir", path)._mkdir_exclusive(path)

    def _read(self, path: str, offset: int, size: int) -> bytes:
        return self._through_service("read", path)._read(path, offset, size)

    def _readv(self, path: str, chunks: list[tuple[int, int]]) -> int:
        return self._through_service("readv", path)._readv(path, chunks)

    def _delete(self, path: str) -> None:
        self._through_service("delete", path)._delete(path)

    def _rmdir(self, path: str) -> None:
        self._through_service("rmdir", path)._rmdir(path)

    def _rename(self, source: str, target: str) -> None:
        self._through_service("rename", source)._rename(source, target)

    def _checksum(self, path: str, algorithm: str) -> str:
        return self._through_service("checksum", path)._checksum(path, algorithm)

    def _version(self) -> str:
        return self._service()._version()

    def _not_empty(self, exc: StorageError) -> bool:  # type: ignore[override]  # base: static
        return self._service()._not_empty(exc)

    def connect(self) -> None:
        """A service connection logs in through gfal2; a load client builds its tool's
        environment now (the loopback-only library compiled, when it is not yet), before
        the step's clock: each tool run logs in by itself."""
        if self.is_load_client:
            self.tool_environment()
            self._private_folder()
        else:
            self._service().connect()

    def close(self) -> None:
        with self._lock:
            service, self._gfal2 = self._gfal2, None
            folder, self._folder = self._folder, None
            self._staged.clear()
        if service is not None:
            service.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


class DccpDriver(CommandDriver):
    """``dccp`` (Debian's ``dcap``; GSI through ``dcap-tunnel-gsi``) in active mode
    (``-A``: it connects to the pool's mover), over a dcap door."""

    name = "dccp"
    tool = "dccp"
    packages = "dcap dcap-tunnel-gsi"
    schemes = ("dcap", "gsidcap")
    option_names = ("ca_dir", "x509_proxy", LISTING_DOOR)

    @classmethod
    def has_checksum(cls, scheme: str) -> bool:
        """dcap has no checksum request."""
        return False

    @classmethod
    def has_listing(cls, scheme: str) -> bool:
        """dccp lists nothing, and libdcap's listing is never sent (the gfal2 driver's
        ``DCAP_NO_LISTING``): a service connection lists through ``listing_door``."""
        return False

    @classmethod
    def listing_door_option(cls, scheme: str) -> str | None:
        return LISTING_DOOR

    def copy_in_arguments(self, local: str, path: str) -> list[str]:
        return ["-A", local, self._tool_url(path)]

    def copy_out_arguments(self, path: str, local: str) -> list[str]:
        return ["-A", self._tool_url(path), local]

    @staticmethod
    def sent_checksum(done: Finished) -> str | None:
        """The adler32 ``dccp -d 2`` says it computed while writing and sent with its
        close (``File checksum is: N``, decimal), as 8 hex digits; None: it said none
        (``-c``, or a copy out)."""
        found = SENT_CHECKSUM.search(done.stderr + done.stdout)
        return f"{int(found.group(1)):08x}" if found else None


class GlobusUrlCopyDriver(CommandDriver):
    """``globus-url-copy`` (Debian's ``globus-gass-copy-progs``) over a GridFTP door:
    copies in and out, and ``-list`` for the namespace scan."""

    name = "globus-url-copy"
    tool = "globus-url-copy"
    packages = "globus-gass-copy-progs"
    schemes = ("gsiftp",)
    tool_requests = ("put", "get", "ls")

    def copy_in_arguments(self, local: str, path: str) -> list[str]:
        return [f"file://{local}", self._tool_url(path)]

    def copy_out_arguments(self, path: str, local: str) -> list[str]:
        return [self._tool_url(path), f"file://{local}"]

    def copy_within(self, source: str, target: str, *options: str,
                    check: bool = True) -> Finished:
        """``globus-url-copy OPTIONS SOURCE-URL TARGET-URL``: a third-party copy from this
        door to itself (its only way to compare checksums of adler32, which it can ask
        the door for: a local file's checksum is OpenSSL's, which has no adler32),
        guarded as a put of ``target`` and recorded as made."""
        self._guard("put", target)
        self._made(target, "file")
        return self.run_tool("put", target, [*options, self._tool_url(source),
                                             self._tool_url(target)], check=check)

    def listing(self, path: str) -> list[str]:
        """``globus-url-copy -list URL/`` on any connection of this driver: the names."""
        done = self.run_tool("ls", path, ["-list", self._tool_url(path.rstrip("/") + "/")])
        return parse_listing(done.stdout, self.name, self.endpoint.server, path)

    @staticmethod
    def door_checksums(done: Finished) -> list[tuple[str, str, str]]:
        """What a ``globus-url-copy -dbg`` run asked the door with ``CKSM`` and what the
        door answered, in order: ``(algorithm, path, answer)``, the answer as the door
        wrote it (``213 5e26cc01``, or its error: ``500 ...``); the debug lines between
        them skipped."""
        asked: list[tuple[str, str, str]] = []
        pending: tuple[str, str] | None = None
        for line in (done.stderr + done.stdout).decode(errors="replace").splitlines():
            command = CKSM_COMMAND.match(line)
            if command:
                pending = (command.group(1), command.group(2))
            elif pending is not None and FTP_REPLY.match(line):
                asked.append((*pending, line.strip()))
                pending = None
        return asked

    def _ls(self, path: str) -> list[str]:
        """``globus-url-copy -list URL/``: its first line the URL, then one entry per
        line, indented, a directory's with a ``/`` after it."""
        if not self.is_load_client:
            return self._service()._ls(path)
        return self.listing(path)


def parse_listing(output: bytes, driver: str, endpoint: str, path: str) -> list[str]:
    """The names of a ``globus-url-copy -list`` answer, sorted (``.`` and ``..`` left
    out); a name that is not UTF-8 is :class:`BadAnswer`, as on the other drivers.
    globus-url-copy 10.12 writes each entry indented by four spaces and followed by one
    character, a space after a file's name and a ``/`` after a directory's (``    a.dat
    ``, ``    sub/``): that one character is taken off, no more (a name may end in a
    space)."""
    try:
        text = output.decode()
    except UnicodeDecodeError as exc:
        raise BadAnswer(f"the listing holds {exc.object[exc.start:exc.start + 40]!r}, not "
                        f"UTF-8 text", driver=driver, endpoint=endpoint, operation="ls",
                        path=path, error_class="bad_answer") from None
    lines = text.split("\n")
    if not lines or "://" not in lines[0]:
        raise BadAnswer(f"not a listing: {text[:200]!r}", driver=driver, endpoint=endpoint,
                        operation="ls", path=path, error_class="bad_answer")
    names = (_entry_name(line.removeprefix("    ")) for line in lines[1:] if line.strip())
    return sorted(name for name in names if name not in (".", ".."))


def _entry_name(entry: str) -> str:
    """An entry of a listing without the one character globus-url-copy writes after it
    (a space after a file, ``/`` after a directory)."""
    return entry[:-1] if entry.endswith((" ", "/")) else entry


def _tail(output: bytes) -> str:
    """The last :data:`QUOTED` characters of a tool's output, on one line."""
    text = " ".join(output.decode(errors="replace").split())
    return text[-QUOTED:]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

