"""The private PostgreSQL cluster of an embedded server (servers/postgres.py) on a
shared host: its loopback port is any local user's to reach, so a connection there
needs the server's role's password; the superuser (who could run programs as the
cluster's user with COPY ... TO PROGRAM) logs in only over the Unix socket in the
private folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from pytest_storagescale.redact import redact_text
from pytest_storagescale.servers.postgres import PostgresCluster, postgres_bin_dir

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    if postgres_bin_dir() is None:
        pytest.skip("PostgreSQL is not installed (scripts/bootstrap.sh installs postgresql)")
    parent = Path(tempfile.mkdtemp(prefix="storagescale-pgtest-"))
    parent.chmod(0o711)  # the cluster's user (postgres, when root) goes through
    database = PostgresCluster(parent / "postgres").start()
    try:
        database.create_databases("dcache", ("chimera",))
        yield database
    finally:
        database.stop()
        shutil.rmtree(parent, ignore_errors=True)


def _psql(database: PostgresCluster, user: str, password: str = "",
          name: str = "chimera") -> subprocess.CompletedProcess:
    """A client over loopback's TCP port, as another local user's would connect."""
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("PG")}
    if password:
        environment["PGPASSWORD"] = password
    return subprocess.run(
        [str(database.bin_dir / "psql"), "-X", "-w", "-h", "127.0.0.1", "-p",
         str(database.port), "-U", user, "-d", name, "-At", "-c", "SELECT 1"],
        capture_output=True, text=True, timeout=30, env=environment)


def test_a_co_tenant_cannot_log_in_over_loopback(cluster):
    done = _psql(cluster, "dcache")
    assert done.returncode != 0 and "password" in done.stderr, done.stderr
    done = _psql(cluster, "postgres", "wrong")
    assert done.returncode != 0 and "no pg_hba.conf entry" in done.stderr, done.stderr


def test_only_the_servers_role_to_its_own_databases_over_loopback(cluster):
    """Issue 31: initdb's rules let any role with a password reach any database over
    loopback; now only the server's role, to its own databases (another role with a
    password, the role to the 'postgres' database: no rule)."""
    cluster.sql("CREATE ROLE other LOGIN PASSWORD 'other-secret';")
    try:
        done = _psql(cluster, "other", "other-secret")
        assert done.returncode != 0 and "no pg_hba.conf entry" in done.stderr, done.stderr
        done = _psql(cluster, "dcache", cluster.password, name="postgres")
        assert done.returncode != 0 and "no pg_hba.conf entry" in done.stderr, done.stderr
    finally:
        cluster.sql("DROP ROLE other;")


def test_the_servers_role_logs_in_with_its_password_never_printed(cluster):
    done = _psql(cluster, "dcache", cluster.password)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr
    assert cluster.password not in redact_text(f"dcache.db.password={cluster.password}")
    assert cluster.sql("SELECT 2", database="chimera").strip() == "2"  # the socket


def test_a_rotated_password_logs_nobody_in_and_ends_the_old_sessions(cluster):
    """dCache's set-up tools show the password on their command lines: after the set-up
    the role gets a new one, and a session opened with the old one is ended."""
    old = cluster.password
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("PG")}
    environment["PGPASSWORD"] = old
    holder = subprocess.Popen(  # a co-tenant's session opened with the leaked password
        [str(cluster.bin_dir / "psql"), "-X", "-w", "-h", "127.0.0.1", "-p",
         str(cluster.port), "-U", "dcache", "-d", "chimera", "-At", "-c", "SELECT pg_sleep(60)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    try:
        for _ in range(300):  # until its session is there (not a timing assertion)
            if cluster.sql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'dcache';",
                           ).strip() not in ("", "0"):
                break
            time.sleep(0.1)
        new = cluster.rotate_password("dcache")
        assert new != old
        _, stderr = holder.communicate(timeout=30)
        assert holder.returncode != 0 and "terminat" in stderr, stderr
    finally:
        if holder.poll() is None:
            holder.kill()
    assert _psql(cluster, "dcache", old).returncode != 0
    done = _psql(cluster, "dcache", new)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr
