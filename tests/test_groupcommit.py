"""Group commit: the library's WriteGroup (calls in one transaction, each a savepoint of
it, signed once), and the server's groups of reads' audit entries (a group whose write
fails or is cancelled is closed, its entries dropped, and the next read starts a new
group that is written)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import apsw
import pytest

from deleatur import (
    DeleaturError,
    Memory,
    RestrictedSubjectError,
    Role,
    Space,
    StoreBusyError,
    StoreError,
    WriteGroup,
    from_bytes,
)
from deleatur.servers.groupcommit import CommitGroups, Group

from .conftest import MASTER


@pytest.mark.parametrize("failure", [StoreBusyError("the lock stayed held"), asyncio.CancelledError()])
def test_a_group_whose_write_fails_is_closed_and_the_next_one_is_written(
    memory: Memory, failure: BaseException
) -> None:
    record = memory.remember("kept", subject="a")
    start = memory.backend.log_size()
    tries: list[int] = []

    async def on_store(work: Callable[[Memory], None]) -> None:
        tries.append(1)
        if len(tries) == 1:
            raise failure
        work(memory)

    async def run() -> None:
        groups = CommitGroups(on_store)
        first: set[Group] = set()
        with groups.collecting(memory, first):
            memory.get(record.id)
        with pytest.raises(type(failure)):
            await groups.written(first)
        later: set[Group] = set()
        with groups.collecting(memory, later):
            memory.get(record.id)
        assert later and later != first  # a new group
        await groups.written(later)

    asyncio.run(run())
    logged = [e.entry.fields["action"] for e in memory.audit_entries(start=start, calls_only=True)]
    assert logged == ["get", "audit.show"]  # the second get; the first was answered with the failure


# -- the library's WriteGroup ----------------------------------------------------------


def _checkpoints(memory: Memory) -> int:
    conn = memory.backend._conn  # type: ignore[attr-defined]
    return int(conn.execute("SELECT count(*) FROM log_checkpoints").fetchone()[0])


def test_a_write_group_commits_its_calls_together_and_signs_once(memory: Memory, store_path: Path) -> None:
    """Calls in a group are one transaction: another connection sees none of them before
    the commit and all after; the log gets one checkpoint for the group, where each write
    alone signs its own (this handle signs every write), and verifies."""
    before = _checkpoints(memory)
    group = memory.write_group()
    for i in range(5):
        with group.joining():
            memory.remember(f"grouped {i}", subject="alice")
    other = apsw.Connection(str(store_path))
    count = "SELECT count(*) FROM records WHERE status = 'ACTIVE'"
    assert other.execute(count).fetchone() == (0,)  # nothing is visible before the commit
    group.commit()
    assert _checkpoints(memory) == before + 1
    assert other.execute(count).fetchone() == (5,)
    other.close()
    assert memory.verify_log().ok
    memory.remember("alone", subject="alice")  # the handle's log cache follows the group's appends
    assert _checkpoints(memory) == before + 2
    assert sorted(r.text for r in memory.list()) == ["alone", *(f"grouped {i}" for i in range(5))]
    assert memory.verify_log().ok


def test_a_call_that_fails_in_a_write_group_undoes_only_its_own_writes(memory: Memory) -> None:
    member = memory.as_principal(memory.create_principal("agent", Role.MEMBER)[0])
    memory.restrict("bob", reason="disputed", actor="dpo")
    group = memory.write_group()
    with group.joining():
        member.remember("kept", subject="alice")
    with group.joining(), pytest.raises(RestrictedSubjectError):
        member.remember("refused", subject="bob")
    with group.joining():
        member.remember("also kept", subject="carol")
    group.commit()
    assert sorted(r.text for r in memory.list()) == ["also kept", "kept"]
    entries = memory.audit_entries(calls_only=True)
    outcomes = [e.entry.fields["outcome"] for e in entries if e.entry.fields["action"] == "remember"]
    assert outcomes == ["ok", "failed", "ok"]
    assert memory.verify_log().ok


def test_a_rolled_back_write_group_leaves_nothing_and_the_log_goes_on(memory: Memory) -> None:
    size = memory.backend.log_size()
    group = memory.write_group()
    for i in range(3):
        with group.joining():
            memory.remember(f"undone {i}", subject="alice")
    group.rollback()
    assert memory.backend.log_size() == size and [*memory.list()] == []
    memory.remember("after", subject="alice")
    assert [r.text for r in memory.list()] == ["after"]
    assert memory.verify_log().ok


def test_a_write_group_whose_commit_fails_leaves_nothing(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    size = memory.backend.log_size()
    group = memory.write_group()
    with group.joining():
        memory.remember("lost", subject="alice")

    def fail() -> bool:
        raise StoreError("the disk is full")

    monkeypatch.setattr(memory, "_sign_group", fail)
    with pytest.raises(StoreError, match="the disk is full"):
        group.commit()
    monkeypatch.undo()
    assert not group.open and memory.backend.log_size() == size and [*memory.list()] == []
    memory.remember("after", subject="alice")
    assert memory.verify_log().ok


def test_a_write_group_refuses_removals_snapshots_and_writes_outside_it(memory: Memory) -> None:
    """A removal must truncate the -wal once it commits, which a group's call cannot do;
    a read snapshot cannot begin inside a write transaction; and a write made outside the
    group while it is open would commit with it unasked. Each is refused, naming why,
    and the group's own writes still commit."""
    record = memory.remember("to retire", subject="alice")
    group = memory.write_group()
    with group.joining():
        memory.remember("grouped", subject="alice")
        with pytest.raises(StoreError, match="removal cannot be made in a group"):
            memory.forget(record_id=record.id)
    with pytest.raises(StoreError, match="write group is open"):
        memory.remember("outside", subject="alice")
    with pytest.raises(StoreError, match="write group is open"), memory.read_snapshot():
        pass
    group.commit()
    assert sorted(r.text for r in memory.list()) == ["grouped", "to retire"]
    memory.forget(record_id=record.id)  # once the group has committed, it goes ahead
    assert [r.text for r in memory.list()] == ["grouped"]


def test_closing_the_handle_rolls_an_open_write_group_back(store_path: Path) -> None:
    memory, _ = Memory.init(store_path, from_bytes(MASTER))
    group = memory.write_group()
    with group.joining():
        memory.remember("never answered", subject="alice")
    memory.close()
    with Memory.open(store_path, from_bytes(MASTER)) as reopened:
        assert [*reopened.list()] == []
        assert reopened.verify_log().ok


def test_audit_entries_written_in_a_rolled_back_write_group_are_written_again(memory: Memory) -> None:
    record = memory.remember("read me", subject="alice")
    batch = memory.audit_batch()
    with batch.collecting():
        memory.get(record.id)
    group = memory.write_group()
    with group.joining():
        batch.write()
    assert len(batch) == 0
    group.rollback()
    assert len(batch) == 1  # back in the batch, not lost
    batch.write()
    assert [e.entry.fields["action"] for e in memory.audit_entries(calls_only=True)][-2:] == ["get", "audit.show"]


def _indexed(memory: Memory, word: str) -> int:
    """The records the full-text index holds ``word`` for, read on the handle's own
    connection (inside a group's transaction, too) without making held-back writes."""
    conn = memory.backend._conn  # type: ignore[attr-defined]
    term = memory._index_terms(Space(), [word])[0]
    return int(conn.execute("SELECT count(*) FROM ft WHERE ft MATCH ?", (f'body:"{term}"',)).fetchone()[0])


def test_a_write_groups_index_writes_are_made_once_as_it_commits(memory: Memory) -> None:
    """Each call of a group is a savepoint, at which FTS5 would write the terms it holds
    to a segment of their own: the calls' index writes are held back and made together,
    and a value written and superseded in the group never enters the index."""
    group = memory.write_group()
    with group.joining():
        memory.remember("a note on the okapi", subject="alice")
    with group.joining():
        memory.remember("pet is a quokka", subject="bob", key="bob::pet")
    with group.joining():
        latest = memory.remember("pet is a wombat", subject="bob", key="bob::pet")
    assert _indexed(memory, "okapi") == 0  # held back, inside the group's transaction
    group.commit()
    assert (_indexed(memory, "okapi"), _indexed(memory, "wombat"), _indexed(memory, "quokka")) == (1, 1, 0)
    assert [h.record.id for h in memory.recall("quokka wombat")] == [latest.id]
    assert memory.verify_log().ok


def test_a_recall_in_a_write_group_finds_what_the_group_wrote_before_it(memory: Memory) -> None:
    group = memory.write_group()
    with group.joining():
        written = memory.remember("a note on the okapi", subject="alice")
    with group.joining():
        assert [h.record.id for h in memory.recall("okapi")] == [written.id]
    with group.joining():
        later = memory.remember("another okapi", subject="alice")
    group.commit()
    assert {h.record.id for h in memory.recall("okapi")} == {written.id, later.id}


def test_the_index_writes_of_a_call_that_fails_in_a_write_group_are_not_made(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its savepoint undoes its record: were its held-back index write made at the
    commit, the index would hold its words under a rowid the next record takes."""
    group = memory.write_group()
    with group.joining():
        memory.remember("the okapi stays", subject="alice")
    insert = memory.backend.insert_many

    def insert_then_fail(rows: Any) -> None:
        insert(rows)
        raise StoreError("the disk is full")

    monkeypatch.setattr(memory.backend, "insert_many", insert_then_fail)
    with group.joining(), pytest.raises(StoreError, match="the disk is full"):
        memory.remember("the quokka goes", subject="bob")
    monkeypatch.undo()
    group.commit()
    after = memory.remember("a later wombat", subject="carol")
    assert [r.text for r in memory.list()] == ["the okapi stays", "a later wombat"]
    assert (_indexed(memory, "okapi"), _indexed(memory, "quokka")) == (1, 0)
    assert [h.record.id for h in memory.recall("quokka wombat")] == [after.id]
    assert memory.verify_log().ok


def test_index_writes_made_in_a_savepoint_that_is_undone_are_made_again(memory: Memory) -> None:
    """A search in a savepoint makes the writes held back before it; undoing the
    savepoint takes them out of the index again, so they must still be made."""
    group = memory.write_group()
    with group.joining():
        kept = memory.remember("the okapi stays", subject="alice")

    class Undone(Exception):
        pass

    def search_then_fail() -> None:
        with memory.backend.atomic():  # a savepoint of the group's transaction
            assert [row.id for row, _ in memory._ranked("okapi", Space(), 10)] == [kept.id]
            assert _indexed(memory, "okapi") == 1
            raise Undone

    with group.joining(), pytest.raises(Undone):
        search_then_fail()
    assert _indexed(memory, "okapi") == 0
    group.commit()
    assert _indexed(memory, "okapi") == 1
    assert [h.record.id for h in memory.recall("okapi")] == [kept.id]


# -- the server's queue of writes ---------------------------------------------------------


def _remember(memory: Memory, *, text: str) -> object:
    return memory.remember(text, subject="alice")


def _queued(memory: Memory, calls: list[Callable[[Memory], object]]) -> list[object]:
    """Each call queued as a server's writes are, and flushed together; what each got."""

    async def on_store(work: Callable[[Memory], None]) -> None:
        work(memory)

    async def run() -> list[object]:
        groups = CommitGroups(on_store)
        return await asyncio.gather(*(groups.write(call) for call in calls), return_exceptions=True)

    return asyncio.run(run())


def test_queued_writes_are_made_in_one_flush_each_answered_with_its_own_outcome(memory: Memory) -> None:
    memory.restrict("bob", reason="disputed", actor="dpo")
    before = _checkpoints(memory)
    got = _queued(
        memory,
        [
            lambda m: m.remember("first", subject="alice").text,
            lambda m: m.remember("refused", subject="bob").text,
            lambda m: m.remember("third", subject="carol").text,
        ],
    )
    assert got[0] == "first" and got[2] == "third"
    assert isinstance(got[1], RestrictedSubjectError)
    assert _checkpoints(memory) == before + 1  # one transaction, signed once
    assert sorted(r.text for r in memory.list()) == ["first", "third"]


def test_queued_writes_whose_commit_fails_all_get_its_error_and_leave_nothing(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = memory.backend.log_size()

    def fail() -> bool:
        raise StoreError("the disk is full")

    monkeypatch.setattr(memory, "_sign_group", fail)
    got = _queued(memory, [partial(_remember, text=f"lost {i}") for i in range(3)])
    monkeypatch.undo()
    assert [str(g) for g in got] == ["the disk is full"] * 3  # none is answered as written
    assert memory.backend.log_size() == size and [*memory.list()] == []


def _interrupt_the_next_record_insert(memory: Memory) -> None:
    """A call in the open group whose record's insert SQLite interrupts: an error (as a
    full disk is) after which SQLite rolls the group's whole transaction back itself."""
    conn = memory.backend._conn  # type: ignore[attr-defined]
    fire: list[bool] = []

    def traced(_cursor: object, sql: str, _bindings: object) -> bool:
        if sql.startswith("INSERT INTO records"):
            fire.append(True)  # the record's own insert, inside its savepoint
        return True

    def interrupt() -> bool:  # SQLite's progress handler: True interrupts the statement
        return bool(fire and fire.pop())

    conn.exec_trace = traced
    conn.set_progress_handler(interrupt, 1)
    try:
        with pytest.raises(DeleaturError) as failed:
            memory.remember("interrupted", subject="alice")
    finally:
        conn.exec_trace = None
        conn.set_progress_handler(None)
    assert isinstance(failed.value.__context__, apsw.InterruptError) or isinstance(failed.value, apsw.InterruptError)
    assert conn.getautocommit()  # the group's transaction is gone


def _a_group_whose_transaction_ended(memory: Memory) -> WriteGroup:
    """A group that wrote "the okapi note" (its index write held), then a call that SQLite
    interrupted, rolling the group's transaction back."""
    group = memory.write_group()
    with group.joining():
        memory.remember("the okapi note", subject="alice")
    with group.joining():
        _interrupt_the_next_record_insert(memory)
    return group


def test_an_error_that_ends_a_write_groups_transaction_leaves_nothing_written(memory: Memory) -> None:
    """Some errors (an interrupt, a full disk) make SQLite roll the whole transaction back
    itself: the group's later calls are refused rather than each commit on its own, its
    commit fails (its held index writes are not made on their own), nothing it wrote is
    stored, and the handle writes on afterwards."""
    size = memory.backend.log_size()
    group = _a_group_whose_transaction_ended(memory)
    with group.joining(), pytest.raises(StoreError, match="enclosing transaction was rolled back"):
        memory.remember("third", subject="alice")
    with pytest.raises(StoreError, match="enclosing transaction was rolled back"):
        group.commit()
    assert memory.backend.log_size() == size
    after = memory.remember("an unrelated wombat", subject="bob")  # takes the rowid the first one had
    assert [r.text for r in memory.list()] == [after.text]
    assert _indexed(memory, "okapi") == 0
    assert [h.record.id for h in memory.recall("okapi")] == []
    assert memory.verify_log().ok


def test_a_recall_after_a_write_groups_transaction_ended_makes_no_index_write(memory: Memory) -> None:
    """A search makes the group's held index writes first: not once SQLite has rolled the
    group's transaction back, where they would commit alone (and stay, whatever the group
    does next)."""
    group = _a_group_whose_transaction_ended(memory)
    with group.joining(), pytest.raises(StoreError, match="enclosing transaction was rolled back"):
        memory.recall("okapi")
    group.rollback()
    assert [*memory.list()] == []
    assert _indexed(memory, "okapi") == 0


def test_a_server_flush_whose_transaction_ended_makes_no_index_write(memory: Memory) -> None:
    """The server's queue: each write's error is kept, and the group is committed; the
    commit must not make the first write's held index write in autocommit."""

    def interrupted(m: Memory) -> None:
        _interrupt_the_next_record_insert(m)

    got = _queued(memory, [lambda m: m.remember("the okapi note", subject="alice"), interrupted])
    assert isinstance(got[0], StoreError)  # not answered as written
    assert [*memory.list()] == []
    memory.remember("an unrelated wombat", subject="bob")
    assert [h.record.text for h in memory.recall("okapi")] == []


def test_held_index_writes_that_fail_part_way_are_made_later_all_of_them(memory: Memory) -> None:
    """A search whose making of the held writes fails without ending the transaction (a
    statement's own error) leaves them held, none half made: the commit makes them."""
    conn = memory.backend._conn  # type: ignore[attr-defined]
    group = memory.write_group()
    with group.joining():
        first = memory.remember("the okapi note", subject="alice")
    with group.joining():
        second = memory.remember("another okapi", subject="alice")
    inserts: list[str] = []

    def refuse_the_second_insert(_cursor: object, sql: str, _bindings: object) -> bool:
        if sql.startswith("INSERT INTO ft(rowid"):
            inserts.append(sql)
        return len(inserts) != 2

    conn.exec_trace = refuse_the_second_insert
    with group.joining(), pytest.raises(apsw.ExecTraceAbort):
        memory.recall("okapi")
    conn.exec_trace = None
    assert len(inserts) == 2 and not conn.getautocommit()  # the first was made, then undone
    group.commit()
    assert {h.record.id for h in memory.recall("okapi")} == {first.id, second.id}
    assert _indexed(memory, "okapi") == 2


def test_no_checkpoint_is_signed_inside_a_write_group(memory: Memory) -> None:
    """The group may yet roll back: a checkpoint of its tree would sign a root the log
    never had, so one asked for inside it (a receipt's), or outside it while it is open,
    is refused; the group signs as it commits."""
    record = memory.remember("signed", subject="alice")
    group = memory.write_group()
    with group.joining():
        memory.remember("grouped", subject="alice")
        with pytest.raises(StoreError, match="checkpoint cannot be signed inside a group"):
            memory.receipt(record.id)
    with pytest.raises(StoreError, match="checkpoint cannot be signed inside a group"):
        memory.checkpoint()
    group.rollback()
    assert memory.verify_log().ok


def test_a_data_key_made_for_a_write_that_failed_in_a_group_is_collected(memory: Memory) -> None:
    """A write refused after its subject's key was made (here: superseding a restricted
    subject's value) leaves no key behind once its group ends, as outside a group."""
    memory.remember("bob's value", subject="bob", key="slot")
    memory.restrict("bob", reason="disputed", actor="dpo")
    keys = memory.keys._conn

    def data_keys() -> int:
        (count,) = keys.execute("SELECT count(*) FROM data_keys").fetchall()[0]
        assert isinstance(count, int)
        return count

    before = data_keys()
    group = memory.write_group()
    with group.joining(), pytest.raises(RestrictedSubjectError):
        memory.remember("carol's value", subject="carol", key="slot")
    assert data_keys() == before + 1  # made, and in use by nothing
    group.commit()
    assert data_keys() == before
    assert not memory.keys.unsettled


def test_queued_writes_whose_flush_committed_keep_their_outcome_whatever_fails_after(memory: Memory) -> None:
    """The flush committed, then giving the handle back failed: the writes were made,
    and are answered as made."""

    async def on_store(work: Callable[[Memory], None]) -> None:
        work(memory)
        raise StoreError("the handle could not be given back")

    async def run() -> list[object]:
        groups = CommitGroups(on_store)
        return await asyncio.gather(*(groups.write(partial(_remember, text=f"made {i}")) for i in range(3)))

    made = asyncio.run(run())
    assert sorted(r.text for r in made) == ["made 0", "made 1", "made 2"]  # type: ignore[attr-defined]
    assert sorted(r.text for r in memory.list()) == ["made 0", "made 1", "made 2"]


def test_a_busy_timeout_fails_only_the_writes_that_waited_it_out(memory: Memory) -> None:
    """A flush that waited the whole busy timeout for a lock held elsewhere fails the
    writes queued before it began; one queued while it waited gets a wait of its own."""
    tries: list[int] = []

    async def on_store(work: Callable[[Memory], None]) -> None:
        tries.append(1)
        if len(tries) == 1:
            later.append(asyncio.ensure_future(groups.write(partial(_remember, text="queued later"))))
            await asyncio.sleep(0)
            raise StoreBusyError("another process held the write lock for over 30 s")
        work(memory)

    groups: CommitGroups
    later: list[asyncio.Future[object]] = []

    async def run() -> tuple[BaseException | object, object]:
        nonlocal groups
        groups = CommitGroups(on_store)
        first = await asyncio.gather(groups.write(partial(_remember, text="waited")), return_exceptions=True)
        return first[0], await later[0]

    first, second = asyncio.run(run())
    assert isinstance(first, StoreBusyError)
    assert getattr(second, "text", None) == "queued later"
    assert [r.text for r in memory.list()] == ["queued later"]


def test_a_write_group_is_used_once(memory: Memory, store_path: Path) -> None:
    """A group that rolled back (by rollback(), or as its handle closed) cannot be
    committed as if its calls' writes were stored; an ended group cannot be joined
    again, nor a committed one rolled back."""
    group = memory.write_group()
    with group.joining():
        memory.remember("undone", subject="alice")
    group.rollback()
    with pytest.raises(StoreError, match="was rolled back: nothing its calls wrote was committed"):
        group.commit()
    with pytest.raises(StoreError, match="has rolled back: make a new one"), group.joining():
        pass
    committed = memory.write_group()
    with committed.joining():
        memory.remember("kept", subject="alice")
    committed.commit()
    committed.commit()  # nothing more to commit
    with pytest.raises(StoreError, match="has committed: its calls' writes are stored"):
        committed.rollback()
    with pytest.raises(StoreError, match="has committed: make a new one"), committed.joining():
        pass
    assert [r.text for r in memory.list()] == ["kept"]
    closing = Memory.open(store_path, from_bytes(MASTER))
    left_open = closing.write_group()
    with left_open.joining():
        closing.remember("never committed", subject="bob")
    closing.close()
    with pytest.raises(StoreError, match="was rolled back"):
        left_open.commit()
    assert [r.text for r in memory.list()] == ["kept"]
