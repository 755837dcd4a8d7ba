"""Restriction of processing (Art. 18)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from deleatur import InvalidInputError, Memory, NewMemory, NotFoundError, Space
from deleatur.log.entries import Entry, EventType
from deleatur.rights.restriction import RestrictedSubjectError

from .conftest import Cli, FakeClock, store_files


def test_restricted_records_are_kept_but_not_recalled_or_written(memory: Memory) -> None:
    kept = memory.remember("Alice likes tea", subject="Alice", key="alice::drink")
    memory.remember("Bob likes tea", subject="Bob")
    restriction = memory.restrict("ALICE", reason="accuracy contested by the subject", actor="dpo")
    assert restriction.subject.startswith("psn:")
    assert [h.record.subject for h in memory.recall("tea")] == ["bob"]
    assert memory.get(kept.id).text == "Alice likes tea"  # access stays
    assert len(list(memory.list(subject="alice"))) == 1
    with pytest.raises(RestrictedSubjectError, match=r"Art\. 18"):
        memory.remember("Alice likes coffee", subject="Alice")
    with pytest.raises(RestrictedSubjectError):
        memory.rectify("alice::drink", "Alice likes water", reason="r", actor="a")
    # Retiring is processing too, by key or by id.
    with pytest.raises(RestrictedSubjectError, match="only kept until the restriction is lifted"):
        memory.forget(key="alice::drink")
    with pytest.raises(RestrictedSubjectError, match="only kept until the restriction is lifted"):
        memory.forget(record_id=kept.id)
    assert memory.get(kept.id).status.value == "ACTIVE"
    claim = memory.remember("Alice's claim evidence", subject="Alice", for_legal_claim=True)
    assert memory.get(claim.id).text == "Alice's claim evidence"
    memory.unrestrict("alice", actor="dpo")
    assert {h.record.subject for h in memory.recall("tea")} == {"alice", "bob"}
    memory.remember("Alice likes coffee", subject="Alice")
    with pytest.raises(NotFoundError, match="not restricted"):
        memory.unrestrict("alice", actor="dpo")


def test_a_write_about_another_subject_cannot_supersede_a_restricted_value(memory: Memory) -> None:
    """The key names a slot, not a subject: a new value in a restricted subject's slot would
    retire the restricted value, whoever the new one is about. The whole batch is refused."""
    kept = memory.remember("Alice phone 111", subject="Alice", key="alice::phone")
    memory.restrict("Alice", reason="accuracy contested", actor="dpo")
    with pytest.raises(RestrictedSubjectError, match=r"Art\. 18"):
        memory.remember("Alice phone 222", subject="A. Smith", key="alice::phone")
    with pytest.raises(RestrictedSubjectError):
        memory.remember_many(
            [
                NewMemory("unrelated", subject="Bob"),
                NewMemory("Alice phone 222", subject="A. Smith", key="alice::phone"),
            ]
        )
    assert memory.get(kept.id).status.value == "ACTIVE"
    assert [r.id for r in memory.history("alice::phone")] == [kept.id]
    assert list(memory.list(subject="Bob")) == []
    claim = memory.remember("Alice phone 222", subject="A. Smith", key="alice::phone", for_legal_claim=True)
    assert claim.supersedes == kept.id


def test_a_legal_claim_allows_a_correction_but_never_hard_deletes_restricted_values(memory: Memory) -> None:
    first = memory.remember("Rita phone +78", subject="Rita Roe", key="rita::phone")
    memory.restrict("Rita Roe", reason="needed for a legal claim", actor="dpo")
    fixed = memory.rectify("rita::phone", "Rita phone +79", reason="fix", actor="dpo", for_legal_claim=True)
    with pytest.raises(RestrictedSubjectError, match="only kept until the restriction is lifted"):
        memory.rectify(
            "rita::phone", "Rita phone +80", reason="fix", actor="dpo", erase_previous=True, for_legal_claim=True
        )
    assert [r.id for r in memory.history("rita::phone")] == [first.id, fixed.id]


def test_erasing_previous_values_spares_none_of_a_restricted_subject(memory: Memory) -> None:
    """A key's earlier value may be another subject's: rectify --erase-previous hard-deleted
    it though its subject was restricted, which keeps it (a purge keeps it too)."""
    alice = memory.remember("Alice's address 1 Rue X", subject="Alice", key="shared::addr")
    memory.remember("Bob's address 2 Rue Y", subject="Bob", key="shared::addr")
    memory.restrict("Alice", reason="needed for my legal claim", actor="dpo")
    for claim in (False, True):
        with pytest.raises(RestrictedSubjectError, match="only kept until the restriction is lifted"):
            memory.rectify(
                "shared::addr", "Bob's 3 Rue Z", reason="typo", actor="a", erase_previous=True, for_legal_claim=claim
            )
    assert memory.get(alice.id).text == "Alice's address 1 Rue X"
    assert [r.text for r in memory.history("shared::addr")] == ["Alice's address 1 Rue X", "Bob's address 2 Rue Y"]
    memory.rectify("shared::addr", "Bob's 3 Rue Z", reason="typo", actor="a")  # kept in history, it may be
    assert memory.get(alice.id).text == "Alice's address 1 Rue X"


def test_deriving_from_a_restricted_subjects_record_is_refused_unless_for_a_legal_claim(memory: Memory) -> None:
    source = memory.remember("Alice phone +100", subject="Alice")
    memory.restrict("Alice", reason="contested", actor="dpo")
    with pytest.raises(RestrictedSubjectError):
        memory.remember("Loan score derived from Alice's phone", subject="Scoring", derived_from=[source.id])
    with pytest.raises(RestrictedSubjectError):
        memory.remember_many([NewMemory("Bea's note", subject="Bea"), NewMemory("Alice again", subject="Alice")])
    assert list(memory.list(subject="Scoring")) == []
    # Refused before any data key was made: no key names a subject of whom nothing is stored.
    assert not memory.keys.has_key(memory.tenant, memory._subject_ref("scoring"))
    assert not memory.keys.has_key(memory.tenant, memory._subject_ref("bea"))
    claim = memory.remember("Evidence summary", subject="Scoring", derived_from=[source.id], for_legal_claim=True)
    assert claim.derived_from == (source.id,)
    # A correction of a value derived from it derives from it too.
    keyed = memory.remember("Score 3", subject="Scoring", key="score", derived_from=[source.id], for_legal_claim=True)
    with pytest.raises(RestrictedSubjectError):
        memory.rectify("score", "Score 4", reason="fix", actor="dpo")
    assert memory.rectify("score", "Score 4", reason="fix", actor="dpo", for_legal_claim=True).supersedes == keyed.id


def test_restrictions_are_logged_by_pseudonym_and_reason_is_encrypted(memory: Memory, store_path: Path) -> None:
    memory.remember("x", subject="Alice Quartermain")
    memory.restrict("Alice Quartermain", reason="zanzibarquokka dispute", actor="dpo")
    [listed] = memory.restrictions()
    assert listed.reason == "zanzibarquokka dispute"
    entries = [Entry.decode(raw) for _, raw in memory.backend.log_entries()]
    restricted = [e for e in entries if e.type is EventType.RESTRICT]
    assert [e.fields["subject"] for e in restricted] == [listed.subject]
    [call] = [e for e in entries if e.type is EventType.CALL and e.fields["action"] == "restrict"]
    assert call.fields["subject"] == listed.subject
    memory.backend.scrub()
    blob = b"".join(p.read_bytes() for p in store_files(store_path)).lower()
    assert b"zanzibarquokka" not in blob
    assert b"quartermain" not in blob
    assert memory.verify_log().ok


def test_erasure_takes_the_restriction_with_it(memory: Memory) -> None:
    memory.remember("x", subject="Alice")
    memory.restrict("Alice", reason="objection", actor="dpo")
    memory.erase("Alice", request_id="DSAR-1", basis="Art. 17(1)(c)", requester="dpo")
    assert memory.restrictions() == []
    memory.remember("Alice again, later", subject="Alice")  # a new subject key, no restriction


def test_restriction_cli(cli: Cli, tmp_path: Path) -> None:
    assert cli("init")[0] == 0
    cli("remember", "Alice likes tea", "-s", "Alice")
    code, out, _ = cli("restrict", "Alice", "--reason", "contested", "--json")
    assert code == 0
    assert json.loads(out)["reason"] == "contested"
    code, _, err = cli("remember", "more", "-s", "alice")
    assert code == 2
    assert "restricted" in err
    assert cli("remember", "evidence", "-s", "alice", "--for-legal-claim")[0] == 0
    code, out, _ = cli("recall", "tea", "--json")
    assert json.loads(out) == []
    code, out, _ = cli("restrictions", "--json")
    assert len(json.loads(out)) == 1
    assert cli("unrestrict", "Alice")[0] == 0
    code, out, _ = cli("recall", "tea", "--json")
    assert len(json.loads(out)) == 1


def test_actors_and_requesters_are_one_line_as_over_http(memory: Memory) -> None:
    """A line break in who acted would let an audit view or a certificate show someone
    else on a line of its own; the servers refuse it, and so does the library."""
    memory.remember("Alice phone +100", subject="Alice", key="alice::phone")
    size = memory.backend.log_size()
    for bad, said in (("dpo\nforged-line", "control characters"), ("x" * 513, "longer than 512"), (" ", "needs")):
        with pytest.raises(InvalidInputError, match=said):
            memory.restrict("Alice", reason="contested", actor=bad)
        with pytest.raises(InvalidInputError, match=said):
            memory.rectify("alice::phone", "Alice phone +200", reason="wrong", actor=bad)
        with pytest.raises(InvalidInputError, match=said):
            memory.erase("Alice", request_id="E-1", basis="Art. 17(1)(a)", requester=bad)
    assert memory.restrictions() == [] and [r.text for r in memory.list()] == ["Alice phone +100"]
    assert memory.erasure_requests() == []
    memory.restrict("Alice", reason="contested", actor="  dpo  ")
    assert [r.actor for r in memory.restrictions()] == ["dpo"]
    with pytest.raises(InvalidInputError, match="control characters"):
        memory.unrestrict("Alice", actor="dpo\rforged")
    assert len(memory.restrictions()) == 1
    assert memory.backend.log_size() > size  # the refused calls are audited, nothing else changed


def test_a_restriction_is_not_restated_over_itself(memory: Memory, clock: FakeClock) -> None:
    """Restricting a restricted subject again replaced its reason, actor and time, and no
    entry kept the first reason. The same restriction again (a retry) changes nothing; one
    for another reason is refused until the first is lifted."""
    memory.remember("Alice's note", subject="Alice")
    first = memory.restrict("Alice", reason="needed for my legal claim", actor="dpo1")
    size = memory.backend.log_size()
    clock.advance(60)
    assert memory.restrict("alice", reason=" needed for my legal claim ", actor="dpo2") == first
    with pytest.raises(RestrictedSubjectError, match=r"already restricted, since .* by dpo1, for another reason"):
        memory.restrict("Alice", reason="second thoughts", actor="intern")
    assert memory.restrictions() == [first]
    restricts = [Entry.decode(raw) for _, raw in memory.backend.log_entries_naming(first.subject)]
    assert [e.type for e in restricts].count(EventType.RESTRICT) == 1
    assert memory.backend.log_size() > size  # the calls are audited all the same
    memory.unrestrict("Alice", actor="dpo1")
    assert memory.restrict("Alice", reason="second thoughts", actor="intern").reason == "second thoughts"


def test_a_dry_run_says_which_records_of_restricted_subjects_an_erasure_takes(memory: Memory) -> None:
    """An erasure of another subject takes a restricted subject's derived record (and an
    account erasure, the restricted records in its spaces), which a purge keeps: the dry
    run counts them, so that whoever confirms knows."""
    bob = memory.remember("Bob's order 17", subject="Bob", space=Space("cust1"))
    memory.remember("Alice saw Bob's order 17", subject="Alice", derived_from=[bob.id], space=Space("cust1"))
    memory.restrict("Alice", reason="needed for my legal claim", actor="dpo")
    erase = functools.partial(memory.erase, request_id="D-1", basis="b", requester="r", dry_run=True)
    plan = erase("Bob").plan
    assert plan is not None and (plan.total, plan.erases_restricted) == (2, 1)
    assert plan.to_json()["erases_restricted"] == 1
    alice = erase("Alice").plan  # her own erasure: her restriction does not hold it back
    assert alice is not None and alice.erases_restricted == 0
    account = memory.erase_all(user_id="cust1", request_id="A-1", basis="b", requester="r", dry_run=True).plan
    assert account is not None and account.erases_restricted == 1
    memory.unrestrict("Alice", actor="dpo")
    plan = erase("Bob").plan
    assert plan is not None and plan.erases_restricted == 0


def test_the_cli_dry_run_warns_of_restricted_records(cli: Cli) -> None:
    assert cli("init")[0] == 0
    bob = cli("remember", "Bob's order 17", "--subject", "Bob")[1].strip()
    assert cli("remember", "Alice saw it", "--subject", "Alice", "--derived-from", bob)[0] == 0
    assert cli("restrict", "Alice", "--reason", "legal claim")[0] == 0
    code, out, _ = cli("erase", "Bob", "--request-id", "D-1", "--basis", "b", "--dry-run")
    assert code == 0 and "WARNING: 1 of these record(s) are of restricted subjects (Art. 18)" in out
