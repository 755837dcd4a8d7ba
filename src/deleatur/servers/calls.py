"""Library calls both servers make that are more than one method call: kept here
once, so the HTTP routes and the MCP tools cannot drift apart."""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..erasure.verify import pinned_key_for, verify_certificate
from ..errors import InvalidInputError
from ..log.note import parse_verifier
from ..log.receipt import Receipt, verify_receipt
from ..log.report import Report
from ..memory import Memory
from ..model import Record, Space, check_int, check_name, loads_readable, utf8_text
from .errors import ServerBusyError

#: The most records one page of a listing holds, over HTTP and MCP alike.
MAX_PAGE = 10_000
#: The most one page of ``GET /v1/memories`` holds, by :func:`record_bytes`: a page is
#: built whole in memory, and 10,000 records of 64 KiB each would be 640 MiB.
MAX_PAGE_BYTES = 4 * 1024 * 1024
#: The most log entries one page of ``GET /v1/audit`` reads (about 0.6 s here):
#: a filter that matches few entries, or a key scoped to few users, read on through the
#: whole log for one page (22 s for 200,000 entries), holding the store handle throughout.
MAX_AUDIT_SCAN = 5_000
#: Exports running at once, per server process; more are refused with 503 ``busy``.
MAX_EXPORTS = 4
#: What a record's JSON holds besides the fields :func:`record_bytes` measures: member
#: names, ids, the status, times and numbers (some 450 bytes).
_RECORD_OVERHEAD = 512


def public_key(memory: Memory) -> dict[str, str]:
    """The log's current verifier key, to give to verifiers out of band."""
    verifier = memory.public_key()
    return {"vkey": verifier.vkey, "public_key": verifier.public_key.hex(), "origin": memory.log.origin}


def check_receipt(memory: Memory, receipt: str | dict[str, Any], key: str | None) -> Report:
    """A receipt checked under ``key`` (a verifier key or 64 hex digits) or, unpinned,
    under the keys the store itself announced. Given as its JSON text, it is read as
    ``deleatur verify-receipt`` reads a file (``Receipt.loads``): one that repeats a key
    or has a member besides its four is refused; given as the value parsed from it, only
    what the parser left can be checked."""
    parsed = Receipt.loads(_as_file(receipt, "the receipt")) if isinstance(receipt, str) else Receipt.from_json(receipt)
    if key is not None:
        # A raw key is named after the log the receipt is of, as `deleatur verify-receipt` names it.
        return verify_receipt(parsed, [parse_verifier(key, parsed.origin)], pinned=True)
    return verify_receipt(parsed, memory.announced_keys(), pinned=False)


def check_certificate(certificate: str | dict[str, Any], expected_pubkey: str | None) -> Report:
    """An erasure certificate verified offline, under a pinned key if one is given. Given
    as its JSON text, it gets the verdict ``deleatur verify`` gives that text in a file:
    text that is not JSON is refused as bad input, and a repeated key or an unsigned
    member fails check 1 (see :func:`deleatur.erasure.verify.verify_certificate`)."""
    parsed: Any = certificate
    if isinstance(certificate, str):
        certificate = _as_file(certificate, "the certificate")
        parsed = loads_readable(certificate, "the certificate")
    key = None if expected_pubkey is None else pinned_key_for(parsed, expected_pubkey)
    return verify_certificate(certificate, expected_key=key)


def _as_file(text: str, what: str) -> str:
    """A document's text, refused as the CLI refuses a file of it that is not UTF-8: a
    body's bytes are decoded as json.loads decodes them, which lets an encoded surrogate
    through as one, where a file's are decoded strictly (``model.utf8_text``)."""
    return utf8_text(text.encode("utf-8", "surrogatepass"), what)


def record_bytes(record: Record) -> int:
    """About the size of ``record``'s JSON, as a page caps it: its text, names and
    metadata in UTF-8, its lineage's ids, and a fixed allowance for the rest. Not the
    JSON itself: encoding every record once more would add a sixth to a page's time."""
    names = (record.subject, record.subject_original, record.key, record.source, record.reason, record.actor)
    space = (record.space.user_id, record.space.agent_id, record.space.run_id)
    size = _RECORD_OVERHEAD + len(record.text.encode()) + sum(len(n.encode()) for n in (*names, *space) if n)
    size += sum(len(parent) + 3 for parent in record.derived_from)
    if record.metadata:
        size += len(json.dumps(record.metadata, ensure_ascii=False).encode())
    return size


def list_page(
    memory: Memory,
    *,
    space: Space,
    subject: str | None,
    key: str | None,
    include_history: bool,
    limit: int,
    after: str | None,
    max_bytes: int,
) -> tuple[list[Record], str | None]:
    """Up to ``limit`` records of ``memory.list`` after the record ``after``, and no
    more than ``max_bytes`` of them, as :func:`_page` pages them."""
    return _page(
        lambda most: memory.list(
            space=space, subject=subject, key=key, include_history=include_history, limit=most, after=after
        ),
        limit,
        max_bytes,
    )


def history_page(
    memory: Memory, *, key: str, space: Space, limit: int, after: str | None, max_bytes: int
) -> tuple[list[Record], str | None]:
    """A page of the versions of ``key`` in ``space``, oldest first, and the cursor of the
    next, as :func:`_page` pages them: ``Memory.history`` returns them all at once, and a
    key rewritten 10,000 times with 64 KiB values would be 640 MiB. Read through
    ``Memory.versions``, so each page is a ``history`` call in the audit trail, and a key
    with no version a failed one, as the library's ``history`` makes them."""
    return _page(lambda most: memory.versions(key, space=space, limit=most, after=after), limit, max_bytes)


def fitting(records: Sequence[Record], max_bytes: int) -> int:
    """How many of ``records``, from the first, one answer holds: as :func:`_page` pages
    them, at most ``max_bytes`` of them but for a first record larger than that."""
    if not records:
        return 0
    page, _ = _page(lambda most: iter(records[:most]), len(records), max_bytes)
    return len(page)


def _page(read: Callable[[int], Iterator[Record]], limit: int, max_bytes: int) -> tuple[list[Record], str | None]:
    """Up to ``limit`` of the records ``read(most)`` streams, and no more than
    ``max_bytes`` of them (:func:`record_bytes`) but for a first record larger than
    that, which comes alone; and the cursor of the next page: the last one's id, or None
    when no record follows. One record more than the page is read, so a page that ends
    the listing says so even when it is full, and a caller never has to fetch an empty
    page to learn it. Records are read one at a time, so a page cut short by
    ``max_bytes`` never decrypted the ``limit`` records it did not hold."""
    check_int(limit, "limit", low=1)
    check_int(max_bytes, "max_bytes", low=1)
    page: list[Record] = []
    size = 0
    for record in read(limit + 1):
        size += record_bytes(record)
        if len(page) == limit or (page and size > max_bytes):
            # Returning drops the listing unfinished, which ends its statement on the handle.
            return page, page[-1].id
        page.append(record)
    return page, None


def audit_page(
    memory: Memory, *, start: int, limit: int, calls_only: bool, actor: str | None, scan: int
) -> tuple[list[dict[str, Any]], int | None]:
    """Up to ``limit`` audit entries (as JSON) from log index ``start``, read from at most
    ``scan`` of the log's entries, and the index the next page starts from, None once the
    log was read to its end: a page may hold fewer than ``limit``, none even, and still
    have a next."""
    trail = memory.audit_entries(start=start, limit=limit, calls_only=calls_only, actor=actor, scan=scan)
    return [entry.to_json() for entry in trail], trail.resume


class Exports:
    """The exports running now in one server process: at most ``limit``, since each
    holds a thread, a store handle and (over MCP, whose answers are whole) its text."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.live = 0
        self._lock = threading.Lock()

    def begin(self) -> None:
        """Count an export in, or refuse it (503 ``busy``); the caller calls ``end``."""
        with self._lock:
            if self.live >= self.limit:
                raise ServerBusyError(f"{self.limit} exports are running; try again when one has finished")
            self.live += 1

    def end(self) -> None:
        with self._lock:
            self.live -= 1


def on_behalf(memory: Memory, named: str | None, what: str) -> str:
    """Who a call is recorded as made by (``what``: an actor, a requester): the principal
    of the caller's key, as '<named> (via <principal>)' when the caller names whom it
    acts for. The principal is always there, and the name is one line: a request cannot
    pass for another's, nor show another principal on a line of its own."""
    caller = memory.principal.who
    if named is None:
        return caller
    if isinstance(named, str) and not named.strip():
        raise InvalidInputError(f"{what} must not be blank")
    return f"{check_name(named, what, allow_empty=False).strip()} (via {caller})"


def new_request_id(given: str | None, prefix: str) -> str:
    """The caller's request id, else a random one. Never derived from the subject: a
    request id outlives the erasure, and a hash of a name is the name to anyone who
    can guess it."""
    return given if given is not None else f"{prefix}-{secrets.token_hex(12)}"
