"""A private PostgreSQL cluster for an embedded server's databases (dCache keeps its
namespace, chimera, in one, as it does in production).

``initdb`` makes the cluster in a folder of the server's private directory and
``postgres`` runs it as a child of the session, in a session of its own (the orphan
reaper finds it by its ``-D`` folder), listening on a free loopback port only (no
Unix socket outside that folder). PostgreSQL refuses to run as root: a root session
runs it as ``postgres`` (Debian's) or the family's unprivileged user. The cluster is
for tests, and no fsync (a crash loses the run's
data, which the run removes anyway). Its port on loopback is any local user's to
reach: only the server's own role logs in there, to its own databases, with a password
(scram; :meth:`PostgresCluster.create_databases`, registered as a secret); the superuser
logs in only over the Unix socket in the private folder (``trust`` there). Readiness
is a real connection (``pg_isready``), never a sleep.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ..errors import EndpointError
from ..redact import register_secret
from .processes import ServerProcess, free_port, log_tail, unprivileged_user

#: Debian's packages of the server and of the client (psql, pg_isready)
PACKAGES = ("postgresql",)
#: the superuser of the private cluster
SUPERUSER = "postgres"
#: settings of a throwaway cluster: loopback only, no durability, room for the
#: connection pools of a JVM's services
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "off",
    "max_connections": "300",
    "shared_buffers": "64MB",
    "log_min_messages": "warning",
}


def postgres_bin_dir() -> Path | None:
    """The folder of ``initdb`` and ``postgres``: Debian's newest
    ``/usr/lib/postgresql/<major>/bin``, else where ``initdb`` on PATH resolves to."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                   key=lambda path: int(path.parent.parent.name)
                   if path.parent.parent.name.isdigit() else 0)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb and (Path(initdb).resolve().parent / "postgres").exists():
        return Path(initdb).resolve().parent
    return None


def check_installed(what: str) -> Path:
    """The binaries' folder, or one paragraph naming the package to install."""
    folder = postgres_bin_dir()
    if folder is None:
        raise EndpointError(
            f"{what} keeps its namespace in PostgreSQL, and no PostgreSQL server is "
            f"installed (no initdb/postgres in /usr/lib/postgresql/*/bin or on PATH). "
            f"Install it: 'sudo apt-get install {' '.join(PACKAGES)}' (or run 'make setup' "
            f"in the pytest-storagescale checkout).")
    return folder


def database_user() -> str | None:
    """Whom the cluster runs as when the session is root: ``postgres`` when it exists,
    else the family's unprivileged user; None when the session is not root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SUPERUSER)
        return SUPERUSER
    except KeyError:
        return unprivileged_user()


class PostgresCluster:
    """A throwaway cluster in ``directory`` (made here; its parent must let the
    cluster's user through), serving ``127.0.0.1:<port>``."""

    def __init__(self, directory: Path, *, startup_timeout: float = 60.0) -> None:
        self.directory = directory
        self.startup_timeout = startup_timeout
        self.bin_dir = check_installed("the embedded server")
        self.user = database_user()
        self.port = 0
        self.process: subprocess.Popen | None = None
        #: the postmaster, watched for a death mid-run
        self.watched: ServerProcess | None = None
        self.version = ""
        #: the password of the role :meth:`create_databases` made
        self.password = ""

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "postgres.log"

    def _run(self, *command: str, sql_input: str | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
        """A PostgreSQL tool as the cluster's user; an EndpointError with its output
        when it fails."""
        done = subprocess.run(list(command), input=sql_input, capture_output=True, text=True,
                              timeout=timeout, cwd=self.directory, user=self.user,
                              env={**os.environ, "LC_ALL": "C", "PGHOST": str(self.directory)})
        if done.returncode != 0:
            raise EndpointError(
                f"the private PostgreSQL cluster: {Path(command[0]).name} failed "
                f"({done.returncode}): {(done.stderr or done.stdout).strip()[-600:]}")
        return done

    @property
    def kept(self) -> bool:
        """Whether the folder holds a cluster already (one kept across servers: an
        upgrade in place starts the new release on the old one's databases)."""
        return (self.data_dir / "PG_VERSION").is_file()

    def start(self) -> PostgresCluster:
        """initdb (unless the folder holds a cluster: :attr:`kept`), then the server;
        returns once a connection is answered."""
        if self.kept:
            self._check_kept()
        else:
            self._initdb()
        self.version = (self.data_dir / "PG_VERSION").read_text().strip()
        last = ""
        for _ in range(3):  # a port picked free can be taken before postgres binds it
            self.port = free_port()
            self._launch()
            last = self._wait_ready()
            if not last:
                return self
            self._terminate()
            if "could not bind" not in log_tail(self.log_path, 20):
                break
        tail = log_tail(self.log_path)
        self.stop()
        raise EndpointError(f"the private PostgreSQL cluster did not start: {last}. "
                            f"Log tail:\n{tail}")

    def _initdb(self) -> None:
        self.directory.mkdir(mode=0o700)
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        # trust only on the Unix socket in the private folder; loopback's port (any
        # local user's to reach) asks for a password: a co-tenant logging in as the
        # superuser could run programs as the cluster's user (COPY ... TO PROGRAM)
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data_dir),
                  "--auth-local=trust", "--auth-host=scram-sha-256",
                  "-U", SUPERUSER, "-E", "UTF8", "--locale=C", "--no-sync")

    def _check_kept(self) -> None:
        """A kept cluster must be of the installed major release (PostgreSQL opens no
        other) and stopped (no ``postmaster.pid``: one server per cluster)."""
        major = (self.data_dir / "PG_VERSION").read_text().strip()
        if major != self.bin_dir.parent.name and self.bin_dir.parent.name.isdigit():
            raise EndpointError(
                f"the kept PostgreSQL cluster {self.data_dir} is of PostgreSQL {major}, and "
                f"PostgreSQL {self.bin_dir.parent.name} is installed: it cannot open it. "
                f"Start the old release's server with PostgreSQL {major} installed, or "
                f"begin with a new state folder.")
        if (self.data_dir / "postmaster.pid").exists():
            raise EndpointError(
                f"the kept PostgreSQL cluster {self.data_dir} has a postmaster.pid: a "
                f"server runs on it, or one that ran was killed. Stop that server (or "
                f"remove the file once none runs), then start again.")

    def _launch(self) -> None:
        command = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir),
                   "-p", str(self.port), "-k", str(self.directory)]
        for name, value in SETTINGS.items():
            command += ["-c", f"{name}={value}"]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, cwd=self.directory, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, user=self.user, env={**os.environ, "LC_ALL": "C"})
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.log_path, entry.pw_uid, entry.pw_gid)
        self.watched = ServerProcess("postgres", self.process, (self.log_path,))

    def _wait_ready(self) -> str:
        assert self.process is not None
        isready = str(self.bin_dir / "pg_isready")
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            try:
                code = self.process.wait(timeout=0.2)  # the pause between probes
                return f"postgres exited with code {code}"
            except subprocess.TimeoutExpired:
                pass
            done = subprocess.run([isready, "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                                  capture_output=True, timeout=30)
            if done.returncode == 0:
                return ""
        return f"no connection answered on port {self.port} within {self.startup_timeout:.0f} s"

    def sql(self, statements: str, database: str = "postgres") -> str:
        """Run ``statements`` through psql as the superuser; its output."""
        return self._run(str(self.bin_dir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                         "-h", str(self.directory), "-p", str(self.port), "-U", SUPERUSER,
                         "-d", database, "-At", "-f", "-", sql_input=statements).stdout

    def create_databases(self, owner: str, names: tuple[str, ...]) -> None:
        """A login role ``owner`` with a password of its own (:attr:`password`, a
        registered secret: what the server gives to log in over loopback) and the
        databases it owns."""
        for name in (owner, *names):
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
                raise ValueError(f"not a plain SQL name: {name!r}")
        self.password = secrets.token_urlsafe(18)  # letters, digits, - and _: no quoting
        register_secret(self.password)
        self.sql(f"CREATE ROLE {owner} LOGIN PASSWORD '{self.password}';\n"
                 + "".join(f"CREATE DATABASE {name} OWNER {owner};\n" for name in names))
        self._allow_only(owner, names)

    def _allow_only(self, owner: str, names: tuple[str, ...]) -> None:
        """``pg_hba.conf`` of two rules: the superuser over the Unix socket in the
        private folder, ``owner`` to its own databases over loopback with its password
        (initdb's allowed every role to every database over loopback, and replication);
        returns once the server applies them (a loopback login as the superuser meets
        no rule), never after a sleep."""
        hba = self.data_dir / "pg_hba.conf"
        with open(hba, "w") as stream:  # in place: the cluster's user keeps it, 0600
            stream.write(f"# pytest-storagescale: nothing else may log in\n"
                         f"local all {SUPERUSER} trust\n"
                         f"host {','.join(names)} {owner} 127.0.0.1/32 scram-sha-256\n")
        self.sql("SELECT pg_reload_conf();")
        psql = str(self.bin_dir / "psql")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = subprocess.run(
                [psql, "-X", "-w", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER,
                 "-d", names[0], "-c", "SELECT 1"], capture_output=True, text=True,
                timeout=30, env={**os.environ, "LC_ALL": "C", "PGPASSWORD": ""})
            if "no pg_hba.conf entry" in done.stderr:
                return
            time.sleep(0.1)  # the postmaster reloads on its SIGHUP, in its own time
        raise EndpointError("the private PostgreSQL cluster did not apply its pg_hba.conf "
                            "within 30 s")

    def rotate_password(self, owner: str) -> str:
        """A new password for ``owner`` (a registered secret), and every open session
        of ``owner`` ended: a password that was on a command line (dCache's set-up
        tools pass it as an argument, which ``ps`` shows every local user) logs
        nobody in afterwards, and no session opened with it outlives it."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", owner):
            raise ValueError(f"not a plain SQL name: {owner!r}")
        self.password = secrets.token_urlsafe(18)
        register_secret(self.password)
        self.sql(f"ALTER ROLE {owner} PASSWORD '{self.password}';\n"
                 f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                 f"WHERE usename = '{owner}';\n")
        return self.password

    def rss_bytes(self) -> int:
        """Resident memory of the postmaster and its backends."""
        import psutil

        if self.process is None:
            return 0
        try:
            leader = psutil.Process(self.process.pid)
            return sum(p.memory_info().rss for p in [leader, *leader.children(recursive=True)])
        except psutil.Error:
            return 0

    def _terminate(self) -> None:
        """A fast shutdown (SIGINT), then SIGKILL to its process group."""
        if self.watched is not None:
            self.watched.stopping()
        process = self.process
        if process is None or process.poll() is not None:
            return
        try:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=15)
            return  # it stopped its backends; its pid is reaped: never signal that group
        except subprocess.TimeoutExpired:
            pass
        try:  # not reaped yet: the group's number is still its own
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        """Stop the server (idempotent); the folder is its owner's to remove."""
        self._terminate()
