"""The tape behind the embedded dCache: a tape library as a folder of the run
(:mod:`.tape_hsm`, run by dCache's ``script`` nearline-storage provider on both pools),
the configuration it needs, and what the tests and the suite ask of it.

What a :class:`TapeLibrary` adds to an :class:`~.dcache.EmbeddedDCache`:

- each pool's ``setup`` file: ``hsm create osm osm script -command=<run>/tape/hsm-tape
  -hsmBase=<run>/tape ...`` (the drives, mount time, per-file delay and idle dismount
  of the library as the script's options, ``-c:puts``/``-c:gets`` the drives), and the
  flush queue of the tape's storage class (``queue define class osm storagescale:tape
  -expire -pending -total``: seed 004's central-flushing triggers ``max.minutes``,
  ``max.files``, ``max.megabytes``);
- a PoolManager setup (``var/config/poolmanager.conf``) with both pools in one group
  that may stage (``pm set default -stage-allowed=yes``);
- the tape-backed directory ``/storagescale/tape`` (tags ``sGroup tape``,
  ``RetentionPolicy CUSTODIAL``, ``AccessLatency NEARLINE``): a file written there is
  precious on its pool until the flush, then cached (``ONLINE_AND_NEARLINE``);
- the services: ``frontend`` (HTTPS, the user's password, proxy or a bearer token: a
  macaroon, or a WLCG-profile JWT of the loopback issuer, :mod:`.oidc_issuer`: the
  namespace's locality and the WLCG Tape REST API ``/api/v1/tape``), ``bulk`` (what serves the
  Tape REST API's requests; its database ``bulk``), ``cleaner-hsm`` (a deleted file's
  tape copy is removed through the script), and ``admin`` (ssh, public key only: the
  run's own key in the run's folder, to evict a replica from a pool:
  ``rep rm -force``).

Everything is in the run's folder (``<run>/tape``: the volumes' files, the drives'
locks and state, the log), removed with it at stop.
"""

from __future__ import annotations

import json
import shlex
import shutil
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..errors import EndpointError
from .oidc_issuer import IssuerAccess

#: the HSM's type and instance (the URIs the script prints: ``osm://osm/?...``)
HSM = "osm"
#: the tape-backed directory's name under the test area, and its storage group
FOLDER, GROUP = "tape", "tape"
#: the store of the tape's storage class (``<store>:<group>@osm``: the test area's)
STORE = "storagescale"
#: how long a pool holds its flush timer after it starts (s): dCache's
#: HsmFlushController schedules its first flush ``_holdUntil = now + 5 minutes`` after
#: the pool's start (10.2.25 and 11.2.5; no command or property changes it;
#: ``flush set interval`` reschedules with the hold still in force): the first flush
#: after a start waited 206-293 s here until :class:`HoldBridge` asked for it
HOLD_S = 300.0
#: how often a pool looks at its flush queues (s): ``flush set interval`` in its setup
FLUSH_INTERVAL_S = 1
#: the services a tape needs beside the embedded dCache's own
SERVICES = ("frontend", "bulk", "cleaner-hsm", "admin")
#: the database of the bulk service (the Tape REST API's requests)
DATABASE = "bulk"
#: the longest the first use of the admin door waits for it to come up (s)
ADMIN_WAIT_S = 600.0
#: what a bearer token for the Tape REST API may do (dCache's macaroon activities;
#: ``STAGE`` is staging, the rest the namespace's reads the suite polls with)
TOKEN_ACTIVITIES = ("LIST", "READ_METADATA", "STAGE")
#: the WLCG-profile scope of the Tape REST API's JWT login (:meth:`TapeAccess.mint_jwt`):
#: ``storage.stage`` (the profile's "read, potentially staging from tape": dCache's
#: LIST, READ_METADATA, DOWNLOAD and STAGE) of the tape-backed directory, a path under
#: the issuer's ``-prefix`` (the test area, servers/dcache.py)
JWT_SCOPE = f"storage.stage:/{FOLDER}"
#: dCache's error code of a stage whose tape copy is gone (``CacheException``'s
#: ``BROKEN_ON_TAPE``: "File is broken on a tape, can't be staged"): the library's
#: ``lost`` fault and a copy it does not hold exit with it (:data:`.tape_hsm.LOST_RC`)
BROKEN_ON_TAPE = 243
#: localities of a file (the frontend's ``fileLocality``, the Tape REST API's)
ON_TAPE = frozenset({"NEARLINE", "ONLINE_AND_NEARLINE"})
ON_DISK = frozenset({"ONLINE", "ONLINE_AND_NEARLINE"})


@dataclass(frozen=True)
class TapeLibrary:
    """A tape library as a folder: its drives, and the pools' flush triggers."""

    #: drives shared by both pools (a request waits for a free one)
    drives: int = 2
    #: seconds to mount a volume on a drive that holds another one or sat idle
    mount_s: float = 1.0
    #: seconds of positioning per file (before the copy)
    per_file_s: float = 0.1
    #: a drive idle this long dismounts (the next request mounts again)
    dismount_s: float = 30.0
    #: flush a storage class's queue when its oldest file is this old (s; seed 004:
    #: max.minutes=10)
    flush_after_s: int = 1
    #: ... or when it holds more files than this (seed 004: max.files=10)
    flush_files: int = 10
    #: ... or more bytes than this (seed 004: max.megabytes=200)
    flush_bytes: int = 200_000_000

    def __post_init__(self) -> None:
        if self.drives < 1 or self.drives > 64:
            raise ValueError(f"a tape library of {self.drives} drives: give 1 to 64")
        for name in ("mount_s", "per_file_s", "dismount_s"):
            value = getattr(self, name)
            if not 0 <= value <= 3600:
                raise ValueError(f"tape library {name}={value}: give 0 to 3600 seconds")
        if self.flush_after_s < 0 or self.flush_files < 0 or self.flush_bytes < 0:
            raise ValueError("tape library flush triggers must not be negative")

    @property
    def flush_delay_s(self) -> float:
        """The longest a written file waits before its flush reaches the library (s):
        its queue's ``-expire``, then the pool's next look at its queues, then a
        volume's mount."""
        return self.flush_after_s + FLUSH_INTERVAL_S + self.mount_s

    def describe(self) -> str:
        return (f"tape library of {self.drives} drive{'s' if self.drives > 1 else ''} "
                f"(mount {self.mount_s:g} s, {self.per_file_s:g} s a file)")


def area(test_area: str) -> str:
    """The tape-backed directory of the test area."""
    return f"{test_area}/{FOLDER}"


def chimera_lines(test_area: str, uid: int, gid: int) -> list[str]:
    """``bin/chimera`` commands making the tape-backed directory (its own storage
    group, custodial and nearline)."""
    folder = area(test_area)
    return [f"mkdir {folder}", f"chown {uid}:{gid} {folder}", f"chmod 777 {folder}",
            f'writetag {folder} sGroup "{GROUP}"',
            f"writetag {folder} RetentionPolicy CUSTODIAL",
            f"writetag {folder} AccessLatency NEARLINE"]


def conf_lines() -> list[str]:
    """``dcache.conf`` lines: staging by every door's user (the xrootd door's anonymous
    user included: the unix login)."""
    return ["dcache.authz.anonymous-staging=true"]


def layout_lines(domain: str, ports: dict[str, int], folder: Path) -> list[str]:
    """The services' sections of the layout."""
    return [
        f"[{domain}/cleaner-hsm]",
        f"[{domain}/bulk]",
        f"[{domain}/frontend]", f"frontend.net.port={ports['frontend']}",
        "frontend.authn.protocol=https", "frontend.authn.basic=true",
        f"[{domain}/admin]", f"admin.net.port={ports['admin']}",
        "admin.ssh.authn.enabled=publickey",
        f"admin.paths.host-keys={folder / 'admin' / 'ssh_host_rsa_key'}",
        f"admin.paths.authorized-keys={folder / 'admin' / 'authorized_keys2'}",
        "admin.paths.history=",
    ]


def poolmanager_conf(pools: tuple[str, ...]) -> str:
    """Both pools in one group, one link for every store, staging allowed."""
    lines = ["psu set regex off", "psu set allpoolsactive off",
             "psu create unit -protocol */*", "psu create unit -net 0.0.0.0/0.0.0.0",
             "psu create unit -net ::/0", "psu create unit -store *@*",
             "psu create ugroup any-store", "psu addto ugroup any-store *@*",
             "psu create ugroup world-net", "psu addto ugroup world-net 0.0.0.0/0.0.0.0",
             "psu addto ugroup world-net ::/0", "psu create ugroup any-protocol",
             "psu addto ugroup any-protocol */*",
             *(f"psu create pool {pool}" for pool in pools),
             "psu create pgroup default",
             *(f"psu addto pgroup default {pool}" for pool in pools),
             "psu create link default-link any-store world-net any-protocol",
             "psu set link default-link -readpref=10 -writepref=10 -cachepref=10 -p2ppref=10",
             "psu addto link default-link default",
             "rc onerror fail", "rc set max retries 3", "rc set retry 5",
             "rc set max restore unlimited",
             "pm create -type=wass default", "pm set default -stage-allowed=yes", ""]
    return "\n".join(lines)


def pool_setup(library: TapeLibrary, folder: Path, store: str) -> str:
    """A pool's ``setup`` file: the HSM through the script, the tape class's flush queue."""
    options = (f"-command={folder / 'hsm-tape'} -hsmBase={folder} -hsmType={HSM} "
               f"-hsmInstance={HSM} -drives={library.drives} -mount={library.mount_s:g} "
               f"-perFile={library.per_file_s:g} -dismount={library.dismount_s:g} "
               f"-c:puts={library.drives} -c:gets={library.drives} -c:removes=1")
    return "\n".join([
        f"hsm create {HSM} {HSM} script {options}",
        f"queue define class {HSM} {store}:{GROUP} -expire={library.flush_after_s} "
        f"-pending={library.flush_files} -total={library.flush_bytes}",
        f"flush set interval {FLUSH_INTERVAL_S}", "flush set retry delay 10",
        "flush set max active 100", "rh set timeout 3600", "st set timeout 3600",
        "rm set timeout 3600", ""])


def prepare(folder: Path) -> None:
    """The library's folder (``<run>/tape``), the wrapper dCache runs (the session's
    python, isolated, on the shipped script), and the admin door's keys (the host key
    and the run's own client key, the only one it takes)."""
    folder.mkdir(mode=0o700)  # the library is the run's alone (its files 0600: umask 077)
    (folder / "data").mkdir(mode=0o700)
    (folder / "drives").mkdir(mode=0o700)
    script = Path(__file__).with_name("tape_hsm.py")
    wrapper = folder / "hsm-tape"
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I "
                       f"{shlex.quote(str(script))} \"$@\"\n")
    wrapper.chmod(0o700)
    admin = folder / "admin"
    admin.mkdir(mode=0o700)
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        raise EndpointError("the embedded dCache's tape needs ssh-keygen and ssh (its admin "
                            "door evicts replicas): 'sudo apt-get install openssh-client'.")
    for name in ("ssh_host_rsa_key", "client_key"):
        subprocess.run([keygen, "-q", "-t", "rsa", "-b", "2048", "-N", "", "-m", "PEM",
                        "-f", str(admin / name)], check=True, capture_output=True, timeout=120)
    public = (admin / "client_key.pub").read_text().split()
    (admin / "authorized_keys2").write_text(f"{public[0]} {public[1]} admin@localhost\n")


def log_records(folder: Path) -> list[dict[str, Any]]:
    """The library's log: one record per flush (``put``) or stage (``get``)."""
    try:
        lines = (folder / "tape.log").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


@dataclass(frozen=True)
class TapeAccess:
    """How to reach a running embedded dCache's tape (picklable: a load step's
    operations get it through their step context): the frontend, the admin door, the
    pools' and the library's folders."""

    area: str
    user: str
    password: str
    ca_dir: str
    frontend_port: int
    admin_port: int
    admin_key: str
    pools: str
    library: str
    srm_url: str
    xrootd_url: str
    driver_options: tuple[tuple[str, str], ...] = ()
    #: the doors' URLs by scheme (``davs``, ``root``, ``srm``...)
    doors: tuple[tuple[str, str], ...] = ()
    #: dCache's billing folder (``var/billing``: its records of every stage, failed
    #: ones with their error code; "" unknown)
    billing: str = ""
    #: the outside token issuer the server trusts (its gPlazma ``oidc`` plugin, WLCG
    #: profile: :mod:`.oidc_issuer`); None: the server trusts none
    oidc: IssuerAccess | None = None

    @classmethod
    def of(cls, server: Any, root: str, user: str) -> TapeAccess:
        """What reaches ``server``'s tape; ``root`` and ``user``: its area and login (given
        by servers/dcache.py, which this module must not import: a circle)."""
        folder = server.directory / "tape"
        return cls(area=area(root), user=user, password=server.password,
                   ca_dir=server.ca_dir, frontend_port=server.ports["frontend"],
                   admin_port=server.ports["admin"],
                   admin_key=str(folder / "admin" / "client_key"),
                   pools=str(server.directory / "pools"), library=str(folder),
                   srm_url=server.url_for("srm"), xrootd_url=server.url_for("root"),
                   driver_options=tuple(server.driver_options().items()),
                   doors=tuple((scheme, server.url_for(scheme)) for scheme in server.schemes),
                   billing=str(server.home / "var" / "billing") if server.home else "",
                   oidc=getattr(server, "oidc_access", None))

    def __repr__(self) -> str:  # never the password
        return f"TapeAccess(area={self.area!r}, frontend_port={self.frontend_port})"

    def control(self, token: str | None = None, *, x509: bool = False) -> TapeControl:
        """What the tests and the suite ask of the tape; ``token``: the frontend
        (namespace, Tape REST API) is asked with ``Authorization: Bearer <token>``
        instead of the user's password; ``x509``: with the session user's X.509 proxy
        as the TLS client certificate, no password."""
        return TapeControl(self, token, x509=x509)

    @property
    def x509_proxy(self) -> str:
        """The session user's proxy (the SRM door's login; '' when there is none)."""
        return dict(self.driver_options).get("x509_proxy", "")

    def mint_jwt(self, scope: str = JWT_SCOPE, **claims: Any) -> str:
        """A bearer token for the frontend from the outside issuer the server trusts: a
        WLCG-profile JWT (:meth:`.oidc_issuer.IssuerAccess.mint`; ``scope`` paths under
        the test area, :data:`JWT_SCOPE` by default; ``lifetime=``, ``audience=``,
        ``subject=``, ``key="other"`` make the tokens dCache must refuse), checked by
        dCache's gPlazma ``oidc`` plugin against the issuer's published keys."""
        if self.oidc is None:
            raise EndpointError("this embedded dCache trusts no token issuer "
                                "(EmbeddedDCache(oidc_issuer=True), with a tape)")
        return self.oidc.mint(scope, **claims)

    def mint_token(self, validity: str = "PT1H",
                   activities: tuple[str, ...] = TOKEN_ACTIVITIES,
                   timeout: float = 60) -> str:
        """A bearer token for the frontend: a macaroon the WebDAV door mints for the
        user (``POST /`` with ``Content-Type: application/macaroon-request``, the
        user's password; dCache's own tokens, verified by every door and the frontend
        with the secret they share through ZooKeeper), limited to ``activities``
        (``STAGE`` is the Tape REST API's) and ``validity`` (ISO 8601)."""
        import base64
        import http.client
        from urllib.parse import urlsplit

        door = urlsplit(dict(self.doors)["davs"])
        context = ssl.create_default_context(capath=self.ca_dir)
        connection = http.client.HTTPSConnection(door.hostname or "localhost", door.port,
                                                 context=context, timeout=timeout)
        secret = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        body = json.dumps({"caveats": [f"activity:{','.join(activities)}"],
                           "validity": validity})
        try:
            connection.request("POST", "/", body=body, headers={
                "Authorization": f"Basic {secret}",
                "Content-Type": "application/macaroon-request"})
            response = connection.getresponse()
            raw = response.read(1 << 20)
        finally:
            connection.close()
        try:
            token = json.loads(raw).get("macaroon") if response.status == 200 else None
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise EndpointError(f"the WebDAV door answered the macaroon request with "
                                f"{response.status}: {raw[:200]!r}")
        from ..redact import register_secret

        register_secret(token)  # never shown, in any output
        return token

    def client(self, scheme: str = "davs", driver: str | None = None, name: str = "tape",
               timeout: float = 60) -> Any:
        """A client of the door ``scheme`` that may write in the tape-backed directory
        (and nowhere else)."""
        from ..drivers.registry import driver_spec

        options = {key: value for key, value in self.driver_options
                   if not (key == "security_protocol" and scheme in ("davs", "https"))}
        return driver_spec(self.door_url(scheme), driver=driver or "auto", options=options,
                           writable_root=self.area).connect(name, timeout=timeout)

    def door_url(self, scheme: str) -> str:
        """The URL of the door ``scheme`` names: a door's name (``dcap``) or its URL's
        scheme (``gsidcap``: a load step over the dcap door asks by its driver's)."""
        urls = dict(self.doors)
        urls.update({url.partition("://")[0]: url for name, url in self.doors
                     if url.partition("://")[0] not in urls})
        if scheme not in urls:
            raise EndpointError(f"the embedded dCache has no {scheme} door "
                                f"(doors: {', '.join(name for name, _ in self.doors)})")
        return urls[scheme]


class TapeControl:
    """What the tests and the suite ask of the tape of a running embedded dCache."""

    #: the restore error code of a file lost on tape (the suite reads it here: this
    #: module is not the plugin's public API)
    broken_on_tape = BROKEN_ON_TAPE

    def __init__(self, access: TapeAccess, token: str | None = None, *,
                 x509: bool = False) -> None:
        self.access = access
        self.folder = Path(access.library)
        self.area = access.area
        #: the frontend's login: a bearer token, the X.509 proxy, else the user's password
        self.token = token
        self.x509 = x509
        if x509 and (token or not access.x509_proxy):
            raise EndpointError("an X.509 login to the frontend needs the session's proxy "
                                "(the embedded dCache's x509_proxy) and no token")

    @property
    def login(self) -> str:
        return "token" if self.token else "x509" if self.x509 else "password"

    def __repr__(self) -> str:  # never the password nor the token
        return f"TapeControl(area={self.area!r}, login={self.login})"

    # -- the admin door -----------------------------------------------------------------
    def admin(self, command: str, timeout: float = 60) -> str:
        """One admin shell command (``\\s pool1 rep ls``) through the ssh door;
        several, one a line, are sent as the session's input."""
        ssh = shutil.which("ssh")
        if ssh is None:
            raise EndpointError("ssh is not on PATH: 'sudo apt-get install openssh-client'")
        self._wait_for_admin(timeout)
        done = subprocess.run(
            [*self.ssh_argv(ssh), *(() if "\n" in command else (command,))],
            capture_output=True, text=True, timeout=timeout,
            input=command + "\n" if "\n" in command else "")
        if done.returncode != 0:
            raise EndpointError(f"the admin door answered {command!r} with exit "
                                f"{done.returncode}: {(done.stderr + done.stdout).strip()[-300:]}")
        return done.stdout

    def ssh_argv(self, ssh: str) -> list[str]:
        """ssh to the admin door with the run's key (no other key, no config, no
        known-hosts file: the door's host key is the run's own)."""
        return [ssh, "-p", str(self.access.admin_port), "-i", self.access.admin_key,
                "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR", "admin@127.0.0.1"]

    def _wait_for_admin(self, timeout: float) -> None:
        """Until the admin door takes connections (it comes up last: the start does not
        wait for it), at most ``max(timeout, ADMIN_WAIT_S)`` seconds."""
        import socket

        deadline = time.monotonic() + max(timeout, ADMIN_WAIT_S)
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.access.admin_port), timeout=10).close()
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise EndpointError(f"the embedded dCache's admin door (127.0.0.1:"
                                        f"{self.access.admin_port}) did not come up: "
                                        f"{exc}") from None
                time.sleep(1)

    # -- the frontend ---------------------------------------------------------------------
    def rest(self, method: str, path: str, body: Any = None, timeout: float = 60
             ) -> tuple[int, Any, dict[str, str]]:
        """A request to the frontend (HTTPS; the bearer token, the X.509 proxy as the
        client certificate, else the user's password): status, JSON, headers."""
        import base64
        import http.client

        context = ssl.create_default_context(capath=self.access.ca_dir)
        headers = {"Accept": "application/json"}
        if self.x509:  # the proxy file: its certificate, its key, the user's certificate
            context.load_cert_chain(self.access.x509_proxy)
        elif self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        else:
            secret = base64.b64encode(f"{self.access.user}:{self.access.password}".encode())
            headers["Authorization"] = f"Basic {secret.decode()}"
        connection = http.client.HTTPSConnection("localhost", self.access.frontend_port,
                                                 context=context, timeout=timeout)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read(16 << 20)
        finally:
            connection.close()
        try:
            parsed = json.loads(raw) if raw.strip() else None
        except ValueError:
            parsed = raw.decode(errors="replace")[:500]
        return response.status, parsed, {key.lower(): value
                                         for key, value in response.getheaders()}

    def attributes(self, path: str) -> dict[str, Any]:
        """The namespace's attributes of ``path`` with its locality."""
        status, answer, _ = self.rest("GET", f"/api/v1/namespace{quote(path)}?locality=true")
        if status != 200 or not isinstance(answer, dict):
            raise EndpointError(f"the frontend answered GET namespace {path} with {status}: "
                                f"{str(answer)[:300]}")
        return answer

    def locality(self, path: str) -> str:
        return str(self.attributes(path).get("fileLocality", ""))

    def wait_locality(self, path: str, wanted: frozenset[str], timeout: float) -> float:
        """Seconds until ``path``'s locality is one of ``wanted`` (an EndpointError
        naming the last one seen after ``timeout``)."""
        began = time.monotonic()
        seen = ""
        while time.monotonic() - began < timeout:
            seen = self.locality(path)
            if seen in wanted:
                return time.monotonic() - began
            time.sleep(0.2)
        raise EndpointError(f"{path}: locality {seen or 'unknown'} after {timeout:.0f} s, "
                            f"not {' or '.join(sorted(wanted))}")

    # -- the pools' disks ------------------------------------------------------------------
    def replicas(self, pnfsid: str) -> list[Path]:
        """The replica files of ``pnfsid`` in the pools' data folders."""
        pools = Path(self.access.pools)
        return sorted(path for path in pools.glob(f"*/data/{pnfsid}") if path.is_file())

    def evict(self, path: str, timeout: float = 60) -> str:
        """Remove ``path``'s replicas from the pools' disks (once it is on tape):
        ``rep rm -force`` through the admin door; returns its pnfsid once no pool
        folder holds the file and its locality says NEARLINE."""
        attributes = self.attributes(path)
        pnfsid, locality = str(attributes.get("pnfsId", "")), attributes.get("fileLocality")
        if locality not in ON_TAPE:
            raise EndpointError(f"{path} is {locality}, not on tape: evicting it would lose it")
        for replica in self.replicas(pnfsid):
            self.admin(f"\\s {replica.parent.parent.name} rep rm -force {pnfsid}")
        began = time.monotonic()
        while self.replicas(pnfsid) or self.locality(path) != "NEARLINE":
            if time.monotonic() - began > timeout:
                raise EndpointError(f"{path} ({pnfsid}) still on a pool's disk after "
                                    f"{timeout:.0f} s: {self.replicas(pnfsid)}")
            time.sleep(0.2)
        return pnfsid

    # -- the stage interfaces ---------------------------------------------------------
    def stage_tape_rest(self, paths: list[str], lifetime: str = "PT1H"
                        ) -> str:
        """``POST /api/v1/tape/stage``: the request's id."""
        status, answer, headers = self.rest(
            "POST", "/api/v1/tape/stage",
            {"files": [{"path": path, "diskLifetime": lifetime} for path in paths]})
        if status not in (200, 201) or not isinstance(answer, dict) or "requestId" not in answer:
            raise StageRefused(f"POST /api/v1/tape/stage answered {status}: {str(answer)[:300]}")
        return str(answer["requestId"])


    def poll_tape_rest(self, request_id: str) -> dict[str, str]:
        """``GET /api/v1/tape/stage/<id>``: path -> state (``COMPLETED``, ``FAILED``...)."""
        return {path: entry["state"] for path, entry in self.tape_rest_files(request_id).items()}

    def tape_rest_files(self, request_id: str) -> dict[str, dict[str, str]]:
        """``GET /api/v1/tape/stage/<id>``: path -> ``{"state": ..., "error": ...}``
        (the error dCache gives a file that ``FAILED``; "" for none)."""
        status, answer, _ = self.rest("GET", f"/api/v1/tape/stage/{quote(request_id)}")
        if status != 200 or not isinstance(answer, dict):
            raise EndpointError(f"GET /api/v1/tape/stage/{request_id} answered {status}: "
                                f"{str(answer)[:300]}")
        return {str(entry.get("path")): {"state": str(entry.get("state", "")),
                                         "error": str(entry.get("error") or "")}
                for entry in answer.get("files", []) if isinstance(entry, dict)}

    def cancel_tape_rest(self, request_id: str, paths: list[str]) -> int:
        """``POST /api/v1/tape/stage/<id>/cancel``: the status (dCache unpins the files,
        and its PinManager stops asking for their restore)."""
        status, _, _ = self.rest("POST", f"/api/v1/tape/stage/{quote(request_id)}/cancel",
                                 {"paths": paths})
        return status

    def release_tape_rest(self, request_id: str, paths: list[str]) -> int:
        """``POST /api/v1/tape/release/<id>``: the status."""
        status, _, _ = self.rest("POST", f"/api/v1/tape/release/{quote(request_id)}",
                                 {"paths": paths})
        return status

    def restore_watch(self) -> RestoreWatch:
        """The stages from tape that dCache's billing records as failed from now on
        (:class:`RestoreWatch`)."""
        return RestoreWatch(self.access.billing)


    def archiveinfo(self, paths: list[str]) -> dict[str, str]:
        """``POST /api/v1/tape/archiveinfo``: path -> locality (or the error it names)."""
        status, answer, _ = self.rest("POST", "/api/v1/tape/archiveinfo", {"paths": paths})
        if status != 200 or not isinstance(answer, list):
            raise EndpointError(f"POST /api/v1/tape/archiveinfo answered {status}: "
                                f"{str(answer)[:300]}")
        return {str(entry.get("path")): str(entry.get("locality") or entry.get("error", ""))
                for entry in answer}


    def prepare_xrootd(self, paths: list[str], timeout: float = 60) -> str:
        """``xrdfs <door> prepare -s <paths>``: the request id it prints; StageRefused
        with the door's answer when it refuses (dCache 11.2: ``[3013] Request 3021 not
        supported``)."""
        xrdfs = shutil.which("xrdfs")
        if xrdfs is None:
            raise EndpointError("xrdfs (XRootD's client) is not on PATH: install xrootd-client")
        url = self.access.xrootd_url.rsplit("//", 1)[0]
        done = subprocess.run([xrdfs, url, "prepare", "-s", *paths], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        said = " ".join((done.stdout + done.stderr).replace("\0", " ").split())
        if done.returncode != 0:
            raise StageRefused(f"xrdfs prepare -s answered {said!r} (exit {done.returncode})")
        return said

    def srm_stager(self, timeout: float = 60) -> SRMStager:
        """SRM bringOnline through gfal2 (its driver sets this process's credentials)."""
        return SRMStager(self.access, timeout)

    def evict_many(self, paths: list[str], timeout: float = 600) -> list[str]:
        """:meth:`evict` of many files with one admin session: their pnfsids."""
        found = {}
        for path in paths:
            attributes = self.attributes(path)
            if attributes.get("fileLocality") not in ON_TAPE:
                raise EndpointError(f"{path} is {attributes.get('fileLocality')}, not on "
                                    f"tape: evicting it would lose it")
            found[path] = str(attributes.get("pnfsId", ""))
        commands = [f"\\s {replica.parent.parent.name} rep rm -force {pnfsid}"
                    for pnfsid in found.values() for replica in self.replicas(pnfsid)]
        if commands:
            self.admin("\n".join(commands), timeout=timeout)
        began = time.monotonic()
        for path, pnfsid in found.items():
            while self.replicas(pnfsid) or self.locality(path) != "NEARLINE":
                if time.monotonic() - began > timeout:
                    raise EndpointError(f"{path} ({pnfsid}) still on a pool's disk after "
                                        f"{timeout:.0f} s: {self.replicas(pnfsid)}")
                time.sleep(0.2)
        return list(found.values())

    def on_tape(self, pnfsid: str) -> bool:
        return (self.folder / "data" / pnfsid).is_file()

    # -- faults ---------------------------------------------------------------------------
    def inject(self, **faults: dict[str, Any] | None) -> None:
        """Make the library fail requests from now on (:mod:`.tape_hsm`'s fault file):
        ``put=`` (flushes) and ``get=`` (stages), each ``{"mode": "fail" | "lost" |
        "hang", "rc": N, "seconds": S, "pnfsids": [...]}`` or None (none). Replaces
        the faults injected before; :meth:`clear_faults` ends them."""
        from .tape_hsm import check_fault

        unknown = sorted(set(faults) - {"put", "get"})
        if unknown:
            raise ValueError(f"tape faults of {unknown}: give put= or get=")
        checked = {what: check_fault(what, fault) for what, fault in faults.items()
                   if fault is not None}
        path = self.folder / "faults.json"
        part = path.with_suffix(".part")
        part.write_text(json.dumps(checked))
        part.replace(path)  # the script reads the whole file or none of it

    def clear_faults(self) -> None:
        (self.folder / "faults.json").unlink(missing_ok=True)

    def failures(self) -> list[dict[str, Any]]:
        """The library's failed requests (the log's records with an error)."""
        return [record for record in self.records() if record.get("error")]

    # -- the pools' flush timers ---------------------------------------------------------
    def flush_held_s(self, timeout: float = 60) -> float:
        """The longest any pool's next timed flush is away (s; 0: every timer runs):
        the pools' ``info`` (``Next flush : 2026-11-29 08:15:49.652 (3 min in the
        future)``, the JVM's local time, this host's), more than the flush interval
        while dCache holds the timer after the pool's start."""
        import re
        from datetime import datetime

        pools = sorted(path.name for path in Path(self.access.pools).iterdir()
                       if (path / "setup").is_file())
        answer = self.admin("\n".join(f"\\s {pool} info" for pool in pools), timeout=timeout)
        stamps = re.findall(r"Next flush\s*:\s*(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)",
                            answer)
        if len(stamps) != len(pools):
            raise EndpointError(f"the pools' info named {len(stamps)} next flush(es) for "
                                f"{len(pools)} pools: {answer[-300:]!r}")
        now = time.time()
        return max(0.0, *(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp() - now
                          for stamp in stamps))

    def flush_class(self, timeout: float = 60) -> str:
        """``flush class osm <store>:tape`` on every pool (one admin session): each
        pool flushes the tape class's queued files now, whatever its timer (dCache
        holds a pool's flush timer for its first 5 minutes: :data:`HOLD_S`)."""
        return self.admin(flush_class_commands(self.access.pools).rstrip("\n"),
                          timeout=timeout)

    def records(self) -> list[dict[str, Any]]:
        return log_records(self.folder)


class RestoreWatch:
    """dCache's own record of failed stages from tape: the ``restore`` records its
    billing appends from the watch's start with an error code (each a
    :class:`~..load.dcache_billing.Transfer`: ``pnfsid``, ``code``, ``message``). Reads
    only what was appended since the last look (bounded by the billing reader's
    budget); nothing when the instance keeps no billing folder."""

    def __init__(self, billing: str) -> None:
        from ..load.dcache_billing import BillingLog

        self.log = BillingLog(billing) if billing else None
        self.marks = self.log.mark() if self.log is not None else {}
        #: the failed restores seen so far
        self.failed: list[Any] = []

    def failures(self) -> list[Any]:
        """Every failed restore recorded since the start (new ones read now)."""
        if self.log is not None:
            records, self.marks, _ = self.log.since(self.marks)
            self.failed += [record for record in records
                            if record.kind == "restore" and record.code]
        return list(self.failed)

    def lost(self, pnfsids: set[str]) -> dict[str, Any]:
        """pnfsid -> its failed restore with dCache's BROKEN_ON_TAPE code, for those of
        ``pnfsids`` that have one (dCache says the file cannot be staged)."""
        return {record.pnfsid: record for record in self.failures()
                if record.code == BROKEN_ON_TAPE and record.pnfsid in pnfsids}


# -- the pools' flush timers while dCache holds them ------------------------------------
#: the longest flush trigger (``flush_after_s``) whose hold is bridged (s): a library
#: with seed 004's triggers (10 minutes) keeps dCache's hold, as a site's pools do
BRIDGE_MAX_AFTER_S = 10


def flush_class_commands(pools: str) -> str:
    """Admin shell lines asking every pool of the folder ``pools`` to flush the tape's
    storage class now (``flush class osm storagescale:tape``), one a line."""
    names = sorted(path.name for path in Path(pools).iterdir() if (path / "setup").is_file())
    return "".join(f"\\s {name} flush class {HSM} {STORE}:{GROUP}\n" for name in names)


class HoldBridge:
    """The pools' flush timer while dCache holds it: for :data:`HOLD_S` after the
    start, every ``flush_after_s`` seconds (at least 1), ``flush class`` of the tape's
    storage class on every pool through one admin session (an ssh process whose input
    stays open; its answers go to ``<run>/tape/hold-bridge.log``). The pools' own
    timers take over when the hold ends (the bridge stops; its deadline is from the
    start's end, later than the pools' own hold). Only for a library whose trigger is
    at most :data:`BRIDGE_MAX_AFTER_S`: ``flush class`` flushes every queued file, so
    a longer trigger (seed 004's ``max.minutes``) would not be the pool's rule."""

    def __init__(self, control: TapeControl, every: float, seconds: float = HOLD_S) -> None:
        self.control = control
        self.every = max(1.0, float(every))
        self.deadline = time.monotonic() + seconds
        self.stopping = threading.Event()
        self.process: subprocess.Popen[bytes] | None = None
        self.thread = threading.Thread(target=self._run, name="tape-hold-bridge", daemon=True)
        #: the ticks sent (each a ``flush class`` to every pool), and why it ended early
        self.sent = 0
        self.error = ""

    def start(self) -> HoldBridge:
        self.thread.start()
        return self

    def _run(self) -> None:
        import socket

        ssh = shutil.which("ssh")
        if ssh is None:
            self.error = "no ssh on PATH"
            return
        while not self.stopping.is_set():  # the admin door comes up last
            if time.monotonic() > self.deadline:
                self.error = "the admin door did not come up within the hold"
                return
            try:
                socket.create_connection(("127.0.0.1", self.control.access.admin_port),
                                         timeout=5).close()
                break
            except OSError:
                self.stopping.wait(1)
        try:
            with open(self.control.folder / "hold-bridge.log", "ab") as log:
                self.process = subprocess.Popen(
                    self.control.ssh_argv(ssh), stdin=subprocess.PIPE, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True)
            commands = flush_class_commands(self.control.access.pools).encode()
            while not self.stopping.is_set() and time.monotonic() < self.deadline:
                if self.process.poll() is not None:
                    self.error = f"the admin session ended (exit {self.process.returncode})"
                    return
                assert self.process.stdin is not None
                self.process.stdin.write(commands)
                self.process.stdin.flush()
                self.sent += 1
                self.stopping.wait(self.every)
        except OSError as exc:  # the session ended under a write: the server stops
            self.error = str(exc)
        finally:
            self._end()

    def _end(self) -> None:
        process = self.process
        if process is None:
            return
        try:
            if process.stdin is not None:
                process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def stop(self) -> None:
        """End the bridge and its ssh process (idempotent; the server's stop)."""
        self.stopping.set()
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
        self.thread.join(timeout=30)
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)


# -- the stage interfaces ---------------------------------------------------------------
#: the stage interfaces by the thresholds' door names: SRM bringOnline through gfal2,
#: kXR_prepare with the stage flag through the xrootd door, the WLCG Tape REST API
STAGE_DOORS = ("srm", "root", "tape-rest")


class StageRefused(RuntimeError):
    """The door refused the stage request itself (not a file that failed to stage)."""


class SRMStager:
    """SRM ``bringOnline`` through gfal2 (``bring_online``, ``bring_online_poll``,
    ``release``), with the gfal2 driver's settings for dCache's SRM door."""

    def __init__(self, access: TapeAccess, timeout: float = 60) -> None:
        from urllib.parse import urlsplit

        from ..drivers.gfal2 import new_context
        from ..drivers.registry import driver_spec
        from ..drivers.srm import SERVICE_PATH

        # the driver sets the process's credentials (the proxy, the CA) for gfal2
        spec = driver_spec(access.srm_url, driver="gfal2", options=dict(access.driver_options))
        self.driver = spec.connect("stage", timeout=timeout)
        self.context = new_context()
        self.context.set_opt_boolean("SRM PLUGIN", "KEEP_ALIVE", False)
        self.context.set_opt_boolean("BDII", "ENABLED", False)
        # the protocols a bringOnline names (gfal2's default, gsiftp rfio gsidcap dcap
        # kdcap, was refused 'Protocol(s) not supported' by a dCache without GridFTP
        # and dcap doors): the doors every embedded dCache has first
        self.context.set_opt_string_list("SRM PLUGIN", "TURL_PROTOCOLS",
                                         ["https", "root", "gsiftp", "dcap"])
        self.prefix = f"srm://{urlsplit(access.srm_url).netloc}{SERVICE_PATH}?SFN="
        self.timeout = timeout

    def surl(self, path: str) -> str:
        return self.prefix + path

    def bring_online(self, path: str, pin_s: int = 3600) -> tuple[str, bool]:
        """An asynchronous bringOnline of ``path``: its request token, and whether the
        file was online at once."""
        import gfal2

        try:
            status, token = self.context.bring_online(self.surl(path), pin_s,
                                                      int(self.timeout), True)
        except gfal2.GError as exc:
            raise StageRefused(f"srmBringOnline of {path} answered {exc}") from None
        return str(token), status == 1

    def poll(self, path: str, token: str) -> bool:
        """Whether ``path`` is online now (``srmStatusOfBringOnlineRequest``)."""
        import gfal2

        try:
            return self.context.bring_online_poll(self.surl(path), token) == 1
        except gfal2.GError as exc:
            raise EndpointError(f"srmStatusOfBringOnlineRequest of {path} answered "
                                f"{exc}") from None

    def release(self, path: str, token: str) -> None:
        import gfal2

        try:
            self.context.release(self.surl(path), token)
        except gfal2.GError as exc:
            raise EndpointError(f"srmReleaseFiles of {path} answered {exc}") from None

    def abort(self, tokens: dict[str, str]) -> str:
        """``srmAbortRequest`` of each path's bringOnline (path -> its token): what
        the door answered, one phrase."""
        import gfal2

        said = []
        for path, token in tokens.items():
            try:
                self.context.abort_bring_online(self.surl(path), token)
                said.append(f"{path} aborted")
            except gfal2.GError as exc:
                said.append(f"{path}: srmAbortRequest answered {exc}")
        return "; ".join(said)

    def close(self) -> None:
        self.driver.close()
