"""Readers of what a WebDAV door answers, each field checked (a malformed one is
:class:`~._errors.Malformed`, which the driver raises as ``bad_answer``): a 207
Multi-Status (through :mod:`~pytest_storagescale.drivers.xmlsafe`, which refuses
entities and DTDs), a one-entry stat answer read without a parser, a listing read as
it arrives (:class:`Listing`), ``Digest`` headers, ``multipart/byteranges`` bodies,
sizes and HTTP dates. No requests here."""

from __future__ import annotations

import base64
import binascii
import email.utils
import functools
import re
from typing import Any
from urllib.parse import unquote, urlsplit
from xml.etree import ElementTree

from .. import xmlsafe
from ..base import StatInfo
from ._errors import Malformed
from ._transport import ANSWER_LIMIT, LISTING_LIMIT, Body

_DAV = "{DAV:}"
#: a size or byte offset: ASCII digits that fit 64 bits
_NUMBER = re.compile(r"[0-9]{1,19}")
_HEX_VALUE = re.compile(r"[0-9a-f]{1,128}")
#: checksum algorithms whose Digest value is hex (RFC 3230 registry); others are base64
_HEX_DIGESTS = {"adler32", "crc32c", "unixcksum"}
#: the fast reading of a one-entry 207 answer (stat): any namespace prefix
_TAG = rb"<(?:[\w.-]+:)?"
_LENGTH = re.compile(_TAG + rb"getcontentlength(?:\s[^>]*)?(?<!/)>([^<]*)<")
_MODIFIED = re.compile(_TAG + rb"getlastmodified(?:\s[^>]*)?(?<!/)>([^<]*)<")
_COLLECTION = re.compile(_TAG + rb"resourcetype[^>/]*>\s*" + _TAG + rb"collection\b")


class Listing(Body):
    """A ``PROPFIND Depth: 1`` answer of directory ``own`` read as it arrives: an
    incremental XML parser reads each ``response`` and drops it, keeping the entry's
    name (``own``'s own entry: whether it is a directory), so a listing costs its
    names, not its answer. The first bytes are kept for an error
    page's words; the whole answer is bounded by ``limit``, one entry by
    :data:`ANSWER_LIMIT` (the parser holds an entry whole until it ends)."""

    __slots__ = ("parser", "own", "own_is_dir", "names", "root", "failure", "entry_began")

    #: what is kept of the answer's bytes (an error page's words)
    HEAD = 2000

    def __init__(self, own: str, limit: int = LISTING_LIMIT) -> None:
        super().__init__(limit=limit)
        # start and end events: read_events gives Elements (typeshed: or namespace pairs)
        self.parser: Any = xmlsafe.PullParser()
        self.own = "/" + own.strip("/")
        self.own_is_dir = False
        #: the names of the entries but ``own``'s, in the answer's order
        self.names: list[str] = []
        self.root: ElementTree.Element | None = None
        #: why the answer could not be read (None: it could, so far)
        self.failure: str | None = None
        #: bytes received when the last entry ended
        self.entry_began = 0
        self.writer = self.feed

    def reset(self) -> None:
        """Forget what was read (a throttled answer's page), for the next answer."""
        super().reset()
        self.parser = xmlsafe.PullParser()
        self.own_is_dir = False
        self.names = []
        self.root = None
        self.failure = None
        self.entry_began = 0

    def too_long(self) -> str:
        if self.counted - self.entry_began > ANSWER_LIMIT:
            return f"with an entry longer than {ANSWER_LIMIT:,} bytes, the most read for one"
        return super().too_long()

    def feed(self, chunk: bytes) -> int | None:
        self.counted += len(chunk)
        if self.counted > self.limit or self.counted - self.entry_began > ANSWER_LIMIT:
            self.overflow = True
            return 0
        if self.counted - len(chunk) < self.HEAD:
            self.chunks.append(chunk[:self.HEAD])
        if self.failure is None:
            try:
                self.parser.feed(chunk)
                self._read_events()
            except (ElementTree.ParseError, Malformed) as exc:
                self.failure = str(exc)
        return None

    def _read_events(self) -> None:
        for event, element in self.parser.read_events():
            if event == "start":
                if self.root is None:
                    self.root = element
            elif element.tag == f"{_DAV}response":
                self._read_response(element)

    def _read_response(self, element: ElementTree.Element) -> None:
        href, info = entry(element)
        href = href.rstrip("/")
        if href in (self.own, ""):
            self.own_is_dir = self.own_is_dir or info.is_dir
        else:
            self.names.append(href.rpartition("/")[2])
        self.entry_began = self.counted
        element.clear()
        root = self.root
        if root is not None and len(root) and root[-1] is element:
            del root[-1]  # the answer's element is gone: memory stays flat

    def finish(self) -> str | None:
        """After the transfer: why the answer could not be read, or None."""
        if self.failure is None:
            try:
                self.parser.close()
                self._read_events()
            except (ElementTree.ParseError, Malformed) as exc:
                self.failure = str(exc)
        return self.failure


def number(text: str | bytes, what: str) -> int:
    """A size or offset: ASCII digits that fit 64 bits (not a Unicode digit, not 5,000
    digits); else :class:`Malformed` naming ``what``."""
    value = text.strip()
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not _NUMBER.fullmatch(value):
        raise Malformed(f"{what} {value[:40]!r}{'...' if len(value) > 40 else ''} is not a "
                        f"number of bytes")
    return int(value)


def multistatus(data: bytes) -> list[tuple[str, StatInfo]]:
    """``(href path, StatInfo)`` of each response of a 207 answer, in its order."""
    return [entry(response)
            for response in xmlsafe.fromstring(data).iter(f"{_DAV}response")]


def entry(response: ElementTree.Element) -> tuple[str, StatInfo]:
    """``(href path, StatInfo)`` of one ``response`` element of a 207 answer."""
    try:
        href = unquote(urlsplit(response.findtext(f"{_DAV}href", "")).path)
    except ValueError as exc:  # urlsplit: "Invalid IPv6 URL"
        raise Malformed(f"href: {exc}") from None
    size, is_dir, modified = 0, False, None
    for propstat in response.iter(f"{_DAV}propstat"):
        if " 200" not in (propstat.findtext(f"{_DAV}status") or " 200"):
            continue
        for prop in propstat.iter(f"{_DAV}prop"):
            length = prop.findtext(f"{_DAV}getcontentlength")
            size = number(length, "getcontentlength") if length and length.strip() else size
            kind = prop.find(f"{_DAV}resourcetype")
            is_dir = is_dir or (kind is not None and kind.find(f"{_DAV}collection")
                                is not None)
            modified = http_date(prop.findtext(f"{_DAV}getlastmodified")) or modified
    return href, StatInfo(size=0 if is_dir else size, is_dir=is_dir, modified=modified)


@functools.lru_cache(maxsize=1024)
def one_entry(data: bytes) -> StatInfo | None:
    """A 207 answer of one entry whose properties all came back 200, read without an
    XML parser (a tenth of its CPU: ``stat`` is the load's most frequent request);
    None for anything else, which the XML parser reads. Remembered by the answer's
    bytes (its path, size and time): a load stats the same files over and over, and
    an answer read before costs a hash of its bytes, not 10 µs of reading."""
    # one response element (its opening and closing tag), every status line a 200: a
    # path that happens to hold these words only sends the answer to the XML parser
    statuses = data.count(b"status>") - data.count(b"multistatus>")
    if data.count(b"response") != 2 or statuses != 2 * data.count(b" 200 "):
        return None
    if b"<!" in data:
        return None  # a declaration (DOCTYPE) or CDATA: the parser reads (refuses) it
    is_dir = _COLLECTION.search(data) is not None
    length = _LENGTH.search(data)
    modified = _MODIFIED.search(data)
    if length and b"&" in length.group(1) or modified and b"&" in modified.group(1):
        return None  # an XML reference (&#49;): the parser reads it
    size = number(length.group(1), "getcontentlength") if length and length.group(
        1).strip() and not is_dir else 0
    return StatInfo(size=size, is_dir=is_dir,
                    modified=http_date(modified.group(1).decode("latin-1")) if modified
                    else None)


@functools.lru_cache(maxsize=4096)
def http_date(text: str | None) -> float | None:
    """An HTTP date (``getlastmodified``); None when absent, :class:`Malformed` when
    unreadable (clean-up compares files' times: a time it cannot read is no time)."""
    if not text or not text.strip():
        return None
    try:
        return email.utils.parsedate_to_datetime(text.strip()).timestamp()
    except (TypeError, ValueError, OverflowError, IndexError):
        shown = text.strip()
        raise Malformed(f"getlastmodified {shown[:60]!r}{'...' if len(shown) > 60 else ''} "
                        f"is not an HTTP date") from None


def digest(header: str, algorithm: str) -> str | None:
    """The value of ``algorithm`` in a ``Digest`` header, as lower-case hex
    (``adler32=0a1b2c3d, md5=...``); None when it is not there."""
    for item in header.split(","):
        name, sep, value = item.strip().partition("=")
        if sep and name.strip().lower() == algorithm.lower():
            return _digest_value(name.strip(), value.strip())
    return None


def _digest_value(name: str, value: str) -> str:
    if name.lower() in _HEX_DIGESTS:
        if not _HEX_VALUE.fullmatch(value.lower()):
            raise Malformed(f"the Digest {name}={value[:40]!r} is not hex")
        return value.lower().rjust(8, "0")
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return value.lower()


def byteranges(data: bytes, boundary: bytes) -> list[bytes]:
    """The parts of a ``multipart/byteranges`` body, each cut by the length its
    ``Content-Range`` gives (a part's bytes may contain the boundary)."""
    parts: list[bytes] = []
    position, marker = 0, b"--" + boundary
    while True:
        start = data.find(marker, position)
        if start < 0 or data.startswith(b"--", start + len(marker)):
            return parts
        head_end = data.find(b"\r\n\r\n", start)
        if head_end < 0:
            return parts
        first, last = _content_range(data[start:head_end])
        body = head_end + 4
        parts.append(data[body:body + last - first + 1])
        position = body + last - first + 1


def _content_range(head: bytes) -> tuple[int, int]:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-range":
            first, _, rest = value.strip().partition(b" ")[2].partition(b"-")
            return (number(first, "Content-Range"),
                    number(rest.partition(b"/")[0], "Content-Range"))
    raise Malformed("a multipart/byteranges part without Content-Range")
