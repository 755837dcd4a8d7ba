"""The HTTP API through real clients: httpx and deleatur.client against uvicorn on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import itertools
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio.to_thread
import apsw
import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from deleatur import (
    AccessDeniedError,
    AuditBatch,
    AuthenticationError,
    Checkpoint,
    DeleaturError,
    IntegrityError,
    InvalidInputError,
    Memory,
    NewMemory,
    NotFoundError,
    Role,
    Status,
    from_bytes,
)
from deleatur.access.principals import split_api_key
from deleatur.client import Client
from deleatur.clock import isoformat
from deleatur.erasure.engine import AmbiguousSubjectError, ConfirmationRequiredError
from deleatur.erasure.requests import RequestStatus, is_request_id
from deleatur.erasure.verify import verify_certificate
from deleatur.log.note import Note
from deleatur.model import Space, SpaceFilter
from deleatur.servers.calls import MAX_AUDIT_SCAN, MAX_EXPORTS
from deleatur.servers.errors import ERROR_CODES
from deleatur.servers.http import create_app
from deleatur.servers.pool import HandlePool
from deleatur.store.evidence import StoreEvidence
from deleatur.store.sqlite import SQLiteBackend

from .conftest import MASTER, Cli, FakeClock, store_files
from .serving import (
    api_key,
    assert_refused_unechoed,
    assert_the_librarys_report,
    certificate_texts,
    new_store,
    paged_by_bytes,
    reads_of_records,
    receipt_texts,
    serving,
)

Keys = dict[Role, str]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Keys]]:
    opener = new_store(tmp_path_factory.mktemp("http") / "mem.db")
    keys = {role: api_key(opener, role) for role in Role}
    with serving(create_app(opener, max_body_bytes=64 * 1024)) as url:
        yield url, keys


@pytest.fixture
def base_url(server: tuple[str, Keys]) -> str:
    return server[0]


@pytest.fixture
def keys(server: tuple[str, Keys]) -> Keys:
    return server[1]


@pytest.fixture
def admin(keys: Keys) -> dict[str, str]:
    return {"Authorization": f"Bearer {keys[Role.ADMIN]}"}


@pytest.fixture
def client(base_url: str, keys: Keys) -> Iterator[Client]:
    with Client(base_url, api_key=keys[Role.ADMIN]) as made:
        yield made


def test_memories_round_trip(client: Client) -> None:
    space = Space("rt-user", agent_id="support")
    first = client.remember("Alice's phone is +100", subject="Alice Martin", key="alice::phone", space=space)
    assert first.status is Status.ACTIVE
    assert client.get(first.id, space=space).text == "Alice's phone is +100"
    with pytest.raises(NotFoundError) as missing:
        client.get(first.id)  # another space: reported like a missing id
    assert missing.value.code == "not_found"  # type: ignore[attr-defined]
    client.remember("Alice prefers email", subject="Alice Martin", space=space, metadata={"channel": "crm"})
    [hit] = client.recall("email", space=space)
    assert hit.record.metadata == {"channel": "crm"}
    assert hit.score > 0
    fixed = client.rectify("alice::phone", "Alice's phone is +101", reason="typo", actor="dpo", space=space)
    assert fixed.supersedes == first.id
    assert [r.text for r in client.history("alice::phone", space=space)] == [
        "Alice's phone is +100",
        "Alice's phone is +101",
    ]
    retired = client.forget(space=space, key="alice::phone")
    assert retired.status is Status.RETIRED
    assert len(list(client.list(space=space))) == 1
    assert len(list(client.list(space=space, include_history=True))) == 3
    assert next(client.list(space=space, subject="alice martin", limit=1)).subject == "alice martin"


def test_no_request_is_logged_even_at_level_info(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A recall's URL holds its query's words, which no log of the server may keep, at
    any level: uvicorn's access log, on by default, wrote each request's path and query."""
    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER)}"}
    with serving(create_app(opener), log_level="info") as url:
        found = httpx.get(f"{url}/v1/memories/search", params={"q": "Zorblax"}, headers=headers)
        assert found.status_code == 200, found.text
    logged = "".join(capfd.readouterr())
    assert "Started server process" in logged  # the server did log, at level info
    assert "Zorblax" not in logged and "/v1/memories" not in logged


def test_receipt_and_log(client: Client) -> None:
    record = client.remember("receipt me", subject="Receipts")
    receipt = client.receipt(record.id)
    key = client.public_key()
    assert client.verify_receipt(receipt, key=key.vkey).ok
    assert client.verify_receipt(receipt.to_json(), key=key.vkey).ok  # a receipt's JSON, as kept in a file
    unpinned = client.verify_receipt(receipt)
    assert unpinned.ok
    assert "KEY NOT PINNED" in unpinned.notes[0]
    latest = client.checkpoint()
    assert latest.text.startswith(key.name + "\n")
    size = Checkpoint.parse(latest.text).size
    assert client.checkpoint(size=size) == latest  # a stored one, fetched by its size
    with pytest.raises(NotFoundError, match=f"no stored checkpoint of size {size + 10**6}"):
        client.checkpoint(size=size + 10**6)
    with pytest.raises(InvalidInputError, match="size must be an integer from 0 to"):
        client.checkpoint(size=2**64)  # beyond SQLite's integers: was a 500
    assert client.verify_log().ok


def test_erase_is_accepted_idempotent_and_certified(client: Client, base_url: str, admin: dict[str, str]) -> None:
    kept = client.remember("Bob likes tea", subject="Bob", space=Space("erase-user"))
    doomed = client.remember("Carol's address", subject="Carol Jones", space=Space("erase-user"))
    derived = client.remember("Carol, derived", subject="Team", derived_from=[doomed.id], space=Space("erase-user"))
    plan = client.erase("carol jones", dry_run=True, issue_token=True)
    assert plan.plan is not None and plan.plan.total == 2
    assert (plan.plan.subject, plan.plan.subjects) == ("carol jones", 2)
    assert plan.token
    response = httpx.delete(
        f"{base_url}/v1/subjects/Carol Jones",
        headers={"Idempotency-Key": "DSAR-1", **admin},
        params={"basis": "Art. 17(1)(a)"},
    )
    assert response.status_code == 202
    body = response.json()
    assert {body["request_id"], body["status"], body["counts"]["records"]} == {"DSAR-1", "complete", 2}
    assert response.headers["location"] == "/v1/erasures/DSAR-1"
    assert body["certificate_url"] == "/v1/erasures/DSAR-1/certificate"
    assert body["request"]["id"] == "DSAR-1"  # the whole request, beside the members that came first
    assert body["request"]["record_ids"] == [doomed.id, derived.id]  # direct, then through lineage
    again = client.erase("Carol Jones", request_id="DSAR-1", basis="Art. 17(1)(a)")
    assert again.repeated is True and again.request is not None
    assert isoformat(again.request.received_at) == body["requested_at"]
    status = client.erasure_request("DSAR-1")
    assert status.status is RequestStatus.COMPLETE
    assert [(p["name"], p["status"]) for p in status.phases()] == [
        ("received", "done"),
        ("records_erased", "done"),
        ("keys_destroyed", "done"),
    ]
    assert all(p["at"] for p in status.phases())
    certificate = client.certificate("DSAR-1")
    report = client.verify_certificate(certificate, expected_pubkey=client.public_key().vkey)
    assert report.ok
    tampered = json.loads(json.dumps(certificate))
    tampered["certificate"]["request"]["basis"] = "Art. 6"
    assert not client.verify_certificate(tampered).ok
    with pytest.raises(NotFoundError):
        client.get(doomed.id, space=Space("erase-user"))
    assert client.get(kept.id, space=Space("erase-user")).text == "Bob likes tea"
    assert "DSAR-1" in [r.id for r in client.erasure_requests()]


def test_a_certificate_is_verified_as_its_text(client: Client, base_url: str, admin: dict[str, str]) -> None:
    """The route gives a certificate's text the library's report, as `deleatur verify`
    does: a key repeated in it, or a member nothing signs, fails check 1, whether the text
    comes as a string or as the object itself, read as the text it has in the body. The
    body's parser used to refuse the repeat with a 422 that quoted the key, and the route
    verified what it had parsed."""
    client.remember("Erin's badge is 7", subject="Erin Example", space=Space("as-text"))
    client.erase("Erin Example", request_id="TEXT-1", scope=SpaceFilter("as-text"))
    vkey = client.public_key().vkey
    url = f"{base_url}/v1/certificates/verify"
    json_body = {**admin, "Content-Type": "application/json"}
    for text, failed in certificate_texts(client.certificate("TEXT-1")):
        as_string = httpx.post(url, json={"certificate": text, "expected_pubkey": vkey}, headers=admin)
        as_object = f'{{"certificate": {text}, "expected_pubkey": "{vkey}"}}'.encode()
        for reply in (as_string, httpx.post(url, content=as_object, headers=json_body)):
            assert reply.status_code == 200, reply.text
            assert_the_librarys_report(reply.json(), text, vkey, failed)
    # Unpinned and without the store: its notes tell an HTTP caller what it can pin, and
    # where the store's part is checked, not to pass options the route does not take.
    unpinned = httpx.post(url, json={"certificate": json.dumps(client.certificate("TEXT-1"))}, headers=admin).json()
    notes = " ".join(unpinned["notes"])
    assert "expected_pubkey over HTTP" in notes and "`deleatur verify --store`, run where its files are" in notes
    assert "pass --store" not in notes and "Pass --expected-pubkey" not in notes
    unreadable = httpx.post(url, json={"certificate": '{"certificate": '}, headers=admin)
    assert (unreadable.status_code, unreadable.json()["error"]["code"]) == (422, "invalid_input")
    assert unreadable.json()["error"]["message"].startswith("the certificate is not JSON: ")
    cut = httpx.post(url, content=b'{"certificate": {"certificate": ', headers=json_body)
    assert (cut.status_code, cut.json()["error"]["code"]) == (422, "invalid_request")
    for neither in (1, None, ["{}"]):  # a certificate is an object, or its text
        refused = httpx.post(url, json={"certificate": neither}, headers=admin)
        assert (refused.status_code, refused.json()["error"]["code"]) == (422, "invalid_request"), neither
        assert refused.json()["error"]["message"].startswith("body.certificate"), neither


def test_a_receipt_is_read_as_its_text(client: Client, base_url: str, admin: dict[str, str]) -> None:
    """As `deleatur verify-receipt` reads a file: a receipt's text, as a string or as the
    object itself, is checked; one that repeats a key or has a member besides its four is
    refused, saying neither what the key nor what the forger wrote."""
    record = client.remember("a receipt as text", subject="Receipts", space=Space("as-text"))
    other = client.remember("another record", subject="Receipts", space=Space("as-text"))
    vkey = client.public_key().vkey
    url = f"{base_url}/v1/receipts/verify"
    json_body = {**admin, "Content-Type": "application/json"}
    for text, problem in receipt_texts(client.receipt(record.id, space=Space("as-text")).to_json(), other.id):
        as_string = httpx.post(url, json={"receipt": text, "key": vkey}, headers=admin)
        as_object = f'{{"receipt": {text}, "key": "{vkey}"}}'.encode()
        for reply in (as_string, httpx.post(url, content=as_object, headers=json_body)):
            if problem is None:
                assert (reply.status_code, reply.json()["verdict"]) == (200, "PASS"), reply.text
            else:
                assert (reply.status_code, reply.json()["error"]["code"]) == (422, "invalid_signed_note")
                assert_refused_unechoed(reply.json()["error"]["message"], problem, other.id)


def test_erase_refusals_have_codes(client: Client, base_url: str, admin: dict[str, str]) -> None:
    client.remember("one", subject="Dana Ng", space=Space("amb"))
    client.remember("two", subject="dana  ng", space=Space("amb"))
    with pytest.raises(AmbiguousSubjectError) as ambiguous:
        client.erase("Dana Ng", request_id="AMB-1", scope=SpaceFilter("amb"))
    assert ambiguous.value.status == 409  # type: ignore[attr-defined]
    response = httpx.delete(f"{base_url}/v1/subjects/x", headers={"Idempotency-Key": "bad id!", **admin})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_input"
    missing = httpx.get(f"{base_url}/v1/erasures/NOPE", headers=admin)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def test_an_empty_request_id_is_refused_by_purge_as_by_erase(base_url: str, admin: dict[str, str]) -> None:
    """An empty Idempotency-Key and an empty purge request_id are both bad input: neither
    quietly becomes a generated id (omitting them is how to ask for one)."""
    erased = httpx.delete(f"{base_url}/v1/subjects/x", headers={"Idempotency-Key": "", **admin})
    purged = httpx.post(f"{base_url}/v1/purge", json={"request_id": ""}, headers=admin)
    for response in (erased, purged):
        assert response.status_code == 422
        assert response.json()["error"]["code"] == "invalid_input"
        assert response.json()["error"]["message"].startswith("request id must be")


def test_dry_runs_take_no_callers_request_id(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The dry-run route named each of its calls 'plan' in the audit trail, so a caller's
    own erasure 'plan' shared its request id with every dry run."""
    opener = new_store(tmp_path_factory.mktemp("plan") / "mem.db")
    admin = api_key(opener, Role.ADMIN)
    with serving(create_app(opener)) as url, Client(url, api_key=admin) as client:
        client.remember("Hugo's address", subject="Hugo")
        planned = client.erase("Hugo", dry_run=True).plan
        assert planned is not None and planned.total == 1
        erased = client.erase("Hugo", request_id="plan").request
        assert erased is not None and erased.counts["records"] == 1
        planned = client.erase("Hugo", dry_run=True).plan
        assert planned is not None and planned.total == 0
        assert client.erasure_request("plan").counts["records"] == 1
        entries = httpx.get(
            f"{url}/v1/audit", params={"calls_only": True}, headers={"Authorization": f"Bearer {admin}"}
        ).json()["entries"]
    erasing = [e["request"] for e in entries if e["action"] == "erase"]
    assert len(erasing) == 3
    assert erasing.count("plan") == 1
    assert len(set(erasing)) == 3


def test_names_with_url_characters(client: Client) -> None:
    odd = "Zoë / O'Brien? #2 %41"
    client.remember("odd name", subject=odd, space=Space("odd/user?#"))
    client.restrict(odd, reason="check")
    client.unrestrict(odd)
    erased = client.erase(odd, request_id="ODD-1").request
    assert erased is not None and erased.counts["records"] == 1
    emptied = client.erase_all(user_id="odd/user?#", request_id="ODD-2").request
    assert emptied is not None and emptied.counts["records"] == 0


def test_a_caller_names_whom_it_acts_for(client: Client) -> None:
    """Recorded beside the key's principal, which a request cannot leave out."""
    client.remember("acting", subject="Ida", space=Space("behalf"))
    assert client.restrict("Ida", reason="contested", actor="dpo").actor == "dpo (via test admin)"
    client.unrestrict("Ida", actor="dpo")
    client.erase("Ida", request_id="VIA-1", requester="the data subject")
    assert client.erasure_request("VIA-1").requester == "the data subject (via test admin)"
    client.erase_all(user_id="behalf", request_id="VIA-2")
    assert client.erasure_request("VIA-2").requester == "test admin"
    # The name is one line, and not blank: no other principal can appear on a line of its own.
    for named, problem in [("   ", "requester must not be blank"), ("dpo (via x)\n", "control characters")]:
        with pytest.raises(InvalidInputError, match=re.escape(problem)):
            client.erase("Ida", request_id="VIA-3", requester=named)
        with pytest.raises(InvalidInputError, match=re.escape(problem.replace("requester", "actor"))):
            client.restrict("Ida", reason="contested", actor=named)
    with pytest.raises(NotFoundError):
        client.erasure_request("VIA-3")  # nothing was recorded


def test_account_erasure_and_status(client: Client) -> None:
    client.remember("a", subject="S1", space=Space("acct-9", agent_id="x"))
    client.remember("b", subject="S2", space=Space("acct-9"))
    client.remember("c", subject="S3", space=Space("acct-10"))
    done = client.erase_all(user_id="acct-9", request_id="ACC-9").request
    assert done is not None and done.counts["records"] == 2
    assert len(list(client.list(space=Space("acct-10")))) == 1


def test_an_agents_erasure_limited_to_its_user_verifies_against_the_store(tmp_path: Path) -> None:
    """An agent's erasure is limited to its users: the person may be known to another user,
    and the certificate still verifies against the store; a request that found nothing
    has one too, which says so."""
    path = tmp_path / "mem.db"
    opener = new_store(path)
    with opener() as memory:
        memory.remember("about Wendy", subject="Wendy", space=Space("uA"))
        memory.remember("about Wendy elsewhere", subject="Wendy", space=Space("uB"))
    admin = {"Authorization": f"Bearer {api_key(opener, Role.ADMIN)}"}
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, headers=admin) as http:
        for request_id, records in (("W-1", 1), ("W-2", 0)):
            erased = http.delete(
                "/v1/subjects/Wendy", params={"user_id": "uA"}, headers={"Idempotency-Key": request_id}
            )
            assert (erased.status_code, erased.json()["counts"]["records"]) == (202, records)
            certificate = http.get(erased.json()["certificate_url"]).json()
            with StoreEvidence(path) as evidence:
                report = verify_certificate(certificate, store=evidence)
            assert report.ok, report.lines()


def test_export_restrict_and_purge(client: Client) -> None:
    client.remember("Eve's note", subject="Eve", space=Space("export-user"))
    out = io.StringIO()
    counts = client.export_json(out, subject="Eve")
    assert counts["records"] == 1
    assert json.loads(out.getvalue())["records"][0]["text"] == "Eve's note"
    restriction = client.restrict("Eve", reason="accuracy contested")
    assert restriction.reason == "accuracy contested"
    with pytest.raises(InvalidInputError) as refused:
        client.remember("more about Eve", subject="Eve")
    assert refused.value.code == "subject_restricted"  # type: ignore[attr-defined]
    assert len(client.restrictions()) == 1
    client.unrestrict("Eve")
    assert client.restrictions() == []
    assert client.purge(dry_run=True).request is None
    nothing = client.purge(request_id="RET-1")  # nothing is due: no request is recorded
    assert (nothing.request, nothing.nothing_due) == (None, True)
    with pytest.raises(NotFoundError):
        client.erasure_request("RET-1")


def test_errors_and_limits(base_url: str, admin: dict[str, str]) -> None:
    bad = httpx.post(f"{base_url}/v1/memories", json={"text": "no subject"}, headers=admin)
    assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_request")
    empty = httpx.post(f"{base_url}/v1/memories", json={"text": " ", "subject": "x"}, headers=admin)
    assert (empty.status_code, empty.json()["error"]["code"]) == (422, "invalid_input")
    for loose in ({"for_legal_claim": "yes"}, {"confidence": "0.5"}, {"expires_at": True}):
        # A value of the wrong JSON type is refused, not coerced: "yes" is no legal claim.
        reply = httpx.post(f"{base_url}/v1/memories", json={"text": "t", "subject": "x", **loose}, headers=admin)
        assert (reply.status_code, reply.json()["error"]["code"]) == (422, "invalid_request"), loose
    past = httpx.post(f"{base_url}/v1/memories", json={"text": "t", "subject": "x", "expires_at": 1}, headers=admin)
    said = "expires_at 1970-01-01T00:00:00.000001Z is in the past"
    error = past.json()["error"]
    assert is_request_id(error.pop("request_id"))  # the call's, which its audit entry carries
    assert (past.status_code, error) == (422, {"code": "invalid_input", "message": said})
    # An expiry as records show it (ISO 8601) is taken; a string that is no time is refused by name.
    late = {"text": "t", "subject": "x", "expires_at": "9999-12-31T00:00:00.5Z"}
    iso = httpx.post(f"{base_url}/v1/memories", json=late, headers=admin)
    assert (iso.status_code, iso.json()["expires_at"]) == (201, "9999-12-31T00:00:00.500000Z")
    vague = httpx.post(f"{base_url}/v1/memories", json={"text": "t", "subject": "x", "expires_at": "1y"}, headers=admin)
    assert (vague.status_code, vague.json()["error"]["code"]) == (422, "invalid_input")
    assert "'1y' is neither microseconds, an ISO 8601 time nor a delay" in vague.json()["error"]["message"]
    json_body = {**admin, "Content-Type": "application/json"}
    for unparsable in (b'{"text": "\xff\xfe", "subject": "x"}', b"[" * 6000 + b"]" * 6000):
        reply = httpx.post(f"{base_url}/v1/memories", content=unparsable, headers=json_body)
        assert (reply.status_code, reply.json()["error"]["code"]) == (422, "invalid_request"), reply.text
    big = httpx.post(f"{base_url}/v1/memories", content=b"{" + b" " * 70_000 + b"}")
    assert (big.status_code, big.json()["error"]["code"]) == (413, "body_too_large")

    def chunks() -> Iterator[bytes]:
        yield from (b" " * 10_000 for _ in range(10))

    chunked = httpx.post(f"{base_url}/v1/memories", content=chunks(), headers=admin)
    assert chunked.status_code == 413
    route = httpx.get(f"{base_url}/v1/nothing-here", headers=admin)
    assert (route.status_code, route.json()["error"]["code"]) == (404, "no_such_route")
    for slashed in ("/v1/memories/", "/v1/erasures/"):  # redirected, they were 307s with no body, to anyone
        for headers in (admin, {}):
            reply = httpx.get(f"{base_url}{slashed}", headers=headers)
            assert (reply.status_code, reply.json()["error"]["code"]) == (404, "no_such_route"), slashed
    spec = httpx.get(f"{base_url}/openapi.json").json()
    assert {"/v1/memories", "/v1/subjects/{subject}", "/v1/erasures/{request_id}"} <= set(spec["paths"])


def test_bodies_refuse_unknown_fields(base_url: str, admin: dict[str, str]) -> None:
    """Every JSON body names the field it does not take: ignored, a misspelt user_id
    would write into the default space."""
    spec = httpx.get(f"{base_url}/openapi.json").json()
    posted = [path for path, ops in spec["paths"].items() if "requestBody" in ops.get("post", {})]
    assert "/v1/memories" in posted
    for path in posted:
        reply = httpx.post(f"{base_url}{path}", json={"user_Id": "alice"}, headers=admin)
        assert (reply.status_code, reply.json()["error"]["code"]) == (422, "invalid_request"), path
        assert "body.user_Id: Extra inputs are not permitted" in reply.json()["error"]["message"], path


def test_bodies_refuse_repeated_keys(base_url: str, admin: dict[str, str]) -> None:
    """A key twice in one JSON object, at any depth, is refused: json.loads kept the last
    value silently, and the writer meant one of them."""
    json_body = {**admin, "Content-Type": "application/json"}
    space = {"user_id": "repeated-keys"}
    repeats = {
        b'{"text": "Dana lives in Oslo", "subject": "Dana", "subject": "Erin", "user_id": "repeated-keys"}': "subject",
        b'{"text": "t", "subject": "s", "user_id": "repeated-keys", "metadata": {"a": {"b": 1, "b": 2}}}': "b",
    }
    for body, key in repeats.items():
        reply = httpx.post(f"{base_url}/v1/memories", content=body, headers=json_body)
        assert (reply.status_code, reply.json()["error"]["code"]) == (422, "invalid_request"), body
        said = f'the request body repeats a key in one object: "{key}"'
        assert reply.json()["error"]["message"] == said
    # A verify route's body is refused too, around the document it carries (which is the
    # verifier's to fail: test_a_certificate_is_verified_as_its_text), naming no key: a
    # route that is given forged documents echoes none of their words.
    refused = {"code": "invalid_request", "message": "the request body repeats a key in one object"}
    for path, body in (
        ("/v1/certificates/verify", b'{"certificate": {"x": 1}, "certificate": {"x": 1}}'),
        ("/v1/certificates/verify", b'{"certificate": "{}", "expected_pubkey": {"Erin": 1, "Erin": 2}}'),
        ("/v1/receipts/verify", b'{"receipt": {"x": 1}, "key": "k", "key": "k"}'),
    ):
        reply = httpx.post(f"{base_url}{path}", content=body, headers=json_body)
        assert (reply.status_code, reply.json()["error"]) == (422, refused), body
    assert httpx.get(f"{base_url}/v1/memories", params=space, headers=admin).json()["records"] == []
    fine = b'{"text": "t", "subject": "s", "user_id": "repeated-keys", "metadata": {"a": {"b": 1}, "b": 2}}'
    assert httpx.post(f"{base_url}/v1/memories", content=fine, headers=json_body).status_code == 201


def test_query_parameters_a_route_does_not_take_are_refused_and_nothing_done(
    base_url: str, admin: dict[str, str]
) -> None:
    """Ignored, an unsupported or misspelt query parameter ran the call without it: a
    `dry_run` erased for real, `user` (for user_id) erased in every user, `user_id` on a
    POST wrote into the default space (the space is in the body)."""
    records = {"Hank Hill": "q-a", "Ivan Petrov": "q-b"}
    for subject, user in records.items():
        posted = httpx.post(
            f"{base_url}/v1/memories", json={"text": "t", "subject": subject, "user_id": user}, headers=admin
        )
        assert posted.status_code == 201
    refused = {
        ("DELETE", "/v1/subjects/Hank%20Hill?basis=x&dry_run=true"): "query.dry_run",
        ("DELETE", "/v1/subjects/Ivan%20Petrov?basis=x&user=q-a"): "query.user",
        ("DELETE", "/v1/users/q-a?agent=a&basis=x"): "query.agent",
        ("POST", "/v1/memories?user_id=q-a"): "query.user_id",
    }
    for (method, path), named in refused.items():
        reply = httpx.request(method, f"{base_url}{path}", json={"text": "new", "subject": "Hank Hill"}, headers=admin)
        assert (reply.status_code, reply.json()["error"]["code"]) == (422, "invalid_request"), path
        assert reply.json()["error"]["message"] == f"{named}: Extra inputs are not permitted", path
    several = httpx.delete(f"{base_url}/v1/users/q-b?agent=a&run=r&agent=b", headers=admin)
    said = "query.agent: Extra inputs are not permitted; query.run: Extra inputs are not permitted"
    assert several.json()["error"]["message"] == said
    # Given twice, the last one would win: which user the caller meant is not known.
    twice = httpx.delete(f"{base_url}/v1/subjects/Ivan%20Petrov?basis=x&user_id=q-a&user_id=q-b", headers=admin)
    assert (twice.status_code, twice.json()["error"]["message"]) == (422, "query.user_id: given 2 times: give it once")
    for subject, user in [*records.items(), ("Hank Hill", "default")]:
        held = httpx.get(f"{base_url}/v1/memories", params={"user_id": user, "subject": subject}, headers=admin)
        assert len(held.json()["records"]) == (user != "default"), (subject, user)


def test_every_route_refuses_a_query_parameter_it_does_not_take(base_url: str, admin: dict[str, str]) -> None:
    """Derived from each route's declared parameters, not listed: the OpenAPI document's
    routes all refuse one they do not declare, and take every one they do."""
    spec = httpx.get(f"{base_url}/openapi.json").json()
    for template, operations in spec["paths"].items():
        path = re.sub(r"\{[^}]*\}", "no-one", template)
        for method, operation in operations.items():
            reply = httpx.request(method, f"{base_url}{path}?no_such=1", json={}, headers=admin)
            assert reply.status_code == 422, (method, template, reply.text)
            assert reply.json()["error"]["message"] == "query.no_such: Extra inputs are not permitted", template
            declared = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query"]
            every = "&".join(f"{name}=1" for name in [*declared, "no_such"])
            reply = httpx.request(method, f"{base_url}{path}?{every}", json={}, headers=admin)
            unknown = re.findall(r"query\.(\w+): Extra inputs", reply.json()["error"]["message"])
            assert unknown == ["no_such"], (method, template, reply.text)
    # The document itself is no API route: it takes what a browser adds.
    assert httpx.get(f"{base_url}/openapi.json?v=2").status_code == 200


def test_a_url_not_utf8_once_percent_decoded_is_refused_and_nothing_done(base_url: str, admin: dict[str, str]) -> None:
    """The server decodes bad bytes to U+FFFD: a Latin-1 client's "Jos%E9" erased a
    subject that has no record, certified that nothing was held, and left José's."""
    space = {"user_id": "latin-1"}
    posted = httpx.post(f"{base_url}/v1/memories", json={"text": "t", "subject": "José", **space}, headers=admin)
    assert posted.status_code == 201

    def erasures() -> list[str]:
        listed = httpx.get(f"{base_url}/v1/erasures", params={"limit": 1000}, headers=admin).json()
        return [r["id"] for r in listed["requests"]]

    before = erasures()
    not_utf8 = "not valid UTF-8 once percent-decoded"
    refused = {
        ("DELETE", "/v1/subjects/Jos%E9?basis=x"): f"path: {not_utf8}",
        ("DELETE", "/v1/subjects/Jos%C3%A9?basis=x&requester=%ED%A0%80"): f"query.requester: {not_utf8}",  # a surrogate
        ("DELETE", "/v1/restrictions/Jos%ED%A0%80"): f"path: {not_utf8}",
        ("GET", "/v1/export?subject=%ED%A0%80"): f"query.subject: {not_utf8}",
        ("GET", "/v1/memories?user_id=latin-1&subject=Jos%E9"): f"query.subject: {not_utf8}",
        ("GET", "/v1/memories?user_id=latin-1&Jos%E9=1"): f"query: a parameter name is {not_utf8}",
    }
    for (method, path), said in refused.items():
        reply = httpx.request(method, f"{base_url}{path}", headers=admin)
        assert (reply.status_code, reply.json()["error"]) == (422, {"code": "invalid_request", "message": said}), path
    assert erasures() == before  # none was recorded, not even one that found nothing
    held = httpx.get(f"{base_url}/v1/memories", params={**space, "subject": "José"}, headers=admin)
    assert len(held.json()["records"]) == 1
    erased = httpx.delete(f"{base_url}/v1/subjects/Jos%C3%A9?basis=x&user_id=latin-1", headers=admin)
    assert (erased.status_code, erased.json()["counts"]["records"]) == (202, 1)


def _refused_keys(open_memory: Callable[[], Memory]) -> list[str]:
    """What each refused API key was refused for, as the audit trail says, in order."""
    with open_memory() as memory:
        entries = [e.entry.fields for e in memory.audit_entries(calls_only=True)]
    return [f["error"] for f in entries if f["action"] == "authenticate" and f["outcome"] == "denied"]


def test_a_caller_without_a_valid_key_is_refused_before_its_url_or_body_is_judged(tmp_path: Path) -> None:
    """The URL was judged before the key: a caller with none, or a bad one, sent a URL the
    route would misread and got a 422 naming the route's parameters, not a 401. Now only
    a valid key learns what is wrong with its URL or its body; a refused key is audited
    once, as with a URL the route takes; and the erasure behind a bad URL is never made."""
    opener = new_store(tmp_path / "mem.db")
    key = api_key(opener, Role.ADMIN)
    with opener() as memory:
        memory.remember("kept", subject="Hank Hill", space=Space("q"))
    principal, secret = split_api_key(key)
    wrong_secret = f"dlt_{principal}_{'A' if secret[0] != 'A' else 'B'}{secret[1:]}"
    # Not more than 10 refused keys in all: past that, a store audits the refusals of a
    # second by their count (access/calls.py, RefusalBudget).
    callers = {"none": {}, "secret": {"Authorization": f"Bearer {wrong_secret}"}}
    body = {"text": "t", "subject": "Hank Hill"}
    bad: list[tuple[str, str, dict[str, Any] | bytes | None]] = [
        ("DELETE", "/v1/subjects/Hank%20Hill?basis=x&dry_run=true", None),  # unknown
        ("DELETE", "/v1/subjects/Hank%20Hill?user_id=q&user_id=r", None),  # repeated
        ("DELETE", "/v1/subjects/Jos%E9", None),  # not UTF-8
        ("GET", "/v1/memories?limit=many", None),  # of the wrong type
        ("POST", "/v1/memories", {**body, "user": "q"}),  # a field the body does not take
        ("POST", "/v1/memories", b'{"text": "t", "subject": "a", "subject": "b"}'),  # a repeated key
    ]

    def send(method: str, path: str, content: dict[str, Any] | bytes | None, headers: dict[str, str]) -> httpx.Response:
        if isinstance(content, bytes):
            headers = {**headers, "Content-Type": "application/json"}
            return http.request(method, path, content=content, headers=headers)
        return http.request(method, path, json=content, headers=headers)

    with serving(create_app(opener)) as url, httpx.Client(base_url=url, timeout=30) as http:
        for (method, path, content), (caller, headers) in itertools.product(bad, callers.items()):
            reply = send(method, path, content, headers)
            said = (reply.status_code, reply.json()["error"]["code"])
            assert said == (401, "unauthenticated"), (method, path, caller, reply.text)
            assert reply.headers["www-authenticate"].startswith("Bearer")
            assert "query" not in reply.text and "body" not in reply.text
        malformed = send("DELETE", "/v1/subjects/Hank%20Hill?dry_run=true", None, {"Authorization": "Bearer dlt_x"})
        assert (malformed.status_code, malformed.json()["error"]["code"]) == (401, "unauthenticated")
        refused = _refused_keys(opener)
        assert refused == ["secret"] * len(bad) + ["malformed"]  # each once, none for no key
        # A URL the route takes: the same refusal, audited once too.
        assert send("DELETE", "/v1/subjects/Hank%20Hill", None, callers["secret"]).status_code == 401
        assert _refused_keys(opener) == [*refused, "secret"]
        # With a valid key, what is wrong is said, as before.
        for method, path, content in bad:
            reply = send(method, path, content, {"Authorization": f"Bearer {key}"})
            said = (reply.status_code, reply.json()["error"]["code"])
            assert said == (422, "invalid_request"), (method, path, reply.text)
        assert _refused_keys(opener) == [*refused, "secret"]
    with opener() as memory:
        assert [r.text for r in memory.list(space=Space("q"))] == ["kept"]
        assert memory.erasure_requests() == []


def test_a_caller_without_a_valid_key_is_refused_before_its_space_is_judged(tmp_path: Path) -> None:
    """A space is checked inside the call, after the key: a bad key with a bad user id
    was a 422 (and no refusal in the audit trail) on the read routes."""
    opener = new_store(tmp_path / "mem.db")
    key = api_key(opener, Role.ADMIN)
    with opener() as memory:
        record = memory.remember("kept", subject="a")
    principal, secret = split_api_key(key)
    wrong = {"Authorization": f"Bearer dlt_{principal}_{'A' if secret[0] != 'A' else 'B'}{secret[1:]}"}
    bad_space = {"user_id": "bell\x07"}
    routes: list[tuple[str, str, dict[str, Any], dict[str, Any] | None]] = [
        ("GET", f"/v1/memories/{record.id}", bad_space, None),
        ("GET", "/v1/memories", bad_space, None),
        ("GET", "/v1/history", {**bad_space, "key": "k"}, None),
        ("GET", "/v1/memories/search", {**bad_space, "q": "kept"}, None),
        ("POST", "/v1/memories/search", {}, {**bad_space, "q": "kept"}),
    ]
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, timeout=30) as http:
        for method, path, params, body in routes:
            reply = http.request(method, path, params=params, json=body, headers=wrong)
            assert (reply.status_code, reply.json()["error"]["code"]) == (401, "unauthenticated"), path
        assert _refused_keys(opener) == ["secret"] * len(routes)
        for method, path, params, body in routes:
            reply = http.request(method, path, params=params, json=body, headers={"Authorization": f"Bearer {key}"})
            assert (reply.status_code, reply.json()["error"]["code"]) == (422, "invalid_input"), path


def test_a_number_past_pythons_digit_limit_is_named(base_url: str, admin: dict[str, str]) -> None:
    """It was "not UTF-8, or nested too deeply", neither of which it is."""
    body = b'{"text": "t", "subject": "s", "metadata": {"n": ' + b"7" * 5000 + b"}}"
    reply = httpx.post(f"{base_url}/v1/memories", content=body, headers={**admin, "Content-Type": "application/json"})
    said = f"the request body holds an integer of more than {sys.get_int_max_str_digits()} digits"
    assert (reply.status_code, reply.json()["error"]) == (422, {"code": "invalid_request", "message": said})


def test_client_errors_are_deleatur_errors(client: Client) -> None:
    """Callers catch DeleaturError from the library: the client raises nothing else."""
    with pytest.raises(InvalidInputError, match="not valid UTF-8"):
        client.restrict("Zed", reason="bad \ud800")
    with pytest.raises(InvalidInputError, match="not valid UTF-8"):
        client.unrestrict("a\udcff")  # in the path
    with pytest.raises(InvalidInputError, match="not valid UTF-8"):
        client.export_json(io.StringIO(), subject="a\udcff")  # in the query
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # a port nobody listens on
        port = sock.getsockname()[1]
    with (
        Client(f"http://127.0.0.1:{port}", api_key="dlt_x") as down,
        pytest.raises(DeleaturError, match="cannot reach"),
    ):
        down.checkpoint()


@pytest.mark.parametrize("held", ["store", "key store"])
def test_a_lock_held_elsewhere_never_stalls_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: str
) -> None:
    """Another process (a CLI erasure, a backup) holds the store's write lock, or the key
    store's (which a remember about a new subject needs, to make its data key: it cannot
    be made in its group of writes, which goes on without it): a remember waits for it
    without holding up the event loop or the store handle, which meanwhile serve other
    requests, then writes its record once (its refused tries changed nothing)."""
    from deleatur import sqlitefile
    from deleatur.memory import keystore_path

    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER)}"}
    waiting = threading.Event()

    class _Time:
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            waiting.set()  # a busy handler is waiting for the lock
            time.sleep(seconds)

    monkeypatch.setattr(sqlitefile, "time", _Time)
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 600_000)  # a stalled loop would hang
    store = tmp_path / "mem.db"
    holder = apsw.Connection(str(store if held == "store" else keystore_path(store)))
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        holder.execute("BEGIN IMMEDIATE").fetchall()
        answers: list[httpx.Response] = []
        writer = threading.Thread(
            target=lambda: answers.append(http.post("/v1/memories", json={"text": "waits", "subject": "a"}))
        )
        writer.start()
        try:
            assert waiting.wait(timeout=30), "the remember never waited for the lock"
            assert http.get("/openapi.json", timeout=5).status_code == 200  # the loop is free
            assert http.get("/v1/public-key", timeout=5).status_code == 200  # and so is the handle
            assert not answers  # and the remember is still waiting
        finally:
            holder.execute("ROLLBACK").fetchall()
            writer.join(timeout=30)
        assert [a.status_code for a in answers] == [201]
        listed = http.get("/v1/memories").json()["records"]
        assert [r["text"] for r in listed] == ["waits"]
    holder.close()


def test_a_long_verification_holds_up_no_other_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Verifying a large log reads it whole for seconds: it runs on a handle of its own,
    and another caller's requests are served meanwhile."""
    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.AUDITOR)}"}
    entered, release = threading.Event(), threading.Event()
    real = Memory.verify_log

    def slow(self: Memory, *args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert release.wait(timeout=30)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Memory, "verify_log", slow)
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        answers: list[httpx.Response] = []
        verifier = threading.Thread(target=lambda: answers.append(http.get("/v1/log/verify")))
        verifier.start()
        try:
            assert entered.wait(timeout=30)
            assert http.get("/v1/whoami", timeout=5).status_code == 200
            assert http.get("/v1/checkpoint", timeout=5).status_code == 200
        finally:
            release.set()
            verifier.join(timeout=30)
        assert [a.status_code for a in answers] == [200] and answers[0].json()["verdict"] == "PASS"


def _ciphertext(store: Path, record_id: str) -> bytes:
    """A record's ciphertext as the store's file holds it."""
    reader = apsw.Connection(str(store), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        ((ciphertext,),) = reader.execute("SELECT ciphertext FROM records WHERE id = ?", (record_id,))
    finally:
        reader.close()
    assert isinstance(ciphertext, bytes)
    return ciphertext


def _holding(store: Path, data: bytes) -> list[str]:
    """The files of the store (its -wal, the key store's included) in which ``data`` is."""
    return [p.name for p in store_files(store) if data in p.read_bytes()]


def _erased_during_a_long_read(http: httpx.Client, subject: str, request_id: str, *, held: bool = True) -> None:
    """Erase ``subject`` while a long read of the server's holds the -wal (``held``): the
    erasure answers without waiting for the read, saying the -wal was not truncated, and
    another request is answered after it. Not ``held``: it truncated the -wal."""
    erased: list[httpx.Response] = []
    eraser = threading.Thread(
        target=lambda: erased.append(http.delete(f"/v1/subjects/{subject}", headers={"Idempotency-Key": request_id})),
        daemon=True,  # if it waits for the read, it ends with it
    )
    eraser.start()
    eraser.join(timeout=30)
    assert erased, "the erasure waited for the long read"
    assert erased[0].status_code == 202
    assert erased[0].json()["counts"].get("wal_not_truncated") == (1 if held else None)
    assert http.get("/v1/whoami").status_code == 200


def test_an_erasure_during_a_verification_waits_not_for_it_and_is_gone_once_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An erasure's scrub waited for the verification's read snapshot to truncate the -wal,
    holding the shared handle, and every request queued behind it, until the verification
    ended. It answers at once now, its request saying the -wal was not truncated, and the
    verification truncates it as it ends: no byte of the erased record is left anywhere."""
    from deleatur import sqlitefile

    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.ADMIN)}"}
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 600_000)  # a scrub that waits outlasts the test
    entered, release = threading.Event(), threading.Event()
    real = Memory.verify_log

    def slow(self: Memory, *args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert release.wait(timeout=60)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Memory, "verify_log", slow)
    store = tmp_path / "mem.db"
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        record = http.post("/v1/memories", json={"text": "qzverifysecret", "subject": "Alice"}).json()
        ciphertext = _ciphertext(store, record["id"])
        assert _holding(store, ciphertext)
        verified: list[httpx.Response] = []
        verifier = threading.Thread(target=lambda: verified.append(http.get("/v1/log/verify")))
        verifier.start()
        try:
            assert entered.wait(timeout=30)
            _erased_during_a_long_read(http, "Alice", "R1")
            assert _holding(store, ciphertext)  # the snapshot still holds its -wal
        finally:
            release.set()
            verifier.join(timeout=60)
        assert [v.status_code for v in verified] == [200] and verified[0].json()["verdict"] == "PASS"
        assert _holding(store, ciphertext) == []
        assert "wal_not_truncated" not in http.get("/v1/erasures/R1").json()["counts"]


def test_writers_waiting_for_a_lock_held_elsewhere_are_refused_one_at_a_time_not_each_in_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a refused request tries again, later ones queue behind it instead of each
    trying in the loop first: one request at a time is refused, so the loop's stalls
    stay one try's wait, however many wait. (Counted, not timed: a time bound that
    tells 60 tries' stall from one try's failed on a loaded machine, at load 13.)"""
    from deleatur import sqlitefile
    from deleatur.servers import http as http_server

    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER)}"}
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 600_000)
    refused_in: set[asyncio.Task[object] | None] = set()

    @contextlib.contextmanager
    def watched_try() -> Iterator[sqlitefile.Attempt]:
        with sqlitefile.first_try() as attempt:
            try:
                yield attempt
            finally:
                if attempt.refused:
                    refused_in.add(asyncio.current_task())

    monkeypatch.setattr(http_server, "first_try", watched_try)
    writers = 60
    arrived = 0
    all_arrived = threading.Event()
    app = create_app(opener)

    async def counting(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal arrived
        if scope["type"] == "http" and scope["method"] == "POST":
            arrived += 1
            if arrived == writers:
                all_arrived.set()
        await app(scope, receive, send)

    holder = apsw.Connection(str(tmp_path / "mem.db"))
    with serving(counting) as url, httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        http.get("/v1/memories")  # the handle is open
        holder.execute("BEGIN IMMEDIATE").fetchall()
        answers: list[int] = []
        threads = [
            threading.Thread(
                target=lambda i=i: answers.append(
                    http.post("/v1/memories", json={"text": f"w{i}", "subject": "a"}).status_code
                )
            )
            for i in range(writers)
        ]
        try:
            for thread in threads:
                thread.start()
            assert all_arrived.wait(timeout=60)
            for _ in range(10):  # a route that never touches the store answers meanwhile
                assert http.get("/openapi.json").status_code == 200
        finally:
            holder.execute("ROLLBACK").fetchall()
            for thread in threads:
                thread.join(timeout=60)
        assert sorted(answers) == [201] * writers
        assert len(refused_in) == 1, f"{len(refused_in)} requests were refused in turn while the lock was held"
    holder.close()


def test_a_tail_no_checkpoint_covers_still_fails_the_servers_verification(tmp_path: Path) -> None:
    """The server signs what it appended before it verifies on a handle of its own, and
    nothing else: a tail another process left unsigned (it died within its checkpoint
    interval) fails the coverage check, as on the store's own handle."""
    import subprocess
    import sys

    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.AUDITOR)}"}
    script = (
        "import os, sys\n"
        "from deleatur import Memory, from_bytes\n"
        "m = Memory.open(sys.argv[1], from_bytes(bytes.fromhex(sys.argv[2])), checkpoint_interval_us=10**15)\n"
        "m.remember('signed at open', subject='a')\n"
        "m.remember('never signed', subject='a')\n"
        "os._exit(0)\n"
    )
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        passed = http.get("/v1/log/verify").json()
        assert passed["verdict"] == "PASS"
        # Its notes name the command that pins, which the route does not: not bare options.
        notes = " ".join(passed["notes"])
        assert "(`deleatur log verify --expected-checkpoint FILE`)" in notes and "no --" not in notes
        for route in ("/v1/log/verify", "/v1/audit/verify"):
            # A new tail for each: the next checkpoint any handle signs covers a tail
            # (the verification's own handle signs one as it closes, as every handle does).
            subprocess.run([sys.executable, "-c", script, str(tmp_path / "mem.db"), MASTER.hex()], check=True)
            report = http.get(route).json()
            failed = [c["name"] for c in report["checks"] if not c["passed"]]
            assert report["verdict"] == "FAIL" and failed, report
            assert any("covers" in c["detail"] for c in report["checks"] if not c["passed"])


def test_a_key_that_may_not_verify_is_refused_a_verification_as_of_a_size(tmp_path: Path) -> None:
    """The refusal is a 403, audited, with or without a size (it was a 500 with one:
    its audit entry could not be written inside the verification's read snapshot), and
    names the verification."""
    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.VIEWER)}"}
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        size = Checkpoint.parse(Note.parse(http.get("/v1/checkpoint").json()["checkpoint"]).text).size
        for route, action in (("/v1/log/verify", "log.verify"), ("/v1/audit/verify", "audit.verify")):
            for params in ({}, {"size": size}):
                refused = http.get(route, params=params)
                assert (refused.status_code, refused.json()["error"]["code"]) == (403, "access_denied"), params
                # Named as the verification asked for (it was log.sign, the server's first step).
                assert f"may not {action}: it needs the verify capability" in refused.json()["error"]["message"]
    with opener() as memory:
        denied = [
            e.entry.fields for e in memory.audit_entries(calls_only=True) if e.entry.fields["outcome"] == "denied"
        ]
    assert [d["action"] for d in denied] == ["log.verify", "log.verify", "audit.verify", "audit.verify"]


def test_a_key_revoked_elsewhere_as_its_verification_begins_is_refused_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process revokes the key after the server's handle signed for its
    verification and before the snapshot began: the snapshot's call sees it revoked, and
    the refusal is a 403, audited (it was a 500: its entry could not be written in the
    snapshot)."""
    opener = new_store(tmp_path / "mem.db")
    revoked: list[str] = []
    real = Memory.sign_pending

    def signed_then_revoked(self: Memory) -> None:
        real(self)
        with opener() as elsewhere:
            elsewhere.revoke_principal(revoked[-1])

    monkeypatch.setattr(Memory, "sign_pending", signed_then_revoked)
    reader = {"Authorization": f"Bearer {api_key(opener, Role.VIEWER)}"}
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, timeout=30) as http:
        size = Checkpoint.parse(Note.parse(http.get("/v1/checkpoint", headers=reader).json()["checkpoint"]).text).size
        for route in ("/v1/log/verify", "/v1/audit/verify"):
            for params in ({}, {"size": size}):
                key = api_key(opener, Role.AUDITOR)
                revoked.append(split_api_key(key)[0])
                refused = http.get(route, params=params, headers={"Authorization": f"Bearer {key}"})
                assert refused.status_code == 403, (route, params, refused.text)
                assert (refused.json()["error"]["code"], refused.json()["error"]["missing"]) == (
                    "access_denied",
                    "principal",
                )
    with opener() as memory:
        denied = [
            e.entry.fields for e in memory.audit_entries(calls_only=True) if e.entry.fields["outcome"] == "denied"
        ]
    assert sorted(d["actor"] for d in denied) == sorted(revoked)
    assert {d["error"] for d in denied} == {"principal"}


def test_verifications_beside_busy_writers_pass(tmp_path: Path) -> None:
    """Writes arriving while the log is verified leave entries the server has not signed
    yet: the verification reads the log as it was when the server's handle had signed
    everything it wrote, so they never fail its coverage check."""
    opener = new_store(tmp_path / "mem.db")
    writer = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER)}"}
    auditor = {"Authorization": f"Bearer {api_key(opener, Role.AUDITOR)}"}
    stop = threading.Event()
    with serving(create_app(opener)) as url:

        def write() -> None:
            with httpx.Client(base_url=url, headers=writer, timeout=30) as http:
                while not stop.is_set():
                    assert http.post("/v1/memories", json={"text": "busy", "subject": "a"}).status_code == 201

        writers = [threading.Thread(target=write) for _ in range(4)]
        for thread in writers:
            thread.start()
        try:
            with httpx.Client(base_url=url, headers=auditor, timeout=30) as http:
                verdicts = [
                    http.get(route).json()["verdict"]
                    for _ in range(5)
                    for route in ("/v1/log/verify", "/v1/audit/verify")
                ]
        finally:
            stop.set()
            for thread in writers:
                thread.join(timeout=30)
    assert verdicts == ["PASS"] * 10


def test_a_verification_covers_what_every_handle_of_the_server_appended(tmp_path: Path) -> None:
    """With several handles, the verification had only the one it leased sign what it
    had appended: when that one had nothing unsigned, the entries another had appended
    within its checkpoint interval failed the coverage check. Every handle signs its own
    now, and appends nothing more until the verification's snapshot has begun."""
    path = tmp_path / "mem.db"
    new_store(path)

    def opener() -> Memory:
        # A handle signs its first write at once, then none until the interval has passed.
        return Memory.open(path, from_bytes(MASTER), checkpoint_interval_us=10**15)

    auditor = {"Authorization": f"Bearer {api_key(opener, Role.AUDITOR)}"}
    app = create_app(opener, handles=2)
    with serving(app) as url, httpx.Client(base_url=url, headers=auditor, timeout=60) as http:
        pool: HandlePool = app.state.pool
        with pool.lease() as first, pool.lease() as second:  # as two requests at once would
            first.remember("signed", subject="a")
            second.remember("signed", subject="a")
            second.remember("unsigned", subject="a")
        # The pool lends first the handle given back last: the verification's call gets
        # `first`, which has nothing to sign.
        assert pool.size == 2
        verdicts = [http.get(route).json()["verdict"] for route in ("/v1/log/verify", "/v1/audit/verify")]
    assert verdicts == ["PASS", "PASS"]


def test_a_verification_on_several_handles_keeps_its_snapshot_in_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read snapshot keeps its handle's turn, which is a thread's: the server opened it
    in one worker thread, verified in another and ended it in a third, so the
    verification waited out the busy timeout (503) and the ending raised RuntimeError.
    Every step on the verification's handle now runs in one thread of its own."""
    from deleatur import memory as memory_module

    monkeypatch.setattr(memory_module, "BUSY_TIMEOUT_MS", 500)
    threads: dict[str, set[int]] = {"snapshot": set(), "verify": set()}
    snapshot, verify = Memory.read_snapshot, Memory.verify_log

    def snapshot_in(self: Memory) -> contextlib.AbstractContextManager[None]:
        threads["snapshot"].add(threading.get_ident())
        return snapshot(self)

    def verify_in(self: Memory, **kwargs: Any) -> Any:
        threads["verify"].add(threading.get_ident())
        return verify(self, **kwargs)

    monkeypatch.setattr(Memory, "read_snapshot", snapshot_in)
    monkeypatch.setattr(Memory, "verify_log", verify_in)
    # Worker threads as a busy server's are: each call in another one (all kept alive, so
    # that no thread's id is handed to the next).
    workers = [ThreadPoolExecutor(max_workers=1) for _ in range(3)]
    turns = itertools.count()

    async def in_another_thread(work: Callable[..., Any], *args: Any, **_: Any) -> Any:
        worker = workers[next(turns) % len(workers)]
        return await asyncio.get_running_loop().run_in_executor(worker, functools.partial(work, *args))

    monkeypatch.setattr(anyio.to_thread, "run_sync", in_another_thread)
    opener = _signing_late(tmp_path / "mem.db")
    auditor = {"Authorization": f"Bearer {api_key(opener, Role.AUDITOR)}"}
    member = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER)}"}
    with serving(create_app(opener, handles=2)) as url, httpx.Client(base_url=url, timeout=60) as http:
        for i in range(4):
            http.post("/v1/memories", headers=member, json={"text": f"note {i}", "subject": "Ola"})
            verified = http.get("/v1/log/verify", headers=auditor)
            assert verified.status_code == 200, verified.text
            threads_of_this_one = (set(threads["snapshot"]), set(threads["verify"]))
            assert len(threads_of_this_one[0]) == 1 and threads_of_this_one[0] == threads_of_this_one[1]
            threads["snapshot"].clear()
            threads["verify"].clear()
    for worker in workers:
        worker.shutdown()


def _signing_late(path: Path) -> Callable[[], Memory]:
    """How to open handles on a new store at ``path`` that sign their first write at
    once, then none until the checkpoint interval has passed (not in any test)."""
    new_store(path)
    return lambda: Memory.open(path, from_bytes(MASTER), checkpoint_interval_us=10**15)


def _leave_unsigned(pool: HandlePool, handles: int) -> None:
    """Have each of ``handles`` handles (opened by :func:`_signing_late`'s opener) append
    an entry it has not signed."""
    with contextlib.ExitStack() as stack:
        for memory in [stack.enter_context(pool.lease()) for _ in range(handles)]:
            memory.remember("signed", subject="a")
            memory.remember("unsigned", subject="a")
    assert pool.size == handles


def test_a_verification_refused_the_lock_past_the_busy_timeout_is_a_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It gives up as a call does, and the next one, once the lock is free, passes."""
    from deleatur import sqlitefile

    path = tmp_path / "mem.db"
    opener = _signing_late(path)
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 300)
    auditor = {"Authorization": f"Bearer {api_key(opener, Role.AUDITOR)}"}
    app = create_app(opener, handles=2)
    holder = apsw.Connection(str(path))
    with serving(app) as url, httpx.Client(base_url=url, headers=auditor, timeout=60) as http:
        _leave_unsigned(app.state.pool, 2)
        holder.execute("BEGIN IMMEDIATE").fetchall()
        try:
            refused = http.get("/v1/log/verify")
        finally:
            holder.execute("ROLLBACK").fetchall()
        assert (refused.status_code, refused.json()["error"]["code"]) == (503, "store_busy")
        assert http.get("/v1/log/verify").json()["verdict"] == "PASS"
    holder.close()


@pytest.mark.parametrize("handles", [1, 2])
def test_a_verification_waiting_for_a_lock_held_elsewhere_holds_up_no_other_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handles: int
) -> None:
    """With several handles, a verification held every one of them while each signed what
    it had appended, and signing waits for the write lock: while another process held it
    (up to the busy timeout), every other request waited too. The handles are given back
    while the lock is waited for now, so other requests are served meanwhile; and once the
    lock is free the verification signs and passes."""
    from deleatur import sqlitefile

    path = tmp_path / "mem.db"
    opener = _signing_late(path)
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 600_000)  # a held handle would outlast the test
    signing, waiting = threading.local(), threading.Event()
    real = Memory.sign_pending

    def watched(self: Memory) -> None:
        signing.now = True
        try:
            real(self)
        finally:
            signing.now = False

    class _Time:
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            if getattr(signing, "now", False):
                waiting.set()  # a signing's busy handler is waiting for the lock
            time.sleep(seconds)

    monkeypatch.setattr(Memory, "sign_pending", watched)
    monkeypatch.setattr(sqlitefile, "time", _Time)
    auditor = {"Authorization": f"Bearer {api_key(opener, Role.AUDITOR)}"}
    app = create_app(opener, handles=handles)
    holder = apsw.Connection(str(path))
    with serving(app) as url, httpx.Client(base_url=url, headers=auditor, timeout=60) as http:
        _leave_unsigned(app.state.pool, handles)
        holder.execute("BEGIN IMMEDIATE").fetchall()
        answers: list[httpx.Response] = []
        verifier = threading.Thread(target=lambda: answers.append(http.get("/v1/log/verify")))
        verifier.start()
        try:
            assert waiting.wait(timeout=60), "the verification's signing never waited for the lock"
            for _ in range(3):
                assert http.get("/v1/whoami", timeout=5).status_code == 200
            assert not answers  # the verification still waits
        finally:
            holder.execute("ROLLBACK").fetchall()
            verifier.join(timeout=60)
        assert [a.status_code for a in answers] == [200] and answers[0].json()["verdict"] == "PASS"
    holder.close()


def test_reads_served_together_are_answered_once_their_entries_commit_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another process holds the write lock, a write waits for it, but recalls are
    still served: their audit entries wait in one group, so they take no lock (not even
    to collect the data key the waiting write made) and none is answered, since a read
    is not answered before its entry is committed. Once the lock is free, one
    transaction writes every entry, before the write's (which ran after them), and then
    every recall is answered."""
    from deleatur import memory as memory_module
    from deleatur import sqlitefile

    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER)}"}
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 600_000)
    readers = 8
    writes: list[tuple[int, bool]] = []  # (entries, went through) of each try that had some
    gathered = threading.Event()
    real, real_collecting = AuditBatch.write, AuditBatch.collecting

    def watched(batch: AuditBatch) -> None:
        size = len(batch)
        if not size:
            real(batch)
            return
        try:
            real(batch)
        except BaseException:
            writes.append((size, False))
            raise
        writes.append((size, True))

    @contextlib.contextmanager
    def watched_collecting(batch: AuditBatch) -> Iterator[None]:
        with real_collecting(batch):
            yield
        if len(batch) == readers:
            gathered.set()

    monkeypatch.setattr(AuditBatch, "write", watched)
    monkeypatch.setattr(AuditBatch, "collecting", watched_collecting)
    held = threading.Event()
    collected_while_held: list[object] = []
    collect = memory_module.collect_unused_keys  # type: ignore[attr-defined]

    def watched_collect(memory: Memory, key_ids: Any = None) -> Any:
        if held.is_set():
            collected_while_held.append(key_ids)
        return collect(memory, key_ids)

    monkeypatch.setattr(memory_module, "collect_unused_keys", watched_collect)
    holder = apsw.Connection(str(tmp_path / "mem.db"))
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        assert http.post("/v1/memories", json={"text": "grouped reads", "subject": "a"}).status_code == 201
        holder.execute("BEGIN IMMEDIATE").fetchall()
        held.set()
        answers: list[httpx.Response] = []
        written: list[httpx.Response] = []

        def recall() -> None:
            answers.append(http.get("/v1/memories/search", params={"q": "grouped"}))

        writer = threading.Thread(
            target=lambda: written.append(http.post("/v1/memories", json={"text": "waits", "subject": "Brand New"}))
        )
        threads = [threading.Thread(target=recall) for _ in range(readers)]
        for thread in [writer, *threads]:
            thread.start()
        try:
            assert gathered.wait(timeout=60), "the recalls' entries never gathered in one group"
            assert not answers and not written  # each read waits for its entry, the write for the lock
        finally:
            held.clear()
            holder.execute("ROLLBACK").fetchall()
            for thread in [writer, *threads]:
                thread.join(timeout=60)
        assert [a.status_code for a in answers] == [200] * readers
        assert all([h["text"] for h in a.json()["hits"]] == ["grouped reads"] for a in answers)
        assert [w.status_code for w in written] == [201]
    holder.close()
    assert not collected_while_held
    # Written once, whole: any try before (one that found the lock held) wrote nothing.
    assert [size for size, went in writes if went] == [readers]
    assert all(not went for _, went in writes[:-1])
    with opener() as memory:
        actions = [e.entry.fields["action"] for e in memory.audit_entries(calls_only=True)]
    assert actions[-readers - 2 :] == ["recall"] * readers + ["remember", "audit.show"]


def test_the_log_lists_calls_in_the_order_they_ran(tmp_path: Path) -> None:
    """Reads and writes served at once, on one handle: the log lists their entries in the
    order the calls ran (each entry's time), a read's grouped entry included: a write
    writes the open group before its own entries."""
    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER)}"}
    with opener() as memory:
        record = memory.remember("ordered", subject="a")

    async def load(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
            calls = [http.get(f"/v1/memories/{record.id}") for _ in range(30)]
            calls += [http.post("/v1/memories", json={"text": f"w{i}", "subject": "a"}) for i in range(10)]
            calls += [http.get("/v1/memories/search", params={"q": "ordered"}) for _ in range(30)]
            answers = await asyncio.gather(*calls)
            assert {a.status_code for a in answers} == {200, 201}

    with serving(create_app(opener)) as url:
        asyncio.run(load(url))
    with opener() as memory:
        entries = [e.entry for e in memory.audit_entries(calls_only=True) if e.entry.fields["action"] != "audit.show"]
    ran = [(e.fields["action"], e.time) for e in entries]
    assert [action for action, _ in ran].count("remember") == 11 and len(ran) == 73
    assert ran == sorted(ran, key=lambda item: item[1])


def test_reads_whose_entries_cannot_be_written_are_a_503(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock held elsewhere past the busy timeout keeps the recalls' group from being
    written: each recall is a 503, not an answer without its entry, and the next recall
    after the lock is free starts a new group and is answered."""
    from deleatur import sqlitefile

    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER)}"}
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 300)
    holder = apsw.Connection(str(tmp_path / "mem.db"))
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        assert http.post("/v1/memories", json={"text": "unwritten reads", "subject": "a"}).status_code == 201
        holder.execute("BEGIN IMMEDIATE").fetchall()
        try:
            refused = http.get("/v1/memories/search", params={"q": "unwritten"})
        finally:
            holder.execute("ROLLBACK").fetchall()
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "store_busy"
        answered = http.get("/v1/memories/search", params={"q": "unwritten"})
        assert answered.status_code == 200 and len(answered.json()["hits"]) == 1
    holder.close()
    with opener() as memory:
        actions = [e.entry.fields["action"] for e in memory.audit_entries(calls_only=True)]
    assert actions.count("recall") == 1


def test_writes_served_together_are_made_and_committed_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another process holds the write lock, remembers queue, none answered; once
    it is free, one transaction makes them all (each its own savepoint) and one
    checkpoint signs them, even where every write is signed; then each is answered with
    its record, and the log verifies."""
    from deleatur import sqlitefile
    from deleatur.servers.groupcommit import CommitGroups

    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER)}"}
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 600_000)
    writers = 8
    queued: list[int] = []
    gathered = threading.Event()
    flushes: list[int] = []  # the writes each flush that went through made
    real_write, real_make = CommitGroups.write, CommitGroups._make

    async def counted(self: CommitGroups, call: Any) -> Any:
        queued.append(1)
        if len(queued) == writers:
            gathered.set()
        return await real_write(self, call)

    def made(self: CommitGroups, memory: Memory, *, flushed: list[Any]) -> None:
        real_make(self, memory, flushed=flushed)
        flushes.append(len(flushed))

    monkeypatch.setattr(CommitGroups, "write", counted)
    monkeypatch.setattr(CommitGroups, "_make", made)
    with opener() as memory:
        start = memory.backend.log_size()
    holder = apsw.Connection(str(tmp_path / "mem.db"))
    app = create_app(opener, sign_every_write=True)
    with serving(app) as url, httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        answers: list[httpx.Response] = []
        holder.execute("BEGIN IMMEDIATE").fetchall()
        threads = [
            threading.Thread(
                target=lambda i=i: answers.append(
                    http.post("/v1/memories", json={"text": f"queued {i}", "subject": "a"})
                )
            )
            for i in range(writers)
        ]
        for thread in threads:
            thread.start()
        try:
            assert gathered.wait(timeout=60), "the remembers never all queued"
            assert not answers and not flushes  # none made, none answered, while the lock is held
        finally:
            holder.execute("ROLLBACK").fetchall()
            for thread in threads:
                thread.join(timeout=60)
        assert sorted(a.status_code for a in answers) == [201] * writers
        assert sorted(a.json()["text"] for a in answers) == sorted(f"queued {i}" for i in range(writers))
    holder.close()
    assert flushes == [writers]
    with opener() as memory:
        assert sorted(r.text for r in memory.list()) == sorted(f"queued {i}" for i in range(writers))
        conn = memory.backend._conn  # type: ignore[attr-defined]
        signed = [size for (size,) in conn.execute("SELECT size FROM log_checkpoints WHERE size > ?", (start,))]
        assert min(signed) == start + 2 * writers  # each write and its call entry, signed once
        assert memory.verify_log().ok


def test_a_server_that_goes_idle_signs_what_its_handle_left_unsigned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One handle signs at most once per checkpoint interval, so the last requests of a
    burst may leave entries no checkpoint covers: once the interval has passed with no
    write to sign them, the server signs them itself, and a verification from another
    process (which signs nothing of another's) finds every entry covered."""
    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER)}"}
    signed = threading.Event()
    real = Memory.sign_pending

    def watched(self: Memory) -> None:
        real(self)
        signed.set()

    def opened() -> Memory:
        # A clock that stands still: only the handle's first write is due to sign.
        return Memory.open(tmp_path / "mem.db", from_bytes(MASTER), clock=FakeClock(), checkpoint_interval_us=50_000)

    monkeypatch.setattr(Memory, "sign_pending", watched)
    with serving(create_app(opened)) as url, httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        for i in range(3):
            assert http.post("/v1/memories", json={"text": f"burst {i}", "subject": "a"}).status_code == 201
        assert http.get("/v1/memories/search", params={"q": "burst"}).status_code == 200
        store = apsw.Connection(str(tmp_path / "mem.db"))
        assert signed.wait(timeout=30), "the server never signed its tail"
        entries = store.execute("SELECT count(*) FROM log_entries").fetchall()[0][0]
        newest = store.execute("SELECT max(size) FROM log_checkpoints").fetchall()[0][0]
        store.close()
        assert newest == entries


def test_a_server_that_stops_leaves_no_signing_of_its_tail_behind(tmp_path: Path) -> None:
    """The signing of the tail, due a checkpoint interval after the last call, is called
    off as the server stops (its handle's close signs instead): a task left to wake up
    later would find the handles closed, in a loop that serves on (an embedding app's)."""
    opener = new_store(tmp_path / "mem.db")
    key = api_key(opener, Role.MEMBER)
    # A clock that stands still: the handle's first write signs, the second leaves its
    # entries for the tail's signing, an hour later.
    hour = 3_600_000_000

    def opened() -> Memory:
        return Memory.open(tmp_path / "mem.db", from_bytes(MASTER), clock=FakeClock(), checkpoint_interval_us=hour)

    app = create_app(opened)

    async def run() -> set[asyncio.Task[Any]]:
        lifespan: asyncio.Queue[Message] = asyncio.Queue()
        events: asyncio.Queue[Message] = asyncio.Queue()
        await lifespan.put({"type": "lifespan.startup"})
        running = asyncio.ensure_future(app({"type": "lifespan"}, lifespan.get, events.put))
        assert (await events.get())["type"] == "lifespan.startup.complete"
        body = json.dumps({"text": "the last write", "subject": "a"}).encode()
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Message) -> None:
            sent.append(message)

        headers = [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]
        scope = {"type": "http", "method": "POST", "path": "/v1/memories", "raw_path": b"/v1/memories"}
        for _ in range(2):
            await app({**scope, "headers": headers, "query_string": b"", "http_version": "1.1"}, receive, send)
        assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [201, 201]
        assert {t.get_coro().__name__ for t in asyncio.all_tasks()} >= {"sign_tail"}  # type: ignore[union-attr]
        await lifespan.put({"type": "lifespan.shutdown"})
        assert (await events.get())["type"] == "lifespan.shutdown.complete"
        await running
        return {task for task in asyncio.all_tasks() if task.get_coro().__name__ == "sign_tail"}  # type: ignore[union-attr]

    assert asyncio.run(run()) == set()  # nothing left to wake up
    with opener() as memory:
        assert memory.verify_log().ok


def test_a_lock_held_past_the_busy_timeout_is_a_503_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deleatur import sqlitefile

    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER)}"}
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 300)
    holder = apsw.Connection(str(tmp_path / "mem.db"))
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        holder.execute("BEGIN IMMEDIATE").fetchall()
        try:
            answers = [http.post("/v1/memories", json={"text": f"waits {i}", "subject": "a"}) for i in range(2)]
        finally:
            holder.execute("ROLLBACK").fetchall()
        for answer in answers:
            assert answer.status_code == 503
            assert answer.json()["error"]["code"] == "store_busy"
            assert "nothing was changed" in answer.json()["error"]["message"]
        assert http.get("/v1/memories").json()["records"] == []
    holder.close()
    with opener() as memory:  # the refused tries left no entry, not even a failed one
        actions = [e.entry.fields["action"] for e in memory.audit_entries(calls_only=True)]
    assert "list" in actions and "remember" not in actions


def test_the_readme_lists_every_error_code() -> None:
    """The README's table of error codes is the servers' mapping, so the two never drift."""
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    listed = {code: int(status) for status, code in re.findall(r"^\| (\d{3}) \| `([a-z_]+)` \|", readme, re.M)}
    assert listed == ERROR_CODES


def test_unexpected_error_is_a_500_naming_only_its_type() -> None:
    def broken() -> Memory:
        raise OSError("disk gone")

    with serving(create_app(broken)) as url:
        response = httpx.get(f"{url}/v1/checkpoint", headers={"Authorization": "Bearer dlt_any"})
    assert response.status_code == 500
    assert response.json()["error"] == {"code": "internal", "message": "internal error (OSError)"}


def test_bearer_key_required_and_capabilities_enforced(base_url: str, keys: Keys) -> None:
    for headers in ({}, {"Authorization": "Bearer dlt_nope"}, {"Authorization": f"Basic {keys[Role.ADMIN]}"}):
        refused = httpx.get(f"{base_url}/v1/memories", headers=headers)
        assert (refused.status_code, refused.json()["error"]["code"]) == (401, "unauthenticated")
        assert refused.headers["www-authenticate"].startswith("Bearer")
    assert httpx.get(f"{base_url}/openapi.json").status_code == 200  # the API's description is public
    with Client(base_url, api_key="dlt_bad") as stranger, pytest.raises(AuthenticationError):
        stranger.list()
    with Client(base_url, api_key=keys[Role.VIEWER]) as viewer:
        assert list(viewer.list(space=Space("nobody"))) == []
        with pytest.raises(AccessDeniedError) as denied:
            viewer.remember("x", subject="y")
        assert denied.value.missing == "write"
        assert denied.value.status == 403  # type: ignore[attr-defined]
    who = httpx.get(f"{base_url}/v1/whoami", headers={"Authorization": f"Bearer {keys[Role.AUDITOR]}"}).json()
    assert (who["role"], who["capabilities"]) == ("auditor", ["verify"])
    with Client(base_url, api_key=keys[Role.AUDITOR]) as auditor:
        assert auditor.verify_log().ok
        denied_erasure = httpx.delete(
            f"{base_url}/v1/subjects/anyone", headers={"Authorization": f"Bearer {keys[Role.AUDITOR]}"}
        )
        assert denied_erasure.status_code == 403
        assert denied_erasure.json()["error"]["missing"] == "delete"


def test_agent_erases_only_with_its_dry_run_token(base_url: str, keys: Keys) -> None:
    with Client(base_url, api_key=keys[Role.AGENT]) as agent:
        agent.remember("Frank's order", subject="Frank", space=Space("agent-user"))
        with pytest.raises(InvalidInputError) as unconfirmed:
            agent.erase("Frank", request_id="AG-1")
        assert unconfirmed.value.status == 428  # type: ignore[attr-defined]
        plan = agent.erase("Frank", dry_run=True, issue_token=True)
        done = agent.erase("Frank", request_id="AG-2", confirmation=plan.token).request
        assert done is not None and done.counts["records"] == 1
        # The token confirms the basis and requester its dry run was given: over HTTP too,
        # where the dry run took neither and confirmed only the default basis.
        agent.remember("Gina's order", subject="Gina", space=Space("agent-user"))
        basis, requester = "Art. 17(1)(d)", "Gina herself"
        plan = agent.erase("Gina", dry_run=True, issue_token=True, basis=basis, requester=requester)
        with pytest.raises(ConfirmationRequiredError, match="another legal basis or requester"):
            agent.erase("Gina", request_id="AG-3", confirmation=plan.token, basis="Art. 17(1)(a)")
        done = agent.erase("Gina", request_id="AG-3", confirmation=plan.token, basis=basis, requester=requester).request
        assert done is not None and done.basis == "Art. 17(1)(d)" and done.requester.startswith("Gina herself (via ")


def test_an_agent_without_a_token_learns_and_holds_no_request_id(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Through HTTP as through the library: with a string that is no token, an id in use
    and a free one get the same refusal, and an erasure the agent made ambiguous records
    no request, so the DPO's erasure under that id goes ahead."""
    opener = new_store(tmp_path_factory.mktemp("agent-token") / "mem.db")
    admin = {"Authorization": f"Bearer {api_key(opener, Role.ADMIN)}"}
    agent = {"Authorization": f"Bearer {api_key(opener, Role.AGENT, scopes=['u2'])}"}
    with serving(create_app(opener)) as url, httpx.Client(base_url=url) as http:
        writes = [(admin, "Carol", "u1"), (agent, "Bob", "u2"), (agent, "BOB", "u2")]
        for headers, subject, user_id in writes:
            written = http.post(
                "/v1/memories", headers=headers, json={"text": "t", "subject": subject, "user_id": user_id}
            )
            assert written.status_code == 201
        taken = http.delete(
            "/v1/subjects/Carol", headers={**admin, "Idempotency-Key": "DSAR-IN-USE"}, params={"user_id": "u1"}
        )
        assert taken.status_code == 202

        def probe(request_id: str) -> tuple[int, Any]:
            refused = http.delete(
                "/v1/subjects/Bob",
                headers={**agent, "Idempotency-Key": request_id},
                params={"user_id": "u2", "confirmation": "garbage"},
            )
            error = refused.json()["error"]
            assert error.pop("request_id") == request_id  # the caller's own, in use or not
            return refused.status_code, error

        in_use, free = probe("DSAR-IN-USE"), probe("DSAR-FREE")
        assert in_use == free == (428, {"code": "confirmation_required", "message": "unknown confirmation token"})
        assert http.get("/v1/erasures/DSAR-FREE", headers=admin).status_code == 404
        dpo = http.delete("/v1/subjects/Dave", headers={**admin, "Idempotency-Key": "DSAR-FREE"})
        assert dpo.status_code == 202 and dpo.json()["request"]["status"] == "complete"


def test_audit_trail_records_calls(client: Client, base_url: str, admin: dict[str, str]) -> None:
    client.remember("audited", subject="Gina", space=Space("audit-user"))
    entries = httpx.get(f"{base_url}/v1/audit", params={"calls_only": True, "limit": 1000}, headers=admin).json()
    actions = [e["action"] for e in entries["entries"]]
    assert "remember" in actions
    verified = httpx.get(f"{base_url}/v1/audit/verify", headers=admin).json()
    assert verified["verdict"] == "PASS"


def test_an_audit_page_reads_a_bounded_part_of_the_log(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of GET /v1/audit read on through the log until it had ``limit`` entries: a
    filter that matches few (an actor's calls, a key scoped to few users) read the whole
    log for one page, 22 s for 200,000 entries, holding the store handle. Now a page reads
    at most MAX_AUDIT_SCAN of the log's entries and says where the next starts; the client
    follows the pages, or stops after reading ``scan`` entries."""
    opener = new_store(tmp_path_factory.mktemp("audit-scan") / "mem.db")
    with opener() as memory:
        principal = memory.create_principal("writer", Role.MEMBER)[0]
        writer = memory.as_principal(principal)
        for n in range(3):
            memory.remember_many([NewMemory(f"note {i}", subject="Someone") for i in range(MAX_AUDIT_SCAN // 2)])
            writer.remember(f"the writer's note {n}", subject="Someone")
        wanted = [e.to_json() for e in memory.audit_entries(actor=principal.id)]
        end = memory.backend.log_size()
    assert len(wanted) == 3 and wanted[-1]["index"] > MAX_AUDIT_SCAN
    read: list[int] = []
    rows = SQLiteBackend.log_entries_with_users

    def counted(backend: SQLiteBackend, tenant: str, start: int = 0) -> Iterator[tuple[int, bytes, str | None]]:
        for row in rows(backend, tenant, start):
            read.append(row[0])
            yield row

    monkeypatch.setattr(SQLiteBackend, "log_entries_with_users", counted)
    key = api_key(opener, Role.AUDITOR)
    auditor = {"Authorization": f"Bearer {key}"}
    with serving(create_app(opener)) as url, Client(url, api_key=key) as remote:
        page = httpx.get(f"{url}/v1/audit", params={"actor": "nobody", "start": 5}, headers=auditor).json()
        assert page == {"entries": [], "next": 5 + MAX_AUDIT_SCAN}
        assert read == list(range(5, 6 + MAX_AUDIT_SCAN))  # the entries read, and the next one's index
        narrower = httpx.get(f"{url}/v1/audit", params={"start": 5, "limit": 2, "scan": 4}, headers=auditor).json()
        assert [e["index"] for e in narrower["entries"]] == [5, 6] and narrower["next"] == 7
        trail = remote.audit_entries(actor=principal.id)
        assert [e.to_json() for e in trail] == wanted and trail.resume is None
        before_last = wanted[-1]["index"]  # reads every entry before the writer's last call
        trail = remote.audit_entries(actor=principal.id, scan=before_last)
        assert [e.to_json() for e in trail] == wanted[:2] and trail.resume == before_last
        last = httpx.get(f"{url}/v1/audit", params={"start": end + 100}, headers=auditor).json()
        assert last == {"entries": [], "next": None}


def test_a_scoped_key_cannot_link_a_guessed_name_through_the_audit_route(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The review's repro: a key scoped to u2 names a guessed person in a dry run of its
    own, then looks for that pseudonym in every other user's entries."""
    opener = new_store(tmp_path_factory.mktemp("audit") / "mem.db")
    admin_key, auditor_key = api_key(opener, Role.ADMIN), api_key(opener, Role.AUDITOR, scopes=["u2"])
    admin, auditor = ({"Authorization": f"Bearer {k}"} for k in (admin_key, auditor_key))
    member = {"Authorization": f"Bearer {api_key(opener, Role.MEMBER, scopes=['u2'])}"}
    with opener() as memory:
        u2 = memory._user_token("u2")
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, timeout=60) as http:
        for text, user in (("diagnosis A", "u1"), ("diagnosis B", "u1"), ("address", "u1"), ("ticket", "u3")):
            memory_json = {"text": text, "subject": "Alice Martin", "user_id": user}
            assert http.post("/v1/memories", headers=admin, json=memory_json).status_code == 201
        assert http.get("/v1/export", headers=admin, params={"subject": "Alice Martin"}).status_code == 200
        restriction = {"subject": "Alice Martin", "reason": "contests accuracy"}
        assert http.post("/v1/restrictions", headers=admin, json=restriction).status_code == 201
        erased = http.delete(
            "/v1/subjects/Alice Martin", headers={**admin, "Idempotency-Key": "DSAR-9"}, params={"user_id": "u1"}
        )
        assert erased.json()["request"]["counts"]["records"] == 3
        own = {"text": "Bob's note", "subject": "Bob", "user_id": "u2"}
        assert http.post("/v1/memories", headers=member, json=own).status_code == 201
        guess = {"subject": "alice martin", "user_id": "u2"}
        assert http.post("/v1/erasure-plans", headers=member, json=guess).status_code == 200

        def trail(who: dict[str, str], limit: int = 1000) -> list[dict[str, Any]]:
            """The trail as ``who`` reads it, ``limit`` entries a page, up to a short page
            (an unscoped reader's trail grows by an entry a page: its reads)."""
            out: list[dict[str, Any]] = []
            while True:
                start = out[-1]["index"] + 1 if out else 0
                page = http.get("/v1/audit", headers=who, params={"start": start, "limit": limit}).json()["entries"]
                out += page
                if len(page) < limit:
                    return out

        seen = trail(member)
        assert trail(auditor) == trail(auditor, limit=2) == seen  # the same scopes see the same, page by page
        shown = json.dumps(seen)
        assert "DSAR-9" not in shown and '"psn:' not in shown and "sealed" not in shown
        assert [e.get("action", e["type"]) for e in seen] == ["key"] + ["principal.create"] * 2 + [
            "write",
            "remember",
            "erase",
        ]
        assert all(e["users"] == [u2] for e in seen if e["type"] == "call")
        assert seen[-1]["subject"].startswith("spsn:") and "subject_name" not in seen[-1]
        assert http.get("/v1/audit/verify", headers=auditor).json()["verdict"] == "PASS"
        # The admin's trail is unchanged: every entry, her name, her erasure in u1.
        everything = trail(admin)
        assert [e["index"] for e in everything] == list(range(len(everything)))
        assert {"DSAR-9", "alice martin"} <= {str(e.get("request")) for e in everything} | {
            str(e.get("subject_name")) for e in everything
        }


def test_decisions_are_signed_and_redacted_on_erasure(client: Client) -> None:
    space = Space("decider")
    used = client.remember("Refunds within 30 days", subject="refund_window", space=space)
    decision = client.record_decision("Refund order #91", [used.id], space=space)
    explained = client.explain_decision(decision.id, space=space)
    assert explained.body["beliefs"][0]["value"] == "Refunds within 30 days"
    erased = client.erase("refund_window", request_id="DEC-1", scope=SpaceFilter("decider")).request
    assert erased is not None and erased.counts["decisions_redacted"] == 1
    belief = client.explain_decision(decision.id, space=space).body["beliefs"][0]
    assert (belief["redacted"], belief["value"]) == (True, None)


def test_client_list_follows_pages_to_the_end(tmp_path_factory: pytest.TempPathFactory) -> None:
    opener = new_store(tmp_path_factory.mktemp("pages") / "mem.db")
    with opener() as memory:
        written = memory.remember_many(
            [NewMemory(f"note {i}", subject="a") for i in range(2_345)], space=Space("pages")
        )
    key = api_key(opener, Role.VIEWER)
    with serving(create_app(opener)) as url, Client(url, api_key=key) as remote:
        everything = list(remote.list(space=Space("pages")))
        assert everything == sorted(written, key=lambda r: r.id)  # all of them, in order, once
        assert len(list(remote.list(space=Space("pages"), limit=1_200))) == 1_200
        assert list(remote.list(space=Space("pages"), after=everything[999].id, limit=5)) == everything[1000:1005]
        page = httpx.get(
            f"{url}/v1/memories",
            params={"user_id": "pages", "limit": 1000, "after": everything[1999].id},
            headers={"Authorization": f"Bearer {key}"},
        ).json()
        assert len(page["records"]) == 345 and page["next"] is None
        exact = httpx.get(
            f"{url}/v1/memories",
            params={"user_id": "pages", "limit": 345, "after": everything[1999].id},
            headers={"Authorization": f"Bearer {key}"},
        ).json()
        assert len(exact["records"]) == 345 and exact["next"] is None  # a full last page says it is the last
        bad = httpx.get(f"{url}/v1/memories", params={"after": "nope"}, headers={"Authorization": f"Bearer {key}"})
        assert bad.status_code == 422 and "not a record id" in bad.text


def test_pages_stop_before_passing_the_byte_cap(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A page of GET /v1/memories was capped by count alone: 10,000 records of 64 KiB,
    640 MiB, built whole on the event loop. Now it stops before the record that would
    pass the cap, and its cursor continues from there; the client follows such pages."""
    opener = new_store(tmp_path_factory.mktemp("bytes") / "mem.db")
    with opener() as memory:
        cap, pages = paged_by_bytes(memory, Space("bytes"))
    key = api_key(opener, Role.VIEWER)
    with serving(create_app(opener, max_page_bytes=cap)) as url, Client(url, api_key=key) as remote:
        assert _pages(url, "/v1/memories", key, {"user_id": "bytes"}) == pages
        assert [r.id for r in remote.list(space=Space("bytes"))] == [i for ids in pages for i in ids]


def _pages(url: str, route: str, key: str, params: dict[str, str | int]) -> list[list[str]]:
    """The record ids of each page of ``route``, following its cursor to the end."""
    got: list[list[str]] = []
    params = {**params, "limit": 100}
    while True:
        page = httpx.get(f"{url}{route}", params=params, headers={"Authorization": f"Bearer {key}"}).json()
        got.append([r["id"] for r in page["records"]])
        if page["next"] is None:
            return got
        params["after"] = page["next"]


def test_history_pages_as_a_listing_does(tmp_path_factory: pytest.TempPathFactory) -> None:
    """GET /v1/history answered every version of a key at once, however many: a key
    rewritten 2,000 times with 60 KB values took 231 MiB to read, and it has no bound.
    Now it pages and stops before the byte cap as GET /v1/memories does; the client
    follows the pages, and a key with no version is still not found. Each page is a
    history call in the audit trail, and an unknown key a failed one, as the library's
    history makes them (they were list calls, and an unknown key left no entry)."""
    opener = new_store(tmp_path_factory.mktemp("history") / "mem.db")
    with opener() as memory:
        cap, pages = paged_by_bytes(memory, Space("bytes"), key="pages::k")
        memory.remember("another key", subject="Pages", key="pages::other", space=Space("bytes"))
    key = api_key(opener, Role.VIEWER)
    with serving(create_app(opener, max_page_bytes=cap)) as url, Client(url, api_key=key) as remote:
        assert _pages(url, "/v1/history", key, {"user_id": "bytes", "key": "pages::k"}) == pages
        assert [r.id for r in remote.history("pages::k", space=Space("bytes"))] == [i for ids in pages for i in ids]
        with pytest.raises(NotFoundError, match="no record with this key in this space"):
            remote.history("pages::none", space=Space("bytes"))
        assert [r.id for r in remote.versions("pages::k", space=Space("bytes"), limit=3, after=pages[0][0])] == [
            pages[0][1],
            *pages[1],
        ]
    with opener() as memory, pytest.raises(NotFoundError):
        memory.history("pages::none", space=Space("bytes"))  # as the library audits it
    ok, unknown = ("history", "ok", None), ("history", "failed", "NotFoundError")
    assert reads_of_records(opener) == [*[ok] * 10, unknown, ok, ok, unknown]  # the last one the library's


def test_exports_stream_and_refusals_keep_their_status(tmp_path_factory: pytest.TempPathFactory) -> None:
    opener = new_store(tmp_path_factory.mktemp("export") / "mem.db")
    with opener() as memory:
        memory.remember_many(
            [NewMemory(f"Alice note {i} " + "x" * 200, subject="Alice") for i in range(1_500)], space=Space("u1")
        )
    scoped = api_key(opener, Role.VIEWER, scopes=["u2"])
    admin_key = api_key(opener, Role.ADMIN)
    with serving(create_app(opener)) as url, Client(url, api_key=admin_key) as remote:
        out = io.StringIO()
        counts = remote.export_json(out, user_id="u1")
        data = json.loads(out.getvalue())  # > 300 kB, several chunks, one valid document
        assert counts == data["counts"] and counts["records"] == len(data["records"]) == 1_500
        with pytest.raises(InvalidInputError, match="exactly one"):
            remote.export_json(io.StringIO(), subject="Alice", user_id="u1")
        with Client(url, api_key=scoped) as narrow, pytest.raises(AccessDeniedError) as denied:
            narrow.export_json(io.StringIO(), user_id="u1")
        assert denied.value.missing == "scope"
        # The pool's handle stays free while an export runs on its own.
        assert remote.recall("note", space=Space("u1"), limit=1)


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Memory]:
    """About 11 MB of export for one user: far more than the export's queue and the
    loopback socket's buffers hold, so an export that is not read stays running."""
    opener = new_store(tmp_path_factory.mktemp("big") / "mem.db")
    with opener() as memory:
        for batch in range(10):
            memory.remember_many(
                [NewMemory(f"note {batch}-{i} " + "y" * 1000, subject="Alice") for i in range(1000)],
                space=Space("u1"),
            )
    return opener


def test_calls_during_an_export_are_not_frozen(big_store: Callable[[], Memory]) -> None:
    admin_key = api_key(big_store, Role.ADMIN)
    headers = {"Authorization": f"Bearer {admin_key}"}
    with serving(create_app(big_store)) as url, Client(url, api_key=admin_key) as remote:
        target = remote.remember("to retire", subject="Bob", space=Space("u2"))
        started, received = threading.Event(), []

        def read_export() -> None:
            with httpx.stream("GET", f"{url}/v1/export", params={"user_id": "u1"}, headers=headers) as response:
                for chunk in response.iter_bytes():
                    received.append(chunk)
                    started.set()

        reader = threading.Thread(target=read_export)
        reader.start()
        assert started.wait(30)
        t0 = time.monotonic()
        remote.forget(record_id=target.id, space=Space("u2"))  # its scrub waits for no read of the export
        assert time.monotonic() - t0 < 10
        reader.join(60)
        assert not reader.is_alive()
        assert json.loads(b"".join(received))["counts"]["records"] == 10_000


@pytest.mark.parametrize("servers", [1, 2])
def test_an_erasure_during_an_export_waits_not_for_it_and_is_gone_at_once(
    big_store: Callable[[], Memory], monkeypatch: pytest.MonkeyPatch, servers: int
) -> None:
    """An erasure's scrub waited for the read of an export its client was slow to take,
    holding the shared handle (and with one handle every request queued behind it) until
    the export ended; then the export held its -wal instead. An export reads the store a
    page at a time now, no read open while it waits for its client: the erasure answers
    at once, having truncated the -wal, and no byte of the erased record is left anywhere
    while the export goes on. So too with two servers on one store (as the workers of
    `serve http --workers 2` are)."""
    from deleatur import sqlitefile

    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 600_000)  # a scrub that waits outlasts the test
    with big_store() as memory:
        store = memory.backend.files()[0]
    headers = {"Authorization": f"Bearer {api_key(big_store, Role.ADMIN)}"}
    subject, request_id = f"Zed {servers}", f"EXPORTING-{servers}"
    with contextlib.ExitStack() as stack:
        exporting = stack.enter_context(serving(create_app(big_store)))
        first = stack.enter_context(httpx.Client(base_url=exporting, headers=headers, timeout=60))
        second = first
        if servers == 2:
            erasing = stack.enter_context(serving(create_app(big_store)))
            second = stack.enter_context(httpx.Client(base_url=erasing, headers=headers, timeout=60))
        export = stack.enter_context(first.stream("GET", "/v1/export", params={"user_id": "u1"}))
        written = second.post("/v1/memories", json={"text": "qzexportsecret", "subject": subject, "user_id": "u3"})
        ciphertext = _ciphertext(store, written.json()["id"])
        assert export.status_code == 200  # begun, its records read as the client takes them
        try:
            _erased_during_a_long_read(second, subject, request_id, held=False)
            assert _holding(store, ciphertext) == []
        finally:
            whole = json.loads(export.read())
        assert whole["counts"]["records"] == 10_000


def test_an_erasure_during_an_export_that_fails_truncates_the_wal_at_once(
    big_store: Callable[[], Memory], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export that fails midway holds no read of the store, though its error, kept to
    cut the response short, holds the frames it failed in: an erasure meanwhile truncates
    the -wal at once, and the response is cut short."""
    from deleatur import sqlitefile

    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 600_000)  # a scrub that waits outlasts the test
    with big_store() as memory:
        store = memory.backend.files()[0]
    admin_key = api_key(big_store, Role.ADMIN)
    decrypt = Memory._decrypt
    calls = itertools.count()
    entered, release = threading.Event(), threading.Event()

    def failing(self: Memory, row: Any) -> Any:
        if next(calls) == 600:  # in the second batch: the read of the records is under way
            entered.set()
            assert release.wait(timeout=60)
            raise IntegrityError("stored bytes fail authentication")
        return decrypt(self, row)

    with (
        serving(create_app(big_store)) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60) as http,
        Client(url, api_key=admin_key) as remote,
    ):
        record = http.post("/v1/memories", json={"text": "qzfailedexport", "subject": "Yan", "user_id": "u3"}).json()
        ciphertext = _ciphertext(store, record["id"])
        monkeypatch.setattr(Memory, "_decrypt", failing)
        cut: list[DeleaturError] = []

        def export() -> None:
            with pytest.raises(DeleaturError, match="cut short") as failed:
                remote.export_json(io.StringIO(), user_id="u1")
            cut.append(failed.value)

        exporter = threading.Thread(target=export)
        exporter.start()
        try:
            assert entered.wait(timeout=30)
            _erased_during_a_long_read(http, "Yan", "FAILING", held=False)
        finally:
            release.set()
            exporter.join(timeout=60)
        assert len(cut) == 1
        assert _holding(store, ciphertext) == []
        assert "wal_not_truncated" not in http.get("/v1/erasures/FAILING").json()["counts"]


def test_exports_beyond_the_limit_get_503(big_store: Callable[[], Memory]) -> None:
    admin_key = api_key(big_store, Role.ADMIN)
    headers = {"Authorization": f"Bearer {admin_key}"}
    with (
        serving(create_app(big_store)) as url,
        httpx.Client(base_url=url, headers=headers, timeout=60) as http,
        contextlib.ExitStack() as held,
    ):
        for _ in range(MAX_EXPORTS):
            stream = held.enter_context(http.stream("GET", "/v1/export", params={"user_id": "u1"}))
            assert stream.status_code == 200  # started, then left unread
        busy = http.get("/v1/export", params={"user_id": "u1"})
        assert (busy.status_code, busy.json()["error"]["code"]) == (503, "busy")


def test_an_export_cut_short_is_reported_not_taken_for_whole(
    big_store: Callable[[], Memory], monkeypatch: pytest.MonkeyPatch
) -> None:
    admin_key = api_key(big_store, Role.ADMIN)
    with serving(create_app(big_store)) as url:
        decrypt = Memory._decrypt
        calls = itertools.count()

        def failing(self: Memory, row: Any) -> Any:
            if next(calls) == 5_000:
                raise IntegrityError("stored bytes fail authentication")
            return decrypt(self, row)

        monkeypatch.setattr(Memory, "_decrypt", failing)
        with Client(url, api_key=admin_key) as remote, pytest.raises(DeleaturError, match="cut short"):
            remote.export_json(io.StringIO(), user_id="u1")


def test_a_raw_key_is_named_after_the_documents_log_as_the_cli_names_it(tmp_path: Path, cli: Cli) -> None:
    """A certificate and a receipt of one store, verified by another store's server under
    the first store's raw (hex) public key: the key is named after the log the document
    comes from, as `deleatur verify` and `verify-receipt` name it, and both pass (the
    server named it after its own store, and both failed)."""
    issuing = new_store(tmp_path / "issuing.db")
    with issuing() as memory:
        record = memory.remember("Alice's phone", subject="Alice Martin")
        receipt = memory.receipt(record.id).to_json()
        memory.erase("Alice Martin", request_id="RAW-KEY", basis="Art. 17", requester="Alice")
        certificate = json.dumps(memory.certificate("RAW-KEY"))
        raw = memory.public_key().public_key.hex()
    (tmp_path / "c.json").write_text(certificate)
    (tmp_path / "r.json").write_text(json.dumps(receipt))
    assert cli("verify", str(tmp_path / "c.json"), "--expected-pubkey", raw)[0] == 0
    assert cli("verify-receipt", str(tmp_path / "r.json"), "--key", raw)[0] == 0
    other = new_store(tmp_path / "other.db")
    with serving(create_app(other)) as url, Client(url, api_key=api_key(other, Role.AUDITOR)) as client:
        assert client.verify_certificate(certificate, expected_pubkey=raw).ok
        assert client.verify_receipt(json.dumps(receipt), key=raw).ok


@pytest.mark.parametrize("writers", [("b", "b", "a", "a"), ("a", "a")])
def test_two_workers_verify_a_healthy_log(tmp_path: Path, writers: tuple[str, ...]) -> None:
    """`serve http --workers 2`: two processes, a handle each (two servers here, made as
    the command makes them). A verification through one of them finds every entry of the
    other covered, the verifying one having entries of its own to sign or none: each
    signs every write (one of them left entries unsigned for its next checkpoint, which
    failed the other's coverage check)."""
    opener = new_store(tmp_path / "mem.db")
    headers = {"Authorization": f"Bearer {api_key(opener, Role.ADMIN)}"}
    with (
        serving(create_app(opener, sign_every_write=True)) as a,
        serving(create_app(opener, sign_every_write=True)) as b,
    ):
        urls = {"a": a, "b": b}
        for i, writer in enumerate(writers):
            written = httpx.post(f"{urls[writer]}/v1/memories", json={"text": f"w{i}", "subject": "S"}, headers=headers)
            assert written.status_code == 201
        for route in ("/v1/log/verify", "/v1/audit/verify"):
            report = httpx.get(f"{b}{route}", headers=headers, timeout=60).json()
            assert report["verdict"] == "PASS", report


def test_a_document_with_bytes_that_are_not_utf8_is_refused_as_the_cli_refuses_its_file(
    tmp_path: Path, cli: Cli
) -> None:
    """An encoded surrogate (ED A0 80) in a certificate or receipt sent as an object: the
    body's bytes are decoded as json.loads decodes them, which let it through, and the
    verifier failed a check; `deleatur verify` refuses a file with those bytes as not
    UTF-8 text (exit 2). Both now refuse it alike (422)."""
    opener = new_store(tmp_path / "mem.db")
    with opener() as memory:
        record = memory.remember("Ann's phone", subject="Ann")
        receipt = json.dumps(memory.receipt(record.id).to_json()).encode()
        memory.erase("Ann", request_id="NOT-UTF8", basis="Art. 17", requester="Ann")
        certificate = json.dumps(memory.certificate("NOT-UTF8")).encode()
    bad_certificate = certificate.replace(b'"NOT-UTF8"', b'"NOT-UTF8\xed\xa0\x80"', 1)
    bad_receipt = receipt.replace(b'"format": "', b'"format": "\xed\xa0\x80', 1)
    assert bad_certificate != certificate and bad_receipt != receipt
    (tmp_path / "c.json").write_bytes(bad_certificate)
    code, _, err = cli("verify", str(tmp_path / "c.json"))
    assert code == 2 and "not UTF-8 text" in err
    headers = {"Authorization": f"Bearer {api_key(opener, Role.AUDITOR)}", "Content-Type": "application/json"}
    with serving(create_app(opener)) as url, httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        for route, member, document in (
            ("/v1/certificates/verify", b"certificate", bad_certificate),
            ("/v1/receipts/verify", b"receipt", bad_receipt),
        ):
            reply = http.post(route, content=b'{"' + member + b'": ' + document + b"}")
            assert (reply.status_code, reply.json()["error"]["code"]) == (422, "invalid_input"), reply.text
            assert reply.json()["error"]["message"] == f"the {member.decode()} is not UTF-8 text"
