"""Decision snapshots: signed, verifiable, and redacted (re-signed, logged) on erasure."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import apsw
import pytest

from deleatur import (
    Entry,
    EventType,
    IntegrityError,
    InvalidInputError,
    Memory,
    NotFoundError,
    Role,
    Space,
    SpaceFilter,
)
from deleatur.decisions.snapshots import CONTEXT, canonical
from deleatur.rights.restriction import RestrictedSubjectError

from .conftest import Cli, store_files

BASIS = "Art. 17(1)(a)"


def _conn(memory: Memory) -> apsw.Connection:
    conn = memory.backend._conn  # type: ignore[attr-defined]
    assert isinstance(conn, apsw.Connection)
    return conn


def _decided(memory: Memory) -> tuple[str, str, str]:
    alice = memory.remember(
        "Alice Quokkafield may get refunds up to 90 days", subject="Alice", key="refund_window", confidence=0.9
    )
    policy = memory.remember("Refunds need a receipt", subject="shop policy", key="refund_rule")
    decision = memory.record_decision("refund approved for order 17", [alice.id, policy.id])
    return decision.id, alice.id, policy.id


def test_a_snapshot_holds_exactly_the_beliefs_used_and_verifies(memory: Memory) -> None:
    decision_id, alice, policy = _decided(memory)
    shown = memory.explain_decision(decision_id)
    beliefs = shown.body["beliefs"]
    assert [b["record"] for b in beliefs] == [alice, policy]
    assert beliefs[0]["value"] == "Alice Quokkafield may get refunds up to 90 days"
    assert beliefs[0]["confidence"] == 0.9
    assert beliefs[0]["log_index"] == memory.backend.log_indexes_of(alice)[0]
    assert shown.body["summary"] == "refund approved for order 17"
    assert shown.body["actor"] == "local-operator"
    # Anyone with the public key can check the signature over the canonical body.
    row = memory.backend.decision("default", decision_id)
    assert row is not None
    [verifier] = memory.announced_keys()
    assert verifier.verify_bytes(CONTEXT + canonical(shown.body), bytes(row["signature"]))
    # The body's hash is in the log.
    logged = [Entry.decode(r) for _, r in memory.backend.log_entries()]
    [entry] = [e for e in logged if e.type is EventType.DECISION]
    assert entry.fields["hash"] == shown.hash == hashlib.sha256(canonical(shown.body)).hexdigest()


def test_values_are_sealed_at_rest(memory: Memory, store_path: Path) -> None:
    _decided(memory)
    memory.backend.scrub()
    blob = b"".join(p.read_bytes() for p in store_files(store_path))
    assert b"Quokkafield" not in blob
    assert b"order 17" not in blob


def test_a_tampered_snapshot_names_the_failed_check(memory: Memory) -> None:
    decision_id, *_ = _decided(memory)
    conn = _conn(memory)
    [(body,)] = conn.execute("SELECT body FROM decisions WHERE id = ?", (decision_id,)).fetchall()
    stored = json.loads(bytes(body))  # type: ignore[arg-type]
    stored["beliefs"][0]["confidence"] = 1.0
    conn.execute("UPDATE decisions SET body = ? WHERE id = ?", (canonical(stored), decision_id))
    with pytest.raises(IntegrityError, match=r"check 1 \(hash\)"):
        memory.explain_decision(decision_id)
    stored["beliefs"][0]["confidence"] = 0.9
    conn.execute(
        "UPDATE decisions SET body = ?, signature = zeroblob(64) WHERE id = ?", (canonical(stored), decision_id)
    )
    with pytest.raises(IntegrityError, match=r"check 2 \(signature\)") as failed:
        memory.explain_decision(decision_id)
    assert "Quokkafield" not in str(failed.value)


def test_erasure_redacts_resigns_and_logs_the_link(memory: Memory, store_path: Path) -> None:
    decision_id, alice, policy = _decided(memory)
    before = memory.explain_decision(decision_id)
    result = memory.erase("Alice", request_id="E-1", basis=BASIS, requester="dpo")
    assert result.request is not None
    assert result.request.counts["decisions_redacted"] == 1
    after = memory.explain_decision(decision_id)  # still verifies: re-signed
    redacted, kept = after.body["beliefs"]
    assert (redacted["record"], redacted["key"], redacted["value"], redacted["salt"]) == (alice, None, None, None)
    assert redacted["redacted"] is True
    assert (kept["record"], kept["value"], kept["redacted"]) == (policy, "Refunds need a receipt", False)
    assert after.body["redactions"] == [
        {
            "by": "erasure",
            "request": "E-1",
            "records": [alice],
            "time": after.body["redactions"][0]["time"],
            "previous": before.hash,
        }
    ]
    [link] = [Entry.decode(r) for _, r in memory.backend.log_entries() if b'"type":"redact"' in r]
    assert (link.fields["old"], link.fields["new"], link.fields["request"]) == (before.hash, after.hash, "E-1")
    assert memory.verify_log().ok
    memory.backend.scrub()
    blob = b"".join(p.read_bytes() for p in store_files(store_path))
    assert b"Quokkafield" not in blob


def test_account_erasure_leaves_the_decisions_only_pseudonyms_of_its_spaces(memory: Memory, store_path: Path) -> None:
    """A user id can name a person: after an account erasure, the decisions made in its
    spaces keep them only as the request's own pseudonyms, re-signed; others are untouched."""
    space = Space("cust_zebu77", "agt_yak", "run_gnu")
    used = memory.remember("Ivy likes okapis", subject="Ivy", space=space)
    decision = memory.record_decision("approved", [used.id], space=space)
    other = memory.remember("Oz likes owls", subject="Oz", space=Space("cust_other"))
    kept = memory.record_decision("declined", [other.id], space=Space("cust_other"))
    result = memory.erase_all(user_id="cust_zebu77", request_id="ACC-1", basis=BASIS, requester="dpo")
    assert result.request is not None
    assert (result.request.counts["decisions_redacted"], result.request.counts["decisions_pseudonymized"]) == (1, 1)
    with pytest.raises(NotFoundError):
        memory.explain_decision(decision.id, space=space)
    row = memory.backend.decision(memory.tenant, decision.id)
    assert row is not None
    moved = Space(row["user_id"], row["agent_id"], row["run_id"])
    assert moved.user_id == result.request.scope.user_id  # the request's pseudonym, and only it
    assert moved.agent_id.startswith("psn:") and moved.run_id.startswith("psn:")
    after = memory.explain_decision(decision.id, space=moved)  # verifies: re-signed
    assert after.body["space"] == {"user_id": moved.user_id, "agent_id": moved.agent_id, "run_id": moved.run_id}
    assert [r["by"] for r in after.body["redactions"]] == ["erasure", "account erasure"]
    assert memory.explain_decision(kept.id, space=Space("cust_other")).body["redactions"] == []
    assert memory.verify_log().ok
    blob = b"".join(p.read_bytes() for p in store_files(store_path))
    for name in (b"cust_zebu77", b"agt_yak", b"run_gnu", b"okapis"):
        assert name not in blob, name


def test_after_an_account_erasure_no_hash_confirms_a_guess_of_its_ids(memory: Memory, store_path: Path) -> None:
    """The redaction keeps the hash of the body it replaced, and the log the first body's
    hash: with the space's ids put back in the body anyone may read, they would confirm a
    guessed user id. The space's salt, blanked with the ids, prevents that."""
    space = Space("cust_5521", "support")
    used = memory.remember("Ivy likes okapis", subject="Ivy", space=space)
    decision = memory.record_decision("approved", [used.id], space=space)
    salt = decision.body["space_salt"]
    assert isinstance(salt, str) and len(salt) == 32
    result = memory.erase_all(user_id="cust_5521", request_id="ACC-1", basis=BASIS, requester="dpo")
    assert result.request is not None
    row = memory.backend.decision(memory.tenant, decision.id)
    assert row is not None
    after = memory.explain_decision(decision.id, space=Space(row["user_id"], row["agent_id"], row["run_id"]))
    *_, redaction = after.body["redactions"]
    assert after.body["space_salt"] is None and redaction["by"] == "account erasure"

    def guess(user_id: str, agent_id: str, space_salt: str | None) -> str:
        body = {**after.body, "redactions": after.body["redactions"][:-1], "space_salt": space_salt}
        body["space"] = {"user_id": user_id, "agent_id": agent_id, "run_id": ""}
        return hashlib.sha256(canonical(body)).hexdigest()

    assert guess("cust_5521", "support", salt) == redaction["previous"]  # the guess is made right
    assert guess("cust_5521", "support", None) != redaction["previous"]  # but nobody has the salt
    memory.backend.scrub()
    blob = b"".join(p.read_bytes() for p in store_files(store_path))
    assert salt.encode() not in blob and b"cust_5521" not in blob


def test_erasing_a_subject_no_decision_used_redacts_nothing(memory: Memory) -> None:
    decision_id, *_ = _decided(memory)
    memory.remember("unrelated", subject="Bob")
    result = memory.erase("Bob", request_id="E-2", basis=BASIS, requester="dpo")
    assert result.request is not None and result.request.counts["decisions_redacted"] == 0
    assert memory.explain_decision(decision_id).body["redactions"] == []


def test_bad_decisions_are_refused_and_write_nothing(memory: Memory) -> None:
    record = memory.remember("x", subject="a", space=Space("u1"))
    size = memory.backend.log_size()
    for summary, used, problem in (
        ("", [record.id], "summary"),
        ("ok", [], "1 to"),
        ("ok", ["not-an-id"], "not a record id"),
        ("ok", ["01a22a03-19d9-75ea-b6f8-0a895b612b14"], "no record"),
        ("ok", [record.id], "no record"),  # in another space
    ):
        with pytest.raises(InvalidInputError, match=problem):
            memory.record_decision(summary, used)
    assert memory.backend.log_size() == size + 5  # the five failed calls, audited; nothing else
    with pytest.raises(NotFoundError):
        memory.explain_decision("nope")
    memory.restrict("a", reason="dispute", actor="dpo")
    with pytest.raises(RestrictedSubjectError):
        memory.record_decision("ok", [record.id], space=Space("u1"))
    assert memory.record_decision("for the claim", [record.id], space=Space("u1"), for_legal_claim=True)


def test_decision_cli(cli: Cli) -> None:
    assert cli("init")[0] == 0
    code, out, _ = cli("remember", "Alice may get refunds", "-s", "Alice", "--json")
    record = json.loads(out)["id"]
    code, out, _ = cli("decision", "record", "refund ok", "--used", record, "--json")
    assert code == 0
    made = json.loads(out)
    decision_id = made["decision"]["id"]
    code, out, _ = cli("decision", "explain", decision_id)
    assert code == 0 and "signature verified" in out and "Alice may get refunds" in out
    assert cli("erase", "Alice", "--request-id", "E-1", "--basis", BASIS)[0] == 0
    code, out, _ = cli("decision", "explain", decision_id, "--json")
    shown = json.loads(out)
    assert shown["decision"]["beliefs"][0]["redacted"] is True
    code, out, _ = cli("decision", "explain", decision_id)
    assert "redacted by erasure E-1: 1 belief(s)" in out
    code, out, _ = cli("remember", "Bob pays by card", "-s", "Bob", "-k", "bob::pay", "--json")
    code, out, _ = cli("decision", "record", "card ok", "--used", json.loads(out)["id"], "--json")
    second = json.loads(out)["decision"]["id"]
    code, out, _ = cli(
        "rectify", "Bob pays cash", "--key", "bob::pay", "--reason", "wrong", "--erase-previous", "--json"
    )
    fixed = json.loads(out)["id"]
    code, out, _ = cli("decision", "explain", second)
    assert f"redacted by rectification {fixed}: 1 belief(s)" in out
    code, _, err = cli("decision", "record", "x", "--used", "bad")
    assert code == 2 and "not a record id" in err


def test_the_hash_of_a_redacted_body_confirms_no_guess(memory: Memory) -> None:
    """The pre-redaction hash is public (in the log and in the redaction): with the
    erased value's salt gone, trying candidate values against it cannot succeed."""
    decision_id, alice, _ = _decided(memory)
    before = memory.explain_decision(decision_id)
    assert len(before.body["beliefs"][0]["salt"]) == 32
    memory.erase("Alice", request_id="E-1", basis=BASIS, requester="dpo")
    after = memory.explain_decision(decision_id).body
    guess = json.loads(json.dumps(after))
    guess.pop("redactions")
    guess["redactions"] = []
    guess["beliefs"][0].update(
        key="refund_window", value="Alice Quokkafield may get refunds up to 90 days", redacted=False
    )
    assert hashlib.sha256(canonical(guess)).hexdigest() != after["redactions"][0]["previous"]  # the right guess fails
    assert guess["beliefs"][0]["salt"] is None and alice


def test_rectify_erase_previous_redacts_the_snapshots_that_used_the_old_value(memory: Memory, store_path: Path) -> None:
    old = memory.remember("Alice's diagnosis: qzwrongvalue", subject="Alice", key="alice::diagnosis")
    decision = memory.record_decision("triage", [old.id])
    new = memory.rectify(
        "alice::diagnosis", "Alice's diagnosis: corrected", reason="lab error", actor="dr", erase_previous=True
    )
    shown = memory.explain_decision(decision.id).body
    assert shown["beliefs"][0]["redacted"] is True and shown["beliefs"][0]["value"] is None
    assert shown["redactions"][0]["by"] == "rectification" and shown["redactions"][0]["request"] == new.id
    memory.erase("Alice", request_id="E-1", basis=BASIS, requester="dpo")
    assert memory.explain_decision(decision.id).body["beliefs"][0]["redacted"] is True  # still verifies
    memory.backend.scrub()
    blob = b"".join(p.read_bytes() for p in store_files(store_path))
    assert b"qzwrongvalue" not in blob


def test_a_row_swapped_for_another_decision_or_moved_is_caught(memory: Memory) -> None:
    first, alice, policy = _decided(memory)
    second = memory.record_decision("loan declined", [policy]).id
    conn = _conn(memory)
    [row] = conn.execute("SELECT body, signature, hash FROM decisions WHERE id = ?", (second,)).fetchall()
    conn.execute("UPDATE decisions SET body = ?, signature = ?, hash = ? WHERE id = ?", (*row, first))
    with pytest.raises(IntegrityError, match=r"check 3 \(identity\)"):
        memory.explain_decision(first)
    conn.execute("UPDATE decisions SET user_id = 'mallory' WHERE id = ?", (second,))
    with pytest.raises(IntegrityError, match=r"check 3 \(identity\)"):
        memory.explain_decision(second, space=Space("mallory"))
    assert alice


def test_a_scoped_key_sees_no_redaction_by_an_erasure_beyond_its_scopes(memory: Memory) -> None:
    """Its audit trail leaves such a redaction's entry out, and its status read of the
    request is refused: the decision it reads must not show the request id (which may
    name a person) either. A redaction by an erasure within its scopes it sees."""
    u1 = Space("u1")
    jules = memory.remember("Jules prefers tea", subject="Jules Roy", space=u1)
    ann = memory.remember("Ann prefers coffee", subject="Ann", space=u1)
    decision = memory.record_decision("served drinks", [jules.id, ann.id], space=u1)
    memory.erase("Jules Roy", request_id="DSAR-JULES-ROY", basis=BASIS, requester="dpo")  # the whole tenant
    memory.erase("Ann", request_id="U1-ANN", basis=BASIS, requester="dpo", scope=SpaceFilter("u1"))
    full = memory.explain_decision(decision.id, space=u1)
    assert [r["request"] for r in full.body["redactions"]] == ["DSAR-JULES-ROY", "U1-ANN"]
    viewer, _ = memory.create_principal("u1 viewer", Role.VIEWER, scopes=["u1"])
    seen = memory.as_principal(viewer).explain_decision(decision.id, space=u1)
    assert [r["request"] for r in seen.body["redactions"]] == ["U1-ANN"]
    assert "DSAR-JULES-ROY" not in json.dumps(seen.to_json())
    assert [b["redacted"] for b in seen.body["beliefs"]] == [True, True]  # the beliefs still show as erased
    assert seen.hash == full.hash  # the one logged: the shown body no longer hashes to it
