"""The owner record of a run directory: who made it, its heartbeat, and a proof.

The record is a small JSON file at the top of every run directory
(:data:`~pytest_storagescale.drivers.base.OWNER_FILE`). It says which run made the
directory (run id, host, pid, user), when (``started``, on this host's clock, and
``storage_started``: the owner file's time as the storage reported it when written),
and when the run last said it was alive (``heartbeat``, renewed every
:data:`HEARTBEAT_EVERY` by the live run).

Anyone who can write the test area can write such a file. So the record carries an
HMAC-SHA256 over its content with a key that only this user holds
(:func:`key_path`: ``~/.cache/pytest-storagescale/owner-key``, mode 0600, made on
first use): a record whose proof does not verify is someone else's (a co-tenant's, a
forgery, or a run of another user) and the plugin never deletes in its directory.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import json
import os
import secrets
import socket
import time
from pathlib import Path

from ..drivers.native import cache_dir

#: the live run renews its heartbeat this often (seconds)
HEARTBEAT_EVERY = 300.0
#: a run directory from another host is stale when its heartbeat is older than this
#: (many missed renewals; its start time alone never makes it stale)
HEARTBEAT_STALE_AFTER = 6 * 3600.0
#: the proof's field in the record
PROOF = "hmac"
_KEY_BYTES = 32


def key_path() -> Path:
    """This user's owner-record key (in the user's cache directory)."""
    return cache_dir() / "owner-key"


def _key() -> bytes:
    """The key, made on first use (0600; an existing key with looser modes is not used)."""
    path = key_path()
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # made by a parallel session meanwhile
        return _read_key(path)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(secrets.token_bytes(_KEY_BYTES))
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        info = os.fstat(descriptor)
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise PermissionError(
                f"{path}: the owner-record key must be this user's file with mode 0600 "
                f"(chmod 600 {path}, or remove it to make a new one)")
        return os.read(descriptor, 4096)
    finally:
        os.close(descriptor)


def _digest(record: dict) -> str:
    body = {key: value for key, value in record.items() if key != PROOF}
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(_key(), text, hashlib.sha256).hexdigest()


def signed(record: dict) -> dict:
    """``record`` with its proof; without one when the key cannot be made or read (a
    read-only home, a key with loose modes): the run goes on, and its directory, should
    it be left behind, is named as unprovable, never removed by a later run."""
    try:
        return {**record, PROOF: _digest(record)}
    except OSError:
        return {key: value for key, value in record.items() if key != PROOF}


def verified(record: object) -> bool:
    """Whether ``record`` carries a proof that this user made it."""
    if not isinstance(record, dict) or not isinstance(record.get(PROOF), str):
        return False
    try:
        return hmac.compare_digest(record[PROOF], _digest(record))
    except (OSError, TypeError, ValueError):
        return False


def owner_record(run_id: str, pid: int, started: float,
                 storage_started: float | None = None) -> dict:
    """What the owner file says (unsigned; :func:`signed` adds the proof)."""
    return {"plugin": "pytest-storagescale", "run_id": run_id, "host": socket.gethostname(),
            "pid": pid, "user": getpass.getuser(), "started": started,
            "storage_started": storage_started, "heartbeat": time.time()}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def stale_reason(owner: dict, now: float) -> str | None:
    """Why the run that wrote the (verified) record ``owner`` is over (None: it may
    still run). On this host: its process is gone. On another host: its heartbeat is
    older than :data:`HEARTBEAT_STALE_AFTER` (how long ago it started does not count)."""
    try:
        pid, host = int(owner["pid"]), str(owner["host"])
        heartbeat = float(owner.get("heartbeat") or owner["started"])
    except (KeyError, TypeError, ValueError):
        return None
    if host == socket.gethostname():
        return None if pid_alive(pid) else f"pid {pid} on this host is gone"
    if now - heartbeat > HEARTBEAT_STALE_AFTER:
        return f"no heartbeat for {(now - heartbeat) / 3600:.0f} h from {host}"
    return None
