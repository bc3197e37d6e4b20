"""The embedded dCache's secrets and doors against another local user (issue 31): CI
runs as root, and a co-tenant (here ``nobody``, in a process of its own) must not read
any file of the instance holding a password or a key (the release's compiled
configuration held the database password 19 times, readable by everyone), reach
PostgreSQL's trusted socket, or open a ZooKeeper session (it created and deleted
nodes under /dcache). Uses the session's dCache (``embedded_dcache``)."""

from __future__ import annotations

import json
import os
import pwd
import socket
import struct
import subprocess
import sys

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="acting as another local user needs root")
#: the co-tenant: no server of the run runs as it (xrootd's own user does when it
#: exists; the probes need only a user that is not the run's)
OTHER = "nobody"

#: what the co-tenant runs: every path it is given, opened and searched for the secrets
#: (given on stdin, never printed); prints the paths it could read that hold one
_READER = """
import json, sys
given = json.load(sys.stdin)
found, readable = [], 0
for path in given["paths"]:
    try:
        with open(path, "rb") as stream:
            data = stream.read(64 << 20)
    except OSError:
        continue
    readable += 1
    if any(secret.encode() in data for secret in given["secrets"]):
        found.append(path)
print(json.dumps({"found": found, "readable": readable}))
"""


def _as_other(command: list[str], stdin: str = "", timeout: float = 120
              ) -> subprocess.CompletedProcess:
    user = pwd.getpwnam(OTHER)

    def demote() -> None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    return subprocess.run(command, input=stdin, capture_output=True, text=True, cwd="/",
                          timeout=timeout, preexec_fn=demote,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                               "LC_ALL": "C"})


def _secrets(server) -> list[str]:
    return [secret for secret in (server.database.password, server.password,
                                  getattr(server, "zookeeper_password", ""), "PRIVATE KEY")
            if secret]


@needs_root
def test_no_file_of_the_dcache_that_holds_a_secret_is_readable_by_another_user(
        embedded_dcache):
    """Every file under the instance's folder (the unpacked release, its
    configuration, the JAAS file, the grid-security folder, PostgreSQL's cluster),
    opened as another user: none that holds the database's, ZooKeeper's or the
    door's password, or a private key, can be read."""
    server = embedded_dcache
    secrets = _secrets(server)
    assert len(secrets) >= 3, "the dCache has no database or door password"
    paths, holding = [], []
    for parent, _, files in os.walk(server.directory):
        for name in files:
            path = os.path.join(parent, name)
            if not os.path.isfile(path) or os.path.islink(path):
                continue
            paths.append(path)
            with open(path, "rb") as stream:
                data = stream.read(64 << 20)
            if any(secret.encode() in data for secret in secrets):
                holding.append(os.path.relpath(path, server.directory))
    # the files known to hold one are there (the check reads what it means to read)
    conf = os.path.relpath(server.home / "etc" / "dcache.conf", server.directory)
    assert {conf, "grid-security/hostkey.pem"} <= set(holding), holding

    done = _as_other([sys.executable, "-I", "-c", _READER],
                     stdin=json.dumps({"paths": paths, "secrets": secrets}))
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout)
    assert answer["found"] == [], answer["found"]
    # the check could read: the CA's certificates are meant for everyone
    assert answer["readable"] > 0
    # no compiled copy of the configuration (it held the password 19 times)
    assert not (server.home / "var" / "config" / "cache").exists()


@needs_root
def test_another_user_cannot_reach_postgres_trusted_socket(embedded_dcache):
    """The cluster's superuser logs in without a password only over the Unix socket
    in its 0700 folder; loopback asks every role for a password (scram)."""
    server = embedded_dcache
    database = server.database
    psql = str(database.bin_dir / "psql")
    done = _as_other([psql, "-X", "-w", "-h", str(database.directory), "-p",
                      str(database.port), "-U", "postgres", "-d", "chimera", "-c", "SELECT 1"])
    assert done.returncode != 0 and "Permission denied" in done.stderr, done.stderr
    done = _as_other([psql, "-X", "-w", "-h", "127.0.0.1", "-p", str(database.port),
                      "-U", "dcache", "-d", "chimera", "-c", "SELECT 1"])
    assert done.returncode != 0 and "password" in done.stderr, done.stderr
    hba = (database.data_dir / "pg_hba.conf").read_text()
    rules = [line.split() for line in hba.splitlines() if line.strip()
             and not line.lstrip().startswith("#")]
    assert all(rule[-1] == "scram-sha-256" for rule in rules if rule[0] == "host"), rules


# -- ZooKeeper: its wire protocol (jute), a session and one create ---------------------------
def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">i", len(data)) + data


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError("closed by the server")
            data += chunk
        return data
    (length,) = struct.unpack(">i", exactly(4))
    if not 0 <= length <= 1 << 20:
        raise ConnectionError(f"a frame of {length} bytes")
    return exactly(length)


def zookeeper_create(port: int, path: str) -> str:
    """``created``, or why not (the session refused, closed, or an error code): a
    ZooKeeper client's first two requests, as the ZooKeeper Java client sends them."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        connect = (struct.pack(">iqiq", 0, 0, 30000, 0) + struct.pack(">i", 16) + bytes(16)
                   + b"\0")
        sock.sendall(_frame(connect))
        try:
            answer = _read_frame(sock)
        except (ConnectionError, OSError) as exc:
            return f"no session: {exc}"
        _, _, session = struct.unpack(">iiq", answer[:16])
        if session == 0:
            return "no session: refused"
        create = (struct.pack(">ii", 1, 1) + _string(path) + struct.pack(">i", 5) + b"probe"
                  + struct.pack(">ii", 1, 31) + _string("world") + _string("anyone")
                  + struct.pack(">i", 0))
        sock.sendall(_frame(create))
        try:
            reply = _read_frame(sock)
        except (ConnectionError, OSError) as exc:
            return f"closed: {exc}"
        _, _, error = struct.unpack(">iqi", reply[:16])
        return "created" if error == 0 else f"error {error}"


@needs_root
def test_another_user_opens_no_zookeeper_session(embedded_dcache):
    """The embedded ZooKeeper listens on loopback (any local user reaches it) and
    takes only sessions that logged in with SASL: another user's create under /dcache
    is refused (it was accepted: the nodes had the open ACL, world:anyone cdrwa)."""
    port = embedded_dcache.ports["zookeeper"]
    probe = (f"import socket, struct\n{_source(_string)}\n{_source(_frame)}\n"
             f"{_source(_read_frame)}\n{_source(zookeeper_create)}\n"
             f"print(zookeeper_create({port}, '/dcache/storagescale-probe-{os.getpid()}'))\n")
    done = _as_other([sys.executable, "-I", "-c", probe])
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = done.stdout.strip()
    assert outcome != "created" and outcome, outcome
    # -124: SESSIONCLOSEDREQUIRESASLAUTH, or the session closed before it answered
    assert outcome.startswith(("error -124", "closed", "no session")), outcome


def _source(function) -> str:
    import inspect

    return inspect.getsource(function)


@needs_root
def test_the_jvms_temporary_files_are_in_the_runs_folder(embedded_dcache):
    """The SRM door's Jetty folder (``java.io.tmpdir``) is made in the run's folder, so
    it goes with it, after a kill too (the orphan reaper removes the folder): it stayed
    in /tmp after every killed dCache."""
    import psutil

    tmp = embedded_dcache.directory / "tmp"
    domain = psutil.Process(embedded_dcache.process.pid)  # run-domain.sh execs the JVM
    assert f"-Djava.io.tmpdir={tmp}" in domain.cmdline(), domain.cmdline()
    assert any(entry.name.startswith("jetty") for entry in tmp.iterdir()), list(tmp.iterdir())
