"""Storage limitation (Art. 5(1)(e)): policy, expiry, purge with tombstones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deleatur import InvalidInputError, Memory, NotFoundError, Space, from_file
from deleatur.clock import system_clock
from deleatur.crypto.master import default_key_file
from deleatur.erasure.engine import ErasureResult, RequestIdReusedError
from deleatur.erasure.requests import RequestKind
from deleatur.errors import StoreError
from deleatur.log.entries import Entry

from .conftest import Cli, FakeClock, store_files

DAY = 86_400


def test_policy_sets_expiry_by_kind_of_space(memory: Memory, clock: FakeClock) -> None:
    memory.set_retention("run", 30)
    run = memory.remember("scratch", subject="a", space=Space("u", "bot", "run-1"))
    user = memory.remember("profile", subject="a", space=Space("u"))
    explicit = memory.remember("short", subject="a", space=Space("u", "bot", "run-1"), expires_at=clock.now + 10)
    assert run.expires_at == clock.now + 30 * DAY * 1_000_000
    assert user.expires_at is None
    assert explicit.expires_at == clock.now + 10
    assert memory.retention_policy() == {"user": None, "agent": None, "run": 30.0}
    memory.set_retention("run", None)
    assert memory.retention_policy()["run"] is None
    with pytest.raises(InvalidInputError, match="not 'session'"):
        memory.set_retention("session", 1)
    for too_short in (0, 1e-12, 0.5 / 86_400):  # 1e-12 days was kept as 0 µs: every record born expired
        with pytest.raises(InvalidInputError, match="from one second"):
            memory.set_retention("run", too_short)
    memory.set_retention("run", 1 / 86_400)
    assert memory.retention_policy()["run"] == 1 / 86_400


def test_purges_in_the_same_second_are_two_requests(memory: Memory, clock: FakeClock) -> None:
    """A cron job or two callers may purge twice within a second: each run is its own
    request, and the second one erases what expired since the first."""
    first = memory.remember("first expiring", subject="a", expires_at=clock.now + 1)
    clock.advance(0.001)
    one = memory.purge().request
    second = memory.remember("second expiring", subject="b", expires_at=clock.now + 1)
    clock.advance(0.001)
    two = memory.purge().request
    assert one is not None and two is not None
    assert one.id != two.id
    assert (one.record_ids, two.record_ids) == ((first.id,), (second.id,))


def test_a_purge_repeated_under_its_request_id_returns_the_first_result(memory: Memory, clock: FakeClock) -> None:
    """As an erasure does: a client retrying a purge must not get a 'reused id' error."""
    memory.remember("expiring", subject="a", expires_at=clock.now + 1)
    clock.advance(1)
    first = memory.purge(request_id="PURGE-1", older_than_days=30).request
    clock.advance(5)
    again = memory.purge(request_id="PURGE-1", older_than_days=30)
    assert again.repeated and again.request == first
    with pytest.raises(RequestIdReusedError, match="used for a different erasure"):
        memory.purge(request_id="PURGE-1", older_than_days=7)


def test_purge_removes_expired_and_old_records_with_tombstones(
    memory: Memory, clock: FakeClock, store_path: Path
) -> None:
    expiring = memory.remember("qzexpiring note", subject="Alice", expires_at=clock.now + 5_000_000)
    old = memory.remember("old note", subject="Bob")
    clock.advance(10 * DAY)
    recent = memory.remember("recent note", subject="Bob")
    assert memory.recall("qzexpiring") == []  # expired: never recalled, even before the purge
    plan = memory.purge(dry_run=True).plan
    assert plan is not None
    assert [r.id for r in plan.direct] == [expiring.id]
    done = memory.purge(older_than_days=5).request
    assert done is not None
    assert done.kind is RequestKind.RETENTION
    assert sorted(done.record_ids) == sorted([expiring.id, old.id])
    with pytest.raises(NotFoundError):
        memory.get(expiring.id)
    assert memory.get(recent.id).text == "recent note"
    assert not memory.keys.has_key(memory.tenant, memory._subject_ref("alice"))  # all of Alice went
    assert memory.keys.has_key(memory.tenant, memory._subject_ref("bob"))
    tombstones = [Entry.decode(r) for _, r in memory.backend.log_entries() if b'"tombstone"' in r]
    assert {e.fields["basis"] for e in tombstones} == {"Art. 5(1)(e) storage limitation"}
    assert memory.verify_log().ok
    assert memory.certificate(done.id)["certificate"]["erasure"]["records"] == 2
    for path in store_files(store_path):
        assert b"qzexpiring" not in path.read_bytes()


def test_purge_keeps_a_restricted_subjects_records_and_says_so(memory: Memory, clock: FakeClock) -> None:
    """Art. 18(1)(c): past its retention, data the subject needs for a legal claim is
    restricted, not deleted; the purge keeps it (and the restriction) and counts it."""
    kept = memory.remember("Eve's contract", subject="Eve Ray", expires_at=clock.now + 5_000_000)
    gone = memory.remember("Bob's note", subject="Bob", expires_at=clock.now + 5_000_000)
    memory.restrict("Eve Ray", reason="needed for a legal claim", actor="dpo")
    clock.advance(10)
    plan = memory.purge(dry_run=True).plan
    assert plan is not None and ([r.id for r in plan.direct], plan.kept_restricted) == ([gone.id], 1)
    done = memory.purge().request
    assert done is not None
    assert (done.record_ids, done.counts["kept_restricted"]) == ((gone.id,), 1)
    assert memory.get(kept.id).text == "Eve's contract"
    assert [r.reason for r in memory.restrictions()] == ["needed for a legal claim"]
    memory.unrestrict("Eve Ray", actor="dpo")
    assert memory.purge().request.record_ids == (kept.id,)  # type: ignore[union-attr]


def test_retention_cli(cli: Cli, tmp_path: Path) -> None:
    assert cli("init")[0] == 0
    assert cli("retention", "set", "run", "30")[0] == 0
    code, out, _ = cli("retention", "show", "--json")
    assert json.loads(out)["run"] == 30
    code, _, err = cli("remember", "old", "-s", "a", "--expires-at", "2000-01-01T00:00:00Z")
    assert (code, err.strip()) == (2, "error: expires_at 2000-01-01T00:00:00Z is in the past")
    # A record that expires a microsecond after it is written has expired by the purge.
    store = tmp_path / "cli.db"
    now = system_clock()
    with Memory.open(store, from_file(default_key_file(store)), clock=lambda: now) as memory:
        memory.remember("old", subject="a", expires_at=now + 1)
    code, out, _ = cli("purge", "--dry-run", "--json")
    assert json.loads(out)["plan"]["total"] == 1
    code, out, _ = cli("purge", "--dry-run")
    assert "would erase 1 record(s): 1 expired or past retention, 0 reached through lineage" in out
    code, out, _ = cli("purge", "--request-id", "RET-1")
    assert code == 0
    assert "erased 1 record(s)" in out
    assert cli("purge", "--older-than", "-1")[0] == 2


def test_a_purge_that_finds_nothing_due_records_no_request(
    memory: Memory, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run daily, a purge must not fill the list of requests with empty ones: one that finds
    nothing due records none, and says so; its call's audit entry shows that it ran."""
    memory.remember("kept", subject="a")
    for request_id in (None, "RET-NAMED"):
        result = memory.purge(request_id=request_id, older_than_days=30)
        assert (result.request, result.nothing_due) == (None, True)
        shown = result.to_json(clock.now)
        assert (shown["dry_run"], shown["nothing_due"], shown["request"]) == (False, True, None)
        assert ErasureResult.from_json(json.loads(json.dumps(shown))) == result
    assert memory.erasure_requests() == []
    with pytest.raises(NotFoundError):
        memory.erasure_request("RET-NAMED")
    calls = [a.entry.fields for a in memory.audit_entries(calls_only=True) if a.entry.fields["action"] == "purge"]
    assert [c["outcome"] for c in calls] == ["ok", "ok"] and calls[1]["request"] == "RET-NAMED"
    # A purge is no subject's erasure: its plan has no note about one.
    plan = memory.purge(dry_run=True).plan
    assert plan is not None and plan.to_json()["note"] is None

    # A request already recorded, failed, is recorded done when retried, though nothing is left.
    expiring = memory.remember("expiring", subject="b", expires_at=clock.now + 1)
    clock.advance(1)

    def broken(rows: object) -> None:
        raise StoreError("disk full")

    with monkeypatch.context() as patched:
        patched.setattr(memory, "_purge", broken)
        with pytest.raises(StoreError):
            memory.purge(request_id="RET-F")
    assert memory.erasure_request("RET-F").status.value == "failed"
    memory.erase("b", request_id="DSAR-B", basis="Art. 17(1)(a)", requester="dpo")
    retried = memory.purge(request_id="RET-F").request
    assert retried is not None and (retried.status.value, retried.record_ids) == ("complete", ())
    with pytest.raises(NotFoundError):  # it went with the subject's erasure
        memory.get(expiring.id)
