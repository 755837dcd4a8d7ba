"""Library calls both servers make that are more than one method call: kept here
once, so the HTTP routes and the MCP tools cannot drift apart."""

from __future__ import annotations

import secrets
from typing import Any

from ..erasure.verify import verify_certificate
from ..errors import InvalidInputError
from ..log.note import parse_verifier
from ..log.receipt import Receipt, verify_receipt
from ..log.report import Report
from ..memory import Memory
from ..model import Record, Space, check_int, check_name

#: The most records one page of a listing holds, over HTTP and MCP alike.
MAX_PAGE = 10_000


def public_key(memory: Memory) -> dict[str, str]:
    """The log's current verifier key, to give to verifiers out of band."""
    verifier = memory.public_key()
    return {"vkey": verifier.vkey, "public_key": verifier.public_key.hex(), "origin": memory.log.origin}


def check_receipt(memory: Memory, receipt: Any, key: str | None) -> Report:
    """A receipt checked under ``key`` (a verifier key or 64 hex digits) or, unpinned,
    under the keys the store itself announced."""
    parsed = Receipt.from_json(receipt)
    if key is not None:
        return verify_receipt(parsed, [parse_verifier(key, memory.log.origin)], pinned=True)
    return verify_receipt(parsed, memory.announced_keys(), pinned=False)


def check_certificate(memory: Memory, certificate: Any, expected_pubkey: str | None) -> Report:
    """An erasure certificate verified offline, under a pinned key if one is given."""
    key = None if expected_pubkey is None else parse_verifier(expected_pubkey, memory.log.origin)
    return verify_certificate(certificate, expected_key=key)


def list_page(
    memory: Memory,
    *,
    space: Space,
    subject: str | None,
    key: str | None,
    include_history: bool,
    limit: int,
    after: str | None,
) -> tuple[list[Record], str | None]:
    """Up to ``limit`` records of ``memory.list`` after the record ``after``, and the
    cursor of the next page: the last one's id, or None when no record follows. One
    record more than the page is read, so a page that ends the listing says so even
    when it is full, and a caller never has to fetch an empty page to learn it."""
    check_int(limit, "limit", low=1)
    records = list(
        memory.list(
            space=space, subject=subject, key=key, include_history=include_history, limit=limit + 1, after=after
        )
    )
    if len(records) > limit:
        return records[:limit], records[limit - 1].id
    return records, None


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
