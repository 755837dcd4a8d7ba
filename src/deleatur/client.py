"""A client for the HTTP API with the embedded library's calls.

``Client`` has :class:`~deleatur.Memory`'s method names and keyword arguments, and
returns what the library returns: a :class:`~deleatur.Record` from ``remember`` and
``get``, :class:`~deleatur.Hit` objects from ``recall``, a stream of records from
``list``, a :class:`~deleatur.Decision`, a :class:`~deleatur.Receipt`, a
:class:`~deleatur.Report`..., read from the JSON the server prints with the same
types' ``to_json``. So a service can move between an embedded store and a remote one
by changing how it gets the object. What stays in the store is not sent: a record's
nonce, an erasure's blind references, and the plan of an erasure that ran (see
:class:`~deleatur.erasure.engine.ErasureResult`). Refusals raise the library's own
errors (``NotFoundError``, ``InvalidInputError``, ...) carrying ``status`` and ``code``.

Where the two differ, on purpose:

- ``remember_many`` is absent: the API has no batch route, and writing the items one
  call at a time would not be all-or-nothing, as the library's batch is.
- ``verify_log`` and ``verify_audit`` refuse ``pinned_keys``, ``pinned_checkpoint`` and
  ``state``: a pin is worth something only when the verifier runs the check, and here
  the server would check the store it serves against the caller's pins and report
  its own verdict. Verify a copy of the store with the library, or with ``deleatur log
  verify --expected-pubkey ... --expected-checkpoint ...``.
- ``audit_entries`` returns entries without the sealed subject (``sealed``), which
  stays in the store.
- ``recall`` sends its query in a body, which the server takes up to its body limit
  (1 MiB by default; a longer query is refused as bad input): the library takes any.

    with Client("http://127.0.0.1:8765", api_key=KEY) as memory:
        record = memory.remember("Alice prefers email", subject="Alice Martin")
        memory.erase("Alice Martin", request_id="DSAR-17", basis="Art. 17(1)(a)")
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from .access.audit import AuditEntry, AuditTrail
from .decisions.snapshots import DECISION_NEEDS_SUMMARY, MAX_SUMMARY_BYTES, Decision
from .erasure.engine import DRY_RUN_FIRST, NEEDS_BASIS, ErasureResult
from .erasure.requests import ErasureRequest, check_request_id
from .errors import DeleaturError, InvalidInputError
from .ids import check_record_id
from .log.note import Note, Verifier
from .log.receipt import Receipt
from .log.report import Report
from .memory import RECTIFY_NEEDS_REASON
from .model import (
    DEFAULT_SPACE,
    EVERYWHERE,
    Hit,
    NewMemory,
    Record,
    Space,
    SpaceFilter,
    check_flags,
    check_int,
    check_items,
    check_number,
    check_optional,
    check_query,
    check_recall_limit,
    check_stated,
    check_type,
    utf8_text,
)
from .rights.export import TextSink
from .rights.restriction import RESTRICTION_NEEDS_REASON, Restriction
from .servers.errors import remote_error

DEFAULT_URL = "http://127.0.0.1:8765"
DEFAULT_BASIS = "Art. 17"

T = TypeVar("T")
C = TypeVar("C")

#: Records per page when following the server's list pages.
_PAGE = 1000
#: How much of an export's end is kept to read its counts from.
_COUNTS_TAIL = 4096
_COUNTS = re.compile(r', "counts": (\{[^{}]*\})\}\s*\Z')


def _hits(answer: Any) -> builtins.list[dict[str, Any]]:
    """A search's hits, each a JSON object, else a TypeError (the client's to report)."""
    hits = answer["hits"]
    if not isinstance(hits, builtins.list) or not all(isinstance(hit, dict) for hit in hits):
        raise TypeError("hits are a list of objects")
    return hits


def _space(space: Space) -> dict[str, str]:
    check_type(space, Space, "space")
    return {"user_id": space.user_id, "agent_id": space.agent_id, "run_id": space.run_id}


def _strings(**values: object) -> None:
    """Each of ``values`` a string or None (not given), named by its keyword: checked
    here, as the library checks them, since a URL or a body would carry a number or a
    list as text and the server would take it."""
    for name, value in values.items():
        check_optional(value, str, name)


#: An argument holding a lone surrogate (what a bad decode leaves) cannot go into a request.
_NOT_UTF8 = "an argument is not valid UTF-8 (it holds a lone surrogate)"
_NOT_JSON = "an argument has no JSON form (a value of another type, NaN or an infinity, a cycle, or nesting too deep)"
#: What a URL over 64 KiB (httpx's limit) held: the arguments sent in a URL are ones the
#: library bounds far below that (names, notes, ids), so it refuses them as bad input too.
#: The one exception: an erasure's confirmation, which the library calls an unknown token.
_TOO_LONG = "an argument is too long: over the length any deleatur name or note may have"
#: What an Authorization header can carry of a key (a deleatur key is of these characters).
_API_KEY = re.compile(r"[\x21-\x7e]+")
_PINS_REFUSED = (
    "pins are checked only where the verification runs, and over HTTP the server would check its own"
    " store against them: verify a copy of the store with the library, or with 'deleatur log verify"
    " --expected-pubkey ... --expected-checkpoint ...'"
)


def _record(record_id: str) -> str:
    # Named as the library's get and receipt name it.
    return _segment(record_id, "record_id", lambda value: check_record_id(value, "record_id"))


def _request_segment(request_id: str) -> str:
    return _segment(request_id, "request_id", check_request_id)


def _segment(value: str, name: str, check: Callable[[str], object] | None = None) -> str:
    """A path segment, percent-encoded: a subject or user id may hold '/', '?' or '#'
    (the routes that take one take the rest of the path). A segment "." or ".." goes as
    %2E, since URL normalization would remove it and the call would reach another route.
    ``check`` is the library's own check of an id whose route takes one segment: an empty
    id, or one holding '/', would reach another route, so what the library refuses is
    refused here, with the library's error."""
    check_type(value, str, name)
    if check is not None:
        check(value)
    try:
        quoted = quote(value, safe="")
    except UnicodeEncodeError:
        raise InvalidInputError(_NOT_UTF8) from None
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def _no_pins(*pins: object) -> None:
    if any(pin is not None for pin in pins):
        raise InvalidInputError(_PINS_REFUSED)


def _page_size(limit: int | None, done: int) -> int:
    return _PAGE if limit is None else min(_PAGE, limit - done)


def _stream(fetch: Callable[[C, int], tuple[builtins.list[T], C | None]], cursor: C, limit: int | None) -> Iterator[T]:
    """The items of a paged route, streamed: ``fetch(cursor, done)`` gets a page and the
    cursor of the next (None after the last). The first page is fetched now, so a refusal
    is raised when the call is made, as the library raises it; the next ones as the items
    are read, until the last page or ``limit`` items."""

    def rest(items: builtins.list[T], following: C | None) -> Iterator[T]:
        done = 0
        while True:
            yield from items
            done += len(items)
            if following is None or (limit is not None and done >= limit):
                return
            items, following = fetch(following, done)

    return rest(*fetch(cursor, 0))


def _document(value: str | bytes | Mapping[str, Any], what: str) -> str | dict[str, Any]:
    """A signed document as a verify route takes it: its text goes as a string, so the
    server verifies it as written (parsed here and sent again, a key it repeats would
    have lost a value); a mapping the caller parsed goes as its object."""
    if isinstance(value, bytes):
        return utf8_text(value, what)
    return value if isinstance(value, str) else dict(value)


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _encode(body: Mapping[str, Any]) -> bytes:
    """A request body, encoded here rather than by httpx, so an argument the library
    would refuse as bad input (metadata holding an object, a NaN confidence) is bad
    input here too, not a TypeError."""
    try:
        return json.dumps(dict(body), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(_NOT_UTF8) from None
    except (TypeError, ValueError, RecursionError):
        raise InvalidInputError(_NOT_JSON) from None


def _page(data: Any) -> tuple[list[Record], str | None]:
    return [Record.from_json(r) for r in data["records"]], data["next"]


def _requests_page(data: Any) -> tuple[list[ErasureRequest], str | None]:
    return [ErasureRequest.from_json(r) for r in data["requests"]], data["next"]


class Client:
    """``transport`` (e.g. ``httpx.MockTransport``) or a whole ``http`` client (e.g.
    Starlette's ``TestClient``) replace the network for tests."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        if api_key is not None and not _API_KEY.fullmatch(check_type(api_key, str, "api_key")):
            raise InvalidInputError("api_key is not a deleatur API key: it must be printable ASCII, with no spaces")
        if httpx.URL(check_type(base_url, str, "base_url")).path.rstrip("/").endswith("/v1"):
            # Every route begins with /v1: given twice, every call would be a bare 404.
            raise InvalidInputError(f"base_url {base_url} ends in /v1: give the server's root, the client adds /v1")
        headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout, transport=transport)
        self.http.headers.update(headers)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Request:
        """A request, built here so that an argument no request can carry is bad input,
        as the library calls it, and not httpx's error."""
        content = None if body is None else _encode(body)
        sent = dict(headers or {}) | ({} if content is None else {"Content-Type": "application/json"})
        try:
            return self.http.build_request(method, path, params=_drop_none(params or {}), content=content, headers=sent)
        except UnicodeEncodeError:
            raise InvalidInputError(_NOT_UTF8) from None
        except httpx.InvalidURL:
            raise InvalidInputError(_TOO_LONG) from None

    def _call(
        self,
        read: Callable[[Any], T],
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> T:
        """One request; ``read`` makes the library's type of the answer's JSON."""
        request = self._request(method, path, params=params, body=body, headers=headers)
        try:
            response = self.http.send(request)
        except httpx.TransportError as exc:
            # The library's callers catch DeleaturError: so must a remote store's.
            raise DeleaturError(f"cannot reach the deleatur server at {self.http.base_url}: {exc}") from None
        if response.status_code >= 400:
            raise _error(response)
        try:
            return read(response.json())
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, InvalidInputError):
            # The server's failure, not the caller's bad input, though the library's checks
            # of what it read say InvalidInputError. Not naming the path: it may hold a subject.
            raise DeleaturError(
                f"the server's answer to this {method} request is not what this client reads"
                " (another deleatur version?)"
            ) from None

    # -- memories ------------------------------------------------------------------

    def remember(
        self,
        text: str,
        *,
        subject: str,
        space: Space = DEFAULT_SPACE,
        key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        source: str | None = None,
        confidence: float | None = None,
        derived_from: Iterable[str] = (),
        expires_at: int | str | None = None,
        for_legal_claim: bool = False,
    ) -> Record:
        check_flags(for_legal_claim=for_legal_claim)
        # Checked by the library's rules: the server would take what JSON can carry of them.
        # A time given as text is the server's to read, against its own clock.
        item = NewMemory(
            text=text,
            subject=subject,
            key=key,
            metadata={} if metadata is None else metadata,
            source=source,
            confidence=confidence,
            derived_from=derived_from,  # type: ignore[arg-type]  # any collection, checked as the library checks it
            expires_at=None if isinstance(expires_at, str) else expires_at,
        )
        body = {
            "text": item.text,
            "subject": item.subject,
            "key": item.key,
            "metadata": None if metadata is None else item.metadata,
            "source": item.source,
            "confidence": item.confidence,
            "derived_from": builtins.list(item.derived_from),
            "expires_at": expires_at,
            "for_legal_claim": for_legal_claim,
            **_space(space),
        }
        return self._call(Record.from_json, "POST", "/v1/memories", body=_drop_none(body))

    def recall(self, query: str, *, space: Space = DEFAULT_SPACE, limit: int = 10) -> builtins.list[Hit]:
        """Hits, best first: records with their ``score``. The query goes in the body: the
        library takes one of any length, which a URL cannot carry, and a URL is logged."""
        return self._search(lambda d: [Hit.from_json(h) for h in _hits(d)], query, space, limit)

    def recall_json(
        self, query: str, *, space: Space = DEFAULT_SPACE, limit: int = 10
    ) -> builtins.list[dict[str, Any]]:
        """:meth:`recall`'s hits as the server sent them (:meth:`Hit.to_json`)."""
        return self._search(_hits, query, space, limit)

    def _search(self, read: Callable[[Any], T], query: str, space: Space, limit: int) -> T:
        body = {"q": check_query(query), "limit": check_recall_limit(limit), **_space(space)}
        return self._call(read, "POST", "/v1/memories/search", body=body)

    def get(self, record_id: str, *, space: Space = DEFAULT_SPACE) -> Record:
        path = f"/v1/memories/{_record(record_id)}"
        return self._call(Record.from_json, "GET", path, params=_space(space))

    def list(
        self,
        *,
        space: Space = DEFAULT_SPACE,
        subject: str | None = None,
        key: str | None = None,
        include_history: bool = False,
        limit: int | None = None,
        after: str | None = None,
    ) -> Iterator[Record]:
        """Every record (or the first ``limit``), oldest first, streamed as the library's
        ``list`` streams them: the server's pages are followed to the end, never silently
        cut."""
        _strings(subject=subject, key=key)
        check_flags(include_history=include_history)
        params = {"subject": subject, "key": key, "history": include_history, **_space(space)}
        return self._records("/v1/memories", params, limit, after)

    def history(self, key: str, *, space: Space = DEFAULT_SPACE) -> builtins.list[Record]:
        """Every version, as the library returns them: the server's pages, followed to the end."""
        return builtins.list(self.versions(key, space=space))

    def versions(
        self, key: str, *, space: Space = DEFAULT_SPACE, limit: int | None = None, after: str | None = None
    ) -> Iterator[Record]:
        """The versions (or the first ``limit``), streamed as the library's ``versions``
        streams them, through the server's pages."""
        check_type(key, str, "key")
        return self._records("/v1/history", {"key": key, **_space(space)}, limit, after)

    def _records(self, route: str, params: dict[str, Any], limit: int | None, after: str | None) -> Iterator[Record]:
        """The records of a paged route, from after ``after``, to its end or ``limit``."""
        if limit is not None:
            # The pages ask for at most _PAGE records: the server never sees this limit.
            check_int(limit, "limit", low=1)
        if after is not None:
            check_record_id(after, "after")

        def fetch(cursor: str | None, done: int) -> tuple[builtins.list[Record], str | None]:
            page = {**params, "limit": _page_size(limit, done), "after": cursor}
            return self._call(_page, "GET", route, params=page)

        return _stream(fetch, after, limit)

    def forget(self, *, space: Space = DEFAULT_SPACE, record_id: str | None = None, key: str | None = None) -> Record:
        _strings(key=key)
        if record_id is not None:
            check_record_id(record_id, "record_id")
        body = _drop_none({"id": record_id, "key": key, **_space(space)})
        return self._call(Record.from_json, "POST", "/v1/forget", body=body)

    def rectify(
        self,
        key: str,
        text: str,
        *,
        reason: str,
        actor: str | None = None,
        space: Space = DEFAULT_SPACE,
        erase_previous: bool = False,
        for_legal_claim: bool = False,
    ) -> Record:
        """The server records the actor as '<actor> (via <the key's principal>)', or as the
        principal alone without one."""
        check_type(key, str, "key")
        check_type(text, str, "text")
        check_stated(reason, "reason", missing=RECTIFY_NEEDS_REASON)
        _strings(actor=actor)
        check_flags(erase_previous=erase_previous, for_legal_claim=for_legal_claim)
        body = {
            "key": key,
            "text": text,
            "reason": reason,
            "actor": actor,
            "erase_previous": erase_previous,
            "for_legal_claim": for_legal_claim,
            **_space(space),
        }
        return self._call(Record.from_json, "POST", "/v1/rectify", body=_drop_none(body))

    def receipt(self, record_id: str, *, space: Space = DEFAULT_SPACE) -> Receipt:
        path = f"/v1/memories/{_record(record_id)}/receipt"
        return self._call(Receipt.from_json, "GET", path, params=_space(space))

    # -- erasure (Art. 17) --------------------------------------------------------------

    def erase(
        self,
        subject: str,
        *,
        request_id: str | None = None,
        basis: str = DEFAULT_BASIS,
        requester: str | None = None,
        scope: SpaceFilter = EVERYWHERE,
        dry_run: bool = False,
        allow_ambiguous: bool = False,
        issue_token: bool = False,
        confirmation: str | None = None,
        require_confirmation: bool = False,
    ) -> ErasureResult:
        """The request the erasure made (its ``plan`` is None: the server does not send
        back what it erased), or with ``dry_run`` the plan (and ``token`` with
        ``issue_token``). Repeating ``request_id`` is safe. The server records the
        requester as '<requester> (via <the key's principal>)', or the principal alone."""
        check_flags(allow_ambiguous=allow_ambiguous)
        check_type(scope, SpaceFilter, "scope")
        asked = _asked(basis, requester, confirmation, require_confirmation)
        if _dry_run(dry_run, issue_token, require_confirmation):
            return self._plan(
                {"subject": subject, **scope.to_json(), "issue_token": issue_token, **_terms(basis, requester)}
            )
        where = {"allow_ambiguous": allow_ambiguous, **scope.to_json()}
        return self._erase(f"/v1/subjects/{_segment(subject, 'subject')}", request_id, {**asked, **where})

    def erase_all(
        self,
        *,
        user_id: str,
        request_id: str | None = None,
        basis: str = DEFAULT_BASIS,
        requester: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        dry_run: bool = False,
        issue_token: bool = False,
        confirmation: str | None = None,
        require_confirmation: bool = False,
    ) -> ErasureResult:
        check_type(user_id, str, "user_id")
        _strings(agent_id=agent_id, run_id=run_id)
        asked = _asked(basis, requester, confirmation, require_confirmation)
        if _dry_run(dry_run, issue_token, require_confirmation):
            where = {"user_id": user_id, "agent_id": agent_id, "run_id": run_id}
            return self._plan({**where, "issue_token": issue_token, **_terms(basis, requester)})
        where = {"agent_id": agent_id, "run_id": run_id}
        return self._erase(f"/v1/users/{_segment(user_id, 'user_id')}", request_id, {**asked, **where})

    def _erase(self, path: str, request_id: str | None, params: Mapping[str, Any]) -> ErasureResult:
        """An erasure that runs: a DELETE whose Idempotency-Key is the request id."""
        _strings(request_id=request_id)
        headers = {} if request_id is None else {"Idempotency-Key": request_id}
        return self._call(ErasureResult.from_json, "DELETE", path, params=params, headers=headers)

    def _plan(self, body: Mapping[str, Any]) -> ErasureResult:
        return self._call(ErasureResult.from_json, "POST", "/v1/erasure-plans", body=_drop_none(body))

    def erasure_request(self, request_id: str) -> ErasureRequest:
        """Status and phases, with timestamps."""
        path = f"/v1/erasures/{_request_segment(request_id)}"
        return self._call(ErasureRequest.from_json, "GET", path)

    def erasure_requests(self, *, limit: int | None = None, after: str | None = None) -> builtins.list[ErasureRequest]:
        """All of them (or the first ``limit``), the server's pages followed to the end."""
        if limit is not None:
            check_int(limit, "limit", low=1)
        if after is not None:
            check_request_id(after)

        def fetch(cursor: str | None, done: int) -> tuple[builtins.list[ErasureRequest], str | None]:
            page = {"limit": _page_size(limit, done), "after": cursor}
            return self._call(_requests_page, "GET", "/v1/erasures", params=_drop_none(page))

        return builtins.list(_stream(fetch, after, limit))[:limit]

    def certificate(self, request_id: str) -> dict[str, Any]:
        return self._call(dict, "GET", f"/v1/erasures/{_request_segment(request_id)}/certificate")

    def verify_certificate(
        self, certificate: str | bytes | Mapping[str, Any], *, expected_pubkey: str | None = None
    ) -> Report:
        """The server's verification of a certificate: give its text (``str``, or UTF-8
        ``bytes``), as issued or read from a file, for the verdict ``deleatur verify`` and
        the library give that text (a repeated key or an unsigned member fails check 1;
        text that is not JSON is refused as bad input). A mapping, already parsed, is
        checked as what the parser left of it."""
        body = {"certificate": _document(certificate, "the certificate"), "expected_pubkey": expected_pubkey}
        return self._call(Report.from_json, "POST", "/v1/certificates/verify", body=_drop_none(body))

    def purge(
        self,
        *,
        older_than_days: float | None = None,
        request_id: str | None = None,
        dry_run: bool = False,
        issue_token: bool = False,
        confirmation: str | None = None,
    ) -> ErasureResult:
        check_flags(dry_run=dry_run, issue_token=issue_token)
        _strings(request_id=request_id, confirmation=confirmation)
        if older_than_days is not None:
            check_number(older_than_days, "older_than_days")
        body = {
            "older_than_days": older_than_days,
            "request_id": request_id,
            "dry_run": dry_run,
            "issue_token": issue_token,
            "confirmation": confirmation,
        }
        return self._call(ErasureResult.from_json, "POST", "/v1/purge", body=_drop_none(body))

    # -- decisions -------------------------------------------------------------------------

    def record_decision(
        self, summary: str, used: Iterable[str], *, space: Space = DEFAULT_SPACE, for_legal_claim: bool = False
    ) -> Decision:
        check_stated(summary, "summary", missing=DECISION_NEEDS_SUMMARY, max_bytes=MAX_SUMMARY_BYTES)
        check_flags(for_legal_claim=for_legal_claim)
        body = {
            "summary": summary,
            "used": check_items(used, str, "used"),
            "for_legal_claim": for_legal_claim,
            **_space(space),
        }
        return self._call(Decision.from_json, "POST", "/v1/decisions", body=body)

    def explain_decision(self, decision_id: str, *, space: Space = DEFAULT_SPACE) -> Decision:
        """The snapshot the server checked (hash and signature); it is not checked again here."""
        path = f"/v1/decisions/{_segment(decision_id, 'decision_id')}"
        return self._call(Decision.from_json, "GET", path, params=_space(space))

    # -- restriction (Art. 18), export (Art. 15/20) -----------------------------------------

    def restrict(self, subject: str, *, reason: str, actor: str | None = None) -> Restriction:
        """The server records the actor as ``rectify`` does."""
        check_type(subject, str, "subject")
        check_stated(reason, "reason", missing=RESTRICTION_NEEDS_REASON)
        _strings(actor=actor)
        body = _drop_none({"subject": subject, "reason": reason, "actor": actor})
        return self._call(Restriction.from_json, "POST", "/v1/restrictions", body=body)

    def unrestrict(self, subject: str, *, actor: str | None = None) -> None:
        _strings(actor=actor)
        path = f"/v1/restrictions/{_segment(subject, 'subject')}"
        self._call(lambda _: None, "DELETE", path, params={"actor": actor})

    def restrictions(self) -> builtins.list[Restriction]:
        return self._call(lambda d: [Restriction.from_json(r) for r in d["restrictions"]], "GET", "/v1/restrictions")

    def export_json(self, out: TextSink, *, subject: str | None = None, user_id: str | None = None) -> dict[str, int]:
        """Stream the ``deleatur-export/v1`` document into ``out``, never holding it
        whole; returns its counts (the document's last member)."""
        _strings(subject=subject, user_id=user_id)
        request = self._request("GET", "/v1/export", params={"subject": subject, "user_id": user_id})
        tail = ""
        try:
            response = self.http.send(request, stream=True)
            try:
                if response.status_code >= 400:
                    response.read()
                    raise _error(response)
                for text in response.iter_text():
                    out.write(text)
                    tail = (tail + text)[-_COUNTS_TAIL:]
            finally:
                response.close()
        except httpx.HTTPError:
            raise DeleaturError("the export was cut short: what was written is incomplete") from None
        # The document's last member; anchored at its end, so no record's metadata can pose as it.
        found = _COUNTS.search(tail)
        if found is None:
            raise DeleaturError("the export was cut short: it does not end with its counts")
        counts: dict[str, int] = json.loads(found.group(1))
        return counts

    # -- the log --------------------------------------------------------------------------

    def checkpoint(self, *, size: int | None = None) -> Note:
        """The latest signed checkpoint, or the stored one of ``size``."""
        _size(size)
        return self._call(lambda d: Note.parse(d["checkpoint"]), "GET", "/v1/checkpoint", params={"size": size})

    def public_key(self) -> Verifier:
        """The log's current verifier key: as the server says; pin one obtained out of band."""
        return self._call(lambda d: Verifier.from_vkey(d["vkey"]), "GET", "/v1/public-key")

    def verify_log(
        self,
        *,
        pinned_keys: builtins.list[Verifier] | None = None,
        pinned_checkpoint: Note | None = None,
        size: int | None = None,
    ) -> Report:
        """The server's verification of its log (as of its stored checkpoint of ``size``,
        or of one it signs now), unpinned: pins are refused (see the module)."""
        _no_pins(pinned_keys, pinned_checkpoint)
        _size(size)
        return self._call(Report.from_json, "GET", "/v1/log/verify", params={"size": size})

    # -- the audit trail --------------------------------------------------------------------

    def audit_entries(
        self,
        *,
        start: int = 0,
        limit: int | None = None,
        calls_only: bool = False,
        actor: str | None = None,
        scan: int | None = None,
    ) -> AuditTrail:
        """The audit trail of the key's tenant, oldest first from log index ``start``,
        streamed as ``list`` streams records, from at most ``scan`` of the log's entries
        (the server reads a bounded number for each page). Each page read is itself
        audited, so the trail grows as it is read; the stream ends where the pages end."""
        if limit is not None:
            check_int(limit, "limit", low=1)  # as for list: the pages ask for less
        if scan is not None:
            check_int(scan, "scan", low=1)
        check_int(start, "start", low=0)
        check_flags(calls_only=calls_only)
        _strings(actor=actor)

        def read(trail: AuditTrail) -> Iterator[AuditEntry]:
            def fetch(begin: int, done: int) -> tuple[builtins.list[AuditEntry], int | None]:
                left = None if scan is None else scan - (begin - start)
                params = {"start": begin, "limit": _page_size(limit, done), "scan": left}
                entries, trail.resume = self._call(
                    _audit_page, "GET", "/v1/audit", params={**params, "calls_only": calls_only, "actor": actor}
                )
                # Log indexes run on without a gap: the entries read so far are those before resume.
                scanned = trail.resume is not None and scan is not None and trail.resume - start >= scan
                return entries, None if scanned else trail.resume

            return _stream(fetch, start, limit)

        return AuditTrail(start, read)

    def verify_audit(
        self, *, pinned_keys: builtins.list[Verifier] | None = None, state: Path | None = None, size: int | None = None
    ) -> Report:
        """The server's verification of the whole trail (as of ``size``, as ``verify_log``);
        pins and an auditor's ``state`` are refused, as ``verify_log`` refuses pins."""
        _no_pins(pinned_keys, state)
        _size(size)
        return self._call(Report.from_json, "GET", "/v1/audit/verify", params={"size": size})

    def verify_receipt(self, receipt: Receipt | str | bytes | Mapping[str, Any], *, key: str | None = None) -> Report:
        """A receipt (as ``receipt`` returns it, its JSON text as ``deleatur verify-receipt``
        reads it from a file, or the value parsed from it) checked by the server, under
        ``key`` or, unpinned, the store's own keys."""
        document = receipt.to_json() if isinstance(receipt, Receipt) else _document(receipt, "the receipt")
        body = _drop_none({"receipt": document, "key": key})
        return self._call(Report.from_json, "POST", "/v1/receipts/verify", body=body)


def _audit_page(data: Any) -> tuple[builtins.list[AuditEntry], int | None]:
    return [AuditEntry.from_json(e) for e in data["entries"]], data["next"]


def _asked(basis: str, requester: str | None, confirmation: str | None, require: bool) -> dict[str, Any]:
    """An erasure DELETE's query: what the request asks, beside where it erases."""
    check_stated(basis, "basis", missing=NEEDS_BASIS)
    _strings(requester=requester, confirmation=confirmation)
    return {"basis": basis, "requester": requester, "confirmation": confirmation, "require_confirmation": require}


def _terms(basis: str, requester: str | None) -> dict[str, str | None]:
    """What a dry run's token confirms beside its plan. The default basis is left for the
    server to fill in: a server older than the terms takes no such member."""
    return {"basis": None if basis == DEFAULT_BASIS else basis, "requester": requester}


def _size(size: int | None) -> None:
    if size is not None:
        check_int(size, "size", low=0)


def _dry_run(dry_run: bool, issue_token: bool, require_confirmation: bool) -> bool:
    """Whether an erasure is a dry run. A token asked for outside one is refused, as the
    library refuses it: the DELETE routes take no such argument, and would erase. Each
    flag is True or False, as the library takes them: any other value, sent as text,
    would decide whether the server erases."""
    check_flags(dry_run=dry_run, issue_token=issue_token, require_confirmation=require_confirmation)
    if issue_token and not dry_run:
        raise InvalidInputError(DRY_RUN_FIRST)
    return dry_run


def _error(response: httpx.Response) -> DeleaturError:
    try:
        payload = response.json()
    except ValueError:
        payload = None
    return remote_error(response.status_code, payload)


__all__ = ["Client"]
