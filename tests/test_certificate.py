"""Erasure certificates: they verify offline, and every tampering fails in the named check."""

from __future__ import annotations

import base64
import copy
import functools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from deleatur import DeleaturError, IntegrityError, Memory, NewMemory, Role, Space, SpaceFilter, from_bytes
from deleatur.clock import from_isoformat, isoformat
from deleatur.erasure import certificate as certificate_module
from deleatur.erasure.certificate import signed_message
from deleatur.erasure.requests import NOTHING_HELD, one_month_after, space_pseudonym
from deleatur.erasure.scope import scope_statement
from deleatur.erasure.verify import verify_certificate
from deleatur.log.entries import Entry
from deleatur.log.note import Note, Signer
from deleatur.log.report import Report
from deleatur.store.evidence import StoreEvidence

from .conftest import MASTER, FakeClock, store_files

BASIS = "Art. 17(1)(a)"


@pytest.fixture
def erased(memory: Memory) -> tuple[Memory, dict[str, Any], Note]:
    """A store with an erasure done, its certificate, and a checkpoint pinned before it."""
    memory.remember_many([NewMemory(f"bystander {i}", subject=f"p{i % 7}") for i in range(30)])
    pinned = memory.checkpoint()
    first = memory.remember("Alice's phone is +100", subject="Alice", key="alice::phone")
    memory.remember("Derived from Alice", subject="Team", derived_from=[first.id])
    memory.erase("Alice", request_id="DSAR-17", basis=BASIS, requester="dpo")
    return memory, memory.certificate("DSAR-17"), pinned


@pytest.fixture
def evidence(store_path: Path) -> Iterator[StoreEvidence]:
    ev = StoreEvidence(store_path)
    yield ev
    ev.close()


def _verify(memory: Memory, cert: Any, store: StoreEvidence | None = None, pinned: Note | None = None) -> list[str]:
    key = memory.announced_keys()[0]
    report = verify_certificate(cert, expected_key=key, expected_checkpoint=pinned, store=store)
    return [c.name for c in report.failed]


def test_certificate_verifies_with_the_public_key_alone(
    erased: tuple[Memory, dict[str, Any], Note], evidence: StoreEvidence
) -> None:
    memory, cert, pinned = erased
    report = verify_certificate(
        cert, expected_key=memory.announced_keys()[0], expected_checkpoint=pinned, store=evidence
    )
    assert report.ok, report.lines()
    assert report.notes == []
    assert report.lines()[-1] == "VERDICT: PASS"
    assert len(report.checks) == 10
    body = cert["certificate"]
    assert body["erasure"]["records"] == 2
    assert body["erasure"]["key_destroyed"] is True
    assert "Alice" not in json.dumps(cert)
    assert "model weights" in body["scope_statement"]["text"]
    # Offline, without pins: still a pass on what can be checked, with a NOTE per missing anchor.
    alone = verify_certificate(json.loads(json.dumps(cert)))
    assert alone.ok
    assert len(alone.notes) == 3


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    else:
        yield path


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        doc = doc[part]
    doc[path[-1]] = value


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _mutate(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if value is None:
        return "x"
    text = str(value)
    return text[:-1] + ("A" if text[-1:] != "A" else "B") if text else "x"


def test_one_changed_byte_in_any_field_fails(erased: tuple[Memory, dict[str, Any], Note]) -> None:
    memory, cert, _ = erased
    paths = list(_leaves(cert["certificate"]))
    assert len(paths) > 40
    for path in paths:
        forged = copy.deepcopy(cert)
        _set(forged["certificate"], path, _mutate(_get(forged["certificate"], path)))
        failed = _verify(memory, forged)
        assert failed, f"changing certificate{list(path)} went unnoticed"
        assert "signature" in failed or "format" in failed, (path, failed)


def test_a_signature_spelled_another_way_in_base64_fails(erased: tuple[Memory, dict[str, Any], Note]) -> None:
    """The last base64 character of a 64-byte signature carries 4 unused bits: flipping one
    decodes to the same bytes, but the document is not the one issued, and only the
    canonical spelling passes."""
    memory, cert, _ = erased
    signature = cert["signature"]
    assert isinstance(signature, str) and signature.endswith("==")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = signature[-3]
    forged = copy.deepcopy(cert)
    forged["signature"] = signature[:-3] + alphabet[alphabet.index(last) ^ 1] + "=="
    assert base64.b64decode(forged["signature"]) == base64.b64decode(signature)
    assert "format" in _verify(memory, forged)


def test_the_issue_time_is_signed(erased: tuple[Memory, dict[str, Any], Note]) -> None:
    memory, cert, _ = erased
    forged = copy.deepcopy(cert)
    forged["certificate"]["issued_at"] = "2020-01-01T00:00:00Z"
    assert _verify(memory, forged) == ["signature"]


def test_a_re_signed_edit_still_fails_the_content_checks(erased: tuple[Memory, dict[str, Any], Note]) -> None:
    """An operator holding the key can re-sign: then the content checks must still hold."""
    memory, cert, _ = erased
    from deleatur.erasure.certificate import signed_message

    signer = memory.log.signer
    assert signer is not None

    def resigned(change: Any) -> list[str]:
        forged = copy.deepcopy(cert)
        change(forged["certificate"])
        forged["signature"] = base64.b64encode(signer.sign_bytes(signed_message(forged["certificate"]))).decode()
        return _verify(memory, forged)

    assert resigned(lambda b: b["scope_statement"].update(text="covers everything, backups too")) == ["scope_intact"]
    assert resigned(lambda b: b["tombstones"].pop()) == ["tombstones", "attests_erasure"]
    assert resigned(lambda b: b["tombstones"][0]["proof"].reverse()) == ["tombstones"]


def _resigned(memory: Memory, cert: dict[str, Any], change: Any) -> dict[str, Any]:
    """``cert`` changed, and signed again by the store's own key: what an issuer signs from
    a request row someone edited (as a release before this one did), or the key holder."""
    signer = memory.log.signer
    assert signer is not None
    forged = copy.deepcopy(cert)
    change(forged["certificate"])
    forged["signature"] = base64.b64encode(signer.sign_bytes(signed_message(forged["certificate"]))).decode()
    return forged


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"basis": "Art. 17(3)(e) legal claims"}, "the request's basis is not the one its log entries state"),
        (
            {"received_at": "2026-09-20T00:00:00Z", "deadline": "2026-10-20T00:00:00Z"},
            "the request's receipt time is not the one the erasure entry states",
        ),
        ({"completed_at": "2026-09-20T00:00:00Z"}, "the request's receipt and completion do not enclose"),
        ({"deadline": "2030-01-01T00:00:00Z"}, "the deadline is not one month after the request's receipt"),
    ],
)
def test_a_certificate_stating_what_its_log_entries_contradict_fails_the_tombstones_check(
    erased: tuple[Memory, dict[str, Any], Note], evidence: StoreEvidence, changes: dict[str, str], problem: str
) -> None:
    """Signed by the store's key, pinned, and the store's log intact: a basis or a time
    other than the erasure's own log entries state (its tombstones and, from v2, its
    erasure entry, which logs when the request was received) fails check 4."""
    memory, cert, pinned = erased
    forged = _resigned(memory, cert, lambda body: body["request"].update(changes))
    report = verify_certificate(
        forged, expected_key=memory.announced_keys()[0], expected_checkpoint=pinned, store=evidence
    )
    assert [c.name for c in report.failed] == ["tombstones"], report.lines()
    assert _detail(report, "tombstones").startswith(problem)
    assert not any(value in json.dumps(report.to_json()) for value in changes.values())


def test_a_receipt_moved_later_to_meet_the_deadline_fails_against_the_erasure_entry(
    memory: Memory, clock: FakeClock, evidence: StoreEvidence
) -> None:
    """A late erasure made to look timely: received, refused, retried and done a month
    later, then its receipt and deadline moved to the retry, still no later than the
    erasure's time. Only the receipt the erasure entry logged tells."""
    memory.remember("a", subject="Jo")
    memory.remember("b", subject="JO")
    with pytest.raises(DeleaturError):
        memory.erase("jo", request_id="DSAR-9", basis=BASIS, requester="dpo")  # ambiguous: recorded as failed
    clock.advance(40 * 86400)
    memory.erase("jo", request_id="DSAR-9", basis=BASIS, requester="dpo", allow_ambiguous=True)
    cert = memory.certificate("DSAR-9")
    request = cert["certificate"]["request"]
    entry = Entry.decode(base64.b64decode(cert["certificate"]["erasure_entry"]["entry"]))
    assert entry.fields["received"] == from_isoformat(request["received_at"]) < entry.time
    assert verify_certificate(cert, store=evidence).ok

    def timely(body: dict[str, Any]) -> None:
        body["request"].update(received_at=isoformat(entry.time), deadline=isoformat(one_month_after(entry.time)))

    report = verify_certificate(_resigned(memory, cert, timely), store=evidence)
    assert [c.name for c in report.failed] == ["tombstones"]
    assert _detail(report, "tombstones") == "the request's receipt time is not the one the erasure entry states"
    assert _verify(memory, _as_v1(memory, _resigned(memory, cert, timely)), evidence) == []  # what v1 could not tell


def _as_v1(memory: Memory, cert: dict[str, Any]) -> dict[str, Any]:
    """The certificate as a release before v2 issued it: no erasure entry."""

    def v1(body: dict[str, Any]) -> None:
        del body["erasure_entry"]
        body["format"] = "deleatur-erasure-certificate/v1"

    return _resigned(memory, cert, v1)


def test_a_v1_certificate_still_verifies_against_its_tombstones(
    erased: tuple[Memory, dict[str, Any], Note], evidence: StoreEvidence
) -> None:
    memory, cert, pinned = erased
    old = _as_v1(memory, cert)
    report = verify_certificate(
        old, expected_key=memory.announced_keys()[0], expected_checkpoint=pinned, store=evidence
    )
    assert report.ok, report.lines()
    assert "receipt time and kind rest on its signature" in _detail(report, "tombstones")
    # Its basis is still checked against its tombstones; a v2 body signed as v1 is not v1.
    assert _verify(memory, _resigned(memory, old, lambda b: b["request"].update(basis=FAKE_BASIS))) == ["tombstones"]
    relabelled = copy.deepcopy(cert)
    relabelled["certificate"]["format"] = "deleatur-erasure-certificate/v1"
    assert _verify(memory, relabelled) == ["signature"]


@pytest.mark.parametrize(
    "edit",
    [
        "basis = 'Art. 17(1)(d) [EDITED]'",
        "received_at = received_at + 3600000000",
        "received_at = received_at - 3600000000",
        "completed_at = received_at - 1",
        "kind = 'account'",
    ],
)
def test_no_certificate_is_issued_from_a_request_row_that_contradicts_the_log(
    memory: Memory, store_path: Path, edit: str
) -> None:
    """The request row is not signed: whoever writes the store's files could edit its
    basis or times, and the certificate would sign the edit. Issuing compares it with the
    erasure's log entries and refuses, naming what disagrees (never the value)."""
    memory.remember("Alice's phone is +100", subject="Alice")
    memory.erase("Alice", request_id="DSAR-17", basis=BASIS, requester="dpo")
    assert verify_certificate(memory.certificate("DSAR-17"), store=StoreEvidence(store_path)).ok
    conn = apsw.Connection(str(store_path))
    conn.execute(f"UPDATE erasure_requests SET {edit} WHERE id = 'DSAR-17'")
    conn.close()
    with pytest.raises(IntegrityError, match="contradicts its log entries") as raised:
        memory.certificate("DSAR-17")
    assert "EDITED" not in raised.value.message and raised.value.request_id == "DSAR-17"


def _detail(report: Report, name: str) -> str:
    [check] = [c for c in report.checks if c.name == name]
    return check.detail


def test_a_request_about_someone_the_store_never_held_is_certified_as_such(
    memory: Memory, clock: FakeClock, evidence: StoreEvidence, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Art. 17 asks for an answer even when nothing is held: the request is recorded, and
    its certificate verifies, saying that nothing was held, never that something was erased."""
    memory.remember("someone else", subject="Bob")
    done = memory.erase("Nobody", request_id="DSAR-0", basis=BASIS, requester="dpo").request
    assert done is not None and done.status.value == "complete"
    assert [r.id for r in memory.erasure_requests()] == ["DSAR-0"]
    cert = memory.certificate("DSAR-0")
    assert "nothing was erased" in cert["certificate"]["scope_statement"]["text"]
    report = verify_certificate(cert, expected_key=memory.announced_keys()[0], store=evidence)
    assert report.ok, report.lines()
    assert _detail(report, "attests_erasure") == NOTHING_HELD
    # It attests nothing: a statement edited to claim more, or a tombstone added, fails.
    signer = memory.log.signer
    assert signer is not None
    forged = copy.deepcopy(cert)
    forged["certificate"]["scope_statement"]["covers"] = ["every record of the subject"]
    forged["signature"] = base64.b64encode(signer.sign_bytes(signed_message(forged["certificate"]))).decode()
    assert _verify(memory, forged) == ["scope_intact"]
    # A certificate of the first statement wording that attests nothing verifies the same.
    monkeypatch.setattr(
        certificate_module, "scope_statement", functools.partial(scope_statement, version="deleatur-scope/v1")
    )
    assert _verify(memory, memory.certificate("DSAR-0"), evidence) == []
    # Whatever of the subject is written later within the request's scope (the tenant) contradicts it.
    clock.advance(1)
    memory.remember("Nobody's phone", subject="Nobody")
    assert _verify(memory, cert, evidence) == ["store_absent"]


def _key_statement(cert: dict[str, Any]) -> tuple[bool, list[str]]:
    body = cert["certificate"]
    return body["erasure"]["key_destroyed"], [
        line for line in body["scope_statement"]["does_not_cover"] if "copies of the database" in line
    ]


@pytest.mark.parametrize("recorded_before", [False, True], ids=["now", "recorded-before-it-said"])
def test_a_certificate_states_what_its_erasure_did_with_the_key_not_what_came_after(
    memory: Memory, evidence: StoreEvidence, recorded_before: bool
) -> None:
    """Issued again after a later erasure destroyed the key this one kept, or after the
    subject was given a new key, a certificate still says what its own erasure did; so
    does one of a request recorded before requests said it (from its other counts), and
    so does the certificate a key scoped to the erased user gets, without those counts.
    An erasure that found the key already gone (R3), or never made (R4), says it is."""
    memory.remember("e1", subject="Eve")
    memory.remember("e2", subject="Eve", space=Space("u2"))
    memory.erase("Eve", request_id="R1", basis=BASIS, requester="dpo", scope=SpaceFilter("u2"))
    memory.erase("Eve", request_id="R2", basis=BASIS, requester="dpo")  # destroys the key R1 kept
    memory.erase("Eve", request_id="R3", basis=BASIS, requester="dpo")
    memory.erase("Nobody Held", request_id="R4", basis=BASIS, requester="dpo")
    conn = memory.backend._conn  # type: ignore[attr-defined]
    said = "SELECT json_extract(counts, '$.subject_key_destroyed') FROM erasure_requests ORDER BY id"
    assert conn.execute(said).fetchall() == [(0,), (1,), (1,), (1,)]
    if recorded_before:
        conn.execute("UPDATE erasure_requests SET counts = json_remove(counts, '$.subject_key_destroyed')")
        assert conn.execute(said).fetchall() == [(None,)] * 4
    kept = (
        False,
        [
            "copies of the database taken before the erasure: the subject's key was kept because 1 of its"
            " record(s) remain outside this erasure's scope"
        ],
    )
    assert _key_statement(memory.certificate("R1")) == kept
    scoped, _ = memory.create_principal("u2 auditor", Role.AUDITOR, scopes=["u2"])
    hidden = memory.as_principal(scoped).certificate("R1")
    assert "kept_in_other_spaces" not in hidden["certificate"]["request"]["counts"]
    assert _key_statement(hidden) == (
        False,
        ["copies of the database taken before the erasure: the subject's key was kept"],
    )
    for request_id in ("R2", "R3", "R4"):
        assert _key_statement(memory.certificate(request_id)) == (True, []), request_id
    memory.remember("e3", subject="Eve")  # a new key for the subject
    assert _key_statement(memory.certificate("R2")) == (True, [])
    for request_id in ("R1", "R2"):
        assert _verify(memory, memory.certificate(request_id), evidence) == ["store_absent"] * (request_id == "R2")


def test_an_erasure_limited_to_some_spaces_is_checked_within_them(
    memory: Memory, clock: FakeClock, evidence: StoreEvidence
) -> None:
    """The subject's records beyond the erasure's scope (another user's) are not this
    erasure's: its certificate verifies against the store, which a record re-inserted
    within the scope, under any id, still fails."""
    memory.remember("n1", subject="N", space=Space("u1"))
    memory.remember("n2", subject="N", space=Space("u1", "bot"))
    memory.remember("n3", subject="N", space=Space("u2"))
    memory.erase("N", request_id="S1", basis=BASIS, requester="dpo", scope=SpaceFilter("u1"))
    cert = memory.certificate("S1")
    assert cert["certificate"]["erasure"]["key_destroyed"] is False
    assert "u1" not in json.dumps(cert["certificate"]["request"]["scope"])  # its key stays in the store
    report = verify_certificate(cert, expected_key=memory.announced_keys()[0], store=evidence)
    assert report.ok, report.lines()
    assert _detail(report, "store_absent") == (
        "none of the 2 erased record(s) is live, nor any record of the subject within its scope"
        " (1 outside it, which this erasure did not reach)"
    )
    clock.advance(1)
    memory.remember("n4", subject="N", space=Space("u3"))  # beyond the scope: still no failure
    assert _verify(memory, cert, evidence) == []
    again = memory.remember("n1", subject="N", space=Space("u1", "other-agent"))
    assert _verify(memory, cert, evidence) == ["store_absent"]
    assert "within the erasure's scope" in _detail(verify_certificate(cert, store=evidence), "store_absent")
    memory.forget(record_id=again.id, space=Space("u1", "other-agent"))  # retired, not gone: still live
    assert _verify(memory, cert, evidence) == ["store_absent"]


def test_a_scope_of_agent_and_run_is_matched_level_by_level(memory: Memory, evidence: StoreEvidence) -> None:
    memory.remember("n1", subject="N", space=Space("u1", "bot", "r1"))
    memory.remember("n2", subject="N", space=Space("u1", "bot", "r2"))
    memory.erase("N", request_id="S2", basis=BASIS, requester="dpo", scope=SpaceFilter(None, "bot", "r1"))
    cert = memory.certificate("S2")
    assert _verify(memory, cert, evidence) == []
    memory.remember("n1 again", subject="N", space=Space("u1", "other", "r1"))
    memory.remember("n1 again", subject="N", space=Space("u2", "bot", "r3"))
    assert _verify(memory, cert, evidence) == []
    memory.remember("n1 again", subject="N", space=Space("u2", "bot", "r1"))
    assert _verify(memory, cert, evidence) == ["store_absent"]


def test_a_key_destroyed_by_a_limited_erasure_is_checked_as_of_the_erasure(
    memory: Memory, clock: FakeClock, evidence: StoreEvidence
) -> None:
    """All of the subject's records lay in the scope, so its key went: a key made later, for
    a record beyond the scope, is not that key; the key restored from a backup is."""
    memory.remember("n1", subject="N", space=Space("u1"))
    keys = memory.keys._conn
    backup = keys.execute("SELECT * FROM data_keys").fetchall()
    memory.erase("N", request_id="S3", basis=BASIS, requester="dpo", scope=SpaceFilter("u1"))
    cert = memory.certificate("S3")
    assert cert["certificate"]["erasure"]["key_destroyed"] is True
    assert _verify(memory, cert, evidence) == []
    clock.advance(1)
    memory.remember("n2", subject="N", space=Space("u2"))
    assert _verify(memory, cert, evidence) == []
    keys.execute("DELETE FROM data_keys")
    keys.executemany(f"INSERT INTO data_keys VALUES ({', '.join('?' * len(backup[0]))})", backup)
    report = verify_certificate(cert, store=evidence)
    assert [c.name for c in report.failed] == ["store_absent"]
    [(key_id, *_)] = backup
    assert isinstance(key_id, bytes)
    assert _detail(report, "store_absent") == (
        f"a data key this erasure destroyed is in the key store again (key {key_id.hex()})"
    )


@pytest.mark.parametrize("kind", ["subject", "account"])
def test_a_destroyed_key_restored_with_a_later_creation_time_fails_by_its_id(
    memory: Memory, store_path: Path, evidence: StoreEvidence, kind: str
) -> None:
    """The key store does not authenticate a key's creation time: a destroyed key put
    back from a backup dated after the erasure would pass for a later write's key, and
    still decrypt every backup of the subject's records. The erasure entry names the
    keys it destroyed, and check 10 looks for them by id (which the wrapping binds)."""
    memory.remember("Alice's phone is +100", subject="Alice", space=Space("cust_1"))
    memory.keys._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    backup = memory.keys._conn.execute("SELECT * FROM data_keys").fetchall()
    if kind == "subject":
        memory.erase("Alice", request_id="E-1", basis=BASIS, requester="dpo")
    else:
        memory.erase_all(user_id="cust_1", request_id="E-1", basis=BASIS, requester="dpo")
    cert = memory.certificate("E-1")
    assert verify_certificate(cert, store=evidence).ok
    [row] = backup
    key_id = row[0]
    assert isinstance(key_id, bytes)
    keys = apsw.Connection(str(store_path) + ".keys")
    keys.execute(f"INSERT INTO data_keys VALUES ({', '.join('?' * len(row))})", (*row[:-1], 2_100_000_000_000_000))
    keys.close()
    report = verify_certificate(cert, expected_key=memory.announced_keys()[0], store=evidence)
    assert [c.name for c in report.failed] == ["store_absent"]
    assert _detail(report, "store_absent") == (
        f"a data key this erasure destroyed is in the key store again (key {key_id.hex()})"
    )
    # A v1 certificate names no key id: what it could not tell, and check 10 says on what it rests.
    old = verify_certificate(_as_v1(memory, cert), store=evidence)
    assert old.ok
    if kind == "subject":
        assert "which the key store does not authenticate" in _detail(old, "store_absent")


def test_a_limited_erasure_recorded_before_the_store_kept_its_scope_key(
    memory: Memory, evidence: StoreEvidence
) -> None:
    """Its scope cannot be matched: the erased ids are still checked, and the detail says
    what could not be."""
    record = memory.remember("n1", subject="N", space=Space("u1"))
    memory.remember("n3", subject="N", space=Space("u2"))
    memory.erase("N", request_id="S4", basis=BASIS, requester="dpo", scope=SpaceFilter("u1"))
    cert = memory.certificate("S4")
    conn = memory.backend._conn  # type: ignore[attr-defined]
    conn.execute("UPDATE erasure_requests SET scope_key = NULL")
    report = verify_certificate(cert, store=evidence)
    assert report.ok, report.lines()
    assert "1 live record(s) of the subject could not be placed" in _detail(report, "store_absent")
    conn.execute(
        "INSERT INTO records SELECT 1000, ?, tenant, user_id, agent_id, run_id, subject_ref, key_ref, key_id, status,"
        " supersedes, confidence, created_at, updated_at, expires_at, ciphertext FROM records WHERE user_id = 'u2'",
        (record.id,),
    )
    assert _verify(memory, cert, evidence) == ["store_absent"]


def test_an_account_erasure_drops_the_scope_keys_that_would_confirm_its_user_id(
    memory: Memory, store_path: Path, evidence: StoreEvidence
) -> None:
    """A limited erasure keeps its scope key beside its scope's pseudonyms; once the
    user's account is erased, key and pseudonym together would confirm a guessed id
    from the files alone: the key goes with the account. A failed request keeps none."""
    user = "bob@example.com"
    memory.remember("n1", subject="N", space=Space(user))
    memory.remember("n2", subject="N", space=Space("u2"))
    memory.remember("m1", subject="M", space=Space(user))
    memory.remember("m2", subject="M", space=Space(user))  # "m" then matches two spellings
    memory.remember("m3", subject="m", space=Space(user))
    memory.erase("N", request_id="S1", basis=BASIS, requester="dpo", scope=SpaceFilter(user))
    with pytest.raises(DeleaturError):
        memory.erase("m", request_id="F1", basis=BASIS, requester="dpo", scope=SpaceFilter(user))
    conn = apsw.Connection(str(store_path))
    keys: dict[str, Any] = {str(i): k for i, k in conn.execute("SELECT id, scope_key FROM erasure_requests")}
    assert keys["S1"] is not None and keys["F1"] is None
    memory.erase_all(user_id=user, request_id="ACC1", basis=BASIS, requester="dpo")
    assert conn.execute("SELECT count(*) FROM erasure_requests WHERE scope_key IS NOT NULL").fetchall() == [(0,)]
    conn.close()
    files = b"".join(p.read_bytes() for p in store_files(store_path))
    assert space_pseudonym(bytes(keys["S1"]), user).encode() in files  # the scope's pseudonym stays,
    assert bytes(keys["S1"]) not in files and user.encode() not in files  # but no key to test a guess
    report = verify_certificate(memory.certificate("S1"), store=evidence)
    assert report.ok, report.lines()


def test_erased_record_reinserted_under_a_new_id_fails(
    erased: tuple[Memory, dict[str, Any], Note], evidence: StoreEvidence
) -> None:
    memory, cert, _ = erased
    assert _verify(memory, cert, evidence) == []
    memory.remember("Alice's phone is +100", subject="Alice")
    assert _verify(memory, cert, evidence) == ["store_absent"]


def test_erased_record_reinserted_into_the_store_fails(
    memory: Memory, store_path: Path, tmp_path: Path, evidence: StoreEvidence
) -> None:
    record = memory.remember("Alice's phone is +100", subject="Alice")
    memory.backend.scrub()
    backup = tmp_path / "backup.db"
    shutil.copy(store_path, backup)
    memory.erase("Alice", request_id="DSAR-17", basis=BASIS, requester="dpo")
    cert = memory.certificate("DSAR-17")
    old = apsw.Connection(str(backup))
    row = old.execute("SELECT * FROM records WHERE id = ?", (record.id,)).fetchall()[0]
    old.close()
    conn = memory.backend._conn  # type: ignore[attr-defined]
    conn.execute(f"INSERT INTO records VALUES ({', '.join('?' * len(row))})", row)
    assert _verify(memory, cert, evidence) == ["store_absent"]


def test_a_tombstone_removed_from_the_log_fails(
    erased: tuple[Memory, dict[str, Any], Note], evidence: StoreEvidence
) -> None:
    memory, cert, _ = erased
    index = cert["certificate"]["tombstones"][0]["index"]
    memory.backend._conn.execute("DELETE FROM log_entries WHERE idx = ?", (index,))  # type: ignore[attr-defined]
    assert _verify(memory, cert, evidence) == ["store_log"]


def test_an_entry_edited_inside_the_certified_tree_fails_the_store_log_check(
    erased: tuple[Memory, dict[str, Any], Note], evidence: StoreEvidence
) -> None:
    """Check 9 re-derives the certified tree from the store's entries: the stored subtree
    hashes, left as they were beside an edited entry, still produce the certified root."""
    memory, cert, _ = erased
    assert _verify(memory, cert, evidence) == []
    index, raw = next((i, r) for i, r in memory.backend.log_entries() if b'"type":"write"' in r)
    memory.backend._conn.execute(  # type: ignore[attr-defined]
        "UPDATE log_entries SET entry = ? WHERE idx = ?", (raw.replace(b'"commitment":"', b'"commitment":"0'), index)
    )
    report = verify_certificate(cert, expected_key=memory.announced_keys()[0], store=evidence)
    assert [c.name for c in report.failed] == ["store_log"]
    assert _detail(report, "store_log") == (
        "the store's log entries no longer produce the certificate's tree: an entry in it was changed"
    )
    # The erasure entry the certificate carries, edited in the store, is named as such.
    erasure = cert["certificate"]["erasure_entry"]
    raw = base64.b64decode(erasure["entry"])
    memory.backend._conn.execute(  # type: ignore[attr-defined]
        "UPDATE log_entries SET entry = ? WHERE idx = ?",
        (raw.replace(b'"records":2', b'"records":0'), erasure["index"]),
    )
    report = verify_certificate(cert, expected_key=memory.announced_keys()[0], store=evidence)
    assert _detail(report, "store_log") == f"the erasure entry {erasure['index']} is changed in the store's log"


def test_a_rewritten_log_re_signed_with_the_same_key_fails_the_pinned_checkpoint(
    erased: tuple[Memory, dict[str, Any], Note], evidence: StoreEvidence
) -> None:
    memory, cert, pinned = erased
    # The key holder rewrites history before the erasure and rebuilds every hash and signature.
    rows = [raw for _, raw in memory.backend.log_entries()]
    rows[3] = rows[3].replace(b'"tenant":"default"', b'"tenant":"rewritten"')
    conn = memory.backend._conn  # type: ignore[attr-defined]
    for table in ("log_entries", "log_nodes", "log_checkpoints"):
        conn.execute(f"DELETE FROM {table}")
    with memory.backend.atomic():
        memory.log.append([(Entry.decode(r), None) for r in rows])
        memory.log.checkpoint()
    forged = memory.certificate("DSAR-17")
    assert _verify(memory, forged, evidence) == []  # self-consistent...
    assert _verify(memory, forged, evidence, pinned=pinned) == ["pinned_checkpoint"]  # ...but not with the pin
    assert "store_log" in _verify(memory, cert, evidence)  # and the honest certificate no longer matches the store


def test_a_certificate_from_another_store_fails(
    erased: tuple[Memory, dict[str, Any], Note], tmp_path: Path, clock: FakeClock
) -> None:
    memory, cert, _ = erased
    other_path = tmp_path / "other.db"
    with Memory.open(other_path, from_bytes(MASTER), clock=clock, create=True) as other:
        other.new_signing_key()
        other.remember("x", subject="y")
    other_evidence = StoreEvidence(other_path)
    try:
        failed = _verify(memory, cert, other_evidence)
    finally:
        other_evidence.close()
    assert failed[0] == "store_identity"


def test_a_certificate_signed_by_another_key_fails(erased: tuple[Memory, dict[str, Any], Note]) -> None:
    memory, cert, _ = erased
    intruder = Signer.generate(memory.log.origin)
    forged = copy.deepcopy(cert)
    forged["certificate"]["public_key"] = intruder.verifier.vkey
    from deleatur.erasure.certificate import signed_message

    forged["signature"] = base64.b64encode(intruder.sign_bytes(signed_message(forged["certificate"]))).decode()
    assert _verify(memory, forged) == ["signature"]
    # Without a pinned key the forgery is self-consistent except for the checkpoint, and the NOTE warns.
    report = verify_certificate(forged)
    assert [c.name for c in report.failed] == ["checkpoint"]
    assert any("KEY NOT PINNED" in n for n in report.notes)


def _forged_with_own_key(cert: dict[str, Any], change: Any = None) -> tuple[dict[str, Any], Signer]:
    """The store's real tree and tombstones, its checkpoint and the body signed by a key of
    the forger's own with the store's key name, the body first changed by ``change``."""
    body = copy.deepcopy(cert["certificate"])
    forger = Signer.generate(body["store"]["origin"])
    text = Note.parse(body["checkpoint"]).text
    body["checkpoint"] = Note(text, (forger.sign(text),)).format()
    body["public_key"] = forger.verifier.vkey
    if change is not None:
        change(body)
    signature = base64.b64encode(forger.sign_bytes(signed_message(body))).decode()
    return {"certificate": body, "signature": signature}, forger


def test_a_certificate_signed_by_a_key_the_store_never_announced_fails_the_store_identity(
    erased: tuple[Memory, dict[str, Any], Note], evidence: StoreEvidence
) -> None:
    """The store's id and origin are public: a forger signs the store's real tree under a
    key of their own named like the store's, reuses its tombstones, and states another
    basis. With --store and no pinned key, the store must show it never announced that key."""
    memory, cert, _ = erased

    def lie(body: dict[str, Any]) -> None:
        body["request"]["basis"] = FAKE_BASIS
        body["issued_at"] = "2030-01-01T00:00:00Z"

    forged, forger = _forged_with_own_key(cert, lie)
    report = verify_certificate(json.dumps(forged), store=evidence)
    assert [c.name for c in report.failed] == ["tombstones", "store_identity"]  # the basis too
    assert _detail(report, "store_identity") == (
        f"the certificate's key {forger.verifier.name} (key {forger.verifier.key_id.hex()}) is not one the"
        " store's log announced"
    )
    assert "retained" not in json.dumps(report.to_json())
    # A key the log did announce, but retired before the certified tree, is refused too.
    old = memory.log.signer
    assert old is not None
    memory.rotate_signing_key()
    later = copy.deepcopy(memory.certificate("DSAR-17"))
    later["certificate"]["public_key"] = old.verifier.vkey
    text = Note.parse(later["certificate"]["checkpoint"]).text
    later["certificate"]["checkpoint"] = Note(text, (old.sign(text),)).format()
    later["signature"] = base64.b64encode(old.sign_bytes(signed_message(later["certificate"]))).decode()
    report = verify_certificate(later, store=evidence)
    assert [c.name for c in report.failed] == ["store_identity"]
    assert "was replaced by" in _detail(report, "store_identity")
    assert verify_certificate(memory.certificate("DSAR-17"), store=evidence).ok


def test_malformed_certificates_fail_the_format_check(memory: Memory) -> None:
    bad_documents: list[Any] = [{}, {"certificate": {"format": "other"}, "signature": "AA=="}, [], {"certificate": 1}]
    for bad in bad_documents:
        report = verify_certificate(bad)
        assert [c.name for c in report.failed] == ["format"]


FAKE_BASIS = "Art. 17(3)(b) - retained for a legal claim of Alice Example"


def test_a_certificate_that_repeats_a_key_fails_the_format_check(
    erased: tuple[Memory, dict[str, Any], Note],
) -> None:
    """JSON keeps the last of two equal keys, so a verifier parsing it so would pass a
    document in which a first-wins parser, or a person, reads another basis: the text is
    read as its readers would, and fails check 1, without echoing what the document says."""
    memory, cert, _ = erased
    text = json.dumps(cert, indent=2)
    assert not _verify(memory, text) and not _verify(memory, text.encode())
    real = f'"basis": {json.dumps(BASIS)}'
    assert text.count(real) == 1
    doubled = text.replace(real, f'"basis": {json.dumps(FAKE_BASIS)}, {real}')
    for document in (doubled, doubled.encode()):
        report = verify_certificate(document, expected_key=memory.announced_keys()[0])
        assert [c.name for c in report.failed] == ["format"]
        assert "repeats a key" in _detail(report, "format")
        assert "retained" not in json.dumps(report.to_json()) and "basis" not in _detail(report, "format")


def test_an_unsigned_member_beside_the_certificate_fails_the_format_check(
    erased: tuple[Memory, dict[str, Any], Note],
) -> None:
    memory, cert, _ = erased
    for extra in ({"extra": 1}, {"note": FAKE_BASIS}):
        report = verify_certificate({**cert, **extra}, expected_key=memory.announced_keys()[0])
        assert [c.name for c in report.failed] == ["format"]
        assert "besides certificate and signature" in _detail(report, "format")
        assert "retained" not in json.dumps(report.to_json())
    report = verify_certificate('{"certificate": ', expected_key=memory.announced_keys()[0])
    assert [c.name for c in report.failed] == ["format"] and "not JSON" in _detail(report, "format")


def test_certificate_of_an_unknown_or_failed_request(memory: Memory) -> None:
    from deleatur import InvalidInputError, NotFoundError

    with pytest.raises(NotFoundError, match="no erasure request"):
        memory.certificate("DSAR-404")
    memory.remember("a", subject="Jo")
    memory.remember("b", subject="JO")
    with pytest.raises(InvalidInputError):
        memory.erase("jo", request_id="DSAR-1", basis=BASIS, requester="dpo")
    with pytest.raises(InvalidInputError, match="is failed"):
        memory.certificate("DSAR-1")


def test_verification_survives_a_key_rotation(erased: tuple[Memory, dict[str, Any], Note]) -> None:
    memory, cert, _ = erased
    memory.rotate_signing_key()
    assert _verify(memory, cert) == []


def test_a_checkpoint_pinned_before_a_key_rotation_anchors_a_later_certificate(
    memory: Memory, evidence: StoreEvidence
) -> None:
    """The verifier pinned a checkpoint signed by the old key; the certificate is signed by
    the new one, which the old key endorsed in the log. With the store, the chain holds."""
    memory.remember_many([NewMemory(f"bystander {i}", subject=f"p{i % 7}") for i in range(30)])
    pinned = memory.checkpoint()
    memory.rotate_signing_key()
    memory.remember("Alice's phone is +100", subject="Alice")
    memory.erase("Alice", request_id="DSAR-17", basis=BASIS, requester="dpo")
    cert = memory.certificate("DSAR-17")
    new_key = memory.announced_keys()[-1]
    report = verify_certificate(cert, expected_key=new_key, expected_checkpoint=pinned, store=evidence)
    assert report.ok, report.lines()
    alone = verify_certificate(cert, expected_key=new_key, expected_checkpoint=pinned)
    assert [(c.name, "--store" in c.detail) for c in alone.failed] == [("pinned_checkpoint", True)]
    # A key entry changed in the store's files is no longer in the certified tree.
    conn = memory.backend._conn  # type: ignore[attr-defined]
    index, raw = evidence.key_entries(evidence.log_size())[0]
    conn.execute("UPDATE log_entries SET entry = ? WHERE idx = ?", (raw.replace(b'"vkey":"', b'"vkey":"x'), index))
    forged = verify_certificate(cert, expected_key=new_key, expected_checkpoint=pinned, store=evidence)
    assert "pinned_checkpoint" in [c.name for c in forged.failed]


def test_space_scope_is_pseudonymous_in_the_certificate(memory: Memory) -> None:
    memory.remember("x", subject="s", space=Space("cust_5521"))
    memory.erase_all(user_id="cust_5521", request_id="ACC-1", basis=BASIS, requester="ops")
    cert = memory.certificate("ACC-1")
    assert "cust_5521" not in json.dumps(cert)
    assert _verify(memory, cert) == []


# A damaged certificate fails a named check; it never crashes the verifier.

_DELETE = object()
_WRONG_VALUES: list[Any] = ["x", "bad \ud800", 0, [], {}, None, _DELETE]
_SECRET = "Alice's phone is +100"


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], StoreEvidence]]:
    """One erasure certificate, built once for the module, with read-only evidence of its store."""
    path = tmp_path_factory.mktemp("issued") / "mem.db"
    with Memory.open(path, from_bytes(MASTER), clock=FakeClock(), create=True, checkpoint_interval_us=0) as memory:
        memory.new_signing_key()
        memory.remember_many([NewMemory(f"bystander {i}", subject=f"p{i % 3}") for i in range(5)])
        first = memory.remember(_SECRET, subject="Alice", key="alice::phone")
        memory.remember("Derived from Alice", subject="Team", derived_from=[first.id])
        memory.erase("Alice", request_id="DSAR-17", basis=BASIS, requester="dpo")
        cert = memory.certificate("DSAR-17")
    evidence = StoreEvidence(path)
    yield cert, evidence
    evidence.close()


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path in a JSON tree, the containers' as well as the leaves'; the root's is ()."""
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for k, v in items:
        yield from _paths(v, (*path, k))


def _damaged(cert: dict[str, Any], path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return None if value is _DELETE else copy.deepcopy(value)
    doc = copy.deepcopy(cert)
    parent = _get(doc, path[:-1])
    if value is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = copy.deepcopy(value)
    return doc


@pytest.mark.parametrize("with_store", [False, True], ids=["offline", "store"])
@pytest.mark.parametrize("value", _WRONG_VALUES, ids=["str", "surrogate", "int", "list", "dict", "null", "deleted"])
def test_every_field_with_a_wrong_type_or_deleted_fails_a_named_check(
    issued: tuple[dict[str, Any], StoreEvidence], value: Any, with_store: bool
) -> None:
    cert, evidence = issued
    assert verify_certificate(copy.deepcopy(cert), store=evidence).ok
    paths = list(_paths(cert))
    assert len(paths) > 60
    checked = 0
    for path in paths:
        if value is not _DELETE and json.dumps(_get(cert, path)) == json.dumps(value):
            continue  # not a change
        damaged = _damaged(cert, path, value)
        try:
            report = verify_certificate(damaged, store=evidence if with_store else None)
        except Exception as exc:  # the assertion names the field that crashed the verifier
            raise AssertionError(f"{list(path)} := {value!r}: {type(exc).__name__}: {exc}") from exc
        assert not report.ok, f"{list(path)} := {value!r} went unnoticed"
        assert report.lines()[-1].startswith("VERDICT: FAIL (check "), (path, report.lines())
        assert report.failed[0].detail, path
        assert _SECRET not in json.dumps(report.to_json())
        json.dumps(report.to_json(), ensure_ascii=False).encode("utf-8")  # an HTTP answer can carry it
        checked += 1
    assert checked > 60


def test_a_checkpoint_too_large_for_the_store_fails_the_pinned_check(
    erased: tuple[Memory, dict[str, Any], Note], evidence: StoreEvidence
) -> None:
    """A consistency proof to a tree of 2**8200 entries must not reach the store's integer columns."""
    _, cert, pinned = erased
    forged = copy.deepcopy(cert)
    note = Note.parse(forged["certificate"]["checkpoint"])
    lines = note.text.split("\n")
    lines[1] = str(2**8200)
    forged["certificate"]["checkpoint"] = Note("\n".join(lines), note.signatures).format()
    report = verify_certificate(forged, expected_checkpoint=pinned, store=evidence)
    assert "pinned_checkpoint" in [c.name for c in report.failed]


def test_certificates_of_the_first_statement_wording_still_verify(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v2 of the scope statement no longer speaks of "registered erasure targets", which
    do not exist; a certificate issued with v1's words stays valid, and a version the
    verifier does not know fails the scope check rather than passing unread."""
    import functools

    from deleatur.erasure import certificate as certificate_module
    from deleatur.erasure.scope import scope_statement

    memory.remember("Alice's note", subject="Alice")
    memory.erase("Alice", request_id="E-V1", basis=BASIS, requester="dpo")
    current = memory.certificate("E-V1")
    assert current["certificate"]["scope_statement"]["version"] == "deleatur-scope/v2"
    assert not any("registered" in line for line in current["certificate"]["scope_statement"]["does_not_cover"])
    assert _verify(memory, current) == []
    monkeypatch.setattr(
        certificate_module, "scope_statement", functools.partial(scope_statement, version="deleatur-scope/v1")
    )
    old = memory.certificate("E-V1")
    assert "not registered as erasure targets" in old["certificate"]["scope_statement"]["text"]
    assert _verify(memory, old) == []

    def unknown(**facts: Any) -> dict[str, Any]:
        return {**scope_statement(**facts), "version": "deleatur-scope/v9"}

    monkeypatch.setattr(certificate_module, "scope_statement", unknown)
    assert _verify(memory, memory.certificate("E-V1")) == ["scope_intact"]
