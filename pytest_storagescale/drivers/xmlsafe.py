"""A server's XML answer read without its document type: an answer declaring one
(entity declarations: a "billion laughs" answer, external entities) is refused as a
malformed answer before any of its declarations is read.

The refusal is a :class:`DeclarationRefused`, an ``ElementTree.ParseError``, so every
caller's handling of an unreadable answer (a ``BadAnswer`` naming the door) applies.
The parser's target refuses at the start of the document type, whatever the answer's
encoding; no byte search of the answer is relied on.
"""

from __future__ import annotations

from typing import Any
from xml.etree import ElementTree


class DeclarationRefused(ElementTree.ParseError):
    """The answer declares a document type (a DOCTYPE: entities may follow)."""


class _Builder(ElementTree.TreeBuilder):
    """A tree builder that refuses a document type and, for :class:`PullParser`,
    keeps the ``start``/``end`` events of the elements it builds."""

    def __init__(self, events: bool = False) -> None:
        super().__init__()
        self.events: list[tuple[str, ElementTree.Element]] | None = [] if events else None

    def doctype(self, name: str, pubid: str | None, system: str | None) -> None:
        raise DeclarationRefused(
            f"the answer declares a document type ({name!r}): refused (no DOCTYPE or "
            f"entity declaration is read from a server)")

    def start(self, tag: Any, attrs: dict[str, str]) -> ElementTree.Element:
        element = super().start(tag, attrs)
        if self.events is not None:
            self.events.append(("start", element))
        return element

    def end(self, tag: Any) -> ElementTree.Element:
        element = super().end(tag)
        if self.events is not None:
            self.events.append(("end", element))
        return element


def fromstring(data: bytes | str) -> ElementTree.Element:
    """``ElementTree.fromstring`` refusing a document type (:class:`DeclarationRefused`)."""
    parser = ElementTree.XMLParser(target=_Builder())
    parser.feed(data)
    root: ElementTree.Element = parser.close()
    return root


class PullParser:
    """``ElementTree.XMLPullParser(events=("start", "end"))`` refusing a document type."""

    __slots__ = ("_builder", "_parser")

    def __init__(self) -> None:
        self._builder = _Builder(events=True)
        self._parser = ElementTree.XMLParser(target=self._builder)

    def feed(self, chunk: bytes) -> None:
        self._parser.feed(chunk)

    def close(self) -> None:
        self._parser.close()

    def read_events(self) -> list[tuple[str, ElementTree.Element]]:
        events = self._builder.events or []
        self._builder.events = []
        return events
