"""The audit trail: what it shows whom, and that every way of tampering with it is
caught by `audit verify` — including cutting the newest entry together with the
latest checkpoint, which a peer's hash chain accepts."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from deleatur import (
    AccessDeniedError,
    DeleaturError,
    Entry,
    EventType,
    InvalidInputError,
    Memory,
    Role,
    Space,
    SpaceFilter,
)
from deleatur.log.merkle import leaf_hash

from .conftest import Cli, FakeClock, store_files, truncate_log

BASIS = "Art. 17(1)(a)"


def _conn(memory: Memory) -> apsw.Connection:
    conn = memory.backend._conn  # type: ignore[attr-defined]
    assert isinstance(conn, apsw.Connection)
    return conn


def _busy_trail(memory: Memory) -> None:
    """A trail of calls by several principals, a denial among them."""
    memory.remember("Alice likes tea", subject="Alice Quartz", space=Space("u1"))
    viewer, _ = memory.create_principal("reader", Role.VIEWER, scopes=["u1"])
    view = memory.as_principal(viewer)
    view.recall("tea", space=Space("u1"))
    with pytest.raises(AccessDeniedError):
        view.recall("tea", space=Space("u2"))
    memory.export_json(io.StringIO(), subject="Alice Quartz")
    memory.recall("tea", space=Space("u1"))  # a read: one call entry, signed on its own


def _calls(memory: Memory) -> list[int]:
    return [i for i, raw in memory.backend.log_entries() if Entry.decode(raw).type is EventType.CALL]


def _edit_outcome(memory: Memory) -> None:
    index, raw = next((i, r) for i, r in memory.backend.log_entries() if b'"outcome":"denied"' in r)
    _conn(memory).execute("UPDATE log_entries SET entry = ? WHERE idx = ?", (raw.replace(b'"denied"', b'"ok"'), index))


def _delete_middle(memory: Memory) -> None:
    _conn(memory).execute("DELETE FROM log_entries WHERE idx = ?", (_calls(memory)[2],))


def _cut_tail_keep_checkpoint(memory: Memory) -> None:
    _conn(memory).execute("DELETE FROM log_entries WHERE idx = (SELECT max(idx) FROM log_entries)")


def _reorder(memory: Memory) -> None:
    a, b = _calls(memory)[1:3]
    rows = dict(memory.backend.log_entries())
    conn = _conn(memory)
    conn.execute("UPDATE log_entries SET entry = ? WHERE idx = ?", (rows[b], a))
    conn.execute("UPDATE log_entries SET entry = ? WHERE idx = ?", (rows[a], b))


def _cut_newest_with_its_checkpoint(memory: Memory) -> None:
    truncate_log(memory, memory.backend.log_size() - 1)


TAMPERING: dict[str, tuple[Callable[[Memory], None], str]] = {
    "an edited entry": (_edit_outcome, "roots"),
    "a deleted entry": (_delete_middle, "entries"),
    "a truncated tail": (_cut_tail_keep_checkpoint, "coverage"),
    "reordered entries": (_reorder, "roots"),
    "the newest entry deleted with the latest checkpoint": (_cut_newest_with_its_checkpoint, "pinned"),
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_every_tampering_is_caught(memory: Memory, tmp_path: Path, case: str) -> None:
    tamper, check = TAMPERING[case]
    _busy_trail(memory)
    state = tmp_path / "auditor.state"
    assert memory.verify_audit(state=state).ok  # the auditor's visit records the head
    assert state.exists()
    tamper(memory)
    report = memory.verify_audit(state=state)
    assert not report.ok
    assert check in [c.name for c in report.failed]
    # A failed verification leaves the auditor's memory as it was.
    assert memory.verify_audit(state=state).ok is False


def test_the_cut_tail_passes_only_for_a_reader_without_memory(memory: Memory) -> None:
    _busy_trail(memory)
    _cut_newest_with_its_checkpoint(memory)
    alone = memory.verify_audit()
    assert alone.ok
    assert any("NOT ANCHORED" in note for note in alone.notes)


def test_a_clean_trail_verifies_again_and_again(memory: Memory, tmp_path: Path) -> None:
    state = tmp_path / "auditor.state"
    for _ in range(3):
        _busy_trail(memory)
        assert memory.verify_audit(state=state).ok
    state.write_text("not a checkpoint")
    with pytest.raises(Exception, match="not an auditor state file"):
        memory.verify_audit(state=state)


def test_show_names_subjects_only_to_readers_and_only_until_erasure(memory: Memory) -> None:
    _busy_trail(memory)
    exported = [a for a in memory.audit_entries(calls_only=True) if a.entry.fields["action"] == "export"]
    assert [a.subject for a in exported] == ["alice quartz"]
    auditor, _ = memory.create_principal("auditor", Role.AUDITOR)
    as_auditor = list(memory.as_principal(auditor).audit_entries(calls_only=True))
    assert all(a.subject is None for a in as_auditor)
    assert any(a.entry.fields.get("subject", "").startswith("psn:") for a in as_auditor)
    memory.erase("Alice Quartz", request_id="E-1", basis=BASIS, requester="dpo")
    after = [a for a in memory.audit_entries(calls_only=True) if a.entry.fields.get("subject")]
    assert after and all(a.subject is None for a in after)  # the sealed names died with the key
    shown = json.dumps([a.to_json() for a in memory.audit_entries()]).lower()
    assert "quartz" not in shown


def test_show_is_limited_to_the_callers_tenant(memory: Memory) -> None:
    memory.remember("x", subject="a")
    outsider, _ = memory.create_principal("acme auditor", Role.AUDITOR, tenant="acme")
    seen = list(memory.as_principal(outsider).audit_entries())
    assert {a.entry.fields.get("tenant") for a in seen} <= {"acme", None}
    # It sees the creation of the store's signing key, and its own call.
    assert [a.entry.fields.get("action", a.entry.type.value) for a in seen] == ["key", "audit.show"]
    assert seen[-1].entry.fields["actor"] == outsider.id


def alice_across_users(memory: Memory) -> None:
    """The review's case: Alice's Art. 15 export, her restriction, and erasure DSAR-9 of
    her 3 records in u1, while a record of hers in u3 keeps her key alive."""
    for text in ("diagnosis A", "diagnosis B", "address"):
        memory.remember(text, subject="Alice Martin", space=Space("u1"))
    memory.remember("ticket", subject="Alice Martin", space=Space("u3"))
    memory.export_json(io.StringIO(), subject="Alice Martin")
    memory.restrict("Alice Martin", reason="contests accuracy", actor="dpo")
    memory.erase("Alice Martin", request_id="DSAR-9", basis=BASIS, requester="dpo", scope=SpaceFilter("u1"))


def test_a_scoped_key_cannot_link_a_guessed_name_to_other_users_requests(memory: Memory) -> None:
    alice_across_users(memory)
    member, _ = memory.create_principal("member u2", Role.MEMBER, scopes=["u2"])
    mine = memory.as_principal(member)
    # It names the guessed person in a call of its own, in its own user, and reads the trail.
    mine.erase("alice martin", request_id="G-1", basis=BASIS, requester="me", scope=SpaceFilter("u2"), dry_run=True)
    seen = list(mine.audit_entries())
    # The signing key, its own creation (scoped to u2) and its own dry run: nothing of u1's or u3's.
    assert [(a.entry.type, a.entry.fields.get("action")) for a in seen] == [
        (EventType.KEY, None),
        (EventType.CALL, "principal.create"),
        (EventType.CALL, "erase"),
    ]
    guess = seen[-1]
    assert guess.entry.fields["users"] == [memory._user_token("u2")]
    assert guess.entry.fields["subject"].startswith("spsn:") and "sealed" not in guess.entry.fields
    assert guess.subject is None and "psn:" not in json.dumps([a.to_json() for a in seen]).replace("spsn:", "")
    # An unscoped reader still sees every entry, the same pseudonym in each entry about
    # her (the erasure in u1 and her dry run alike) and her name.
    everything = list(memory.audit_entries())
    assert [a.index for a in everything] == list(range(memory.backend.log_size()))
    [dry_run] = [a for a in everything if a.entry.fields.get("request") == "G-1"]
    [hers] = {a.entry.fields["subject"] for a in everything if a.subject == "alice martin"}
    assert hers == dry_run.entry.fields["subject"] and hers.startswith("psn:")
    assert {EventType.ERASURE, EventType.RESTRICT, EventType.EXPORT} <= {a.entry.type for a in everything}


def test_a_scoped_reader_sees_its_own_users_entries_page_by_page(memory: Memory) -> None:
    u2 = SpaceFilter("u2")
    memory.remember("Bob in u1", subject="Bob", space=Space("u1"))
    kept = memory.remember("Bob likes jazz", subject="Bob", space=Space("u2"))
    also = memory.remember("Bob plays bass", subject="Bob", space=Space("u2"))
    gone = memory.remember("Carol's address", subject="Carol", space=Space("u2"))
    memory.record_decision("a jazz night for Bob", [kept.id], space=Space("u2"))
    for subject, request_id, dry_run in (("Bob", "B-0", True), ("Carol", "C-0", True), ("Carol", "U2-1", False)):
        memory.erase(subject, request_id=request_id, basis=BASIS, requester="dpo", scope=u2, dry_run=dry_run)
    auditor, key = memory.create_principal("auditor u2", Role.AUDITOR, scopes=["u2"])
    wider, _ = memory.create_principal("auditor u2 u3", Role.AUDITOR, scopes=["u2", "u3"])
    view = memory.as_principal(auditor)
    seen = list(view.audit_entries())
    calls = [a for a in seen if a.entry.type is EventType.CALL]
    assert {tuple(a.entry.fields["users"]) for a in calls} == {(memory._user_token("u2"),)}
    # Not the wider key's creation: it names u3 too.
    actions = ["remember"] * 3 + ["decision.record"] + ["erase"] * 3 + ["principal.create"]
    assert [a.entry.fields["action"] for a in calls] == actions
    # Its records' entries while they are held, and its erasure's: Carol's write went with her record.
    data = {(a.entry.type, a.entry.record or a.entry.fields.get("request")) for a in seen if a not in calls}
    assert data - {(EventType.KEY, None), (EventType.DECISION, None)} == {
        (EventType.WRITE, kept.id),
        (EventType.WRITE, also.id),
        (EventType.TOMBSTONE, gone.id),
        (EventType.ERASURE, "U2-1"),
    }
    assert {EventType.KEY, EventType.DECISION} <= {a.entry.type for a in seen}
    # The entries about one subject link to each other, under this key's scopes only.
    bob, carol, erased = (a.entry.fields["subject"] for a in calls[4:7])
    assert carol == erased != bob and bob.startswith("spsn:")
    assert not any("sealed" in a.entry.fields for a in calls)
    as_wider = {a.index: a for a in memory.as_principal(wider).audit_entries()}
    assert as_wider[calls[4].index].entry.fields["subject"] not in (bob, None)
    # Paging by start and limit gives the same entries, however many are skipped between.
    paged: list[int] = []
    while page := list(view.audit_entries(start=paged[-1] + 1 if paged else 0, limit=2)):
        paged += [a.index for a in page]
    assert paged == [a.index for a in seen]
    # Its verification still reads every entry.
    assert view.verify_audit().ok
    # With u2's account erased and the key rescoped to the erased user, it sees the
    # same calls with the same pseudonyms, and that erasure.
    memory.erase_all(user_id="u2", request_id="U2-ALL", basis=BASIS, requester="dpo")
    rescoped = memory.as_principal(memory.authenticate(key))
    assert rescoped.principal.scopes != auditor.scopes
    after = {a.index: a for a in rescoped.audit_entries()}
    assert all(after[a.index].entry.fields.get("subject") == a.entry.fields.get("subject") for a in calls)
    assert any(a.entry.type is EventType.ERASURE and a.entry.fields["request"] == "U2-ALL" for a in after.values())


def test_an_explicit_tenant_that_is_not_the_api_keys_is_refused(cli: Cli) -> None:
    """Isolation holds either way; but an operator who names a tenant must not act on
    another one believing it was the one named, the default included."""
    assert cli("init")[0] == 0
    code, out, _ = cli("principals", "create", "acme admin", "--role", "admin", "--in-tenant", "acme", "--json")
    key = json.loads(out)["api_key"]
    for named in ("default", "other"):
        code, _, err = cli("--tenant", named, "--api-key", key, "remember", "x", "-s", "a")
        assert code == 2 and f"belongs to tenant 'acme', not '{named}'" in err
    assert cli("--api-key", key, "remember", "in acme", "-s", "a")[0] == 0
    assert cli("--tenant", "acme", "--api-key", key, "recall", "acme")[0] == 0
    code, out, _ = cli("--tenant", "acme", "list", "--json")
    assert [r["text"] for r in json.loads(out)] == ["in acme"]


def test_audit_cli(cli: Cli, tmp_path: Path) -> None:
    assert cli("init")[0] == 0
    assert cli("remember", "Alice likes tea", "-s", "Alice", "-u", "u1")[0] == 0
    code, out, _ = cli("principals", "create", "bot", "--role", "agent", "--scope", "u1", "--json")
    assert code == 0
    made = json.loads(out)
    assert made["role"] == "agent" and made["scopes"] == ["u1"]
    code, out, _ = cli("--api-key", made["api_key"], "whoami", "--json")
    assert json.loads(out)["id"] == made["id"]
    code, out, _ = cli("--api-key", made["api_key"], "recall", "tea", "-u", "u1", "--json")
    assert code == 0 and json.loads(out)[0]["text"] == "Alice likes tea"
    code, _, err = cli("--api-key", made["api_key"], "recall", "tea", "-u", "u2")
    assert code == 3
    assert "outside this key's scopes" in err
    code, _, err = cli("--api-key", made["api_key"], "principals", "list")
    assert code == 3 and "admin capability" in err
    code, _, err = cli("--api-key", "dlt_nope", "whoami")
    assert code == 3 and "the API key is not valid" in err  # told no more than that; the audit says why
    code, out, _ = cli("audit", "show", "--calls", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["action"], r["outcome"]) for r in rows[-5:]] == [
        ("recall", "ok"),
        ("recall", "denied"),
        ("principal.list", "denied"),
        ("authenticate", "denied"),  # the malformed key
        ("audit.show", "ok"),  # showing the trail is a call like any other
    ]
    state = tmp_path / "auditor.state"
    code, out, _ = cli("audit", "verify")
    # The note names the option that anchors this command, which it takes.
    assert code == 0 and "(`deleatur audit verify --state FILE, which keeps the checkpoint of each passing" in out
    assert "(`deleatur audit verify --expected-pubkey`)" in out and "--expected-checkpoint" not in out
    code, out, _ = cli("audit", "verify", "--state", str(state))
    assert code == 0 and "VERDICT: PASS" in out
    code, out, _ = cli("audit", "verify", "--state", str(state))
    assert code == 0 and "NOT ANCHORED" not in out
    code, out, _ = cli("principals", "list", "--json")
    assert [p["name"] for p in json.loads(out)] == ["bot"]
    assert cli("principals", "revoke", made["id"])[0] == 0
    assert cli("--api-key", made["api_key"], "whoami")[0] == 3
    assert cli("principals", "revoke", made["id"])[0] == 2


def _reader_calls(memory: Memory, clock: FakeClock, days: float, n: int) -> None:
    viewer, _ = memory.create_principal(f"reader {days}", Role.VIEWER)
    view = memory.as_principal(viewer)
    for _ in range(n):
        view.recall("tea", space=Space("u1"))
    clock.advance(days * 86_400)


def test_audit_retention_prunes_old_calls_and_still_verifies(memory: Memory, clock: FakeClock, tmp_path: Path) -> None:
    memory.remember("Alice likes tea", subject="Alice Quartz", space=Space("u1"))
    _reader_calls(memory, clock, 40, 3)
    state = tmp_path / "auditor.state"
    assert memory.verify_audit(state=state).ok
    old_calls = {i for i, raw in memory.backend.log_entries() if b'"type":"call"' in raw}
    _reader_calls(memory, clock, 0, 2)
    pruned = memory.prune_audit(older_than_days=30)
    assert pruned == len(old_calls)
    for index, raw in memory.backend.log_entries():
        assert (index in old_calls) == raw.startswith(b"\x00"), index
    report = memory.verify_audit(state=state)  # consistent with what the auditor saw before
    assert report.ok, report.lines()
    assert "1 retention anchor" in next(c.detail for c in report.checks if c.name == "retention")
    assert all(a.index not in old_calls for a in memory.audit_entries())
    assert memory.prune_audit(older_than_days=30) == 0  # nothing older is left
    # The pruned bytes are gone from every file the store wrote.
    memory.backend.scrub()
    blob = b"".join(p.read_bytes() for p in store_files(memory.backend.files()[0]))
    assert blob.count(b'"action":"recall"') == 2  # only the two recent recalls are left anywhere


def test_pruning_without_an_anchor_or_against_it_is_caught(memory: Memory, clock: FakeClock) -> None:
    memory.remember("x", subject="a")
    _reader_calls(memory, clock, 40, 3)
    _reader_calls(memory, clock, 0, 1)
    memory.prune_audit(older_than_days=30)
    conn = _conn(memory)
    # Prune one more call entry, silently: no anchor accounts for it.
    index, raw = next((i, r) for i, r in memory.backend.log_entries() if b'"type":"call"' in r)
    conn.execute("UPDATE log_entries SET entry = ? WHERE idx = ?", (b"\x00" + leaf_hash(raw), index))
    report = memory.verify_audit()
    assert [c.name for c in report.failed] == ["retention"]
    conn.execute("UPDATE log_entries SET entry = ? WHERE idx = ?", (raw, index))
    assert memory.verify_audit().ok
    # A pruned marker that does not hold the entry's leaf hash breaks the tree.
    pruned_index = next(i for i, r in memory.backend.log_entries() if r.startswith(b"\x00"))
    conn.execute("UPDATE log_entries SET entry = ? WHERE idx = ?", (b"\x00" + bytes(32), pruned_index))
    assert "roots" in [c.name for c in memory.verify_audit().failed]


def test_only_the_operator_prunes_the_audit_trail(memory: Memory) -> None:
    admin, _ = memory.create_principal("tenant admin", Role.ADMIN)
    size = memory.backend.log_size()
    with pytest.raises(AccessDeniedError, match="operator") as denied:
        memory.as_principal(admin).prune_audit(older_than_days=0)
    assert denied.value.missing == "operator"
    entries = [Entry.decode(raw) for _, raw in memory.backend.log_entries(size)]
    assert [(e.fields["action"], e.fields["outcome"]) for e in entries] == [("purge.audit", "denied")]
    with pytest.raises(InvalidInputError):
        memory.prune_audit(older_than_days=-1)


def test_purge_include_audit_cli(cli: Cli) -> None:
    assert cli("init")[0] == 0
    assert cli("remember", "x", "-s", "a")[0] == 0
    code, _, err = cli("purge", "--include-audit")
    assert code == 2 and "--older-than" in err
    for bad in (["--request-id", "bad id!"], ["--issue-token"], ["--confirm", "some-token"]):
        code, _, err = cli("purge", "--older-than", "0", "--include-audit", *bad)
        assert code == 2, bad
    code, out, _ = cli("audit", "show", "--json")
    assert code == 0 and "retention" not in {json.loads(line)["type"] for line in out.splitlines()}  # nothing pruned
    code, out, _ = cli("purge", "--older-than", "0", "--include-audit", "--json")
    assert code == 0, out
    assert json.loads(out)["audit_entries_pruned"] >= 2
    code, out, _ = cli("audit", "verify")
    assert code == 0 and "retention anchor" in out
    code, out, _ = cli("principals", "create", "adm", "--role", "admin", "--json")
    key = json.loads(out)["api_key"]
    code, _, err = cli("--api-key", key, "purge", "--older-than", "0", "--include-audit")
    assert code == 3 and "operator" in err


def test_an_agent_purges_through_the_cli_with_its_dry_runs_token(cli: Cli) -> None:
    assert cli("init")[0] == 0
    code, out, _ = cli("principals", "create", "bot", "--role", "agent", "--json")
    key = json.loads(out)["api_key"]
    code, _, err = cli("--api-key", key, "purge")
    assert code != 0 and "token" in err
    for due in (False, True):
        if due:
            assert cli("remember", "old note", "-s", "a")[0] == 0
        code, out, _ = cli("--api-key", key, "purge", "--older-than", "0", "--dry-run", "--issue-token", "--json")
        assert code == 0, out
        token = json.loads(out)["token"]
        code, out, err = cli("--api-key", key, "purge", "--older-than", "0", "--confirm", token, "--json")
        assert code == 0, err
        done = json.loads(out)
        assert done["request"]["status"] == "complete" if due else done["nothing_due"]


def test_streaming_calls_refuse_bad_arguments_when_made_and_audit_the_failure(memory: Memory) -> None:
    with pytest.raises(InvalidInputError):
        memory.list(subject="   ")
    with pytest.raises(InvalidInputError):
        memory.audit_entries(start=-5)
    calls = [Entry.decode(raw).fields for _, raw in memory.backend.log_entries() if b'"type":"call"' in raw]
    assert [(c["action"], c["outcome"]) for c in calls[-2:]] == [("list", "failed"), ("audit.show", "failed")]


def test_a_dry_run_is_told_from_the_erasure_it_plans_in_the_trail(memory: Memory) -> None:
    """Both are `erase` calls naming the subject and the request id: only the dry run's
    entry says it changed nothing."""
    memory.remember("Dora's phone", subject="Dora")
    memory.erase("Dora", request_id="D-1", basis=BASIS, requester="dpo", dry_run=True, issue_token=True)
    memory.erase("Dora", request_id="D-1", basis=BASIS, requester="dpo")
    memory.purge(older_than_days=0, dry_run=True)
    erases = [a.entry.fields for a in memory.audit_entries(calls_only=True) if a.entry.fields["action"] == "erase"]
    assert [(f["request"], f.get("dry_run")) for f in erases] == [("D-1", True), ("D-1", None)]
    assert erases[0]["subject"] == erases[1]["subject"]
    (purged,) = [a.entry.fields for a in memory.audit_entries(calls_only=True) if a.entry.fields["action"] == "purge"]
    assert purged["dry_run"] is True
    # Refused ones too: beyond a scoped key's scopes, without a basis, given a token.
    scoped, _ = memory.create_principal("u1 member", Role.MEMBER, scopes=["u1"])
    view = memory.as_principal(scoped)
    refusals: list[Callable[[], object]] = [
        lambda: view.erase("Dora", request_id="D-2", basis=BASIS, requester="dpo", dry_run=True),
        lambda: memory.erase("Dora", request_id="D-3", basis="", requester="dpo", dry_run=True),
        lambda: memory.erase("Dora", request_id="D-4", basis=BASIS, requester="dpo", dry_run=True, confirmation="t"),
    ]
    for refused in refusals:
        with pytest.raises(DeleaturError):
            refused()
    refused_ids = ("D-2", "D-3", "D-4")
    later = [a.entry.fields for a in memory.audit_entries(calls_only=True) if a.entry.fields["request"] in refused_ids]
    assert [(f["request"], f["outcome"], f.get("dry_run")) for f in later] == [
        ("D-2", "denied", True),
        ("D-3", "failed", True),
        ("D-4", "failed", True),
    ]
