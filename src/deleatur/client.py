"""A client for the HTTP API with the embedded library's calls.

``Client`` has :class:`~deleatur.Memory`'s method names and keyword arguments, so
a service can move between an embedded store and a remote one by changing how
it gets the object. Results are the JSON the API returns (records as
``Record.to_json()`` prints them); refusals raise the library's own errors
(``NotFoundError``, ``InvalidInputError``, ...) carrying ``status`` and ``code``.

    with Client("http://127.0.0.1:8765", api_key=KEY) as memory:
        record = memory.remember("Alice prefers email", subject="Alice Martin")
        memory.erase("Alice Martin", request_id="DSAR-17", basis="Art. 17(1)(a)")
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from .errors import DeleaturError, InvalidInputError
from .model import DEFAULT_SPACE, EVERYWHERE, Space, SpaceFilter
from .rights.export import TextSink
from .servers.errors import remote_error

DEFAULT_URL = "http://127.0.0.1:8765"
DEFAULT_BASIS = "Art. 17"


#: Records per page when following the server's list pages.
_PAGE = 1000
#: How much of an export's end is kept to read its counts from.
_COUNTS_TAIL = 4096
_COUNTS = re.compile(r', "counts": (\{[^{}]*\})\}\s*\Z')


def _space(space: Space) -> dict[str, str]:
    return {"user_id": space.user_id, "agent_id": space.agent_id, "run_id": space.run_id}


#: An argument holding a lone surrogate (what a bad decode leaves) cannot go into a request.
_NOT_UTF8 = "an argument is not valid UTF-8 (it holds a lone surrogate)"


def _segment(value: str) -> str:
    """A path segment: a subject or user id may hold '/', '?' or '#'."""
    try:
        return quote(value, safe="")
    except UnicodeEncodeError:
        raise InvalidInputError(_NOT_UTF8) from None


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


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
        headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout, transport=transport)
        self.http.headers.update(headers)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        payload = None if body is None else dict(body)
        try:
            response = self.http.request(method, path, params=_drop_none(params or {}), json=payload, headers=headers)
        except UnicodeEncodeError:
            raise InvalidInputError(_NOT_UTF8) from None
        except httpx.TransportError as exc:
            # The library's callers catch DeleaturError: so must a remote store's.
            raise DeleaturError(f"cannot reach the deleatur server at {self.http.base_url}: {exc}") from None
        if response.status_code >= 400:
            raise _error(response)
        return response.json()

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
        expires_at: int | None = None,
        for_legal_claim: bool = False,
    ) -> dict[str, Any]:
        body = {
            "text": text,
            "subject": subject,
            "key": key,
            "metadata": None if metadata is None else dict(metadata),
            "source": source,
            "confidence": confidence,
            "derived_from": builtins.list(derived_from),
            "expires_at": expires_at,
            "for_legal_claim": for_legal_claim,
            **_space(space),
        }
        result: dict[str, Any] = self._call("POST", "/v1/memories", body=_drop_none(body))
        return result

    def recall(self, query: str, *, space: Space = DEFAULT_SPACE, limit: int = 10) -> builtins.list[dict[str, Any]]:
        """Hits, best first: records with their ``score``."""
        hits: builtins.list[dict[str, Any]] = self._call(
            "GET", "/v1/memories/search", params={"q": query, "limit": limit, **_space(space)}
        )["hits"]
        return hits

    def get(self, record_id: str, *, space: Space = DEFAULT_SPACE) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/memories/{_segment(record_id)}", params=_space(space))
        return result

    def list(
        self,
        *,
        space: Space = DEFAULT_SPACE,
        subject: str | None = None,
        key: str | None = None,
        include_history: bool = False,
        limit: int | None = None,
    ) -> builtins.list[dict[str, Any]]:
        """Every record (or the first ``limit``), as the library's ``list``: the pages the
        server hands out are followed to the end, never silently cut."""
        params: dict[str, Any] = {"subject": subject, "key": key, "history": include_history, **_space(space)}
        records: builtins.list[dict[str, Any]] = []
        after = None
        while limit is None or len(records) < limit:
            page_size = _PAGE if limit is None else min(_PAGE, limit - len(records))
            page = self._call("GET", "/v1/memories", params={**params, "limit": page_size, "after": after})
            records += page["records"]
            after = page["next"]
            if after is None:
                break
        return records

    def history(self, key: str, *, space: Space = DEFAULT_SPACE) -> builtins.list[dict[str, Any]]:
        records: builtins.list[dict[str, Any]] = self._call("GET", "/v1/history", params={"key": key, **_space(space)})[
            "records"
        ]
        return records

    def forget(
        self, *, space: Space = DEFAULT_SPACE, record_id: str | None = None, key: str | None = None
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", "/v1/forget", body=_drop_none({"id": record_id, "key": key, **_space(space)})
        )
        return result

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
    ) -> dict[str, Any]:
        body = {
            "key": key,
            "text": text,
            "reason": reason,
            "actor": actor,
            "erase_previous": erase_previous,
            "for_legal_claim": for_legal_claim,
            **_space(space),
        }
        result: dict[str, Any] = self._call("POST", "/v1/rectify", body=_drop_none(body))
        return result

    def receipt(self, record_id: str, *, space: Space = DEFAULT_SPACE) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/memories/{_segment(record_id)}/receipt", params=_space(space))
        return result

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
    ) -> dict[str, Any]:
        """The 202 body (``request_id``, ``status``, ``counts``...), or with ``dry_run``
        the plan (and ``token`` with ``issue_token``). Repeating ``request_id`` is safe.
        The server records the requester as '<requester> (via <the key's principal>)',
        or the principal alone."""
        if dry_run:
            return self._plan({"subject": subject, **scope.to_json(), "issue_token": issue_token})
        asked = {"basis": basis, "requester": requester, "confirmation": confirmation}
        params = {**asked, "allow_ambiguous": allow_ambiguous, **scope.to_json()}
        result: dict[str, Any] = self._call(
            "DELETE", f"/v1/subjects/{_segment(subject)}", params=params, headers=_idempotency(request_id)
        )
        return result

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
    ) -> dict[str, Any]:
        if dry_run:
            return self._plan({"user_id": user_id, "agent_id": agent_id, "run_id": run_id, "issue_token": issue_token})
        asked = {"basis": basis, "requester": requester, "confirmation": confirmation}
        params = {**asked, "agent_id": agent_id, "run_id": run_id}
        result: dict[str, Any] = self._call(
            "DELETE", f"/v1/users/{_segment(user_id)}", params=params, headers=_idempotency(request_id)
        )
        return result

    def _plan(self, body: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/v1/erasure-plans", body=_drop_none(body))
        return result

    def erasure_request(self, request_id: str) -> dict[str, Any]:
        """Status and phases, with timestamps."""
        result: dict[str, Any] = self._call("GET", f"/v1/erasures/{_segment(request_id)}")
        return result

    def erasure_requests(self) -> builtins.list[dict[str, Any]]:
        requests: builtins.list[dict[str, Any]] = self._call("GET", "/v1/erasures")["requests"]
        return requests

    def certificate(self, request_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/erasures/{_segment(request_id)}/certificate")
        return result

    def verify_certificate(
        self, certificate: Mapping[str, Any], *, expected_pubkey: str | None = None
    ) -> dict[str, Any]:
        body = {"certificate": dict(certificate), "expected_pubkey": expected_pubkey}
        result: dict[str, Any] = self._call("POST", "/v1/certificates/verify", body=_drop_none(body))
        return result

    def purge(
        self,
        *,
        older_than_days: float | None = None,
        request_id: str | None = None,
        dry_run: bool = False,
        issue_token: bool = False,
        confirmation: str | None = None,
    ) -> dict[str, Any]:
        body = {
            "older_than_days": older_than_days,
            "request_id": request_id,
            "dry_run": dry_run,
            "issue_token": issue_token,
            "confirmation": confirmation,
        }
        result: dict[str, Any] = self._call("POST", "/v1/purge", body=_drop_none(body))
        return result

    # -- decisions -------------------------------------------------------------------------

    def record_decision(
        self, summary: str, used: Iterable[str], *, space: Space = DEFAULT_SPACE, for_legal_claim: bool = False
    ) -> dict[str, Any]:
        body = {"summary": summary, "used": builtins.list(used), "for_legal_claim": for_legal_claim, **_space(space)}
        result: dict[str, Any] = self._call("POST", "/v1/decisions", body=body)
        return result

    def explain_decision(self, decision_id: str, *, space: Space = DEFAULT_SPACE) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/decisions/{_segment(decision_id)}", params=_space(space))
        return result

    # -- restriction (Art. 18), export (Art. 15/20) -----------------------------------------

    def restrict(self, subject: str, *, reason: str, actor: str | None = None) -> dict[str, Any]:
        """The server records the actor as ``rectify`` does."""
        body = _drop_none({"subject": subject, "reason": reason, "actor": actor})
        result: dict[str, Any] = self._call("POST", "/v1/restrictions", body=body)
        return result

    def unrestrict(self, subject: str, *, actor: str | None = None) -> None:
        self._call("DELETE", f"/v1/restrictions/{_segment(subject)}", params={"actor": actor})

    def restrictions(self) -> builtins.list[dict[str, Any]]:
        restrictions: builtins.list[dict[str, Any]] = self._call("GET", "/v1/restrictions")["restrictions"]
        return restrictions

    def export_json(self, out: TextSink, *, subject: str | None = None, user_id: str | None = None) -> dict[str, int]:
        """Stream the ``deleatur-export/v1`` document into ``out``, never holding it
        whole; returns its counts (the document's last member)."""
        params = _drop_none({"subject": subject, "user_id": user_id})
        tail = ""
        try:
            with self.http.stream("GET", "/v1/export", params=params) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error(response)
                for text in response.iter_text():
                    out.write(text)
                    tail = (tail + text)[-_COUNTS_TAIL:]
        except UnicodeEncodeError:
            raise InvalidInputError(_NOT_UTF8) from None
        except httpx.HTTPError:
            raise DeleaturError("the export was cut short: what was written is incomplete") from None
        # The document's last member; anchored at its end, so no record's metadata can pose as it.
        found = _COUNTS.search(tail)
        if found is None:
            raise DeleaturError("the export was cut short: it does not end with its counts")
        counts: dict[str, int] = json.loads(found.group(1))
        return counts

    # -- the log --------------------------------------------------------------------------

    def checkpoint(self, *, size: int | None = None) -> str:
        """The latest signed checkpoint, or the stored one of ``size``, as note text."""
        text: str = self._call("GET", "/v1/checkpoint", params={"size": size})["checkpoint"]
        return text

    def public_key(self) -> dict[str, str]:
        result: dict[str, str] = self._call("GET", "/v1/public-key")
        return result

    def verify_log(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/log/verify")
        return result

    def verify_receipt(self, receipt: Mapping[str, Any], *, key: str | None = None) -> dict[str, Any]:
        body = {"receipt": dict(receipt), "key": key}
        result: dict[str, Any] = self._call("POST", "/v1/receipts/verify", body=_drop_none(body))
        return result


def _idempotency(request_id: str | None) -> dict[str, str]:
    return {} if request_id is None else {"Idempotency-Key": request_id}


def _error(response: httpx.Response) -> DeleaturError:
    try:
        payload = response.json()
    except ValueError:
        payload = None
    return remote_error(response.status_code, payload)


__all__ = ["Client"]
