"""HTTP third-party copy (WebDAV ``COPY``; XrdHttpTPC, dCache, EOS): one ``COPY`` sent
with a ``Source:`` (pull) or ``Destination:`` (push) header, the other server's token
forwarded in ``TransferHeaderAuthorization``, ``Credential: none``. The server answers
at once and streams performance markers while it copies; the copy's outcome is the
body's last line (``success: ...``, ``failure: ...``), not the status code."""

from __future__ import annotations

import re
from typing import NamedTuple

from ...errors import StorageError
from ._errors import ErrorMapper, Malformed, text_of
from ._transport import LISTING_LIMIT, Transport
from ._webdav import number

#: a COPY answered with one of these: the server has no third-party copy; or with 400
#: and one of the words (XrdHttp without XrdHttpTPC: 400 "Request unknown")
_NO_TPC_STATUSES = {405, 501}
_NO_TPC_WORDS = ("request unknown", "not supported", "not allowed", "unknown method")
#: what the last line of a COPY answer starts with when the copy did not succeed
_TPC_FAILURES = ("failure", "failed", "aborted")
_STRIPE_BYTES = re.compile(r"Stripe Bytes Transferred:\s*(\S+)", re.IGNORECASE)
_OPERATION = "third-party copy"


class CopyOutcome(NamedTuple):
    """What a ``COPY`` (HTTP third-party copy) answered."""

    #: HTTP status of the answer
    status: int
    #: the body's last line: ``success: Created``
    outcome: str
    #: performance markers the server sent while copying
    markers: int
    #: bytes the last marker reported (None: no marker)
    bytes_reported: int | None


def copy(transport: Transport, path: str, written: str, headers: list[str]) -> CopyOutcome:
    """``COPY path`` with ``headers`` (the source or destination and its credential);
    ``written``: the path the copy writes, which errors name. An error unless the
    answer's last line says success."""
    errors = transport.errors
    answer = transport.request("COPY", path, operation=_OPERATION, headers=[
        *transport.auth, *headers, "Overwrite: T", "Credential: none"], limit=LISTING_LIMIT)
    reason = " ".join(text_of(answer.data).split())[:200]
    if answer.status in _NO_TPC_STATUSES or answer.status == 400 and any(
            words in reason.lower() for words in _NO_TPC_WORDS):
        raise StorageError(
            f"COPY refused: {reason or 'no third-party copy'}",
            error_class="tpc_not_supported",
            **errors.kwargs(_OPERATION, written, f"HTTP {answer.status}"))
    if not 200 <= answer.status < 300:
        raise errors.status(answer.status, answer.data, _OPERATION, written)
    return _outcome(answer.status, answer.data.decode("utf-8", "replace"), errors, written)


def _outcome(status: int, text: str, errors: ErrorMapper, written: str) -> CopyOutcome:
    """The outcome a successful ``COPY`` answer's ``text`` reports."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    sizes = _STRIPE_BYTES.findall(text)
    try:
        reported = number(sizes[-1], "Stripe Bytes Transferred") if sizes else None
    except Malformed as exc:
        raise errors.bad_answer(str(exc), _OPERATION, written, status) from None
    outcome = CopyOutcome(status, last, text.count("Perf Marker"), reported)
    if last.lower().startswith("success"):
        return outcome
    why = (f"the copy ended with {last!r}" if last.lower().startswith(_TPC_FAILURES)
           else f"the answer ended without a 'success' line (last line {last!r:.200})")
    raise StorageError(why, error_class="tpc_failed", **errors.kwargs(
        _OPERATION, written, f"HTTP {status}"))
