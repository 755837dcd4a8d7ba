"""deleatur.client against the library: for each call they share, the client (through
uvicorn on loopback) returns what ``Memory`` returns over the same store, of the same
type, and refuses with the same error class."""

from __future__ import annotations

import inspect
import io
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from deleatur import (
    AccessDeniedError,
    Checkpoint,
    DeleaturError,
    ExposedKeyFileError,
    Hit,
    InvalidInputError,
    Memory,
    NoteError,
    Receipt,
    Record,
    Role,
    SigningKeyMissingError,
    Space,
    SpaceFilter,
    Status,
    Verifier,
    from_bytes,
    verify_receipt,
)
from deleatur import client as client_module
from deleatur.access.audit import AuditEntry
from deleatur.client import Client
from deleatur.clock import LATEST, system_clock
from deleatur.erasure.engine import ErasureResult
from deleatur.erasure.verify import verify_certificate
from deleatur.servers.http import create_app

from .conftest import MASTER
from .serving import (
    api_key,
    assert_refused_unechoed,
    assert_the_librarys_report,
    certificate_texts,
    new_store,
    receipt_texts,
    serving,
)


@dataclass
class Pair:
    """One principal, remote and embedded: a client of the server, and a library
    handle on the server's store acting for the same key."""

    remote: Client
    local: Memory
    store: Path


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Role, Pair]]:
    store = tmp_path_factory.mktemp("client") / "mem.db"
    opener = new_store(store)
    keys = {role: api_key(opener, role) for role in (Role.ADMIN, Role.VIEWER)}
    with serving(create_app(opener)) as url, opener() as memory:
        made = {
            role: Pair(Client(url, api_key=key), memory.as_principal(memory.authenticate(key)), store)
            for role, key in keys.items()
        }
        try:
            yield made
        finally:
            for pair in made.values():
                pair.remote.close()


@pytest.fixture
def admin(pairs: dict[Role, Pair]) -> Pair:
    return pairs[Role.ADMIN]


def same(remote: object, local: object) -> None:
    """Equal, and of the same type (element by element for a list)."""
    assert type(remote) is type(local)
    if isinstance(remote, list) and isinstance(local, list):
        assert [type(item) for item in remote] == [type(item) for item in local]
    assert remote == local


def test_records_are_the_librarys(admin: Pair) -> None:
    client, memory = admin.remote, admin.local
    space = Space("records", agent_id="support", run_id="r1")
    first = client.remember(
        "Ann's phone is +100",
        subject="  Ann   LEE ",
        key="Ann::Phone",
        space=space,
        metadata={"crm": {"id": 7, "tags": ["vip", None]}, "score": 0.1},
        source="crm",
        confidence=0.75,
        expires_at=4_000_000_000_000_001,
    )
    same(first, memory.get(first.id, space=space))
    derived = client.remember("Ann's team is blue", subject="Team", derived_from=[first.id], space=space)
    same(derived, memory.get(derived.id, space=space))
    same(client.get(first.id, space=space), memory.get(first.id, space=space))
    fixed = client.rectify("ann::phone", "Ann's phone is +101", reason="typo", actor="dpo", space=space)
    same(fixed, memory.get(fixed.id, space=space))
    same(client.history("ann::phone", space=space), memory.history("ann::phone", space=space))
    retired = client.forget(record_id=derived.id, space=space)
    same(retired, memory.get(derived.id, space=space))
    same(client.recall("phone team", space=space), memory.recall("phone team", space=space))
    assert client.recall_json("phone team", space=space) == memory.recall_json("phone team", space=space)
    for arguments in (
        {},
        {"include_history": True},
        {"subject": "ann lee", "include_history": True},
        {"key": "ANN::phone"},
        {"limit": 1, "include_history": True},
        {"after": first.id, "include_history": True},
    ):
        remote, local = client.list(space=space, **arguments), memory.list(space=space, **arguments)
        assert isinstance(remote, Iterator) and isinstance(local, Iterator), arguments
        same(list(remote), list(local))


def test_the_log_is_the_librarys(admin: Pair) -> None:
    client, memory = admin.remote, admin.local
    record = client.remember("receipt me", subject="Receipts", space=Space("log"))
    remote, local = client.receipt(record.id, space=Space("log")), memory.receipt(record.id, space=Space("log"))
    assert type(remote) is type(local)
    # Every call is audited, so the log has grown between the two: the same entry, at
    # the same index, proven under a later checkpoint.
    assert (remote.record_id, remote.entry, remote.proof.index) == (local.record_id, local.entry, local.proof.index)
    key = client.public_key()
    same(key, memory.public_key())
    checked = client.verify_receipt(remote, key=key.vkey)
    same(checked, verify_receipt(remote, [key], pinned=True))
    assert checked.ok
    same(client.checkpoint(), memory.checkpoint())
    size = Checkpoint.parse(memory.checkpoint().text).size
    same(client.checkpoint(size=size), memory.checkpoint(size=size))
    memory.checkpoint()  # both handles' entries covered, so both verify the same log
    remote_report, local_report = client.verify_log(), memory.verify_log()
    same(remote_report, local_report)
    assert remote_report.ok


def test_erasures_are_the_librarys(admin: Pair) -> None:
    client, memory = admin.remote, admin.local
    doomed = client.remember("Bo's address", subject="Bo Ek", space=Space("erasing"))
    client.remember("Bo, derived", subject="Team B", derived_from=[doomed.id], space=Space("erasing", agent_id="x"))
    client.remember("Bo elsewhere", subject="bo  ek", space=Space("kept"))

    remote_plan = client.erase("bo ek", scope=SpaceFilter("erasing"), dry_run=True, issue_token=True)
    local_plan = memory.erase(
        "bo ek",
        request_id="plan",
        basis="b",
        requester="r",
        scope=SpaceFilter("erasing"),
        dry_run=True,
        issue_token=True,
    )
    assert type(remote_plan) is type(local_plan) and remote_plan.plan is not None
    same(remote_plan.plan, local_plan.plan)
    # Team B's key goes with its one record; Bo Ek's stays, for its record in "kept".
    assert (remote_plan.plan.keys_destroyed, remote_plan.plan.subjects) == (1, 2)
    assert remote_plan.request is None and isinstance(remote_plan.token, str)
    account_plan = client.erase_all(user_id="erasing", dry_run=True)
    same(account_plan, memory.erase_all(user_id="erasing", request_id="p", basis="b", requester="r", dry_run=True))

    # The library's call as written: the server records who asked through which key.
    done = client.erase(
        "Bo Ek", request_id="PAR-1", basis="Art. 17(1)(a)", requester="dpo", scope=SpaceFilter("erasing")
    )
    assert isinstance(done, ErasureResult) and not done.repeated
    assert done.plan is None  # the server does not send back what it erased
    same(done.request, memory.erasure_request("PAR-1"))
    assert done.request is not None and done.request.requester == "dpo (via test admin)"
    repeat = memory.erase(
        "Bo Ek", request_id="PAR-1", basis="Art. 17(1)(a)", requester="r", scope=SpaceFilter("erasing")
    )
    same(client.erase("Bo Ek", request_id="PAR-1", basis="Art. 17(1)(a)", scope=SpaceFilter("erasing")), repeat)

    client.remember("an account", subject="Cy", space=Space("account", agent_id="a"))
    gone = client.erase_all(user_id="account", request_id="PAR-2")
    same(gone.request, memory.erasure_request("PAR-2"))
    same(
        client.erase_all(user_id="account", request_id="PAR-2"),
        memory.erase_all(user_id="account", request_id="PAR-2", basis="Art. 17", requester="r"),
    )

    # A record that expires a microsecond after it is written has expired by the purge.
    now = system_clock()
    with Memory.open(admin.store, from_bytes(MASTER), clock=lambda: now) as writer:
        writer.remember("long expired", subject="Old", space=Space("retention"), expires_at=now + 1)
    same(client.purge(dry_run=True), memory.purge(dry_run=True))
    purged = client.purge(request_id="PAR-3")
    same(purged.request, memory.erasure_request("PAR-3"))
    same(client.purge(request_id="PAR-3"), memory.purge(request_id="PAR-3"))

    same(client.erasure_request("PAR-1"), memory.erasure_request("PAR-1"))
    same(client.erasure_requests(), memory.erasure_requests())
    certificate = client.certificate("PAR-1")
    assert type(certificate) is dict and certificate["certificate"]["request"]["id"] == "PAR-1"
    same(
        client.verify_certificate(certificate, expected_pubkey=client.public_key().vkey),
        verify_certificate(certificate, expected_key=memory.public_key()),
    )


def test_a_certificate_or_receipt_text_gets_the_librarys_verdict(admin: Pair) -> None:
    """A certificate's text, as a str or as bytes, gets the report the library gives that
    text: a repeated key or an unsigned member fails check 1. Sent as a dict once parsed,
    as the client took it, a repeated key had lost its first value before the server saw
    it. Text that is not JSON is bad input, as `deleatur verify` says. A receipt's text is
    read as the library reads it (Receipt.loads), and a forged one refused alike."""
    client, memory = admin.remote, admin.local
    memory.remember("Erin's badge is 7", subject="Erin Example", space=Space("as-text"))
    memory.erase("Erin Example", request_id="TEXT-1", basis="Art. 17(1)(a)", requester="dpo")
    vkey = client.public_key().vkey
    for text, failed in certificate_texts(client.certificate("TEXT-1")):
        for sent in (text, text.encode()):
            report = client.verify_certificate(sent, expected_pubkey=vkey)
            assert_the_librarys_report(report.to_json(), text, vkey, failed)
    with pytest.raises(InvalidInputError, match=r"^the certificate is not JSON: "):
        client.verify_certificate('{"certificate": ', expected_pubkey=vkey)
    with pytest.raises(InvalidInputError, match=r"^the certificate is not UTF-8 text$"):
        client.verify_certificate(b'{"certificate": "\xff"}', expected_pubkey=vkey)

    record = memory.remember("a receipt as text", subject="Receipts", space=Space("as-text"))
    other = memory.remember("another record", subject="Receipts", space=Space("as-text"))
    receipt = memory.receipt(record.id, space=Space("as-text"))
    for text, problem in receipt_texts(receipt.to_json(), other.id):
        if problem is None:
            local = verify_receipt(Receipt.loads(text), [Verifier.from_vkey(vkey)], pinned=True)
            same(client.verify_receipt(text, key=vkey), local)
            continue
        with pytest.raises(NoteError) as refused:
            Receipt.loads(text)
        for sent in (text, text.encode()):
            with pytest.raises(NoteError) as remote:
                client.verify_receipt(sent, key=vkey)
            assert remote.value.message == refused.value.message
            assert_refused_unechoed(remote.value.message, problem, other.id)


def test_decisions_restrictions_and_exports_are_the_librarys(admin: Pair) -> None:
    client, memory = admin.remote, admin.local
    space = Space("deciding")
    used = client.remember("Refunds within 30 days", subject="refund_window", space=space, confidence=0.9)
    decision = client.record_decision("Refund order #91", [used.id], space=space)
    same(decision, memory.explain_decision(decision.id, space=space))
    same(client.explain_decision(decision.id, space=space), memory.explain_decision(decision.id, space=space))

    restriction = client.restrict("Dee Fox", reason="accuracy contested", actor="dpo")
    assert restriction.actor == "dpo (via test admin)"
    [own] = [r for r in memory.restrictions() if r.subject == restriction.subject]
    same(restriction, own)
    same(client.restrictions(), memory.restrictions())
    client.unrestrict("Dee Fox", actor="dpo")
    same(client.restrictions(), memory.restrictions())

    remote_out, local_out = io.StringIO(), io.StringIO()
    remote_counts = client.export_json(remote_out, subject="refund_window")
    local_counts = memory.export_json(local_out, subject="refund_window")
    assert type(remote_counts) is type(local_counts)
    # The audit trail grows with each export (the first is in the second's): the rest is the same.
    assert {**remote_counts, "audit_entries": 0} == {**local_counts, "audit_entries": 0}
    assert json.loads(remote_out.getvalue())["records"] == json.loads(local_out.getvalue())["records"]


Call = Callable[[Any], object]
#: A record id no record has: UUIDv7, in the year 2000.
UNKNOWN = "00dc6acf-ac00-7000-8000-000000000000"

#: Calls the library refuses, each made through both as written (see ``refusal_setup``).
REFUSALS: dict[str, Call] = {
    "unknown record": lambda m: m.get(UNKNOWN),
    "malformed record id": lambda m: m.get("nope"),
    "record in another space": lambda m: m.get(next(m.list(space=Space("refusals"))).id),
    "query without words": lambda m: m.recall(" ! "),
    "recall limit": lambda m: m.recall("x", limit=0),
    "list limit": lambda m: m.list(limit=0),
    "list cursor": lambda m: m.list(after="nope"),
    "unknown key": lambda m: m.history("no::such"),
    "forget without a target": lambda m: m.forget(),
    "rectify an unknown key": lambda m: m.rectify("no::such", "t", reason="r", actor="a"),
    "blank text": lambda m: m.remember(" ", subject="s"),
    "metadata with no JSON form": lambda m: m.remember("t", subject="s", metadata={"a": object()}),
    "NaN confidence": lambda m: m.remember("t", subject="s", confidence=math.nan),
    "restricted subject": lambda m: m.remember("more", subject="Restricted Rae", space=Space("refusals")),
    "unknown decision": lambda m: m.explain_decision(UNKNOWN),
    "unknown request": lambda m: m.erasure_request("NOPE-1"),
    "malformed request id": lambda m: m.erasure_request("bad id!"),
    "certificate of no request": lambda m: m.certificate("NOPE-1"),
    "checkpoint of no size": lambda m: m.checkpoint(size=10**12),
    "token outside a dry run": lambda m: m.erase("Amb", request_id="TOK-1", basis="b", requester="r", issue_token=True),
    "ambiguous subject": lambda m: m.erase("Amb", request_id="AMB-1", basis="b", requester="r"),
    "request id reused": lambda m: m.erase("someone else", request_id="REUSED-1", basis="b", requester="r"),
    # Arguments the client converted or sent before the library could see them: they
    # raised TypeError, ValueError or httpx.InvalidURL, or reached another route.
    "metadata a list": lambda m: m.remember("t", subject="s", metadata=[1, 2]),
    "metadata a string": lambda m: m.remember("t", subject="s", metadata="x"),
    "metadata an empty list": lambda m: m.remember("t", subject="s", metadata=[]),
    "list limit beyond SQLite's integers": lambda m: m.list(limit=2**63),
    "audit limit beyond SQLite's integers": lambda m: m.audit_entries(limit=2**63),
    "key too long for a URL": lambda m: m.history("k" * 70_000),
    "export subject too long for a URL": lambda m: m.export_json(io.StringIO(), subject="s" * 70_000),
    "empty record id": lambda m: m.get(""),
    "receipt of an empty record id": lambda m: m.receipt(""),
    "empty decision id": lambda m: m.explain_decision(""),
    "decision id holding a slash": lambda m: m.explain_decision("a/b"),
    "empty request id": lambda m: m.erasure_request(""),
    "certificate of an empty request id": lambda m: m.certificate(""),
    "record id holding a slash": lambda m: m.get("a/receipt"),
    "subject holding a line break": lambda m: m.erase("a\nb", request_id="NL-1", basis="b", requester="r"),
    "user id holding a line break": lambda m: m.erase_all(user_id="a\nb", request_id="NL-2", basis="b", requester="r"),
    "confirmation required": lambda m: m.erase(
        "Nobody", request_id="RC-1", basis="b", requester="r", require_confirmation=True
    ),
    "account erasure confirmation required": lambda m: m.erase_all(
        user_id="refusals", request_id="RC-2", basis="b", requester="r", require_confirmation=True
    ),
}

#: Refusals of ids a route cannot take as they are (empty, or holding '/'): the client
#: refuses them as the library does, message and all, rather than call another route.
SAME_MESSAGE = [name for name in REFUSALS if " id" in name and ("empty" in name or "slash" in name)]


@pytest.fixture(scope="module")
def refusal_setup(pairs: dict[Role, Pair]) -> None:
    memory = pairs[Role.ADMIN].local
    memory.remember("held back", subject="Restricted Rae", space=Space("refusals"))
    memory.restrict("Restricted Rae", reason="contested", actor="dpo")
    memory.remember("one", subject="Amb", space=Space("refusals"))
    memory.remember("two", subject="AMB", space=Space("refusals"))
    memory.remember("reused", subject="Reused", space=Space("reused"))
    memory.erase("Reused", request_id="REUSED-1", basis="b", requester="r")


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refusals_are_the_librarys_errors(admin: Pair, refusal_setup: None, name: str) -> None:
    with pytest.raises(DeleaturError) as local:
        REFUSALS[name](admin.local)
    with pytest.raises(DeleaturError) as remote:
        REFUSALS[name](admin.remote)
    assert type(remote.value) is type(local.value), (remote.value, local.value)


@pytest.mark.parametrize("name", SAME_MESSAGE)
def test_ids_a_route_cannot_take_are_refused_with_the_librarys_message(admin: Pair, name: str) -> None:
    with pytest.raises(DeleaturError) as local:
        REFUSALS[name](admin.local)
    with pytest.raises(DeleaturError) as remote:
        REFUSALS[name](admin.remote)
    assert (type(remote.value), remote.value.message) == (type(local.value), local.value.message)


_ERASE = {"request_id": "ARG-1", "basis": "b", "requester": "r"}

#: Arguments of the wrong type, which the library refuses naming them. Sent as they were,
#: a flag went as text (``dry_run=None`` was dropped: the client erased for real; "false"
#: was true to the server), a number as a string, and a None or a string where a space or
#: a list belongs raised AttributeError or TypeError, or was split into characters.
WRONG_TYPES: dict[str, Callable[[Any], object]] = {
    "dry_run None": lambda m: m.erase("Nobody", dry_run=None, **_ERASE),
    "dry_run 0": lambda m: m.erase("Nobody", dry_run=0, **_ERASE),
    "dry_run text": lambda m: m.erase("Nobody", dry_run="false", **_ERASE),
    "account dry_run None": lambda m: m.erase_all(user_id="u", dry_run=None, **_ERASE),
    "purge dry_run None": lambda m: m.purge(dry_run=None),
    "require_confirmation None": lambda m: m.erase("Nobody", require_confirmation=None, **_ERASE),
    "allow_ambiguous text": lambda m: m.erase("Nobody", allow_ambiguous="yes", **_ERASE),
    "include_history text": lambda m: m.list(include_history="yes"),
    "list subject a number": lambda m: m.list(subject=5),
    "space a string": lambda m: m.remember("t", subject="s", space="u1"),
    "space None": lambda m: m.recall("t", space=None),
    "history space None": lambda m: m.history("k", space=None),
    "scope a string": lambda m: m.erase("Nobody", scope="u1", **_ERASE),
    "derived_from None": lambda m: m.remember("t", subject="s", derived_from=None),
    "derived_from a string": lambda m: m.remember("t", subject="s", derived_from="abc"),
    "used None": lambda m: m.record_decision("s", None),
    "used a string": lambda m: m.record_decision("s", "abc"),
    "summary None": lambda m: m.record_decision(None, []),
    "subject None": lambda m: m.erase(None, **_ERASE),
    "unrestrict None": lambda m: m.unrestrict(None, actor="a"),
    "user_id None": lambda m: m.erase_all(user_id=None, **_ERASE),
    "recall limit 0": lambda m: m.recall("x", limit=0),
    "confidence text": lambda m: m.remember("t", subject="s", confidence="0.5"),
    "reason None": lambda m: m.rectify("k", "t", reason=None, actor="a"),
    "restriction reason None": lambda m: m.restrict("s", reason=None, actor="a"),
    "basis None": lambda m: m.erase("Nobody", request_id="ARG-1", basis=None, requester="r"),
    "checkpoint size -1": lambda m: m.checkpoint(size=-1),
    "for_legal_claim 1": lambda m: m.remember("t", subject="s", for_legal_claim=1),
    "erase_previous text": lambda m: m.rectify("k", "t", reason="r", actor="a", erase_previous="yes"),
    "expires_at True": lambda m: m.remember("t", subject="s", expires_at=True),
    "expires_at a float": lambda m: m.remember("t", subject="s", expires_at=1.5),
    "key a number": lambda m: m.remember("t", subject="s", key=5),
    "forget record_id a number": lambda m: m.forget(record_id=5),
    "older_than_days text": lambda m: m.purge(older_than_days="5"),
    "calls_only 1": lambda m: m.audit_entries(calls_only=1),
    "query a number": lambda m: m.recall(5),
}


@pytest.mark.parametrize("name", list(WRONG_TYPES))
def test_an_argument_of_the_wrong_type_is_refused_as_the_library_refuses_it(admin: Pair, name: str) -> None:
    """Refused by the client with the library's error and message, before any request."""
    sent: list[httpx.Request] = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    with pytest.raises(DeleaturError) as local:
        WRONG_TYPES[name](admin.local)
    with (
        Client("http://deleatur.test", transport=httpx.MockTransport(server)) as remote,
        pytest.raises(DeleaturError) as refused,
    ):
        WRONG_TYPES[name](remote)
    assert (type(refused.value), refused.value.message) == (type(local.value), local.value.message)
    assert sent == []


@pytest.mark.parametrize("key", ["", "é", "two words", "line\nbreak"])
def test_an_api_key_no_header_can_carry_is_bad_input(key: str) -> None:
    with pytest.raises(InvalidInputError, match="api_key is not a deleatur API key"):
        Client("http://deleatur.test", api_key=key)
    with pytest.raises(InvalidInputError, match="api_key must be a string"):
        Client("http://deleatur.test", api_key=b"key")  # type: ignore[arg-type]
    for with_v1 in ("http://deleatur.test/v1", "http://deleatur.test/proxy/v1/"):
        with pytest.raises(InvalidInputError, match=f"base_url {with_v1} ends in /v1: give the server's root"):
            Client(with_v1)
    Client("http://deleatur.test/proxy/").close()  # a server behind a path prefix


@pytest.mark.parametrize(
    ("spoil", "error", "code", "remote_message"),
    [
        (Path.unlink, SigningKeyMissingError, "signing_key_missing", "the store's signing key is missing"),
        (lambda key: key.chmod(0o644), ExposedKeyFileError, "key_file_exposed", "a key file on the server is open to"),
    ],
    ids=["missing", "exposed"],
)
def test_a_signing_key_file_unfit_to_use_is_the_librarys_error(
    tmp_path: Path, spoil: Callable[[Path], None], error: type[DeleaturError], code: str, remote_message: str
) -> None:
    """A server whose signing key file is gone, or open to other users, refuses a write
    as the library does (503: the operator restores or restricts the file, then the call
    can be made again), not as a failure of the keys (key_store_error, 500)."""
    store = tmp_path / "mem.db"
    opener = new_store(store)
    key = api_key(opener, Role.ADMIN)
    spoil(store.with_name(store.name + ".signing-key"))
    with pytest.raises(error) as local, opener() as memory:  # an exposed key is refused as the store opens
        memory.remember("kept", subject="Sig")
    with (
        serving(create_app(opener)) as url,
        Client(url, api_key=key) as client,
        pytest.raises(error) as remote,
    ):
        client.remember("kept", subject="Sig")
    assert (remote.value.status, remote.value.code) == (503, code)  # type: ignore[attr-defined]
    # The library's message names the key's file; a remote caller learns no server path.
    assert str(store.parent) in local.value.message and str(store.parent) not in remote.value.message
    assert remote.value.message.startswith(remote_message)


def test_a_query_too_long_for_a_url_is_answered(admin: Pair) -> None:
    client, memory = admin.remote, admin.local
    space = Space("long-query")
    client.remember("the zebra crossing", subject="Roads", space=space)
    query = "zebra " + "word " * 14_000  # over 64 KiB, which no URL carries; the library answers it
    remote = client.recall(query, space=space)
    same(remote, memory.recall(query, space=space))
    assert [hit.record.text for hit in remote] == ["the zebra crossing"]


@pytest.mark.parametrize("name", [".", ".."])
def test_dot_segments_reach_their_own_route(admin: Pair, name: str) -> None:
    """URL normalization removes a "." or ".." segment: sent as it was, erase(".") became
    a DELETE of /v1/subjects, erase("..") of /v1, and unrestrict("..") found no route."""
    client, memory = admin.remote, admin.local
    subject_space, user_space = Space(f"dots{len(name)}"), Space(name)
    client.remember("a dotted subject", subject=name, space=subject_space)
    client.remember("a dotted user", subject=f"Dot {len(name)}", space=user_space)
    client.restrict(name, reason="contested")
    client.unrestrict(name)
    assert all(r.subject != name for r in memory.restrictions())
    gone = client.erase(name, request_id=f"DOT-{len(name)}", scope=SpaceFilter(subject_space.user_id))
    assert gone.request is not None and gone.request.counts["records"] == 1
    same(gone.request, memory.erasure_request(f"DOT-{len(name)}"))
    account = client.erase_all(user_id=name, request_id=f"DOTU-{len(name)}")
    assert account.request is not None and account.request.counts["records"] == 1
    same(account.request, memory.erasure_request(f"DOTU-{len(name)}"))


def test_erasure_requests_page_as_the_librarys(admin: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request can name thousands of records: the route answers a page at a time, and
    the client follows the pages, as the library's list is whole."""
    client, memory = admin.remote, admin.local
    for n in range(5):
        memory.erase(f"Nobody {n}", request_id=f"PAGE-{n}", basis="Art. 17(1)(a)", requester="dpo")
    everything = [r.id for r in memory.erasure_requests()]
    monkeypatch.setattr(client_module, "_PAGE", 2)  # so the client follows many pages
    assert [r.id for r in client.erasure_requests()] == everything
    start = everything.index("PAGE-1")
    for arguments in ({"limit": 3}, {"after": "PAGE-1"}, {"after": "PAGE-1", "limit": 2}):
        local = [r.id for r in memory.erasure_requests(**arguments)]
        assert [r.id for r in client.erasure_requests(**arguments)] == local, arguments
    assert [r.id for r in memory.erasure_requests(after="PAGE-1", limit=2)] == everything[start + 1 : start + 3]
    assert memory.erasure_requests(after="NO-SUCH-REQUEST") == []
    page = client.http.get("/v1/erasures", params={"limit": 2}).json()
    assert [r["id"] for r in page["requests"]] == everything[:2] and page["next"] == everything[1]
    last = client.http.get("/v1/erasures", params={"limit": 1000, "after": everything[-2]}).json()
    assert [r["id"] for r in last["requests"]] == everything[-1:] and last["next"] is None


def test_the_audit_trail_is_the_librarys(admin: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    client, memory = admin.remote, admin.local
    # Entries enough for every limit below, and some that name their subject, whichever
    # tests ran before.
    for n in range(12):
        client.remember(f"audited {n}", subject="Audit Al", space=Space("auditing"))
    client.restrict("Audit Al", reason="audited", actor="dpo")
    client.unrestrict("Audit Al", actor="dpo")
    monkeypatch.setattr(client_module, "_PAGE", 7)  # so the stream follows many pages
    fixed = memory.checkpoint()  # entries before it do not change; reading the trail adds more
    size = Checkpoint.parse(fixed.text).size
    bounded: list[dict[str, Any]] = [{"scan": 10}, {"start": 2, "calls_only": True, "scan": 9, "limit": 2}]
    unbounded: list[dict[str, Any]] = [
        {},
        {"start": 3, "limit": 20},
        {"calls_only": True, "limit": 9},
        {"actor": memory.principal.id},  # every call the admin made, this test's remember included
    ]
    for arguments in unbounded + bounded:
        remote = client.audit_entries(**arguments)
        local = memory.audit_entries(**arguments)
        assert isinstance(remote, Iterator) and isinstance(local, Iterator), arguments
        remote_shown = [e.to_json() for e in remote if e.index < size]
        local_shown = [e.to_json() for e in local if e.index < size]
        assert remote_shown == local_shown and remote_shown, arguments
        if arguments in bounded:
            assert remote.resume == local.resume and local.resume is not None and local.resume < size, arguments
        if "limit" in arguments:
            assert len(list(client.audit_entries(**arguments))) == arguments["limit"]
    named = [e for e in memory.audit_entries() if e.subject is not None]
    assert named  # entries that name their subject read back with the name
    for entry in named:
        assert AuditEntry.from_json(entry.to_json()).to_json() == entry.to_json()
    memory.checkpoint()
    remote_report, local_report = client.verify_audit(), memory.verify_audit()
    same(remote_report, local_report)
    assert remote_report.ok


def test_pins_are_refused_not_ignored(admin: Pair, tmp_path: Path) -> None:
    """The server would check its own store against them: a pinned report from it would
    prove nothing, and an unpinned one given for a pinned call would mislead."""
    client, memory = admin.remote, admin.local
    key, checkpoint = memory.public_key(), memory.checkpoint()
    calls: list[Callable[[], object]] = [
        lambda: client.verify_log(pinned_keys=[key]),
        lambda: client.verify_log(pinned_checkpoint=checkpoint),
        lambda: client.verify_audit(pinned_keys=[key]),
        lambda: client.verify_audit(state=tmp_path / "auditor.state"),
    ]
    for call in calls:
        with pytest.raises(InvalidInputError, match="verify a copy of the store"):
            call()
    assert not (tmp_path / "auditor.state").exists()


#: Memory's calls the client does not have: none of them maps onto a route.
NOT_IN_CLIENT = {
    # No batch route, and a call per item would not be all-or-nothing, as the library's is.
    "remember_many",
    # The operator's: opening stores, principals, keys, witnesses, retention policy.
    "init",
    "open",
    "info",
    "as_principal",
    "authenticate",
    "create_principal",
    "principals",
    "revoke_principal",
    "new_signing_key",
    "rotate_signing_key",
    "signing_keys",
    "announced_keys",
    "add_cosignatures",
    "consistency_request",
    "rotation_proof",
    "prove",
    "prune_audit",
    "set_retention",
    "retention_policy",
    # No route: a CSV bundle is a directory, a residue scan is an operator's audit.
    "export_csv",
    "residue",
    # A server's own handles: what it signs and reads as of a moment (its verifications),
    # the -wal it truncates as such a read ends, the calls it group-commits, and the -wal
    # it leaves a thread to copy.
    "sign_pending",
    "read_snapshot",
    "finish_scrub",
    "audit_batch",
    "write_group",
    "upkeep_in_background",
}


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name))}


def test_the_clients_calls_take_the_librarys_arguments() -> None:
    """The same names, of the same kinds (positional, keyword-only), for every call both
    have; the client may give defaults where the server supplies one (a request id, the
    requester)."""
    assert _public(Memory) - _public(Client) == NOT_IN_CLIENT
    for name in sorted(_public(Memory) & _public(Client)):
        remote = inspect.signature(getattr(Client, name)).parameters.values()
        local = inspect.signature(getattr(Memory, name)).parameters.values()
        assert {p.name: p.kind for p in remote} == {p.name: p.kind for p in local}, name
        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert [p.name for p in remote if p.kind is positional] == [p.name for p in local if p.kind is positional]


def test_a_viewers_refusals_are_the_librarys(pairs: dict[Role, Pair]) -> None:
    viewer = pairs[Role.VIEWER]
    with pytest.raises(AccessDeniedError) as local:
        viewer.local.remember("x", subject="y")
    with pytest.raises(AccessDeniedError) as remote:
        viewer.remote.remember("x", subject="y")
    assert type(remote.value) is type(local.value)
    assert remote.value.missing == local.value.missing == "write"


def test_an_answer_the_client_cannot_read_is_a_deleatur_error() -> None:
    def wrong(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"id": "x"})

    with (
        Client("http://deleatur.test", transport=httpx.MockTransport(wrong)) as odd,
        pytest.raises(DeleaturError, match="not what this client reads"),
    ):
        odd.get(UNKNOWN)


#: A hit as the server sends it.
HIT = Hit(
    Record(
        UNKNOWN,
        "default",
        Space(),
        "s",
        "S",
        None,
        "t",
        {},
        None,
        None,
        (),
        Status.ACTIVE,
        None,
        1,
        1,
        None,
        b"",
        None,
        None,
    ),
    1.0,
).to_json()


@pytest.mark.parametrize(
    ("hits", "objects"),
    [("ab", False), ({"id": "x"}, False), ([1], False), ([{"id": "x"}], True), ([{**HIT, "user_id": ""}], True)],
)
def test_hits_the_client_cannot_read_are_a_deleatur_error(hits: Any, objects: bool) -> None:
    """Not the caller's InvalidInputError (an empty user_id), nor a KeyError or TypeError;
    recall_json reads hits that are objects as they are."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"hits": hits})

    with Client("http://deleatur.test", transport=httpx.MockTransport(answer)) as odd:
        with pytest.raises(DeleaturError, match="not what this client reads"):
            odd.recall("x")
        if objects:
            assert odd.recall_json("x") == hits
        else:
            with pytest.raises(DeleaturError, match="not what this client reads"):
                odd.recall_json("x")


# -- the JSON form, both ways -------------------------------------------------------------

_names = st.text(st.characters(exclude_categories=["Cc", "Cs"]), max_size=20)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _names,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_names, inner, max_size=3),
    max_leaves=10,
)
_times = st.integers(0, LATEST)
_records = st.builds(
    Record,
    id=_names,
    tenant=_names,
    space=st.builds(Space, _names.filter(bool), _names, _names),
    subject=_names,
    subject_original=_names,
    key=st.none() | _names,
    text=st.text(max_size=50),
    metadata=st.dictionaries(_names, _json, max_size=4),
    source=st.none() | _names,
    confidence=st.none() | st.floats(0, 1),
    derived_from=st.lists(_names, max_size=3).map(tuple),
    status=st.sampled_from(Status),
    supersedes=st.none() | _names,
    created_at=_times,
    updated_at=_times,
    expires_at=st.none() | _times,
    nonce=st.binary(min_size=16, max_size=16),
    reason=st.none() | _names,
    actor=st.none() | _names,
)


def _wire(value: dict[str, Any]) -> dict[str, Any]:
    """What a server sends and a client reads: JSON text in between."""
    decoded: dict[str, Any] = json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False))
    return decoded


@given(_records)
def test_a_record_survives_its_json(record: Record) -> None:
    sent = record.to_json()
    assert "nonce" not in sent  # the salt of the log's commitment stays in the store
    back = Record.from_json(_wire(sent))
    assert back == record
    assert back.to_json() == sent


@given(_records, st.floats(allow_nan=False, allow_infinity=False))
def test_a_hit_survives_its_json(record: Record, score: float) -> None:
    hit = Hit(record, score)
    assert Hit.from_json(_wire(hit.to_json())) == hit
