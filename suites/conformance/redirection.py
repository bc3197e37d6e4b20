"""Redirection checks: an XRootD redirector (a ``cmsd`` manager, an EOS MGM, a dCache
door that redirects) finds the files written through it on its data servers.

They run on an XRootD door whose ``locate`` answers with data servers other than
the door itself (a redirector), and always on the embedded cluster
(``--storage-embedded redirector``), where an answer without data servers is a
failure; on a server that answers ``locate`` with itself (a standalone xrootd), an
HTTP door, or a door whose ``locate`` fails, each check is skipped with the answer
that says why.

What the documentation says ls through a redirector does, which the listing check
holds the storage to: ``xrdfs ls`` (the client's ``DirListFlags.LOCATE``) locates
every server holding the directory, lists each and merges the answers; a plain
``kXR_dirlist`` sent to an XRootD 5.5 manager is answered from the manager's own
disk (``ofs.dirlist local``, the default) or by one data server holding the
directory (``ofs.dirlist remote``), so it shows one server's entries, not the merge.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_storagescale import StorageError

from .checks import ConformanceChecks, Place, adler32_hex, call, fail, payload
from .doors import Door

#: a ``locate`` answer: entries with ``address`` (``host:port``), ``port``, ``is_server``
#: and ``pending`` (the XRootD door's driver class answers it: ``locate``)
Locations = tuple[Any, ...]
#: the embedded server kind that is a redirector (its checks never skip)
REDIRECTOR_KIND = "redirector"
#: files written for the listing check (an XRootD manager places new files round
#: robin: two on each of two data servers; each new file costs its lookup delay)
LISTING_FILES = 4


@dataclass(frozen=True)
class Redirector:
    """A door that redirects: its own address and the data servers ``locate`` named."""

    door: Door
    #: the redirector's own host and port
    host: str
    port: int
    #: the data servers that answered for the check's directory
    data_servers: Locations

    def is_itself(self, address: str) -> bool:
        """Whether ``host:port`` (a locate answer's) is the redirector."""
        return same_server(address, self.host, self.port)

    @property
    def server(self) -> str:
        return self.door.spec.endpoint.server

    def locate(self, path: str, *, refresh: bool = True) -> Locations:
        """Data servers holding ``path``, asked of the redirector now (``refresh``: it
        asks its servers, not its cache, which can still name a server just gone)."""
        return self.door.spec.driver_class.locate(self.server, path, timeout=self.door.timeout,
                                                  refresh=refresh)


def plain_host(host: str) -> str:
    """``host`` without brackets, an IPv4 address in IPv6 form (``[::ffff:127.0.0.1]``,
    or ``[::127.0.0.1]`` as an XRootD 5.5 manager's locate names a data server) as IPv4."""
    host = host.strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        if 0 < int(address) < 2**32:  # IPv4-compatible (::a.b.c.d)
            return str(ipaddress.IPv4Address(int(address)))
    return str(address)


def plain_address(address: str) -> str:
    """``host:port`` of a locate answer with :func:`plain_host`."""
    host, _, port = address.rpartition(":")
    host = plain_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _addresses(host: str) -> set[str]:
    """Every IP address ``host`` has (itself when it does not resolve)."""
    host = plain_host(host)
    try:
        return {plain_host(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return {host}


def same_server(address: str, host: str, port: int) -> bool:
    """Whether ``host:port`` (a locate answer's) is the server at ``host``, ``port``."""
    name, _, number = address.rpartition(":")
    return number == str(port) and bool(_addresses(name) & _addresses(host))


def redirector_of(door: Door, folder: str, embedded_redirector: bool) -> Redirector:
    """The door as a redirector of ``folder``; a skip naming the answer when it is not
    one (a failure on the embedded cluster, which must be)."""
    endpoint = door.spec.endpoint
    if not (door.is_xrootd and hasattr(door.spec.driver_class, "locate")):
        # one reason for every door it skips (the test id names the door): one line
        pytest.skip("not an XRootD door: redirection is XRootD's (kXR_locate, kXR_redirect)")
    door.client("conformance-env").close()  # the door's credentials in the environment
    port = endpoint.port or 1094
    try:
        answer = door.spec.driver_class.locate(endpoint.server, folder, timeout=door.timeout)
    except StorageError as exc:
        if embedded_redirector:
            fail(door, "locate", folder, f"answered an error: {exc}",
                 "the data servers holding the directory (the embedded cluster's manager)")
        pytest.skip(f"{door.name} door ({door.display}): locate of {folder} answered an error "
                    f"({exc}), so whether it redirects is unknown: the redirection checks "
                    f"need a redirector that answers locate")
    servers = tuple(entry for entry in answer
                    if not same_server(entry.address, endpoint.host, port))
    if not servers:
        did = f"named {', '.join(entry.address for entry in answer) or 'nothing'}"
        if embedded_redirector:
            fail(door, "locate", folder, did, "its data servers (the embedded cluster's "
                 "manager serves no file itself)")
        pytest.skip(f"{door.name} door: locate of the test area {did}: the door serves its "
                    f"files itself, there is no data server to redirect to (the checks need "
                    f"an XRootD redirector)")
    return Redirector(door, endpoint.host, port, servers)


class RedirectionChecks(ConformanceChecks):
    """A file written through the redirector is located on a data server, read back
    identically through the redirector, and listed."""

    @pytest.fixture
    def redirector(self, place: Place, storage_endpoint) -> Redirector:
        embedded = storage_endpoint.embedded_kind == REDIRECTOR_KIND
        return redirector_of(place.door, place.folder, embedded)

    def test_locate_names_data_server(self, place: Place, redirector: Redirector) -> None:
        """``locate`` through the redirector names a data server for a file written
        through it, and that data server has the file (its own stat: the size)."""
        data = payload(100_003, seed=11)
        path = place.put("located.dat", data)
        answer = _locate(redirector, path)
        for entry in answer:
            if redirector.is_itself(entry.address):
                fail(place.door, "locate", path, f"named the redirector itself "
                     f"({entry.address}) among {_names(answer)}", "data servers only")
            size = _stat_on(place.door, entry.address, path)
            if size != len(data):
                fail(place.door, f"stat on data server {entry.address}", path,
                     f"answered {size}, although the redirector's locate named that server "
                     f"for the file", f"the file of {len(data)} bytes written through the "
                     f"redirector")

    def test_read_through_redirector(self, place: Place, redirector: Redirector) -> None:
        """A file written through the redirector reads back identically through it (size,
        bytes, adler32), served by a data server ``locate`` names."""
        data = payload(1_500_001, seed=12)
        path = place.put("read.dat", data)
        holders = _locate(redirector, path)
        got, served_by = _read_through(place.door, path)
        if got != data:
            fail(place.door, "read through the redirector", path, f"gave {len(got)} bytes "
                 f"(adler32 {adler32_hex(got)}) from data server {served_by}",
                 f"the {len(data)} bytes written (adler32 {adler32_hex(data)})")
        if served_by and not any(same_server(served_by, *_host_port(entry.address))
                                 for entry in holders):
            fail(place.door, "read through the redirector", path, f"was served by "
                 f"{served_by}, which its locate did not name ({_names(holders)})",
                 "a read redirected to a data server holding the file")
        info = call(place.door, "stat", path, place.client.stat, path)
        if info.size != len(data):
            fail(place.door, "stat through the redirector", path, f"answered size "
                 f"{info.size}", f"{len(data)}")

    def test_ls_through_redirector(self, place: Place, redirector: Redirector) -> None:
        """A listing with the locate flag (``xrdfs ls``: every server holding the
        directory, merged) names every file written through the redirector, on
        whichever data server; a plain listing names them all (a merging redirector)
        or exactly one data server's (an XRootD manager hands it to one server)."""
        names = [f"file-{index}.dat" for index in range(LISTING_FILES)]
        for name in names:
            place.put(f"listing/{name}", name.encode())
        folder = place.path("listing")
        by_server: dict[str, set[str]] = {}
        for name in names:
            for entry in _locate(redirector, f"{folder}/{name}", refresh=False):
                by_server.setdefault(entry.address, set()).add(name)
        merged = _listing(place.door, folder, locate=True)
        if sorted(set(merged)) != names:
            fail(place.door, "ls with the locate flag (xrdfs ls)", folder,
                 f"listed {sorted(set(merged))}; its data servers hold "
                 f"{ {server: sorted(held) for server, held in by_server.items()} }",
                 f"every file written through the redirector: {names}")
        plain = set(_listing(place.door, folder, locate=False))
        if plain == set(names) or any(plain == held for held in by_server.values()):
            return
        fail(place.door, "ls (a plain dirlist)", folder, f"listed {sorted(plain)}; its data "
             f"servers hold { {server: sorted(held) for server, held in by_server.items()} }",
             "every file written (a merging redirector) or exactly the files of one data "
             "server (a manager passes a plain listing to one server)")


def expect_located(redirector: Redirector, path: str, before: Locations
                   ) -> Locations:
    """Locate ``path`` again; a failure naming the data servers of ``before`` (an
    earlier answer) that the redirector no longer names, and what it answered."""
    try:
        answer = redirector.locate(path)
    except StorageError as exc:
        answer, did = (), f"answered {exc.error_class}: {exc}"
    else:
        did = f"named {_names(answer)}"
    gone = [entry.address for entry in before
            if not any(same_server(now.address, *_host_port(entry.address)) for now in answer)]
    if gone:
        fail(redirector.door, "locate through the redirector", path,
             f"{did}: data server {', '.join(gone)}, which held the file, is no longer named "
             f"(gone from the cluster, or offline)", f"the file on {_names(before)}")
    return answer


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _names(answer: Locations) -> str:
    return ", ".join(entry.address for entry in answer) or "no server"


def _locate(redirector: Redirector, path: str, *, refresh: bool = True
            ) -> Locations:
    """The data servers holding ``path``; a failure when the redirector names none."""
    door = redirector.door
    try:
        answer = redirector.locate(path, refresh=refresh)
    except StorageError as exc:
        fail(door, "locate through the redirector", path, f"answered an error: {exc}",
             "the data server holding the file written through it")
    servers = tuple(entry for entry in answer if entry.is_server)
    if not servers:
        fail(door, "locate through the redirector", path, f"named {_names(answer)} and no "
             f"data server", "the data server holding the file written through it")
    return servers


def _stat_on(door: Door, address: str, path: str) -> int | str:
    """The size data server ``address`` answers for ``path`` (asked directly), or its
    error."""
    from XRootD import client

    status, info = client.FileSystem(f"{door.scheme}://{plain_address(address)}").stat(
        path, timeout=max(1, int(door.timeout)))
    return info.size if status.ok else f"an error: {status.message.strip()}"


def _read_through(door: Door, path: str) -> tuple[bytes, str]:
    """The file's bytes read through the door, and the data server that served them
    (the client's ``DataServer`` property after the redirected open)."""
    from XRootD import client
    from XRootD.client.flags import OpenFlags

    timeout = max(1, int(door.timeout))
    handle = client.File()
    status, _ = handle.open(door.url(path), OpenFlags.READ,
                            timeout=timeout)
    if not status.ok:
        fail(door, "open through the redirector", path, f"answered an error: "
             f"{status.message.strip()}", "the file written through the redirector")
    try:
        served_by = handle.get_property("DataServer") or ""
        status, data = handle.read(timeout=timeout)
        if not status.ok:
            fail(door, f"read from data server {served_by}", path, f"answered an error: "
                 f"{status.message.strip()}", "the file's bytes")
    finally:
        handle.close(timeout=timeout)
    return data, served_by.removeprefix("root://").rstrip("/")


def _listing(door: Door, folder: str, *, locate: bool) -> list[str]:
    """The names in ``folder`` through the door: one ``kXR_dirlist``, or with the locate
    flag (every server holding it, asked in turn, as ``xrdfs ls`` does)."""
    from XRootD import client
    from XRootD.client.flags import DirListFlags

    flags = DirListFlags.LOCATE if locate else DirListFlags.NONE
    status, listing = client.FileSystem(door.spec.endpoint.server).dirlist(
        folder, flags, timeout=max(1, int(door.timeout)))
    if not status.ok:
        what = "ls with the locate flag (xrdfs ls)" if locate else "ls (a plain dirlist)"
        fail(door, what, folder, f"answered an error: {status.message.strip()}",
             "the files written through the redirector")
    return [entry.name for entry in listing]


__all__ = ["Redirector", "RedirectionChecks", "expect_located", "plain_address",
           "redirector_of", "same_server"]
