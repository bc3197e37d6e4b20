"""The SRM driver's own SOAP calls (drivers/srm.py) against a hostile door on loopback:
every call has a deadline, not only each read (a door sending a byte at a time), and
a listing whose slices never end (a door answering every srmLs with a full slice)
ends at its deadline as a timeout, not a loop that grows without bound."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from pytest_storagescale.drivers.srm import LS_COUNT, soap_call, srm_ls
from pytest_storagescale.drivers.url import EndpointURL
from pytest_storagescale.errors import BadAnswer, StorageError, StorageTimeout
from pytest_storagescale.servers.credentials import ThrowawayCA


class HostileSRMDoor:
    """A TLS door on loopback that reads one SOAP request per connection and answers
    with ``answer(count)`` (bytes, or a callable writing to the connection)."""

    def __init__(self, folder: Path, answer) -> None:
        self.authority = ThrowawayCA(folder)
        cert = self.authority.issue_host(folder / "door.pem", folder / "door.key")
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert.cert, cert.key)
        self.answer = answer
        self.requests = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(raw,), daemon=True).start()

    def _one(self, raw: socket.socket) -> None:
        try:
            with self.context.wrap_socket(raw, server_side=True) as connection:
                connection.settimeout(10)
                request = b""
                while b"Envelope>" not in request:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    request += chunk
                self.requests += 1
                self.answer(connection, self.requests)
        except (OSError, ssl.SSLError):
            return

    def url(self, path: str) -> EndpointURL:
        return EndpointURL.parse(f"srm://localhost:{self.port}/srm/managerv2?SFN={path}")

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


def _http(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_a_door_sending_a_byte_at_a_time_meets_the_calls_deadline(tmp_path):
    sent = []

    def trickle(connection, _count) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        for _ in range(600):  # a byte every 50 ms for 30 s: each read gets one
            connection.sendall(b"x")
            sent.append(1)
            if door.closed.wait(0.05):
                return

    door = HostileSRMDoor(tmp_path, trickle)
    try:
        with pytest.raises(StorageTimeout, match="no whole answer within 1 s"):
            soap_call(door.url("/a"), b"<Envelope></Envelope>", timeout=1,
                      ca_dir=str(door.authority.ca_dir), operation="ls", path="/a")
        assert len(sent) < 600  # the driver gave up before the door was done
    finally:
        door.close()


def test_a_listing_whose_slices_never_end_is_a_timeout(tmp_path):
    """Each srmLs answered with a full slice of new names (the door would go on for
    5,000 slices): the listing ends at its deadline, not after them."""

    def full_slice(connection, count) -> None:
        size = LS_COUNT if count < 5000 else 1
        entries = "".join(f"<pathDetailArray><path>/d/f{count}_{index}</path>"
                          f"</pathDetailArray>" for index in range(size))
        body = ("<Envelope><Body><srmLsResponse><returnStatus><statusCode>SRM_SUCCESS"
                "</statusCode></returnStatus><details><pathDetailArray><path>/d</path>"
                "<status><statusCode>SRM_SUCCESS</statusCode></status><arrayOfSubPaths>"
                f"{entries}</arrayOfSubPaths></pathDetailArray></details></srmLsResponse>"
                "</Body></Envelope>").encode()
        connection.sendall(_http(body))

    door = HostileSRMDoor(tmp_path, full_slice)
    outcome: list = []

    def listing() -> None:
        try:
            outcome.append(srm_ls(door.url("/d"), "srm://x/d", "/d", timeout=2,
                                  ca_dir=str(door.authority.ca_dir)))
        except StorageError as exc:  # a wrong kind shows in the assertion below
            outcome.append(exc)

    try:
        worker = threading.Thread(target=listing, daemon=True)
        worker.start()
        worker.join(120)  # a ceiling for the test, not a measured time
        assert outcome and isinstance(outcome[0], StorageTimeout), outcome[:1] and type(
            outcome[0])
        assert "within" in str(outcome[0])  # the listing's, or its last slice's
        assert door.requests < 5000
    finally:
        door.close()


def test_a_door_that_accepts_and_never_shakes_hands_is_a_timeout():
    """A TLS handshake that outlasts the call's deadline is a timeout, not an
    unreachable door (CI once had a listing's handshake time out under load)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=8)
    port = listener.getsockname()[1]
    try:
        url = EndpointURL.parse(f"srm://localhost:{port}/srm/managerv2?SFN=/a")
        with pytest.raises(StorageTimeout, match="TLS handshake within 1 s"):
            soap_call(url, b"<Envelope></Envelope>", timeout=1, operation="ls", path="/a")
    finally:
        listener.close()


def test_an_answer_declaring_a_document_type_is_refused(tmp_path):
    """An srmLs answer with a DOCTYPE (an entity naming a planted path) is refused as
    unreadable before any declaration is read, in a BadAnswer naming the door."""

    def declaring(connection, _count) -> None:
        body = (b'<?xml version="1.0"?><!DOCTYPE Envelope [<!ENTITY p "/d/planted">]>'
                b"<Envelope><Body><srmLsResponse><returnStatus><statusCode>SRM_SUCCESS"
                b"</statusCode></returnStatus><details><pathDetailArray><path>/d</path>"
                b"<status><statusCode>SRM_SUCCESS</statusCode></status><arrayOfSubPaths>"
                b"<pathDetailArray><path>&p;</path></pathDetailArray></arrayOfSubPaths>"
                b"</pathDetailArray></details></srmLsResponse></Body></Envelope>")
        connection.sendall(_http(body))

    door = HostileSRMDoor(tmp_path, declaring)
    try:
        with pytest.raises(BadAnswer) as info:
            srm_ls(door.url("/d"), "srm://x/d", "/d", timeout=20,
                   ca_dir=str(door.authority.ca_dir))
        assert "declares a document type" in info.value.message
        assert f"localhost:{door.port}" in str(info.value)
    finally:
        door.close()
