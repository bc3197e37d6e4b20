"""Third-party copy (TPC) between the storage under test and a second storage (the
*peer*), over root:// (XRootD ``ofs.tpc``) and over HTTP (WebDAV ``COPY``: XrdHttpTPC,
dCache, EOS), into the storage and out of it; each copy is verified at its
destination by size and adler32.

The peer: a second embedded xrootd (TPC on, unix login) when the storage under test
is the embedded one, trusted by it (its CA put in the storage's CA folder); for a
remote storage, ``--storage-tpc-peer URL`` (ini ``storage_tpc_peer``), one writable
area per protocol (``root://peer//area``, ``davs://peer:8443/area``). Without one the
checks skip, saying which option names it. A suite gets the peer fixture by importing
it (the doors, ``storage_doors``, are the plugin's fixture)::

    from ..conformance.tpc import storage_tpc_peer  # noqa: F401

What each protocol offers, and which side is guarded (every write is guarded to this
run's directory on the server written):

- root://: TPC is destination-driven -- the client asks the destination server, which
  fetches the file from the source with the rendezvous key. *Pull* (into the storage):
  the storage is the destination and runs the copy. *Push* (out of the storage): the
  peer is the destination and fetches from the storage, which checks the key as the
  source. The guard is always the destination client's (the storage's run directory
  for a pull, the peer's for a push).
- HTTP: the ``COPY`` goes to the storage both ways, so the storage runs every copy:
  *pull* with ``Source:`` (the storage GETs from the peer; guarded on the storage's
  path), *push* with ``Destination:`` (the storage PUTs to the peer; guarded on the
  peer's path before the ``COPY`` is sent, the storage's file is only read).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest

from pytest_storagescale import (
    CreatedPaths,
    Driver,
    DriverSpec,
    StorageError,
    StorageScaleUsageError,
    StorageScaleWarning,
    driver_spec,
    redact_url,
    start_embedded,
)
from pytest_storagescale.conformance import door_problem, remove_folder

from .checks import (
    KnownIssues,
    MiB,
    Place,
    call,
    check_adler32,
    fail,
    open_place,
    payload,
    release,
)
from .doors import Door, folder_name

#: the protocols of the checks (a door and a peer URL belong to one as their driver
#: class tells: Driver.is_xrootd, Driver.is_http) and their schemes, for messages
PROTOCOLS = {"root": "root://, roots://", "http": "davs://, https://"}
OPTION = "--storage-tpc-peer"
EXPECTED = ("the file copied server to server (third-party copy offered: 'ofs.tpc' for "
            "root://, a WebDAV COPY handler such as XrdHttpTPC for https://)")


@dataclass(frozen=True)
class TPCPeer:
    """The second storage of the copies: one door per protocol (``root``, ``http``),
    each guarded to this run's directory on it; or why there is none."""

    doors: dict[str, Door] = field(default_factory=dict)
    #: what the peer is (for messages)
    description: str = ""
    #: why the checks cannot run (a skip reason), "" when they can
    absent: str = ""


def protocol_of(url: str) -> str | None:
    """``root`` or ``http`` as the URL's driver class tells, None for anything else."""
    try:
        spec = driver_spec(url)
    except StorageScaleUsageError:  # no driver speaks it, or no area in it
        return None
    return door_protocol(Door("peer", spec, spec.endpoint.path))


def door_protocol(door: Door) -> str | None:
    """``root`` or ``http``: the protocol ``door`` speaks, None for another."""
    return "root" if door.is_xrootd else "http" if door.is_http else None


def peer_urls(raw: str | list[str] | tuple[str, ...] | None) -> dict[str, str]:
    """Protocol -> URL of the peer's area, from ``--storage-tpc-peer`` (repeated) or the
    ini's lines; a URL of another protocol fails in one paragraph."""
    items = raw.splitlines() if isinstance(raw, str) else list(raw or [])
    urls: dict[str, str] = {}
    for item in (i.strip() for i in items):
        if not item or item.startswith("#"):
            continue
        protocol = protocol_of(item)
        if protocol is None or not urlsplit(item).path.strip("/"):
            pytest.fail(
                f"{OPTION} {redact_url(item)!r}: not the URL of a writable area over root:// "
                f"or HTTP(S). Give one per protocol, e.g. {OPTION} root://peer:1094//tmp/area "
                f"{OPTION} davs://peer:8443/tmp/area (ini storage_tpc_peer: one per line).",
                pytrace=False)
        urls[protocol] = item
    return urls


def peer_door(name: str, url: str, main: DriverSpec, folder: str, timeout: float,
              ca_dir: str = "") -> Door:
    """The peer's door at ``url``, its clients guarded to ``<area>/<folder>`` there; the
    options are those of the session's own clients that its driver takes (``ca_dir``:
    the peer's CA folder when the session's clients have none, e.g. a storage without
    TLS)."""
    cls = driver_spec(url).driver_class
    options = {key: value for key, value in main.options.items() if key in cls.option_names}
    if ca_dir and "ca_dir" in cls.option_names:
        options.setdefault("ca_dir", ca_dir)
    run_dir = f"{driver_spec(url).endpoint.path.rstrip('/')}/{folder}"
    return Door(name, driver_spec(url, options=options, writable_root=run_dir), run_dir,
                timeout)


def _storage_ca(doors: dict[str, Door]) -> str:
    return next((d.spec.options["ca_dir"] for d in doors.values()
                 if d.spec.options.get("ca_dir")), "")


def _start_embedded_peer(doors: dict[str, Door]):
    """A second embedded xrootd (TPC on), whose CA the storage and the clients trust."""
    peer = start_embedded("xrootd", "unix")
    storage_ca = _storage_ca(doors)
    if storage_ca and peer.ca_dir:
        try:
            peer.share_ca(storage_ca)
        except OSError as exc:
            peer.stop()
            pytest.fail(f"the TPC peer's CA could not be added to the storage's CA folder "
                        f"{storage_ca}: {exc}", pytrace=False)
    return peer


@pytest.fixture(scope="session")
def storage_tpc_peer(storage_endpoint, storage_doors: dict[str, Door], storage_settings,
                     request: pytest.FixtureRequest) -> Iterator[TPCPeer]:
    """The peer of the third-party copies (see the module's text), its directory for
    this run made, and removed (with the embedded peer) at the end."""
    settings = storage_settings
    urls = peer_urls(settings.tpc_peer)
    peer = None
    if not urls and not storage_endpoint.is_embedded:
        yield TPCPeer(absent=(
            f"third-party copy needs a second storage: name its writable area with {OPTION} "
            f"URL (ini storage_tpc_peer), one per protocol, e.g. {OPTION} "
            f"root://peer:1094//tmp/area {OPTION} davs://peer:8443/tmp/area"))
        return
    if not urls and settings.embedded_login != "unix":
        yield TPCPeer(absent=(
            f"the embedded TPC peer logs in with unix; a copy between it and a storage with "
            f"the {settings.embedded_login} login needs delegated credentials, which the "
            f"embedded pair does not set up: run with --storage-embedded-login unix, or name "
            f"a peer with {OPTION} URL"))
        return
    if not urls:
        peer = _start_embedded_peer(storage_doors)
        urls = {"root": peer.url, "http": peer.https_url}
    worker = getattr(request.config, "workerinput", {}).get("workerid", "")
    folder = f"{storage_endpoint.run_id}-tpc" + (f"-{worker}" if worker else "")
    timeout = settings.hang_timeout or Door.timeout
    main = storage_endpoint.driver_spec
    peer_ca = peer.ca_dir if peer is not None and not _storage_ca(storage_doors) else ""
    doors = {protocol: peer_door(f"peer {protocol}", url, main, folder, timeout, peer_ca)
             for protocol, url in urls.items()}
    described = peer.describe() if peer else ", ".join(d.display for d in doors.values())
    try:
        made = False
        for door in doors.values():
            # the peer's area must exist: only this run's directory is made, exclusively,
            # through its first door (the others show it)
            problem = door_problem(door, OPTION, run_dir_made=made)
            if problem:
                pytest.fail(problem, pytrace=False)
            if not made:
                _on(door, "mkdir", door.run_dir, lambda c, p: c.mkdir(p, parents=False),
                    door.run_dir)
                made = True
        yield TPCPeer(doors, described)
    finally:
        try:
            for door in doors.values():  # the first removes it, the others see it gone
                _on(door, "remove", door.run_dir, _remove_run_dir, door.run_dir, clean_up=True)
        finally:
            if peer is not None:
                peer.stop()


def _remove_run_dir(client: Driver, run_dir: str) -> None:
    """The peer's run directory and the folders the checks emptied in it (``tpc/``),
    each with ``rmdir`` only: anything a check left is left and named."""
    client.created = CreatedPaths(run_dir)
    remove_folder(client, run_dir, who="TPC peer")


def _on(door: Door, operation: str, path: str, action: Callable[..., Any], *args,
        clean_up: bool = False) -> None:
    """``action(client, *args)`` with a new client of ``door``; a storage error fails
    in one paragraph (a warning when cleaning up)."""
    client = door.client(f"tpc-{operation}")
    try:
        action(client, *args)
    except StorageError as exc:
        if not clean_up:
            fail(door, operation, path, f"answered an error: {exc}", "success (the "
                 "third-party-copy peer's directory for this run)")
        warnings.warn(StorageScaleWarning(f"{door.name}: clean-up of {path} failed ({exc})"),
                      stacklevel=1)
    finally:
        client.close()


def run_copy(door: Door, operation: str, path: str, function: Callable[..., Any], *args) -> Any:
    """``function(*args)``, a third-party copy; its refusal fails the check saying
    whether the storage does not offer third-party copy or the copy failed."""
    try:
        return function(*args)
    except StorageError as exc:
        reason, kind = f"{exc.message} [{exc.native_status}]", exc.error_class
    did = ("does not offer third-party copy" if kind == "tpc_not_supported"
           else "refused or failed the third-party copy")
    fail(door, operation, path, f"{did}: {reason}", EXPECTED)


def check_copy(place: Place, path: str, data: bytes, what: str) -> None:
    """The copy at ``path`` has the size and the adler32 of the bytes copied."""
    info = call(place.door, "stat", path, place.client.stat, path)
    if info.size != len(data) or info.is_dir:
        fail(place.door, "stat", path, f"shows {info.size} bytes after {what}",
             f"{len(data)} bytes, the size of the file copied")
    check_adler32(place.door, place.client, path, data)


class ThirdPartyCopyChecks(KnownIssues):
    """root:// and HTTP third-party copy into the storage (pull) and out of it (push),
    with a second storage (the fixture ``storage_tpc_peer``)."""

    #: the size of the file each check copies
    tpc_file_size = 8 * MiB + 5

    @pytest.fixture
    def tpc_pair(self, storage_doors: dict[str, Door], storage_tpc_peer: TPCPeer,
                 request: pytest.FixtureRequest):
        """``pair(protocol)`` -> (the storage's place, the peer's place): a client of
        each side's door of ``protocol`` and a fresh directory of the check's on each;
        both removed after the check. Skips, naming why, when a side has no such door."""
        made: list[Place] = []

        def pair(protocol: str) -> tuple[Place, Place]:
            if storage_tpc_peer.absent:
                pytest.skip(storage_tpc_peer.absent)
            door = next((d for d in storage_doors.values() if door_protocol(d) == protocol),
                        None)
            if door is None:
                pytest.skip(f"the storage has no {protocol} door ({PROTOCOLS[protocol]}...): "
                            f"add one with --storage-door NAME=URL")
            other = storage_tpc_peer.doors.get(protocol)
            if other is None:
                pytest.skip(f"the TPC peer ({storage_tpc_peer.description}) has no {protocol} "
                            f"door: name one with {OPTION} URL")
            relative = f"tpc/{folder_name(request.node.name)}"
            for side in (door, other):
                made.append(open_place(side, f"tpc-{side.name}", relative))
                client = made[-1].client
                if not hasattr(client, "pull"):
                    pytest.skip(f"{side.name} door: the {client.name} driver has no "
                                f"third-party copy (the xrootd and http drivers have)")
                call(side, "mkdir", side.path(relative), client.mkdir, side.path(relative))
            return made[-2], made[-1]

        yield pair
        for place in made:
            release(place)

    def test_tpc_root_pull(self, tpc_pair) -> None:
        """root:// TPC into the storage: the storage, as destination, fetches a file
        from the peer (``xrdcp --tpc only``; XRootD's TPC is destination-driven)."""
        storage, peer = tpc_pair("root")
        data = payload(self.tpc_file_size, seed=11)
        source = peer.put("source.dat", data)
        target = storage.path("pulled.dat")
        run_copy(storage.door, f"third-party copy (the storage pulls) from "
             f"{peer.door.url(source)} to", target,
             storage.client.pull, target, peer.client, source)
        check_copy(storage, target, data, "a root:// third-party copy into it")

    def test_tpc_root_push(self, tpc_pair) -> None:
        """root:// TPC out of the storage: the peer, as destination, fetches a file from
        the storage, which serves it as the TPC source (checks the rendezvous key).
        root:// has no push of its own: the destination always runs the copy."""
        storage, peer = tpc_pair("root")
        data = payload(self.tpc_file_size, seed=12)
        source = storage.put("source.dat", data)
        target = peer.path("pushed.dat")
        run_copy(storage.door, f"third-party copy to {peer.door.url(target)} "
             f"(the peer pulls: root:// TPC is destination-driven) of", source,
             peer.client.pull, target, storage.client, source)
        check_copy(peer, target, data, "a root:// third-party copy from the storage")

    def test_tpc_http_pull(self, tpc_pair) -> None:
        """HTTP TPC into the storage: ``COPY`` with ``Source:`` to the storage, which
        GETs the file from the peer; the outcome is the answer's last line."""
        storage, peer = tpc_pair("http")
        data = payload(self.tpc_file_size, seed=13)
        source = peer.put("source.dat", data)
        target = storage.path("pulled.dat")
        run_copy(storage.door, f"COPY (Source: {peer.client.transfer_url(source)}) to", target,
             storage.client.pull, target, peer.client, source)
        check_copy(storage, target, data, "an HTTP third-party copy into it")

    def test_tpc_http_push(self, tpc_pair) -> None:
        """HTTP TPC out of the storage: ``COPY`` with ``Destination:`` to the storage,
        which PUTs the file to the peer; the outcome is the answer's last line."""
        storage, peer = tpc_pair("http")
        data = payload(self.tpc_file_size, seed=14)
        source = storage.put("source.dat", data)
        target = peer.path("pushed.dat")
        run_copy(storage.door, f"COPY (Destination: {peer.client.transfer_url(target)}) of",
             source, storage.client.push, source, peer.client, target)
        check_copy(peer, target, data, "an HTTP third-party copy from the storage")


__all__ = ["TPCPeer", "ThirdPartyCopyChecks", "peer_urls", "storage_tpc_peer"]
