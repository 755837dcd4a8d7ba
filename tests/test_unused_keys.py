"""Data keys made for writes whose records never committed: a key is made in the key
store before the records commit in the database, so a crash or a refusal in between
leaves a key about a subject the store holds nothing on. Such keys are destroyed, and
never one a concurrent writer is about to commit under."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from multiprocessing.synchronize import Barrier
from pathlib import Path

import apsw
import pytest

from deleatur import Memory, from_bytes
from deleatur.erasure.engine import collect_unused_keys
from deleatur.rights.restriction import RestrictedSubjectError

from .conftest import MASTER, store_files

BASIS = "Art. 17(1)(a)"
SRC = str(Path(__file__).parent.parent / "src")


def _key_rows(memory_or_path: Memory | Path) -> dict[bytes, bytes]:
    """Every data key in the key store, as key id: wrapped key."""
    if isinstance(memory_or_path, Memory):
        rows = memory_or_path.keys._conn.execute("SELECT key_id, wrapped FROM data_keys")
        return {bytes(k): bytes(w) for k, w in rows}
    conn = apsw.Connection(str(memory_or_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return {bytes(k): bytes(w) for k, w in conn.execute("SELECT key_id, wrapped FROM data_keys")}
    finally:
        conn.close()


def _marks(memory: Memory) -> int:
    """How many keys are marked unconfirmed."""
    ((count,),) = memory.keys._conn.execute("SELECT count(*) FROM unconfirmed_keys").fetchall()
    assert isinstance(count, int)
    return count


def _has_key(memory: Memory, subject: str) -> bool:
    return memory.keys.has_key(memory.tenant, memory._subject_ref(subject))


def _killed_writing(store: Path, subject: str) -> subprocess.CompletedProcess[bytes]:
    """A process that makes ``subject``'s data key, and is killed (SIGKILL) inside the
    database transaction that would have committed its record."""
    script = f"""
import os, signal, sys
sys.path.insert(0, {SRC!r})
from deleatur import Memory, from_bytes
m = Memory.open({str(store)!r}, from_bytes({MASTER!r}))
m.backend.insert_many = lambda rows: os.kill(os.getpid(), signal.SIGKILL)
m.remember("qzorphannote", subject={subject!r})
"""
    return subprocess.run([sys.executable, "-c", script], check=False)


def test_a_writer_killed_between_the_two_commits_leaves_no_key_once_the_store_is_opened(store_path: Path) -> None:
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        kept = memory.remember("Bob's note", subject="Bob")
    before = _key_rows(Path(f"{store_path}.keys"))
    assert _killed_writing(store_path, "Zed Orphan").returncode == -signal.SIGKILL
    left = {k: w for k, w in _key_rows(Path(f"{store_path}.keys")).items() if k not in before}
    assert len(left) == 1  # the crash left Zed's key, and no record under it
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert not _has_key(memory, "zed orphan")
        assert _key_rows(memory) == before
        assert _marks(memory) == 0
        assert memory.get(kept.id).text == "Bob's note"
        assert list(memory.list(subject="zed orphan")) == []
        plan = memory.erase("Zed Orphan", request_id="R1", basis=BASIS, requester="dpo", dry_run=True).plan
        assert plan is not None and plan.keys_destroyed == 0
    (wrapped,) = left.values()
    for path in store_files(store_path):
        assert wrapped not in path.read_bytes(), path  # nor in the key store's -wal


def test_a_write_refused_under_the_lock_leaves_no_key(memory: Memory) -> None:
    """The write's own subject may be written, but the value it would supersede is a
    restricted subject's: refused once the new subject's key exists."""
    memory.remember("Alice's desk", subject="Alice", key="desk")
    memory.restrict("Alice", reason="accuracy contested", actor="dpo")
    before = _key_rows(memory)
    with pytest.raises(RestrictedSubjectError):
        memory.remember("Zed's desk", subject="Zed", key="desk")
    assert not _has_key(memory, "zed")
    assert _key_rows(memory) == before
    assert not memory.keys.unsettled


def test_what_is_in_use_keeps_its_key(store_path: Path) -> None:
    """A subject with records, a restricted subject without any (its reason is sealed under
    its key), and a tenant's key for decision summaries (a reference that names no one)."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        first = memory.remember("Ann's note", subject="Ann")
        assert _marks(memory) == 1  # dropped in this handle's next write to the key store
        memory.remember("Bo's note", subject="Bo")
        assert _marks(memory) == 1
        memory.restrict("Cy", reason="contested", actor="dpo")
        decision = memory.record_decision("approved", used=[first.id])
        assert _marks(memory) == 0  # a call's keys left unused by its records are checked as it ends
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert _marks(memory) == 0
        assert [r.text for r in memory.list()] == ["Ann's note", "Bo's note"]
        assert [r.reason for r in memory.restrictions()] == ["contested"]
        assert memory.explain_decision(decision.id).body["summary"] == "approved"
        assert len(_key_rows(memory)) == 4


def test_lifting_the_restriction_of_a_subject_with_nothing_stored_leaves_no_key(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restricting someone the store holds nothing on makes their key (the reason is sealed
    under it); lifting it left that key, and its blind reference, until an erasure."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        memory.remember("Ann's note", subject="Ann")
        before = _key_rows(memory)
        memory.restrict("Ghost Person", reason="contested", actor="dpo")
        assert len(_key_rows(memory)) == len(before) + 1  # needed while it lasts
        with pytest.raises(RestrictedSubjectError):
            memory.remember("a note", subject="ghost person")
        memory.unrestrict("Ghost Person", actor="dpo")
        assert _key_rows(memory) == before and _marks(memory) == 0
        # A subject with records keeps its key, and so does one written to while restricted.
        memory.restrict("Ann", reason="contested", actor="dpo")
        memory.unrestrict("Ann", actor="dpo")
        memory.restrict("Gus", reason="contested", actor="dpo")
        memory.remember("Gus's claim", subject="Gus", for_legal_claim=True)
        memory.unrestrict("Gus", actor="dpo")
        assert len(_key_rows(memory)) == len(before) + 1 and _has_key(memory, "gus")
        assert sorted(r.text for r in memory.list()) == ["Ann's note", "Gus's claim"]
        # Cut off before the call's end collects it, the key goes when the store is next opened.
        memory.restrict("Hal", reason="contested", actor="dpo")
        with monkeypatch.context() as patched:
            patched.setattr("deleatur.memory.collect_unused_keys", lambda *args: 0)
            memory.unrestrict("Hal", actor="dpo")
        assert _has_key(memory, "hal") and _marks(memory) == 1
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert not _has_key(memory, "hal") and _marks(memory) == 0
        assert len(_key_rows(memory)) == len(before) + 1
        assert memory.restrictions() == []
        assert memory.verify_log().ok


def test_lifting_a_restriction_killed_after_it_committed_leaves_no_key_once_the_store_is_opened(
    store_path: Path,
) -> None:
    """The restriction goes in the store's commit, the key's mark in the key store's: a
    process killed between the two left the key of someone the store holds nothing on,
    for good, and its audit entries went on naming them."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        memory.restrict("Ghost Person", reason="contested", actor="dpo")
        assert _has_key(memory, "ghost person")
    script = f"""
import contextlib, os, sys
sys.path.insert(0, {SRC!r})
from deleatur import Memory, from_bytes
m = Memory.open({str(store_path)!r}, from_bytes({MASTER!r}))
logged = Memory._logged

@contextlib.contextmanager
def killed_once_committed(self, *args, **kwargs):
    with logged(self, *args, **kwargs) as events:
        yield events
    os._exit(9)

Memory._logged = killed_once_committed
m.unrestrict("Ghost Person", actor="dpo")
"""
    assert subprocess.run([sys.executable, "-c", script], check=False).returncode == 9
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert memory.restrictions() == []
        assert not _has_key(memory, "ghost person") and _marks(memory) == 0
        lifted = [a for a in memory.audit_entries() if a.entry.type.value == "unrestrict"]
        assert len(lifted) == 1 and lifted[0].subject is None  # its pseudonym names no one now
        assert memory.verify_log().ok


@pytest.mark.parametrize("stops", [None, "before destroying", "before unlisting"])
def test_a_collection_never_takes_the_key_of_a_write_in_flight(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, stops: str | None
) -> None:
    """A writer makes Zed's key K and, before it takes the lock, another handle finds K
    with nothing under it and collects it (and may die part way). The writer must not
    commit under K: its record would be unreadable. ``stops``: where the collection dies."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
    writer = Memory.open(store_path, from_bytes(MASTER))
    collector = Memory.open(store_path, from_bytes(MASTER))
    destroy = collector.keys.destroy_ids
    made: list[bytes] = []

    def dying_destroy(key_ids: Iterable[bytes], *, wait: bool = True) -> int:
        if stops == "before destroying":
            raise RuntimeError("killed")
        destroy(key_ids, wait=wait)
        raise RuntimeError("killed")

    def meanwhile(subject_refs: dict[str, bytes]) -> object:
        keys = Memory._data_keys(writer, subject_refs)  # K, made; the writer holds no lock
        made.extend(key_id for _, key_id, _ in keys.values())
        if stops is None:
            assert collect_unused_keys(collector) == 1
        else:
            monkeypatch.setattr(collector.keys, "destroy_ids", dying_destroy)
            with pytest.raises(RuntimeError, match="killed"):
                collect_unused_keys(collector)
            assert collector.backend.collecting_keys() == made  # committed for destruction
        return keys

    monkeypatch.setattr(writer, "_data_keys", meanwhile)
    record = writer.remember("Zed's note", subject="Zed")
    collector.close()
    writer.close()
    with Memory.open(store_path, from_bytes(MASTER)) as memory:  # finishes what the collection left
        assert memory.get(record.id).text == "Zed's note"
        assert memory.backend.collecting_keys() == []
        assert not memory.keys.has_key_id(made[0])
        assert _marks(memory) == 0
        assert len(_key_rows(memory)) == 1  # Zed's new key


def test_a_key_store_of_the_previous_release_gains_its_marks(store_path: Path) -> None:
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        kept = memory.remember("written before", subject="Ann")
    conn = apsw.Connection(f"{store_path}.keys")  # as the release before left it
    conn.execute("DROP TABLE unconfirmed_keys")
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert memory.keys._conn.execute("PRAGMA user_version").fetchall() == [(2,)]
        assert memory.get(kept.id).text == "written before"
        memory.remember("written after", subject="Bo")
        assert _marks(memory) == 1
        # The older release, still running, destroys Bo's key (an erasure) and not its mark.
        memory.keys._conn.execute("DELETE FROM data_keys WHERE subject_ref = ?", (memory._subject_ref("bo"),))
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert _marks(memory) == 0  # the mark of a key that is gone goes too
        assert memory.get(kept.id).text == "written before"


SUBJECTS = 60


def _writer(store: str, name: str, barrier: Barrier) -> None:
    with Memory.open(store, from_bytes(MASTER)) as memory:
        barrier.wait()
        for i in range(SUBJECTS):
            # New subjects, each its own key; shared ones race the other writer to make theirs.
            memory.remember(f"{name} note {i}", subject=f"{name} person {i}" if i % 2 else f"shared {i}")


def _collector(store: str, barrier: Barrier) -> None:
    with Memory.open(store, from_bytes(MASTER)) as memory:
        barrier.wait()
        for i in range(4 * SUBJECTS):
            collect_unused_keys(memory)
            if i % 20 == 0:
                Memory.open(store, from_bytes(MASTER)).close()  # opening collects too


def _crasher(store: str, barrier: Barrier) -> None:
    memory = Memory.open(store, from_bytes(MASTER))
    barrier.wait()
    memory.remember("before the crash", subject="Crash Survivor")
    memory.backend.insert_many = lambda rows: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore[method-assign]
    memory.remember("never committed", subject="Crash Orphan")


def test_writers_racing_collections_and_a_crash_lose_nothing(store_path: Path) -> None:
    """Real processes: two writers making new keys, one process collecting unused keys
    over and over, one killed between its key and its records. Every record stays
    readable, and once the store is opened no key is left without its records."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [
        ctx.Process(target=_writer, args=(str(store_path), "p1", barrier)),
        ctx.Process(target=_writer, args=(str(store_path), "p2", barrier)),
        ctx.Process(target=_collector, args=(str(store_path), barrier)),
        ctx.Process(target=_crasher, args=(str(store_path), barrier)),
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, -signal.SIGKILL]
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        texts = sorted(r.text for r in memory.list(include_history=True))  # each decrypted
        expected = [f"{name} note {i}" for name in ("p1", "p2") for i in range(SUBJECTS)] + ["before the crash"]
        assert texts == sorted(expected)
        subjects = {r.subject for r in memory.list(include_history=True)}
        assert len(_key_rows(memory)) == len(subjects)
        assert not _has_key(memory, "crash orphan")
        assert _marks(memory) == 0
        assert memory.backend.collecting_keys() == []


def test_a_reader_of_the_key_store_cannot_keep_a_collected_key_in_its_wal(store_path: Path) -> None:
    """Unused keys are destroyed without waiting for readers of the key store: one that
    holds a snapshot keeps the key's bytes in the -wal, and the store stays marked until
    a later open (or scrub) truncates it."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        memory.remember("Bob's note", subject="Bob")
    before = _key_rows(Path(f"{store_path}.keys"))
    assert _killed_writing(store_path, "Zed Orphan").returncode == -signal.SIGKILL
    (wrapped,) = [w for k, w in _key_rows(Path(f"{store_path}.keys")).items() if k not in before]
    reader = apsw.Connection(f"{store_path}.keys", flags=apsw.SQLITE_OPEN_READONLY)
    reader.execute("BEGIN").fetchall()
    reader.execute("SELECT count(*) FROM data_keys").fetchall()  # a snapshot from before the collection
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert not _has_key(memory, "zed orphan")
        assert memory.backend.scrub_pending()
    assert wrapped in b"".join(p.read_bytes() for p in store_files(store_path))  # held by the reader
    reader.execute("ROLLBACK").fetchall()
    reader.close()
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert not memory.backend.scrub_pending()
    for path in store_files(store_path):
        assert wrapped not in path.read_bytes(), path
