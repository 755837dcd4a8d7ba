"""Two real processes writing one store at once lose nothing; nor do threads sharing
one handle."""

from __future__ import annotations

import gc
import multiprocessing
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from deleatur import Memory, NewMemory, Role, StoreBusyError, StoreError, from_bytes, sqlitefile
from deleatur import memory as memory_module

from .conftest import MASTER, FakeClock

SINGLE = 150
BATCH = 300


def _writer(store: str, name: str, barrier: Barrier) -> None:
    with Memory.open(store, from_bytes(MASTER)) as memory:
        barrier.wait()  # start together, so the writes really interleave
        for i in range(SINGLE):
            # Shared subjects: both processes race to create the same new data keys.
            memory.remember(f"{name} single {i}", subject=f"shared {i % 20}", key=f"{name}::{i % 10}")
        memory.remember_many(NewMemory(f"{name} batch {i}", subject=f"shared {i % 30}") for i in range(BATCH))


def test_two_processes_writing_lose_nothing(store_path: Path) -> None:
    Memory.open(store_path, from_bytes(MASTER), create=True).close()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(str(store_path), name, barrier)) for name in ("p1", "p2")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0, 0]

    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        everything = list(memory.list(include_history=True))
        texts = sorted(r.text for r in everything)
        expected = sorted(
            f"{name} {kind} {i}"
            for name in ("p1", "p2")
            for kind, n in (("single", SINGLE), ("batch", BATCH))
            for i in range(n)
        )
        assert texts == expected
        # Each process superseded its own keys: exactly one active value per key.
        for name in ("p1", "p2"):
            for k in range(10):
                assert len(list(memory.list(key=f"{name}::{k}"))) == 1
        # One data key per subject, even though both processes created them concurrently.
        [(count,)] = memory.keys._conn.execute("SELECT count(*) FROM data_keys").fetchall()
        assert count == 30


def test_two_handles_writing_in_one_millisecond_keep_ids_in_commit_order(store_path: Path) -> None:
    """A reader paging by id (after the last id it saw) must never miss a record that
    another handle commits later."""
    clock = FakeClock()  # every write in the same millisecond
    a = Memory.open(store_path, from_bytes(MASTER), clock=clock, create=True)
    b = Memory.open(store_path, from_bytes(MASTER), clock=clock)
    seen: list[str] = []
    for i in range(300):
        writer = a if i % 2 else b
        record = writer.remember(f"note {i}", subject="s")
        assert not seen or record.id > seen[-1]
        seen.append(record.id)
    a.close()
    b.close()


def test_a_long_read_is_marked_for_other_processes_until_it_ends_or_its_process_dies(tmp_path: Path) -> None:
    """A server's long read (an export, a verification) is seen by every process on the
    store, so their scrubs need not wait for it; a killed process leaves no mark."""
    database = tmp_path / "mem.db"
    assert not sqlitefile.long_read_marked(database)  # no marker file yet
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from deleatur import sqlitefile\n"
            f"with sqlitefile.long_read(Path({str(database)!r})):\n"
            "    print('held', flush=True); sys.stdin.readline()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    assert sqlitefile.long_read_marked(database)
    with sqlitefile.long_read(database):  # a second one, here, alongside
        assert sqlitefile.long_read_marked(database)
    assert sqlitefile.long_read_marked(database)  # the other one still holds
    holder.kill()
    holder.wait(timeout=30)
    assert not sqlitefile.long_read_marked(database)
    with sqlitefile.long_read(database):
        assert sqlitefile.long_read_marked(database)
    assert not sqlitefile.long_read_marked(database)


def test_threads_sharing_a_handle_take_turns(memory: Memory) -> None:
    """One handle (and its views) used by several threads at once: each call waits for
    the one in progress. Before, two calls at once interleaved on the one connection and
    raised apsw's ThreadingViolationError, leaving transactions half-done."""
    view = memory.as_principal(memory.create_principal("worker", Role.MEMBER)[0])
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def work(name: str, handle: Memory) -> None:
        barrier.wait()
        try:
            for i in range(40):
                handle.remember(f"{name} note {i}", subject=f"{name} {i % 5}", key=f"{name}::{i % 7}")
                handle.recall("note")
                handle.list(subject=f"{name} {i % 5}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"t{n}", view if n % 2 else memory)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(list(memory.list(include_history=True))) == 4 * 40
    assert len(list(memory.list())) == 4 * 7  # the newest value of each key
    assert memory.verify_log().ok


def test_a_write_group_keeps_the_handle_until_it_ends(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread's call waits for an open write group to end (it would have joined
    its transaction, and gone with a rollback while its caller was told it was stored),
    and the group is ended by the thread that began it."""
    monkeypatch.setattr(memory_module, "BUSY_TIMEOUT_MS", 50)  # how long the other thread waits
    group = memory.write_group()
    with group.joining():
        memory.remember("in the group", subject="Grace")
    outcome: list[object] = []

    def other(call: str) -> None:
        try:
            if call == "remember":
                memory.remember("beside it", subject="Other")
            else:
                group.commit()
            outcome.append(call)
        except BaseException as exc:
            outcome.append(exc)

    for call in ("remember", "commit"):
        thread = threading.Thread(target=other, args=(call,))
        thread.start()
        thread.join()
    waited, foreign_commit = outcome
    assert isinstance(waited, StoreBusyError) and "in use by another thread" in waited.message
    assert isinstance(foreign_commit, StoreError) and "begun by another thread" in foreign_commit.message
    group.rollback()
    assert [r.text for r in memory.list(subject="Grace")] == []
    thread = threading.Thread(target=other, args=("remember",))
    thread.start()
    thread.join()
    assert [r.text for r in memory.list(subject="Other")] == ["beside it"]


def _in_a_thread(step: Callable[[], object]) -> BaseException | None:
    """Run ``step`` in a new thread, which has ended on return; what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            step()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return raised[0] if raised else None


def _leave_a_group_open(memory: Memory) -> None:
    """A thread that begins a write group, writes in it, and ends without ending it."""

    def leave_it_open() -> None:
        group = memory.write_group()
        with group.joining():
            memory.remember("never committed", subject="Grace")

    assert _in_a_thread(leave_it_open) is None


def test_a_write_group_left_open_by_a_thread_that_ended_is_said_at_once(store_path: Path) -> None:
    """Its thread ended, so the group will never end: a call from another thread is told
    so at once (it waited out the busy timeout, then read as a handle in use), whatever
    that thread's id (a thread started later may have the ended one's, which owned the
    turn by id, and would have written inside the abandoned group)."""
    memory, _ = Memory.init(store_path, from_bytes(MASTER))
    _leave_a_group_open(memory)
    started = time.monotonic()
    for _ in range(3):  # new threads, likely given the ended thread's id
        refused = _in_a_thread(lambda: memory.remember("after it", subject="Other"))
        assert isinstance(refused, StoreError) and "ended without ending it" in refused.message
    with pytest.raises(StoreError, match="ended without ending it"):
        memory.remember("after it", subject="Other")
    assert time.monotonic() - started < sqlitefile.BUSY_TIMEOUT_MS / 1000 / 10
    memory.close()


@pytest.mark.parametrize("closers", [1, 2])
def test_closing_the_handle_rolls_back_a_write_group_whose_thread_ended(store_path: Path, closers: int) -> None:
    """Closing takes over the turn the ended thread kept, and rolls its group back, from
    any thread (a new one may have the ended one's id); two closing at once close it
    once, both without error."""
    memory, _ = Memory.init(store_path, from_bytes(MASTER))
    _leave_a_group_open(memory)
    barrier = threading.Barrier(closers)

    def close() -> None:
        barrier.wait()
        memory.close()

    threads = [threading.Thread(target=lambda: errors.append(_in_a_thread(close))) for _ in range(closers)]
    errors: list[BaseException | None] = []
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [None] * closers
    with pytest.raises(StoreError, match="closed"):
        memory.remember("on the closed handle", subject="Other")
    memory.close()  # again: nothing
    with Memory.open(store_path, from_bytes(MASTER)) as reopened:
        assert [*reopened.list()] == []  # the group's write never committed
        reopened.remember("the store works on", subject="Other")
        assert reopened.verify_log().ok


def test_a_close_waiting_for_a_group_whose_thread_then_ends_rolls_it_back(store_path: Path) -> None:
    """A close that began waiting while the group's thread was alive takes the turn over
    once that thread ends, rather than failing."""
    memory, _ = Memory.init(store_path, from_bytes(MASTER))
    begun, end_it = threading.Event(), threading.Event()

    def hold_then_end() -> None:
        group = memory.write_group()
        with group.joining():
            memory.remember("never committed", subject="Grace")
        begun.set()
        end_it.wait()  # and ends, leaving the group open

    holder = threading.Thread(target=hold_then_end)
    holder.start()
    begun.wait()
    closer = threading.Thread(target=memory.close)
    closer.start()
    end_it.set()
    holder.join()
    closer.join()
    with pytest.raises(StoreError, match="closed"):
        memory.remember("on the closed handle", subject="Other")
    with Memory.open(store_path, from_bytes(MASTER)) as reopened:
        assert [*reopened.list()] == []


def _calls_audited(store_path: Path) -> list[str]:
    with Memory.open(store_path, from_bytes(MASTER)) as reopened:
        assert reopened.verify_log().ok
        return [e.entry.fields["action"] for e in reopened.audit_entries(calls_only=True)]


@pytest.mark.parametrize("closed_by", ["another thread, its own having ended", "its own thread, in the block"])
def test_closing_the_handle_ends_a_read_snapshot_left_open_and_audits_its_calls(
    store_path: Path, closed_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calls made in the snapshot were answered: their entries, written as the block
    ends, are written as the handle closes (close() used to fail, beginning its write in
    the snapshot's read transaction, and they were lost). The block, ended later or
    collected in another thread, ends nothing more, and raises nothing."""
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    memory, _ = Memory.init(store_path, from_bytes(MASTER))
    record = memory.remember("Grace's note", subject="Grace")
    left_open: list[AbstractContextManager[None]] = []

    def read_and_leave_open() -> None:
        snapshot = memory.read_snapshot()
        snapshot.__enter__()
        left_open.append(snapshot)
        assert memory.get(record.id).text == "Grace's note"

    if closed_by.startswith("another thread"):
        assert _in_a_thread(read_and_leave_open) is None
        memory.close()
        left_open.clear()
        gc.collect()
    else:
        read_and_leave_open()
        memory.close()
        left_open.pop().__exit__(None, None, None)
    assert unraisable == []
    with pytest.raises(StoreError, match="closed"):
        memory.get(record.id)
    assert _calls_audited(store_path)[-3:] == ["remember", "get", "audit.show"]  # the last, reading them


def _each_in_a_thread_of_its_own(*steps: Callable[[], object]) -> list[BaseException]:
    """Run ``steps`` one after another, each in its own thread, all kept alive until the
    last is done (a thread that ended may hand its id to the next one); what they raised."""
    errors: list[BaseException] = []
    go = [threading.Event() for _ in steps]
    done = [threading.Event() for _ in steps]
    end = threading.Event()

    def worker(n: int) -> None:
        go[n].wait()
        try:
            steps[n]()
        except BaseException as exc:
            errors.append(exc)
        done[n].set()
        end.wait()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(len(steps))]
    for thread in threads:
        thread.start()
    for n in range(len(steps)):
        go[n].set()
        done[n].wait()
    end.set()
    for thread in threads:
        thread.join()
    return errors


@contextmanager
def _held_by_another_thread(hold: Callable[[], AbstractContextManager[object]]) -> Iterator[None]:
    """Inside: another thread is in ``hold()``'s block."""
    inside, done = threading.Event(), threading.Event()

    def holder() -> None:
        with hold():
            inside.set()
            done.wait()

    thread = threading.Thread(target=holder)
    thread.start()
    inside.wait()
    try:
        yield
    finally:
        done.set()
        thread.join()


def test_a_read_snapshot_keeps_the_handle_until_it_ends(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread's call waits for a read snapshot to end: run in it, a write failed
    to begin its transaction (apsw SQLError) and a read saw the snapshot's store, its
    audit entry going to the snapshot's batch."""
    monkeypatch.setattr(memory_module, "BUSY_TIMEOUT_MS", 50)
    memory.remember("a note", subject="Ida")
    with (
        _held_by_another_thread(memory.read_snapshot),
        pytest.raises(StoreBusyError, match="in use by another thread"),
    ):
        memory.remember("beside it", subject="Ida")
    memory.remember("after it", subject="Ida")
    assert [r.text for r in memory.list(subject="Ida")] == ["a note", "after it"]


def test_two_threads_collecting_entries_lose_none(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread's block collecting a handle's entries keeps the handle: two threads' blocks
    ending out of order left every later call's entry in a batch no one wrote."""
    monkeypatch.setattr(memory_module, "BUSY_TIMEOUT_MS", 50)
    with (
        _held_by_another_thread(memory.audit_batch().collecting),
        pytest.raises(StoreBusyError, match="in use by another thread"),
    ):
        memory.audit_batch().collecting().__enter__()
    size = memory.backend.log_size()
    memory.remember("a note", subject="Ida")
    assert memory._shared.deferred is None and memory.backend.log_size() > size


def test_a_stream_reads_in_the_handles_turn(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing is read after its call returned: each step reads the connection, and so
    waits for another thread's turn (a write group's here) as a call would."""
    monkeypatch.setattr(memory_module, "BUSY_TIMEOUT_MS", 50)
    memory.remember_many(NewMemory(f"note {i}", subject="Joe") for i in range(3))
    stream = memory.list(subject="Joe")
    group = memory.write_group()
    begun, stepped = threading.Event(), threading.Event()

    def hold_the_turn() -> None:
        group.begin()
        begun.set()
        stepped.wait()
        group.rollback()

    holder = threading.Thread(target=hold_the_turn)
    holder.start()
    begun.wait()
    with pytest.raises(StoreBusyError, match="in use by another thread"):
        next(stream)
    stepped.set()
    holder.join()
    assert list(stream) == []  # a stream that raised has ended, as any generator
    assert [r.text for r in memory.list(subject="Joe")] == ["note 0", "note 1", "note 2"]
