"""Erasure by subject and account: dry run, lineage, atomicity, crypto-shredding,
requests, idempotency, confirmation tokens, residue and pseudonymized traces."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import shutil
import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import apsw
import pytest

from deleatur import (
    DataKeyDestroyedError,
    DeleaturError,
    InvalidInputError,
    Memory,
    NewMemory,
    NotFoundError,
    Role,
    Space,
    StoreError,
    from_bytes,
)
from deleatur.clock import isoformat
from deleatur.erasure.engine import (
    AmbiguousSubjectError,
    ConfirmationRequiredError,
    ErasureResult,
    RequestIdReusedError,
)
from deleatur.erasure.requests import ErasureRequest, RequestStatus, one_month_after
from deleatur.erasure.verify import verify_certificate
from deleatur.log.entries import Entry, EventType
from deleatur.memory import keystore_path
from deleatur.model import SpaceFilter, cached_space, names_forgotten
from deleatur.rights.restriction import RestrictedSubjectError
from deleatur.sqlitefile import scrubs_unwaited_during
from deleatur.store.evidence import StoreEvidence

from .conftest import MASTER, FakeClock, store_files

BASIS = "Art. 17(1)(a)"


def _erase(memory: Memory, subject: str, request_id: str = "DSAR-17", **kwargs: object) -> object:
    return memory.erase(subject, request_id=request_id, basis=BASIS, requester="dpo@example", **kwargs)  # type: ignore[arg-type]


def _on_disk(memory: Memory, store_path: Path, word: str) -> bool:
    """Whether the index term of ``word`` (default space) is in a byte of the store's files:
    its last hex digits, which FTS5 stores whole whatever prefix it shares with its neighbour."""
    term = memory._index_terms(Space(), [word])[0]
    return term[-10:].encode() in b"".join(p.read_bytes() for p in store_files(store_path))


def _snapshot(memory: Memory) -> tuple[object, ...]:
    conn = memory.backend._conn  # type: ignore[attr-defined]
    keys = memory.keys._conn
    return (
        conn.execute("SELECT id, status, ciphertext FROM records ORDER BY id").fetchall(),
        # Every call is audited, refusals and dry runs included: nothing else may be added.
        conn.execute(
            'SELECT count(*) FROM log_entries WHERE CAST(entry AS TEXT) NOT LIKE \'%"type":"call"%\''
        ).fetchall(),
        keys.execute("SELECT key_id FROM data_keys ORDER BY key_id").fetchall(),
    )


@pytest.fixture
def family(memory: Memory) -> dict[str, str]:
    """Alice's records, a chain derived from them (a -> b -> c), and bystanders."""
    a1 = memory.remember("Alice's phone is +100", subject="Alice Smith", key="alice::phone")
    a2 = memory.remember("Alice's phone is +101", subject="Alice Smith", key="alice::phone", space=Space("u1"))
    b = memory.remember("Summary: Alice moved", subject="Team notes", derived_from=[a1.id])
    c = memory.remember("Digest of the summary", subject="Digest", derived_from=[b.id])
    bob = memory.remember("Bob likes tea", subject="Bob")
    team = memory.remember("Team lunch on Friday", subject="Team notes")
    return {"a1": a1.id, "a2": a2.id, "b": b.id, "c": c.id, "bob": bob.id, "team": team.id}


def test_dry_run_shows_the_blast_radius_and_changes_nothing(memory: Memory, family: dict[str, str]) -> None:
    before = _snapshot(memory)
    result = _erase(memory, "alice smith", dry_run=True)
    plan = result.plan  # type: ignore[attr-defined]
    assert {r.id for r in plan.direct} == {family["a1"], family["a2"]}
    assert [r.id for r in plan.lineage] == [family["b"], family["c"]]  # transitive
    assert plan.other_subjects == ("digest", "team notes")
    assert plan.per_space() == {"default//": 3, "u1//": 1}
    assert len(plan.destroy_keys) == 2  # Alice's and Digest's; Team notes keeps other records
    assert "residue" in plan.to_json()["note"]
    assert result.request is None  # type: ignore[attr-defined]
    assert _snapshot(memory) == before
    assert memory.erasure_requests() == []


def test_erasure_removes_everything_of_the_subject(memory: Memory, family: dict[str, str]) -> None:
    result = _erase(memory, "Alice Smith")
    request = result.request  # type: ignore[attr-defined]
    assert request.status is RequestStatus.COMPLETE
    assert request.counts["records"] == 4
    for name in ("a1", "a2", "b", "c"):
        with pytest.raises(NotFoundError):
            memory.get(family[name], space=Space("u1") if name == "a2" else Space())
    assert memory.recall("phone") == []
    assert [r.id for r in memory.list(include_history=True)] == [family["bob"], family["team"]]
    assert memory.get(family["team"]).text == "Team lunch on Friday"
    assert not memory.keys.has_key(memory.tenant, memory._subject_ref("alice smith"))
    assert memory.keys.has_key(memory.tenant, memory._subject_ref("team notes"))
    entries = [Entry.decode(raw) for _, raw in memory.backend.log_entries()]
    tombstones = [e for e in entries if e.type is EventType.TOMBSTONE]
    assert sorted(str(e.record) for e in tombstones) == sorted(family[n] for n in ("a1", "a2", "b", "c"))
    assert all(e.fields["request"] == "DSAR-17" and e.fields["basis"] == BASIS for e in tombstones)
    assert memory.verify_log().ok


def test_traces_keep_no_name_and_the_pseudonym_cannot_be_recomputed(memory: Memory, family: dict[str, str]) -> None:
    ref = memory._subject_ref("alice smith")
    before = memory.keys.pseudonym(memory.tenant, ref, "alice smith")
    request = _erase(memory, "Alice Smith").request  # type: ignore[attr-defined]
    assert request.subject_pseudonym == before
    assert memory.keys.pseudonym(memory.tenant, ref, "alice smith") is None
    from deleatur.model import _canonical

    assert _canonical.cache_info().currsize == 0  # no erased name left in the process's cache
    conn = memory.backend._conn  # type: ignore[attr-defined]
    rows = repr(conn.execute("SELECT * FROM erasure_requests").fetchall()).lower()
    log = b"".join(raw for _, raw in memory.backend.log_entries()).lower()
    for needle in ("alice", "smith", "phone"):
        assert needle not in rows
        assert needle.encode() not in log


def test_repeating_a_request_id_returns_the_earlier_result(memory: Memory, family: dict[str, str]) -> None:
    first = _erase(memory, "Alice Smith").request  # type: ignore[attr-defined]
    memory.remember("Alice again", subject="Alice Smith")
    again = _erase(memory, "Alice Smith")
    assert again.repeated  # type: ignore[attr-defined]
    assert again.request == first  # type: ignore[attr-defined]
    assert len(list(memory.list(subject="Alice Smith"))) == 1  # nothing new was erased


def test_requests_list_with_deadline(memory: Memory, family: dict[str, str], clock: FakeClock) -> None:
    _erase(memory, "Alice Smith")
    [request] = memory.erasure_requests()
    assert request.deadline == one_month_after(request.received_at)
    assert request.deadline_met(clock.now) is True
    data = request.to_json(clock.now)
    assert data["subject"].startswith("psn:")
    assert data["deadline_met"] is True


def test_one_month_deadline_clamps_to_month_end() -> None:
    from datetime import UTC, datetime

    from deleatur.clock import from_datetime, to_datetime

    assert to_datetime(one_month_after(from_datetime(datetime(2027, 1, 31, 12, tzinfo=UTC)))).date().isoformat() == (
        "2027-02-28"
    )
    assert to_datetime(one_month_after(from_datetime(datetime(2026, 12, 15, tzinfo=UTC)))).date().isoformat() == (
        "2027-01-15"
    )


def test_ambiguous_subject_is_refused_until_allowed(memory: Memory) -> None:
    memory.remember("one", subject="Jo Smith")
    memory.remember("two", subject="JO SMITH")
    with pytest.raises(AmbiguousSubjectError, match="2 different original spellings"):
        _erase(memory, "jo smith")
    [failed] = memory.erasure_requests()
    assert failed.status is RequestStatus.FAILED
    assert "spellings" in (failed.error or "")
    assert len(list(memory.list())) == 2  # nothing erased
    done = _erase(memory, "jo smith", allow_ambiguous=True).request  # type: ignore[attr-defined]
    assert done.status is RequestStatus.COMPLETE
    assert list(memory.list()) == []


def test_a_retried_request_keeps_its_first_receipt_and_its_place(memory: Memory, clock: FakeClock) -> None:
    """A failed request retried under its id is the same request: its month runs from its
    first receipt (Art. 12(3)), which its status and certificate state, and it keeps its
    place in the list, so a pager holding its id as the cursor skips none received since."""
    memory.remember("one", subject="Jo Smith")
    memory.remember("two", subject="JO SMITH")
    with pytest.raises(AmbiguousSubjectError):
        _erase(memory, "jo smith", request_id="R-1")
    first = clock.now
    [cursor] = memory.erasure_requests(limit=1)
    clock.advance(86400)
    _erase(memory, "Nobody", request_id="R-2")
    clock.advance(20 * 86400)
    with pytest.raises(AmbiguousSubjectError):
        _erase(memory, "jo smith", request_id="R-1")
    assert memory.erasure_request("R-1").received_at == first
    clock.advance(20 * 86400)
    done = _erase(memory, "jo smith", request_id="R-1", allow_ambiguous=True).request  # type: ignore[attr-defined]
    assert done.status is RequestStatus.COMPLETE
    assert (done.received_at, done.deadline) == (first, one_month_after(first))
    assert done.deadline_met(clock.now) is False  # done 41 days after it was first received
    assert memory.erasure_request("R-1") == done
    assert memory.certificate("R-1")["certificate"]["request"]["received_at"] == isoformat(first)
    assert [r.id for r in memory.erasure_requests(after=cursor.id)] == ["R-2"]
    assert [r.id for r in memory.erasure_requests()] == ["R-1", "R-2"]


def test_a_failure_recorded_late_never_replaces_the_erasure_that_ran(
    memory: Memory, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed erasure records its failure after its transaction rolled back, in one of
    its own; meanwhile another caller may have run the same request. The failure must not
    replace that erasure's record (its counts, tombstones, keys pending destruction)."""
    memory.remember("one", subject="Jo Smith")
    memory.remember("two", subject="JO SMITH")
    real = memory.backend.atomic
    ran: list[ErasureRequest] = []

    def atomic() -> AbstractContextManager[None]:
        if isinstance(sys.exc_info()[1], AmbiguousSubjectError) and not ran:  # recording the failure
            with Memory.open(store_path, from_bytes(MASTER)) as other:
                ran.append(_erase(other, "jo smith", request_id="R-1", allow_ambiguous=True).request)  # type: ignore[attr-defined]
        return real()

    monkeypatch.setattr(memory.backend, "atomic", atomic)
    with pytest.raises(AmbiguousSubjectError):
        _erase(memory, "jo smith", request_id="R-1")
    assert ran and ran[0].status is RequestStatus.COMPLETE
    assert memory.erasure_request("R-1") == ran[0]


def test_a_failure_before_the_id_is_checked_never_replaces_another_erasures_request(memory: Memory) -> None:
    """An erasure of someone else under a failed request's id, failing before it can find
    that the id names another erasure (here: the log cannot be signed), records nothing
    over that request, whose own retry then goes through."""
    memory.remember("one", subject="Jo Smith")
    memory.remember("two", subject="JO SMITH")
    with pytest.raises(AmbiguousSubjectError):
        _erase(memory, "jo smith", request_id="R-1")
    before = memory.erasure_request("R-1")
    signer, memory.log.signer = memory.log.signer, None  # the signing key is missing
    with pytest.raises(DeleaturError):
        memory.erase("Somebody Else", request_id="R-1", basis="another basis", requester="intruder")
    memory.log.signer = signer
    assert memory.erasure_request("R-1") == before
    done = _erase(memory, "jo smith", request_id="R-1", allow_ambiguous=True).request  # type: ignore[attr-defined]
    assert done.status is RequestStatus.COMPLETE and done.requester == "dpo@example"


def test_a_request_an_older_release_recorded_with_a_multi_line_requester_can_be_retried(memory: Memory) -> None:
    """Older releases took a requester of several lines; today's must be one. A request
    they left, failed, is retried under its id with its requester as it was given (line
    breaks and all) or in its one-line form, and records the one-line form. A requester
    of several lines stays refused anywhere else, recording nothing."""
    memory.remember("one", subject="Jo Smith")
    memory.remember("two", subject="JO SMITH")
    old = "DPO office\r\n  ticket 4411\n"
    for request_id in ("OLD-1", "OLD-2"):
        with pytest.raises(AmbiguousSubjectError):
            memory.erase("jo smith", request_id=request_id, basis=BASIS, requester="dpo")
    conn = memory.backend._conn  # type: ignore[attr-defined]
    conn.execute("UPDATE erasure_requests SET requester = ?", (old,))  # as the older release wrote them
    before = _snapshot(memory)

    def erase(request_id: str, requester: str, *, allow_ambiguous: bool = True, dry_run: bool = False) -> ErasureResult:
        return memory.erase(
            "jo smith",
            request_id=request_id,
            basis=BASIS,
            requester=requester,
            allow_ambiguous=allow_ambiguous,
            dry_run=dry_run,
        )

    for request_id, requester, dry_run in [
        ("OLD-1", "someone\nelse", False),  # not the request's requester
        ("NEW-1", old, False),  # no request of that id
        ("OLD-1", old, True),  # a dry run is no retry
    ]:
        with pytest.raises(InvalidInputError, match="requester contains control characters") as refused:
            erase(request_id, requester, dry_run=dry_run)
        assert refused.value.request_id == request_id
    assert _snapshot(memory) == before
    assert [(r.id, r.requester) for r in memory.erasure_requests()] == [("OLD-1", old), ("OLD-2", old)]

    with pytest.raises(AmbiguousSubjectError):  # retried, and failed again: still that request's
        erase("OLD-1", old, allow_ambiguous=False)
    assert memory.erasure_request("OLD-1").requester == "DPO office ticket 4411"
    done = erase("OLD-1", old).request
    assert done is not None and done.status is RequestStatus.COMPLETE and done.counts["records"] == 2
    assert done.requester == "DPO office ticket 4411"
    again = erase("OLD-1", old)
    assert again.repeated and again.request == done
    memory.remember("three", subject="Jo Smith")
    one_line = erase("OLD-2", "DPO office ticket 4411").request
    assert one_line is not None and one_line.status is RequestStatus.COMPLETE
    assert one_line.requester == "DPO office ticket 4411"


def test_agents_must_present_a_single_use_token(memory: Memory, family: dict[str, str]) -> None:
    with pytest.raises(ConfirmationRequiredError):
        _erase(memory, "Alice Smith", require_confirmation=True)
    token = _erase(memory, "Alice Smith", dry_run=True, issue_token=True).token  # type: ignore[attr-defined]
    assert token
    with pytest.raises(ConfirmationRequiredError, match="unknown confirmation token"):
        _erase(memory, "Alice Smith", request_id="DSAR-18", require_confirmation=True, confirmation="nope")
    done = _erase(memory, "Alice Smith", request_id="DSAR-19", require_confirmation=True, confirmation=token)
    assert done.request.counts["records"] == 4  # type: ignore[attr-defined]
    with pytest.raises(ConfirmationRequiredError, match="already used"):
        _erase(memory, "Bob", request_id="DSAR-20", confirmation=token)


def test_a_spent_token_leaves_nothing_that_confirms_a_guessed_name(
    memory: Memory, family: dict[str, str], store_path: Path
) -> None:
    """The plan a token confirms is a hash over the subject's name and what the request
    row keeps in clear (record ids, key references, principal id): kept unkeyed, anyone
    with the database file could test a guessed name against it."""
    plan = memory.erase(
        "Alice Smith", request_id="D", basis=BASIS, requester="dpo@example", dry_run=True, issue_token=True
    )
    assert plan.plan is not None and plan.token
    (stored,) = _token_digests(store_path)
    (terms,) = _token_digests(store_path, "terms")
    assert terms in _raw(store_path)
    assert stored in _raw(store_path)  # the test reads the right place
    _erase(memory, "Alice Smith", request_id="DSAR-19", require_confirmation=True, confirmation=plan.token)
    guessed = hashlib.sha256(b"deleatur/confirmed-plan/v1\n" + plan.plan.digest + memory.principal.id.encode()).digest()
    memory.backend.scrub()
    blob = _raw(store_path)
    assert plan.plan.digest not in blob and guessed not in blob
    # Nor the keyed hash, which the master key's holder could test a guess against.
    assert stored not in blob and _token_digests(store_path) == [b""]
    # Nor the keyed hash of the requester's name.
    assert terms not in blob and _token_digests(store_path, "terms") == [b""]


def _raw(store_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in store_files(store_path))


def _token_digests(store_path: Path, column: str = "plan_digest") -> list[bytes]:
    """The plan digest (or another keyed hash) of every confirmation token the store
    holds, read as another process would read the file."""
    conn = apsw.Connection(str(store_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return [bytes(d) for (d,) in conn.execute(f"SELECT {column} FROM erasure_confirmations")]
    finally:
        conn.close()


def test_issuing_a_token_removes_those_past_their_time(
    memory: Memory, family: dict[str, str], store_path: Path, clock: FakeClock
) -> None:
    """Every dry run with a token left its row for good, spent or not: the table grew with
    each one, and each row kept a keyed hash of its plan, the subject's name among the rest."""
    for _ in range(3):
        _erase(memory, "Alice Smith", dry_run=True, issue_token=True)
    spent = _erase(memory, "Bob", dry_run=True, issue_token=True).token  # type: ignore[attr-defined]
    _erase(memory, "Bob", request_id="DSAR-BOB", confirmation=spent)
    old = [d for d in _token_digests(store_path) if d]  # a spent token's is gone already
    assert len(_token_digests(store_path)) == 4 and all(d in _raw(store_path) for d in old)
    clock.advance(15 * 60)  # a token still confirms at the very end of its lifetime
    kept = _erase(memory, "Team notes", dry_run=True, issue_token=True).token  # type: ignore[attr-defined]
    assert len(_token_digests(store_path)) == 5
    clock.advance(1)
    _erase(memory, "Digest", dry_run=True, issue_token=True)
    assert len(_token_digests(store_path)) == 2  # the one issued a second ago, and this one
    raw = _raw(store_path)
    assert not any(d in raw for d in old)
    with pytest.raises(ConfirmationRequiredError, match="unknown confirmation token"):
        _erase(memory, "Bob", request_id="DSAR-BOB", confirmation=spent)
    done = _erase(memory, "Team notes", request_id="DSAR-TEAM", confirmation=kept).request  # type: ignore[attr-defined]
    assert done.status is RequestStatus.COMPLETE


def test_an_erasure_leaves_no_token_of_its_plan(memory: Memory, family: dict[str, str], store_path: Path) -> None:
    """The token an erasure spent kept its keyed hash of the plan, which names the erased
    subject, as did the other tokens issued for that plan (another dry run of the same
    agent, another principal's), which can confirm nothing once it ran. Now the erasure
    spends them all, and a spent token keeps no hash: each still repeats the erasure
    until it expires."""
    agent = memory.as_principal(memory.create_principal("bot", Role.AGENT)[0])
    first, second = (_erase(agent, "Alice Smith", dry_run=True, issue_token=True).token for _ in range(2))  # type: ignore[attr-defined]
    _erase(memory, "Alice Smith", dry_run=True, issue_token=True)
    other = _erase(agent, "Bob", dry_run=True, issue_token=True).token  # type: ignore[attr-defined]
    digests = set(_token_digests(store_path))
    assert len(digests) == 3 and all(d in _raw(store_path) for d in digests)
    done = _erase(agent, "Alice Smith", confirmation=second).request  # type: ignore[attr-defined]
    assert done.status is RequestStatus.COMPLETE and "wal_not_truncated" not in done.counts
    *spent, bob = sorted(_token_digests(store_path))  # Bob's plan keeps its hash
    assert spent == [b""] * 3 and bob in digests
    raw = _raw(store_path)
    assert not any(d in raw for d in digests - {bob}) and bob in raw
    assert all(_erase(agent, "Alice Smith", confirmation=t).repeated for t in (first, second))  # type: ignore[attr-defined]
    with pytest.raises(ConfirmationRequiredError, match="already used"):
        _erase(agent, "Alice Smith", request_id="DSAR-18", confirmation=first)
    assert _erase(agent, "Bob", request_id="DSAR-BOB", confirmation=other).request.status is RequestStatus.COMPLETE  # type: ignore[attr-defined]


def test_a_refused_confirmation_neither_records_a_request_nor_reveals_ids_in_use(
    memory: Memory, family: dict[str, str]
) -> None:
    """An agent without a valid token learns nothing of the request ids in use, and its
    refused attempt does not hold the id against the erasure someone else means to make."""
    agent = memory.as_principal(memory.create_principal("agent", Role.AGENT)[0])
    _erase(memory, "Bob", request_id="DSAR-IN-USE")
    refusals = []
    for request_id in ("DSAR-IN-USE", "DSAR-FREE"):
        with pytest.raises(ConfirmationRequiredError) as refused:
            _erase(agent, "Alice Smith", request_id=request_id)
        refusals.append(refused.value.message)
    assert refusals[0] == refusals[1]
    with pytest.raises(ConfirmationRequiredError, match="unknown confirmation token"):
        _erase(agent, "Alice Smith", request_id="DSAR-FREE", confirmation="forged")
    assert [r.id for r in memory.erasure_requests()] == ["DSAR-IN-USE"]
    done = _erase(memory, "Alice Smith", request_id="DSAR-FREE").request  # type: ignore[attr-defined]
    assert done.status is RequestStatus.COMPLETE


def _agent_beside_a_request(memory: Memory) -> Memory:
    """An agent key scoped to user u2, with a record of Bob there, and the DPO's erasure
    DSAR-IN-USE of user u1's Carol: a request the agent may not read."""
    memory.remember("Carol lives in Paris", subject="Carol", space=Space("u1"))
    _erase(memory, "Carol", request_id="DSAR-IN-USE", scope=SpaceFilter("u1"))
    agent = memory.as_principal(memory.create_principal("agent@u2", Role.AGENT, scopes=["u2"])[0])
    agent.remember("Bob likes tea", subject="Bob", space=Space("u2"))
    return agent


def _erase_bob(agent: Memory, request_id: str, **kwargs: object) -> ErasureResult:
    result = _erase(agent, "Bob", request_id, scope=SpaceFilter("u2"), **kwargs)
    assert isinstance(result, ErasureResult)
    return result


def _refusals(agent: Memory, token: str) -> set[tuple[type[DeleaturError], str]]:
    """How the agent's erasure of Bob is refused under the id in use and under a free one."""
    out = set()
    for request_id in ("DSAR-IN-USE", "DSAR-FREE"):
        with pytest.raises(DeleaturError) as refused:
            _erase_bob(agent, request_id=request_id, confirmation=token)
        out.add((type(refused.value), refused.value.message))
    return out


def _token(agent: Memory, subject: str = "Bob") -> str:
    token = _erase(agent, subject, scope=SpaceFilter("u2"), dry_run=True, issue_token=True).token  # type: ignore[attr-defined]
    assert isinstance(token, str)
    return token


def test_a_string_that_is_no_token_tells_nothing_of_the_ids_in_use(memory: Memory, clock: FakeClock) -> None:
    """Any string used to pass the first check, and the request id was looked up before
    the token was: an id in use (here another user's request, whose status the agent may
    not read) was refused as reused, a free one as unconfirmed. A token is now checked
    first: known, unexpired, issued in this tenant."""
    agent = _agent_beside_a_request(memory)
    elsewhere = memory.as_principal(memory.create_principal("t2 agent", Role.AGENT, tenant="t2")[0])
    foreign = _erase(elsewhere, "Bob", dry_run=True, issue_token=True).token  # type: ignore[attr-defined]
    expired = _token(agent)
    clock.advance(16 * 60)
    unknown = {(ConfirmationRequiredError, "unknown confirmation token")}
    assert _refusals(agent, "garbage") == _refusals(agent, foreign) == unknown
    assert _refusals(agent, expired) == {(ConfirmationRequiredError, "confirmation token expired")}
    assert [r.id for r in memory.erasure_requests()] == ["DSAR-IN-USE"]


def test_a_string_that_is_no_token_cannot_hold_a_request_id(memory: Memory) -> None:
    """Two spellings of one subject in the agent's own space make its erasure ambiguous,
    which was refused before the token was checked and recorded as a failed request under
    whatever id the agent named: a deadline running, and the DPO's erasure under that id
    refused as reused. A failure is recorded only for a caller whose token confirmed."""
    agent = _agent_beside_a_request(memory)
    agent.remember("Bob likes coffee", subject="BOB", space=Space("u2"))
    with pytest.raises(ConfirmationRequiredError, match="unknown confirmation token"):
        _erase_bob(agent, request_id="DSAR-NEXT", confirmation="garbage")
    assert [r.id for r in memory.erasure_requests()] == ["DSAR-IN-USE"]
    memory.remember("Dave's file", subject="Dave")
    done = _erase(memory, "Dave", request_id="DSAR-NEXT").request  # type: ignore[attr-defined]
    assert done.status is RequestStatus.COMPLETE and done.counts["records"] == 1

    token = _token(agent)
    with pytest.raises(AmbiguousSubjectError):
        _erase_bob(agent, request_id="DSAR-BOB", confirmation=token)
    assert memory.erasure_request("DSAR-BOB").status is RequestStatus.FAILED
    # The failure rolled the token's spending back: it confirms the retry.
    retried = _erase_bob(agent, request_id="DSAR-BOB", confirmation=token, allow_ambiguous=True).request
    assert retried is not None and retried.status is RequestStatus.COMPLETE


def test_a_scoped_key_finds_a_request_beyond_its_scopes_only_by_spending_a_token(memory: Memory) -> None:
    """An id naming a request a scoped key may not see is answered as a free one until
    the key's token confirms this very erasure; then it is refused as reused, and the
    token is spent, so each id found in use costs the key a dry run."""
    agent = _agent_beside_a_request(memory)
    hidden = memory.erasure_request("DSAR-IN-USE")
    another_plan = (
        ConfirmationRequiredError,
        "confirmation token was issued for a different erasure (the blast radius changed) or caller",
    )
    assert _refusals(agent, _token(agent, "Nobody")) == {another_plan}
    token = _token(agent)
    with pytest.raises(RequestIdReusedError, match="request id DSAR-IN-USE was used for a different erasure"):
        _erase_bob(agent, request_id="DSAR-IN-USE", confirmation=token)
    assert _refusals(agent, token) == {(ConfirmationRequiredError, "confirmation token already used")}
    assert memory.erasure_request("DSAR-IN-USE") == hidden
    assert [r.id for r in memory.erasure_requests()] == ["DSAR-IN-USE"]
    token = _token(agent)
    done = _erase_bob(agent, request_id="DSAR-FREE", confirmation=token).request
    assert done is not None and done.status is RequestStatus.COMPLETE
    # Spent, the token still repeats the erasure it confirmed (a retry of a lost answer).
    assert _erase_bob(agent, request_id="DSAR-FREE", confirmation=token).repeated


def test_a_token_for_another_blast_radius_is_refused(memory: Memory, family: dict[str, str]) -> None:
    token = _erase(memory, "Alice Smith", dry_run=True, issue_token=True).token  # type: ignore[attr-defined]
    memory.remember("Alice's new address", subject="Alice Smith")
    with pytest.raises(ConfirmationRequiredError, match="blast radius changed"):
        _erase(memory, "Alice Smith", confirmation=token)


def test_a_token_confirms_the_basis_and_requester_of_its_dry_run(memory: Memory, family: dict[str, str]) -> None:
    """The certificate states the erasure's basis: a token a dry run issued under one basis
    (or for one requester) confirms no erasure under another, and is not spent by it."""
    token = _erase(memory, "Bob", dry_run=True, issue_token=True).token  # type: ignore[attr-defined]
    other_terms = "confirmation token was issued for another legal basis or requester"
    with pytest.raises(ConfirmationRequiredError, match=other_terms):
        memory.erase("Bob", request_id="DSAR-40", basis="Art. 17(1)(d)", requester="dpo@example", confirmation=token)
    with pytest.raises(ConfirmationRequiredError, match=other_terms):
        memory.erase("Bob", request_id="DSAR-40", basis=BASIS, requester="someone else", confirmation=token)
    assert memory.get(family["bob"]).text == "Bob likes tea"
    assert memory.erasure_requests() == []
    done = _erase(memory, "Bob", request_id="DSAR-40", confirmation=token).request  # type: ignore[attr-defined]
    assert done.record_ids == (family["bob"],) and done.basis == BASIS


def test_a_token_is_spent_only_by_the_principal_it_was_issued_to(memory: Memory, family: dict[str, str]) -> None:
    """An agent's confirmation is its own: handed to another agent, the token erases nothing."""
    first = memory.as_principal(memory.create_principal("agent one", Role.AGENT)[0])
    second = memory.as_principal(memory.create_principal("agent two", Role.AGENT)[0])
    token = _erase(first, "Bob", dry_run=True, issue_token=True).token  # type: ignore[attr-defined]
    with pytest.raises(ConfirmationRequiredError, match=r"different erasure .* or caller"):
        _erase(second, "Bob", request_id="DSAR-30", confirmation=token)
    assert memory.get(family["bob"]).text == "Bob likes tea"
    done = _erase(first, "Bob", request_id="DSAR-31", confirmation=token).request  # type: ignore[attr-defined]
    assert done.record_ids == (family["bob"],)


def test_expired_token_is_refused(memory: Memory, family: dict[str, str], clock: FakeClock) -> None:
    token = _erase(memory, "Alice Smith", dry_run=True, issue_token=True).token  # type: ignore[attr-defined]
    clock.advance(16 * 60)
    with pytest.raises(ConfirmationRequiredError, match="expired"):
        _erase(memory, "Alice Smith", confirmation=token)


def test_a_space_limited_erasure_keeps_the_key(memory: Memory, family: dict[str, str]) -> None:
    result = _erase(memory, "Alice Smith", scope=SpaceFilter(user_id="u1"))
    request = result.request  # type: ignore[attr-defined]
    assert request.record_ids == (family["a2"],)
    assert request.counts["kept_in_other_spaces"] == 1
    assert memory.get(family["a1"]).text == "Alice's phone is +100"
    cert = memory.certificate("DSAR-17")["certificate"]
    assert cert["erasure"]["key_destroyed"] is False
    assert any("key was kept because 1" in line for line in cert["scope_statement"]["does_not_cover"])


def test_the_dry_run_counts_a_key_left_with_no_records_as_the_erasure_destroys_it(memory: Memory) -> None:
    """A write refused for a restricted subject leaves the data key it made (never used);
    the dry run says the erasure destroys it, as the erasure then does."""
    memory.restrict("Carol", reason="accuracy contested", actor="dpo")
    with pytest.raises(RestrictedSubjectError):
        memory.remember("Carol's phone", subject="Carol")
    assert memory.keys.has_key(memory.tenant, memory._subject_ref("carol"))
    plan = _erase(memory, "Carol", dry_run=True).plan  # type: ignore[attr-defined]
    assert (plan.total, plan.keys_destroyed) == (0, 1)
    done = _erase(memory, "Carol").request  # type: ignore[attr-defined]
    assert (done.counts["keys_to_destroy"], done.counts["keys_destroyed"]) == (1, 1)
    assert not memory.keys.has_key(memory.tenant, memory._subject_ref("carol"))


def test_account_erasure_never_touches_another_user(memory: Memory) -> None:
    for user in ("user1", "user10", "user"):
        for agent in ("", "bot"):
            memory.remember(f"{user} {agent} note", subject=f"person of {user}", space=Space(user, agent))
    result = memory.erase_all(user_id="user1", request_id="ACC-1", basis=BASIS, requester="ops")
    assert result.request.counts["records"] == 2  # type: ignore[union-attr]
    assert list(memory.list(space=Space("user1"))) == []
    assert list(memory.list(space=Space("user1", "bot"))) == []
    for user in ("user10", "user"):
        assert len(list(memory.list(space=Space(user)))) == 1
        assert len(list(memory.list(space=Space(user, "bot")))) == 1
    with pytest.raises(InvalidInputError, match="user_id must not be empty"):
        memory.erase_all(user_id="", request_id="X", basis=BASIS, requester="ops")


def test_account_erasure_of_one_space(memory: Memory) -> None:
    memory.remember("support", subject="s", space=Space("user1", "support"))
    memory.remember("sales", subject="s", space=Space("user1", "sales"))
    memory.erase_all(user_id="user1", agent_id="support", request_id="ACC-2", basis=BASIS, requester="ops")
    assert [r.text for r in memory.list(space=Space("user1", "sales"))] == ["sales"]
    assert list(memory.list(space=Space("user1", "support"))) == []


def test_bad_requests_are_refused_before_anything_happens(memory: Memory, family: dict[str, str]) -> None:
    before = _snapshot(memory)
    with pytest.raises(InvalidInputError, match="request id"):
        memory.erase("Alice Smith", request_id="no spaces allowed", basis=BASIS, requester="x")
    with pytest.raises(InvalidInputError, match="legal basis"):
        memory.erase("Alice Smith", request_id="D-1", basis=" ", requester="x")
    with pytest.raises(InvalidInputError, match="subject must not be empty"):
        memory.erase("  ", request_id="D-1", basis=BASIS, requester="x")
    assert _snapshot(memory) == before


def test_a_failure_midway_erases_nothing(
    memory: Memory, family: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _snapshot(memory)
    real = memory.backend.purge

    def broken(ids: object) -> int:
        real(ids)  # type: ignore[arg-type]
        raise InvalidInputError("disk full (injected)")

    monkeypatch.setattr(memory.backend, "purge", broken)
    with pytest.raises(InvalidInputError, match="injected"):
        _erase(memory, "Alice Smith")
    monkeypatch.undo()
    assert _snapshot(memory)[0] == before[0]  # every record still there
    assert _snapshot(memory)[2] == before[2]  # every key still there
    [failed] = memory.erasure_requests()
    assert failed.status is RequestStatus.FAILED
    assert failed.error == "disk full (injected)"
    assert memory.get(family["a1"]).text == "Alice's phone is +100"
    assert memory.verify_log().ok
    assert _erase(memory, "Alice Smith").request.status is RequestStatus.COMPLETE  # type: ignore[attr-defined]


def test_keys_left_pending_by_a_crash_are_destroyed_on_open(
    memory: Memory, family: dict[str, str], store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deleatur.erasure import engine

    monkeypatch.setattr(engine, "finish_pending", lambda memory, request: request)  # the process dies here
    request = _erase(memory, "Alice Smith").request  # type: ignore[attr-defined]
    assert request.status is RequestStatus.KEYS_PENDING
    ref = memory._subject_ref("alice smith")
    assert memory.keys.has_key(memory.tenant, ref)
    monkeypatch.undo()
    with Memory.open(store_path, from_bytes(MASTER)) as reopened:
        assert not reopened.keys.has_key(reopened.tenant, ref)
        assert reopened.erasure_request("DSAR-17").status is RequestStatus.COMPLETE


def test_a_locked_key_store_leaves_the_erasure_pending_and_the_next_read_finishes_it(
    memory: Memory, family: dict[str, str], store_path: Path
) -> None:
    """Another process holds the key store: the erasure commits, truncates the -wal and
    reports keys_pending (not an internal error); a later status read in the same process
    destroys the keys."""
    import apsw

    from deleatur import KeyStoreBusyError

    holder = apsw.Connection(str(store_path) + ".keys")
    holder.execute("BEGIN IMMEDIATE")
    memory.keys._conn.set_busy_timeout(20)
    with pytest.raises(KeyStoreBusyError):
        memory.keys.destroy_ids([b"x" * 16])
    request = _erase(memory, "Alice Smith").request  # type: ignore[attr-defined]
    assert request.status is RequestStatus.KEYS_PENDING
    assert memory.erasure_request("DSAR-17").status is RequestStatus.KEYS_PENDING  # still locked
    with pytest.raises(NotFoundError):
        memory.get(family["a1"])
    assert not _on_disk(memory, store_path, "phone")
    holder.execute("ROLLBACK")
    holder.close()
    done = memory.erasure_request("DSAR-17")
    assert (done.status, done.counts["keys_destroyed"]) == (RequestStatus.COMPLETE, 2)  # Alice's and Digest's
    assert not memory.keys.has_key(memory.tenant, memory._subject_ref("alice smith"))
    assert memory.certificate("DSAR-17")["certificate"]["erasure"]["key_destroyed"] is True


def test_a_repeat_finishes_a_pending_erasure_and_truncates_the_wal(
    memory: Memory, family: dict[str, str], store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deleatur.erasure import engine

    monkeypatch.setattr(engine, "settle", lambda memory, request: request)  # the process dies here
    assert _erase(memory, "Alice Smith").request.status is RequestStatus.KEYS_PENDING  # type: ignore[attr-defined]
    monkeypatch.undo()
    assert _on_disk(memory, store_path, "phone")  # in old -wal frames
    repeated = _erase(memory, "Alice Smith")
    assert repeated.repeated and repeated.request.status is RequestStatus.COMPLETE  # type: ignore[attr-defined]
    assert "wal_not_truncated" not in repeated.request.counts  # type: ignore[attr-defined]
    assert not _on_disk(memory, store_path, "phone")


def test_an_erasure_does_not_count_the_keys_another_is_destroying(
    memory: Memory, family: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from deleatur.erasure import engine

    monkeypatch.setattr(engine, "settle", lambda memory, request: request)  # S1 is between commit and keys
    first = _erase(memory, "Alice Smith", request_id="S1").request  # type: ignore[attr-defined]
    monkeypatch.undo()
    second = _erase(memory, "Alice Smith", request_id="S2").request  # type: ignore[attr-defined]
    assert (second.counts["records"], second.counts["keys_destroyed"]) == (0, 0)
    # ...and it finishes the one it found pending: the subject's key is gone when it ends.
    row = memory.backend.get_request(memory.tenant, "S1")
    assert row is not None and ErasureRequest.from_row(row).status is RequestStatus.COMPLETE
    assert not memory.keys.has_key(memory.tenant, memory._subject_ref("alice smith"))
    assert memory.erasure_request("S1").counts["keys_destroyed"] == len(first.pending_keys) == 2


def test_a_wal_left_untruncated_is_truncated_by_the_next_status_read(
    memory: Memory, family: dict[str, str], store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory.backend, "scrub", lambda wait=True, settled=True: False)  # a reader holds a snapshot
    done = _erase(memory, "Alice Smith").request  # type: ignore[attr-defined]
    assert done.counts["wal_not_truncated"] == 1
    monkeypatch.undo()
    assert "wal_not_truncated" not in memory.erasure_request("DSAR-17").counts
    assert not _on_disk(memory, store_path, "phone")


def test_a_wal_a_reader_kept_is_truncated_as_the_next_call_ends(
    memory: Memory, family: dict[str, str], store_path: Path
) -> None:
    """It stayed, the erased record's pages in it, until the request's status was read,
    another removal was made or the store was opened again: for as long as a process
    that made other calls lived."""
    with Memory.open(store_path, from_bytes(MASTER)) as reader:
        with reader.read_snapshot(), scrubs_unwaited_during(lambda: True):
            done = _erase(memory, "Alice Smith").request  # type: ignore[attr-defined]
        assert done.counts["wal_not_truncated"] == 1
        assert _on_disk(memory, store_path, "phone")  # the reader kept it
    memory.recall("anything")
    assert not _on_disk(memory, store_path, "phone")
    row = memory.backend.get_request(memory.tenant, "DSAR-17")
    assert row is not None and "wal_not_truncated" not in ErasureRequest.from_row(row).counts


def test_lineage_survives_every_hard_delete_that_keeps_a_derived_record(
    memory: Memory, clock: FakeClock, store_path: Path
) -> None:
    """A purge, a rectification's erase-previous and a space-limited erasure hard-delete a
    record and keep what was derived from it: a later erasure of its subject still reaches
    the derived records (through a stub of blind references), and the certificate holds."""
    sam = memory.remember("Sam lives at Old Street", subject="Sam Soe", key="sam::addr")
    route = memory.remember("Route 7 via Old Street for Sam", subject="Route 7", derived_from=[sam.id])
    memory.rectify("sam::addr", "Sam lives at New Street", reason="wrong", actor="dpo", erase_previous=True)
    tom = memory.remember("Tom's session", subject="Tom", expires_at=clock.now + 1_000_000)
    summary = memory.remember("Summary of Tom's session", subject="Summary", derived_from=[tom.id])
    ann = memory.remember("Ann's file", subject="Ann", space=Space("u1"))
    note = memory.remember("Note from Ann's file", subject="Notes", derived_from=[ann.id], space=Space("u2"))
    clock.advance(2)
    assert memory.purge().request.record_ids == (tom.id,)  # type: ignore[union-attr]
    _erase(memory, "Ann", scope=SpaceFilter("u1"), request_id="DSAR-ANN-U1")
    for subject, derived, request_id in (
        ("Sam Soe", route, "DSAR-SAM"),
        ("Tom", summary, "DSAR-TOM"),
        ("Ann", note, "DSAR-ANN"),
    ):
        plan = _erase(memory, subject, request_id=request_id, dry_run=True).plan  # type: ignore[attr-defined]
        assert [r.id for r in plan.lineage] == [derived.id], subject
        done = _erase(memory, subject, request_id=request_id).request  # type: ignore[attr-defined]
        assert derived.id in done.record_ids
        with pytest.raises(NotFoundError):
            memory.get(derived.id, space=Space("u2") if subject == "Ann" else Space())
        evidence = StoreEvidence(store_path)
        report = verify_certificate(
            memory.certificate(request_id), expected_key=memory.announced_keys()[-1], store=evidence
        )
        evidence.close()
        assert report.ok, report.lines()
    conn = memory.backend._conn  # type: ignore[attr-defined]
    assert conn.execute("SELECT count(*) FROM lineage_stubs").fetchall() == [(0,)]  # none left to serve


def test_residue_scan_finds_untagged_mentions(memory: Memory, family: dict[str, str]) -> None:
    memory.remember("Bob met ALICE SMITH at the station", subject="Bob")
    memory.remember("call +100 back", subject="Carol")
    hits = memory.residue("Alice Smith", ["+100"])
    # "Summary: Alice moved" names no full identifier, so it is not reported.
    assert sorted(h.subject for h in hits) == ["Bob", "Carol"]
    with pytest.raises(InvalidInputError, match="at least one"):
        memory.residue("Alice Smith", [" "])


def test_erased_subject_can_be_remembered_again_under_a_new_key(memory: Memory, family: dict[str, str]) -> None:
    old_key = memory.backend.get(memory.tenant, family["a1"])
    assert old_key is not None
    _erase(memory, "Alice Smith")
    again = memory.remember("Alice is back", subject="Alice Smith")
    row = memory.backend.get(memory.tenant, again.id)
    assert row is not None
    assert row.key_id != old_key.key_id
    assert memory.get(again.id).text == "Alice is back"


def test_reads_through_a_stale_cached_key_fail_once_destroyed(memory: Memory, family: dict[str, str]) -> None:
    row = memory.backend.get(memory.tenant, family["a1"])
    assert row is not None
    _erase(memory, "Alice Smith")
    with pytest.raises(DataKeyDestroyedError):
        memory.keys.key_by_id(row.key_id)


def test_account_ids_do_not_survive_in_the_process_caches(memory: Memory, store_path: Path) -> None:
    """The process keeps names it read for reuse (spaces, a handle's tokens of them): an
    account erasure empties those caches, those of every handle in the process included,
    one that makes no call meanwhile too."""
    other = Memory.open(store_path, from_bytes(MASTER))
    try:
        memory.remember("x", subject="s", space=Space("cust_5521"))
        assert [r.text for r in other.list(space=Space("cust_5521"))] == ["x"]  # it caches the user's names
        held = [repr(list(cache)) for cache in (memory._tokens, other._tokens)]
        assert all("cust_5521" in names for names in held)
        assert cached_space.cache_info().currsize
        memory.erase_all(user_id="cust_5521", request_id="ACC-9", basis=BASIS, requester="ops")
        assert cached_space.cache_info().currsize == 0
        assert all("cust_5521" not in repr(list(handle._tokens)) for handle in (memory, other))  # an idle one too
    finally:
        other.close()


def test_a_stream_begun_before_an_erasure_leaves_no_erased_name_cached(memory: Memory, store_path: Path) -> None:
    """A stream reads the store as it was when it began: its rows of an erased user, read
    after the erasure emptied the caches, would have put the user's names back."""
    memory.remember_many([NewMemory(f"x{i}", subject="s") for i in range(300)], space=Space("cust_5521"))
    other = Memory.open(store_path, from_bytes(MASTER))
    try:
        stream = other.list(space=Space("cust_5521"))
        next(stream)
        before = names_forgotten()
        # A long read, as a server tells its erasures (the -wal is truncated as it ends).
        with scrubs_unwaited_during(lambda: True):
            memory.erase_all(user_id="cust_5521", request_id="ACC-11", basis=BASIS, requester="ops")
        assert cached_space.cache_info().currsize == 0
        with contextlib.suppress(DataKeyDestroyedError):  # its keys may still be in the handle's cache
            for _ in stream:
                assert cached_space.cache_info().currsize == 0
        # One erasure counted once: emptying the caches again (as the erasure's own call,
        # and each step of the stream, ended) is not counted, or calls overlapping each
        # other would go on emptying them.
        assert names_forgotten() == before + 1
    finally:
        other.close()


@pytest.mark.parametrize("reader", ["another handle", "the erasing handle"])
def test_a_stream_begun_before_an_erasure_returns_none_of_the_erased_records(
    memory: Memory, store_path: Path, reader: str
) -> None:
    """A stream reads the store a page at a time: a record erased while it is read (its
    data key destroyed, or kept, as a record derived from the subject's but about another
    is) is not returned after the erasure, through this handle or another; the others
    still come, and no stream keeps the -wal from being truncated."""
    u1 = Space("u1")
    memory.remember_many([NewMemory(f"x{i}", subject="Alice Smith" if i % 2 else "Bob") for i in range(600)], space=u1)
    for i in range(3):
        memory.remember(f"Alice's phone {i}", subject="Alice Smith", key="alice::phone", space=u1)
    source = next(memory.list(space=u1, subject="Alice Smith"))
    derived = memory.remember("Team: Alice Smith moved", subject="Team", derived_from=[source.id], space=u1)
    memory.remember("Team lunch", subject="Team", space=u1)
    other = Memory.open(store_path, from_bytes(MASTER))
    try:
        streaming = other if reader == "another handle" else memory
        records = streaming.list(space=u1)
        versions = streaming.versions("alice::phone", space=u1)
        assert (next(records).text, next(versions).text) == ("x0", "Alice's phone 0")
        assert derived.id in [r.id for r in streaming.list(space=u1)]
        done = _erase(memory, "Alice Smith").request  # type: ignore[attr-defined]
        assert derived.id in done.record_ids and "wal_not_truncated" not in done.counts
        assert [r.text for r in records] == [*(f"x{i}" for i in range(2, 600, 2)), "Team lunch"]
        assert list(versions) == []
    finally:
        other.close()


@pytest.mark.parametrize("key", ["cached", "read again"])
@pytest.mark.parametrize("reader", ["list", "export"])
def test_a_stream_or_export_skips_a_record_erased_as_it_was_read(
    memory: Memory, store_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str, key: str
) -> None:
    """Another process's erasure commits, then destroys the subject's key: landing as a
    stream or an export read a record (checked for removals before its read), the record
    went out through the handle's cached key, or (its key not cached) the export failed
    with DataKeyDestroyedError. The check is made once the record is read: the page is
    read again without what the erasure removed."""
    u1 = Space("u1")
    memory.remember_many([NewMemory(f"x{i}", subject="Alice Smith" if i % 2 else "Bob") for i in range(20)], space=u1)
    decrypt = Memory._decrypt
    reads = itertools.count(1)

    def erased_as_the_second_is_read(self: Memory, row: Any) -> Any:
        if next(reads) == 2:
            with Memory.open(store_path, from_bytes(MASTER)) as other:
                _erase(other, "Alice Smith")
            if key == "read again":
                self.keys._by_id.clear()
        return decrypt(self, row)

    monkeypatch.setattr(Memory, "_decrypt", erased_as_the_second_is_read)
    if reader == "list":
        texts = [r.text for r in memory.list(space=u1)]
    else:
        out = io.StringIO()
        memory.export_json(out, user_id="u1")
        texts = [record["text"] for record in json.loads(out.getvalue())["records"]]
    assert texts == [f"x{i}" for i in range(0, 20, 2)]  # x1, read as Alice was erased, is not


def test_a_versions_stream_returns_no_value_a_rectification_erased_meanwhile(memory: Memory) -> None:
    for i in range(3):
        memory.remember(f"Bob's phone {i}", subject="Bob", key="bob::phone")
    versions = memory.versions("bob::phone")
    assert next(versions).text == "Bob's phone 0"
    memory.rectify("bob::phone", "Bob's phone 3", reason="wrong", actor="dpo", erase_previous=True)
    assert [r.text for r in versions] == ["Bob's phone 3"]


def test_a_stream_read_after_its_handle_closed_says_so(store_path: Path) -> None:
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.remember("x", subject="s")
        begun, unread = memory.list(), memory.list()
        assert next(begun).text == "x"
    for stream in (begun, unread):
        with pytest.raises(StoreError, match="closed"):
            next(stream)


def test_a_record_whose_key_was_destroyed_before_the_stream_began_is_reported(
    memory: Memory, store_path: Path, tmp_path: Path
) -> None:
    """A database restored beside a later key store holds records no key opens: a stream
    reports the first, as get() does, rather than skip what no erasure of its time removed."""
    shredded = memory.remember("Carol's diagnosis", subject="Carol")
    memory.backend.scrub()
    backup = tmp_path / "backup.db"
    shutil.copy(store_path, backup)
    _erase(memory, "Carol")
    shutil.copy(keystore_path(store_path), keystore_path(backup))
    with Memory.open(backup, from_bytes(MASTER)) as restored:
        with pytest.raises(DataKeyDestroyedError):
            restored.get(shredded.id)
        with pytest.raises(DataKeyDestroyedError):
            list(restored.list())


_HOLDER = """
import sys
from pathlib import Path
from deleatur import Memory, Space, from_bytes
from deleatur.model import cached_space
memory = Memory.open(Path(sys.argv[1]), from_bytes(bytes.fromhex(sys.argv[2])))
def held():
    return cached_space.cache_info().currsize, "cust_5521" in repr(list(memory._tokens))
assert [r.text for r in memory.list(space=Space("cust_5521"))] == ["x"]
print(*held(), flush=True)
sys.stdin.readline()
assert list(memory.list(space=Space("bystander"))) == []  # its next call, after the erasure
print(*held(), flush=True)
memory.close()
"""


def test_account_ids_do_not_survive_in_another_processs_caches(memory: Memory, store_path: Path) -> None:
    """A server's other worker processes hold names too: each empties its caches as its
    next call finds that an erasure was made (the count the erasure keeps in the store)."""
    memory.remember("x", subject="s", space=Space("cust_5521"))
    command = [sys.executable, "-c", _HOLDER, str(store_path), MASTER.hex()]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        assert holder.stdout.readline().split() == ["1", "True"]
        memory.erase_all(user_id="cust_5521", request_id="ACC-10", basis=BASIS, requester="ops")
        holder.stdin.write("erased\n")
        holder.stdin.flush()
        assert holder.stdout.readline().split() == ["0", "False"]
        assert holder.wait(timeout=60) == 0


def test_account_ids_do_not_survive_in_requests(memory: Memory) -> None:
    memory.remember("x", subject="s", space=Space("cust_5521"))
    memory.erase_all(user_id="cust_5521", request_id="ACC-3", basis=BASIS, requester="ops")
    conn = memory.backend._conn  # type: ignore[attr-defined]
    assert b"cust_5521" not in repr(conn.execute("SELECT * FROM erasure_requests").fetchall()).encode()
