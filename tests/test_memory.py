"""The operations of the library, run against every backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deleatur import InvalidInputError, Memory, NewMemory, NotFoundError, Role, Space, Status, StoreError, from_bytes

from .conftest import MASTER, FakeClock


def test_remember_then_get_round_trips_every_field(memory: Memory) -> None:
    parent = memory.remember("Alice said she moved", subject="Alice")
    record = memory.remember(
        "Alice lives in Lyon",
        subject="  ALICE ",
        key="Alice::City",
        metadata={"channel": "chat", "n": [1, 2]},
        source="crm/alice",
        confidence=0.8,
        derived_from=[parent.id],
        expires_at=memory._clock() + 10**9,
    )
    got = memory.get(record.id)
    assert got == record
    assert got.subject == "alice" and got.subject_original == "  ALICE "
    assert got.key == "alice::city"
    assert got.derived_from == (parent.id,)
    assert got.status is Status.ACTIVE
    assert len(got.nonce) == 16 and got.nonce != parent.nonce


def test_new_value_for_a_key_supersedes_the_old(memory: Memory, clock: FakeClock) -> None:
    first = memory.remember("phone +100", subject="Alice", key="alice::phone")
    clock.advance(1)
    second = memory.remember("phone +200", subject="Alice", key="alice::phone")
    assert second.supersedes == first.id
    assert memory.get(first.id).status is Status.SUPERSEDED
    assert [h.record.id for h in memory.recall("phone")] == [second.id]
    assert [r.text for r in memory.history("alice::phone")] == ["phone +100", "phone +200"]


def test_recall_ranks_by_bm25_and_honours_limit(memory: Memory) -> None:
    memory.remember_many(
        [
            NewMemory("the weather in Lyon is mild", subject="w"),
            NewMemory("Lyon Lyon Lyon is where Alice lives, Lyon", subject="alice"),
            NewMemory("nothing to see here", subject="x"),
        ]
    )
    hits = memory.recall("Lyon")
    assert [h.record.subject for h in hits] == ["alice", "w"]
    assert hits[0].score > hits[1].score
    assert len(memory.recall("Lyon", limit=1)) == 1
    with pytest.raises(InvalidInputError, match=r"^limit must be an int$"):  # the type, not the range, is wrong
        memory.recall("Lyon", limit="5")  # type: ignore[arg-type]
    # Punctuation and FTS syntax in a query are words, not operators.
    assert len(memory.recall('Lyon" OR scope:*')) == 2


def test_recall_json_is_recalls_hits_as_json_and_audited_alike(memory: Memory, clock: FakeClock) -> None:
    """What a server answers with, made without the records: every field as Hit.to_json
    spells it (an update's time, a rectification's reason and actor, metadata, lineage,
    expiry), and the same audit entry as recall's."""
    first = memory.remember("Lyon is home", subject="Alice", key="alice::city", source="chat", confidence=0.5)
    clock.advance(1)
    memory.remember("Lyon weather", subject="w", metadata={"n": [1, {"x": None}]}, derived_from=[first.id])
    memory.remember("Lyon, briefly", subject="b", expires_at=clock.now + 10**9, space=Space("u1", "bot", "r"))
    clock.advance(1)
    memory.rectify("alice::city", "Lyon, since May", reason="user said so", actor="support")
    for space in (Space(), Space("u1", "bot", "r")):
        made = memory.recall_json("Lyon", space=space, limit=5)
        assert made == [h.to_json() for h in memory.recall("Lyon", space=space, limit=5)] and made
    assert {h["reason"] for h in memory.recall_json("Lyon")} == {None, "user said so"}
    *calls, shown = [e.entry.fields for e in memory.audit_entries(calls_only=True)][-6:]
    assert [f["action"] for f in calls] == ["recall"] * 5 and shown["action"] == "audit.show"
    for json_call, call in (calls[0:2], calls[2:4]):  # recall_json's, then recall's, per space
        assert {**json_call, "request": None} == {**call, "request": None}


def test_recall_is_scoped_to_one_exact_space(memory: Memory) -> None:
    memory.remember("user1 secret plan", subject="a", space=Space("user1"))
    memory.remember("user10 secret plan", subject="b", space=Space("user10"))
    memory.remember("agent secret plan", subject="c", space=Space("user1", agent_id="bot"))
    assert [h.record.text for h in memory.recall("secret", space=Space("user1"))] == ["user1 secret plan"]
    assert [h.record.text for h in memory.recall("secret", space=Space("user10"))] == ["user10 secret plan"]
    assert [h.record.text for h in memory.recall("secret", space=Space("user1", "bot"))] == ["agent secret plan"]
    assert memory.recall("secret", space=Space("user")) == []
    assert [r.text for r in memory.list(space=Space("user1"))] == ["user1 secret plan"]


def test_get_from_another_space_is_not_found(memory: Memory) -> None:
    record = memory.remember("private", subject="a", space=Space("user1"))
    with pytest.raises(NotFoundError, match="no record"):
        memory.get(record.id, space=Space("user10"))


def test_tenants_are_hard_partitions(store_path: Path, clock: FakeClock) -> None:
    with Memory.open(store_path, from_bytes(MASTER), clock=clock, create=True, tenant="acme") as acme:
        record = acme.remember("acme fact", subject="alice")
    with Memory.open(store_path, from_bytes(MASTER), clock=clock, tenant="globex") as globex:
        assert globex.recall("acme") == []
        assert list(globex.list()) == []
        with pytest.raises(NotFoundError):
            globex.get(record.id)


def test_views_of_one_handle_keep_each_tenants_tokens(store_path: Path, clock: FakeClock) -> None:
    """The handle and its views share one cache of blind-index tokens: a tenant's view
    still gets its own tenant's, never those the handle cached for another."""
    with Memory.open(store_path, from_bytes(MASTER), clock=clock, create=True) as memory:
        globex_admin, _ = memory.create_principal("globex admin", Role.ADMIN, tenant="globex")
        ours = memory._scope_token(Space())
        theirs = memory.as_principal(globex_admin)._scope_token(Space())
        assert memory._scope_token(Space()) == ours
    with Memory.open(store_path, from_bytes(MASTER), clock=clock, tenant="globex") as globex:
        assert globex._scope_token(Space()) == theirs != ours


def test_a_closed_handle_says_so(store_path: Path, clock: FakeClock) -> None:
    """A call on a handle already closed is refused by the library's own error (a
    StoreError, exit 2 in the shells), not SQLite's; closing twice is harmless."""
    memory = Memory.open(store_path, from_bytes(MASTER), clock=clock, create=True)
    memory.remember("Alice likes tea", subject="Alice")
    memory.close()
    memory.close()
    with pytest.raises(StoreError, match="handle is closed"):
        memory.recall("tea")
    with pytest.raises(StoreError, match="handle is closed"):
        memory.remember("more", subject="Alice")


def test_closing_twice_is_harmless_after_the_first_close_signed_the_tail(store_path: Path, clock: FakeClock) -> None:
    """The second of two writes within the checkpoint interval is left for the next
    checkpoint, which the first close() signs: a second close() (an explicit one inside a
    ``with`` block, then the block's) raised SQLite's own "connection has been closed"."""
    memory = Memory.init(store_path, from_bytes(MASTER), clock=clock)[0]
    with memory:
        memory.remember("signed at once", subject="Alice")
        memory.remember("left for the next checkpoint", subject="Alice")
        memory.close()
    memory.close()
    with pytest.raises(StoreError, match="handle is closed"):
        memory.recall("checkpoint")
    with Memory.open(store_path, from_bytes(MASTER), clock=clock) as reopened:
        assert reopened.verify_log().ok  # the first close signed the tail


def test_forget_retires_but_keeps_history(memory: Memory) -> None:
    record = memory.remember("Alice likes tea", subject="Alice", key="alice::drink")
    retired = memory.forget(record_id=record.id)
    assert retired.status is Status.RETIRED
    assert memory.recall("tea") == []
    assert list(memory.list()) == []
    assert [r.status for r in memory.list(include_history=True)] == [Status.RETIRED]
    assert [r.id for r in memory.history("alice::drink")] == [record.id]
    with pytest.raises(InvalidInputError, match="RETIRED, not ACTIVE"):
        memory.forget(record_id=record.id)


def test_forget_by_key(memory: Memory) -> None:
    memory.remember("v1", subject="a", key="alice::phone")
    current = memory.remember("v2", subject="a", key="alice::phone")
    assert memory.forget(key="alice::phone").id == current.id
    with pytest.raises(NotFoundError, match="no active value for this key") as missing:
        memory.forget(key="alice::phone")
    # Error messages end up in logs: a fact key can name a person, so none is echoed.
    assert "alice" not in str(missing.value)
    with pytest.raises(InvalidInputError, match="exactly one"):
        memory.forget()


def test_rectify_records_reason_and_actor(memory: Memory) -> None:
    old = memory.remember("Alice phone +100", subject="Alice", key="alice::phone", source="crm", confidence=0.5)
    new = memory.rectify("alice::phone", "Alice phone +111", reason="subject's request", actor="dpo@example")
    assert new.supersedes == old.id
    assert (new.reason, new.actor) == ("subject's request", "dpo@example")
    assert (new.subject_original, new.source, new.confidence) == ("Alice", "crm", 0.5)
    assert memory.get(old.id).status is Status.SUPERSEDED
    assert [r.text for r in memory.history("alice::phone")] == ["Alice phone +100", "Alice phone +111"]


def test_rectify_erase_previous_hard_deletes_earlier_values(memory: Memory) -> None:
    first = memory.remember("wrong one", subject="a", key="k")
    second = memory.remember("wrong two", subject="a", key="k")
    new = memory.rectify("k", "right", reason="inaccurate", actor="ops", erase_previous=True)
    assert [r.id for r in memory.history("k")] == [new.id]
    for gone in (first, second):
        with pytest.raises(NotFoundError):
            memory.get(gone.id)


def test_rectify_errors(memory: Memory) -> None:
    with pytest.raises(NotFoundError, match="no active value"):
        memory.rectify("missing", "x", reason="r", actor="a")
    memory.remember("v", subject="a", key="k")
    with pytest.raises(InvalidInputError, match="needs a reason"):
        memory.rectify("k", "x", reason=" ", actor="a")


def test_rectify_of_an_expired_value_is_refused_and_writes_nothing(memory: Memory, clock: FakeClock) -> None:
    """A correction keeps the value's expiry: once that has passed, it would write a value
    that is expired at birth, so it is refused instead."""
    old = memory.remember("Alice phone +100", subject="Alice", key="alice::phone", expires_at=clock.now + 5_000_000)
    clock.advance(6)
    with pytest.raises(NotFoundError, match=r"expired at .* awaits purge_expired"):
        memory.rectify("alice::phone", "Alice phone +111", reason="inaccurate", actor="dpo@example")
    assert [r.id for r in memory.history("alice::phone")] == [old.id]
    assert memory.get(old.id).status is Status.ACTIVE


def test_list_filters_by_subject_and_key(memory: Memory) -> None:
    memory.remember("a1", subject="Alice", key="alice::x")
    memory.remember("a2", subject="alice")
    memory.remember("b1", subject="Bob", key="bob::x")
    assert [r.text for r in memory.list(subject="ALICE")] == ["a1", "a2"]
    assert [r.text for r in memory.list(key="bob::x")] == ["b1"]
    assert [r.text for r in memory.list(limit=1)] == ["a1"]


def test_history_of_unknown_key_is_not_found(memory: Memory) -> None:
    with pytest.raises(NotFoundError, match="no record with this key"):
        memory.history("nope")


def test_expired_records_are_never_recalled(memory: Memory, clock: FakeClock) -> None:
    memory.remember("short lived note", subject="a", expires_at=clock.now + 5_000_000)
    assert len(memory.recall("note")) == 1
    clock.advance(6)
    assert memory.recall("note") == []


def test_expiry_must_have_a_calendar_date(memory: Memory) -> None:
    """A time past 9999-12-31 has no ISO 8601 form: accepted, it made the record, its
    space's listing and its subject's export fail on every read."""
    latest = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
    kept = memory.remember("kept a long time", subject="a", expires_at=latest)
    assert memory.get(kept.id).to_json()["expires_at"] == "9999-12-31T23:59:59.999999Z"
    for bad in (latest + 1, -1, 2**63):
        with pytest.raises(InvalidInputError, match="from 1970 to the year 9999"):
            memory.remember("never stored", subject="a", expires_at=bad)
    assert [r.id for r in memory.list()] == [kept.id]


def test_expiry_is_taken_as_records_show_it(memory: Memory, clock: FakeClock) -> None:
    """A record shows its expiry in ISO 8601: that form (or a delay, as the CLI takes)
    is taken back, so a caller can copy one record's expiry onto another."""
    first = memory.remember("kept a week", subject="a", expires_at="7d")
    assert first.expires_at == clock.now + 7 * 86_400 * 1_000_000
    shown = first.to_json()["expires_at"]
    assert memory.remember("kept as long", subject="b", expires_at=shown).expires_at == first.expires_at
    assert memory.remember("no offset is UTC", subject="c", expires_at="9999-01-01T00:00").expires_at == (
        memory.remember("explicit UTC", subject="c", expires_at="9999-01-01T00:00:00Z").expires_at
    )
    # Microseconds as text (a command line's only kind of value) are microseconds, as a number.
    assert memory.remember("µs", subject="e", expires_at=str(clock.now + 5)).expires_at == clock.now + 5
    assert memory.remember("a basic ISO date", subject="e", expires_at="99991231").expires_at == (
        memory.remember("the same", subject="e", expires_at="9999-12-31").expires_at
    )
    for bad, said in (
        ("soon", "neither microseconds, an ISO 8601 time nor a delay"),
        ("1", "1970-01-01T00:00:00.000001Z is in the past"),
        ("11111111111", "1970-01-01T03:05:11.111111Z is in the past"),  # not 1111-11-11T11:00
        ("1" * 20, "after the year 9999"),
        ("1" * 5000, "after the year 9999"),
        ("²d", "neither"),
        ("2000-01-01", "past"),
    ):
        with pytest.raises(InvalidInputError, match=said):
            memory.remember("never stored", subject="d", expires_at=bad)
    assert [r.subject for r in memory.list()] == ["a", "b", "c", "c", "e", "e", "e"]


def test_expiry_must_be_in_the_future(memory: Memory, clock: FakeClock) -> None:
    """A record already expired was written, never recalled, and erased by the next purge."""
    for past in (1, clock.now - 1, clock.now):
        with pytest.raises(InvalidInputError, match=r"^expires_at .* is in the past$"):
            memory.remember("never stored", subject="a", expires_at=past)
    with pytest.raises(InvalidInputError, match=r"^expires_at 1970-01-01T00:00:00\.000001Z is in the past$"):
        memory.remember_many(
            [NewMemory("fine", subject="a"), NewMemory("late", subject="b", expires_at=1), NewMemory("ok", subject="c")]
        )
    assert list(memory.list(include_history=True)) == []
    assert memory.remember("just in time", subject="a", expires_at=clock.now + 1).expires_at == clock.now + 1


def test_lineage_must_name_existing_records(memory: Memory) -> None:
    with pytest.raises(NotFoundError, match="unknown record id"):
        memory.remember("x", subject="a", derived_from=["01a22a03-19d9-75ea-b6f8-0a895b612b14"])
    with pytest.raises(InvalidInputError, match="not a record id"):
        memory.remember("x", subject="a", derived_from=["nope"])


def test_remember_many_is_all_or_nothing(memory: Memory) -> None:
    good = NewMemory("fine", subject="a")
    bad = NewMemory("bad lineage", subject="a", derived_from=("01a22a03-19d9-75ea-b6f8-0a895b612b14",))
    with pytest.raises(NotFoundError):
        memory.remember_many([good, bad])
    assert list(memory.list(include_history=True)) == []
    with pytest.raises(InvalidInputError, match="over the"):
        memory.remember_many([good, NewMemory("x" * 70_000, subject="a")])
    assert list(memory.list(include_history=True)) == []
    assert len(memory.remember_many([good, good])) == 2


def test_multiple_spaces_per_user_keep_their_own_keys(memory: Memory) -> None:
    a = Space("alice", agent_id="support")
    b = Space("alice", agent_id="sales")
    memory.remember("support value", subject="x", key="k", space=a)
    memory.remember("sales value", subject="x", key="k", space=b)
    assert [r.text for r in memory.history("k", space=a)] == ["support value"]
    assert [r.text for r in memory.history("k", space=b)] == ["sales value"]


def test_text_size_cap_is_configurable(store_path: Path) -> None:
    with Memory.open(store_path, from_bytes(MASTER), create=True, max_text_bytes=8) as mem:
        with pytest.raises(InvalidInputError, match="9 bytes, over the 8-byte limit"):
            mem.remember("123456789", subject="a")
        assert mem.remember("12345678", subject="a").text == "12345678"
        # So is the metadata's size, as JSON: read back with the record, it is as large.
        with pytest.raises(InvalidInputError, match=r"metadata is 9 bytes as JSON, over the 8-byte limit"):
            mem.remember("a", subject="a", metadata={"k": "v"})
        with pytest.raises(InvalidInputError, match="metadata is"):
            mem.remember_many([NewMemory("a", subject="a"), NewMemory("b", subject="a", metadata={"k": "vv"})])
        assert [r.text for r in mem.list()] == ["12345678"]
        assert mem.remember("b", subject="a", metadata={"k": ""}).metadata == {"k": ""}  # 8 bytes


def test_very_common_terms_give_way_to_rare_ones(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    import deleatur.memory as memory_module

    monkeypatch.setattr(memory_module, "_COMMON_TERM_DOCS", 5)
    memory.remember_many([NewMemory(f"common filler {i}", subject="s") for i in range(20)])
    target = memory.remember("common words and one zebra", subject="s")
    newest = memory.remember("common again", subject="s")
    # "common" is in more than 5 records: the rare word decides the ranking.
    assert [h.record.id for h in memory.recall("common zebra", limit=1)] == [target.id]
    # Only common words: the newest matches come first.
    assert [h.record.id for h in memory.recall("common", limit=2)] == [newest.id, target.id]
    assert [h.record.text for h in memory.recall("Zébra")] == ["common words and one zebra"]


def test_a_term_in_many_records_is_ranked_among_its_newest_matches(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deleatur.memory as memory_module

    monkeypatch.setattr(memory_module, "_TERM_CANDIDATES", 5)
    # The best BM25 match for "apple", but older than its 5 newest matches.
    memory.remember("apple apple apple", subject="s")
    memory.remember_many([NewMemory(f"apple and filler number {i}", subject="s") for i in range(20)])
    newest = memory.remember_many([NewMemory(f"apple pie {i}", subject="s") for i in range(5)])
    hits = memory.recall("apple", limit=3)
    assert len(hits) == 3
    assert {h.record.id for h in hits} <= {r.id for r in newest}
    assert all(h.score > 0 for h in hits)
    # A limit above the cap raises it: every one of the 26 matches is a candidate.
    top = memory.recall("apple", limit=30)
    assert len(top) == 26
    assert top[0].record.text == "apple apple apple"


def test_a_rare_term_finds_an_old_record_among_many_common_ones(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deleatur.memory as memory_module

    monkeypatch.setattr(memory_module, "_TERM_CANDIDATES", 5)
    target = memory.remember("apple and a zebra", subject="s")
    memory.remember_many([NewMemory(f"apple filler {i}", subject="s") for i in range(30)])
    newest = memory.remember_many([NewMemory(f"apple again {i}", subject="s") for i in range(5)])
    hits = memory.recall("apple zebra", limit=4)
    assert hits[0].record.id == target.id
    # The rest are "apple" records, from among its 5 newest.
    assert {h.record.id for h in hits[1:]} <= {r.id for r in newest}
    assert len(hits) == 4


def test_capped_recall_stays_in_its_space_and_honours_limit(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    import deleatur.memory as memory_module

    monkeypatch.setattr(memory_module, "_TERM_CANDIDATES", 5)
    alice, bob = Space("alice"), Space("bob")
    mine = memory.remember_many([NewMemory(f"apple note {i}", subject="s") for i in range(8)], space=alice)
    memory.remember_many([NewMemory(f"apple note {i}", subject="s") for i in range(30)], space=bob)
    mine_ids = {r.id for r in mine}
    for limit in (1, 3, 5, 8, 20):
        hits = memory.recall("apple note", space=alice, limit=limit)
        assert len(hits) == min(limit, 8)
        assert {h.record.id for h in hits} <= mine_ids
    assert {h.record.id for h in memory.recall("apple", space=alice, limit=20)} == mine_ids
    assert all(h.record.space == bob for h in memory.recall("apple", space=bob, limit=50))


def test_capped_recall_looks_further_back_when_the_newest_are_hidden(
    memory: Memory, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deleatur.memory as memory_module

    monkeypatch.setattr(memory_module, "_TERM_CANDIDATES", 5)
    kept = memory.remember_many([NewMemory(f"apple kept {i}", subject="s") for i in range(3)])
    soon = clock.now + 1_000_000
    memory.remember_many([NewMemory(f"apple gone {i}", subject="s", expires_at=soon) for i in range(6)])
    memory.remember_many([NewMemory(f"apple hidden {i}", subject="restricted") for i in range(6)])
    memory.restrict("restricted", reason="contested", actor="dpo")
    clock.advance(2)
    # The 12 newest "apple" records are expired or restricted: recall reaches past them.
    assert {h.record.id for h in memory.recall("apple", limit=3)} == {r.id for r in kept}
    assert {h.record.id for h in memory.recall("apple", limit=10)} == {r.id for r in kept}


def test_recall_scores_are_fts5_bm25(memory: Memory) -> None:
    from deleatur.store.sqlite import _BM25, SQLiteBackend

    memory.remember_many(
        [
            NewMemory("the weather in Lyon is mild and the weather is kind", subject="w"),
            NewMemory("Lyon Lyon is where Alice lives", subject="alice"),
            NewMemory("Alice likes mild weather", subject="alice"),
            NewMemory("nothing to see here at all, really nothing", subject="x"),
            NewMemory("a long note " + "filler " * 30 + "about weather", subject="x"),
        ]
    )
    backend = memory.backend
    assert isinstance(backend, SQLiteBackend)
    phrases = [f'"{term}"' for term in memory._index_terms(Space(), ["weather", "lyon", "alice"])]
    query = " OR ".join(phrases)
    # No term is capped here: recall gives FTS5's own ranking and scores.
    hits = memory.recall("weather Lyon alice", limit=10)
    expected = backend._conn.execute(
        "SELECT r.id, -bm25(ft) FROM ft JOIN records r ON r.rowid = ft.rowid WHERE ft MATCH ? ORDER BY 2 DESC",
        (query,),
    ).fetchall()
    assert [(h.record.id, pytest.approx(h.score, rel=1e-9)) for h in hits] == [tuple(row) for row in expected]
    # Where a term is capped, recall scores with its own BM25, given the document
    # frequencies: given the exact ones, it must agree with FTS5's bm25().
    frequencies = [
        backend._conn.execute("SELECT count(*) FROM ft WHERE ft MATCH ?", (phrase,)).fetchall()[0][0]
        for phrase in phrases
    ]
    rows = backend._conn.execute(
        f"SELECT {_BM25}(ft, ?, ?, ?), -bm25(ft) FROM ft WHERE ft MATCH ?", (*frequencies, query)
    ).fetchall()
    assert len(rows) == 4
    assert all(ours == pytest.approx(theirs, rel=1e-9) for ours, theirs in rows)


def test_a_batch_superseding_its_own_rows_recalls_only_the_survivors(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory.remember("phone zebra", subject="a", key="a::phone")
    batch = memory.remember_many(
        [
            NewMemory("phone giraffe", subject="a", key="a::phone"),
            NewMemory("unrelated okapi", subject="b"),
            NewMemory("phone hippo", subject="a", key="a::phone"),
        ]
    )
    assert [h.record.id for h in memory.recall("phone")] == [batch[2].id]
    assert memory.recall("zebra") == [] and memory.recall("giraffe") == []
    assert [h.record.id for h in memory.recall("okapi")] == [batch[1].id]
    # A batch that fails after superseding a value leaves the index as it was.
    write = memory._write
    calls: list[int] = []

    def failing_write(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return write(*args, **kwargs)

    monkeypatch.setattr(memory, "_write", failing_write)
    with pytest.raises(RuntimeError):
        memory.remember_many([NewMemory("phone lion", subject="a", key="a::phone"), NewMemory("x", subject="a")])
    monkeypatch.undo()
    assert [h.record.id for h in memory.recall("phone")] == [batch[2].id]
    assert memory.recall("lion") == []
