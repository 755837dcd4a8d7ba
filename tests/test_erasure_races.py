"""Erasure under concurrency and crashes (found in review): nothing half-done, no
record written under a key about to be destroyed, no leftover -wal, honest counts."""

from __future__ import annotations

import io
import multiprocessing
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from multiprocessing.synchronize import Barrier
from pathlib import Path

import apsw
import pytest

from deleatur import KeyStoreError, Memory, Space, from_bytes
from deleatur.erasure.engine import RequestIdReusedError
from deleatur.erasure.requests import RequestStatus
from deleatur.erasure.verify import verify_certificate
from deleatur.store.protocol import WAL_NOT_TRUNCATED

from .conftest import MASTER, FakeClock, store_files

BASIS = "Art. 17(1)(a)"


@contextmanager
def _write_locked(path: Path) -> Iterator[None]:
    """Another connection holding the write lock of the SQLite file at ``path``."""
    holder = apsw.Connection(str(path))
    holder.execute("BEGIN IMMEDIATE").fetchall()
    try:
        yield
    finally:
        holder.execute("ROLLBACK").fetchall()
        holder.close()


def _erase_worker(store: str, barrier: Barrier, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    with Memory.open(store, from_bytes(MASTER)) as memory:
        barrier.wait()
        result = memory.erase("Alice", request_id="DSAR-1", basis=BASIS, requester="agent")
        queue.put((result.repeated, result.request.counts["records"] if result.request else -1))


def test_two_processes_with_one_request_id_erase_once(memory: Memory, store_path: Path) -> None:
    for i in range(5):
        memory.remember(f"a{i}", subject="Alice")
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_erase_worker, args=(str(store_path), barrier, queue)) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    outcomes = sorted(queue.get(timeout=10) for _ in range(2))
    assert outcomes == [(False, 5), (True, 5)]
    request = memory.erasure_request("DSAR-1")
    assert request.status is RequestStatus.COMPLETE
    assert len(request.record_ids) == 5
    assert len(request.tombstones) == 5
    assert memory.certificate("DSAR-1")["certificate"]["erasure"]["records"] == 5


class _PausingClock(FakeClock):
    """A handle's clock whose next reading, once paused, waits for ``resume`` (in its
    caller's thread): an erasure stopped between its time of receipt and the write lock."""

    def __init__(self, start: int) -> None:
        super().__init__(start)
        self.paused, self._resumed = threading.Event(), threading.Event()
        self._pausing = False

    def pause_next(self) -> None:
        self._pausing = True

    def resume(self) -> None:
        self._resumed.set()

    def __call__(self) -> int:
        if self._pausing:
            self._pausing = False
            self.paused.set()
            assert self._resumed.wait(timeout=60)
        return self.now


def test_a_page_read_between_two_erasures_commits_misses_neither(
    memory: Memory, store_path: Path, clock: FakeClock
) -> None:
    """An erasure takes its time of receipt before it waits for the write lock, so the one
    received first can commit second. A pager that read its page between the two commits
    must find that one after its cursor: the list follows the order of commits."""
    early, late = _PausingClock(clock.now), FakeClock(clock.now + 1_000_000)
    with (
        Memory.open(store_path, from_bytes(MASTER), clock=early) as first,
        Memory.open(store_path, from_bytes(MASTER), clock=late) as second,
        ThreadPoolExecutor(1) as pool,
    ):
        early.pause_next()
        erasing = pool.submit(first.erase, "Ann", request_id="FIRST", basis=BASIS, requester="dpo")
        try:
            assert early.paused.wait(timeout=60)  # FIRST is received, and waits
            second.erase("Bob", request_id="SECOND", basis=BASIS, requester="dpo")
            page = memory.erasure_requests(limit=100)
        finally:
            early.resume()
        erasing.result(timeout=60)
    assert [r.id for r in page] == ["SECOND"]
    assert [r.id for r in memory.erasure_requests(after=page[-1].id)] == ["FIRST"]
    assert memory.erasure_request("FIRST").received_at < memory.erasure_request("SECOND").received_at


def test_a_request_id_cannot_be_reused_for_another_erasure(memory: Memory) -> None:
    memory.remember("a", subject="Alice")
    memory.remember("b", subject="Bob")
    memory.erase("Alice", request_id="DSAR-1", basis=BASIS, requester="dpo")
    with pytest.raises(RequestIdReusedError, match="different erasure"):
        memory.erase("Bob", request_id="DSAR-1", basis=BASIS, requester="dpo")
    assert [r.text for r in memory.list()] == ["b"]


def test_a_write_under_a_key_committed_for_destruction_is_rekeyed(
    memory: Memory, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deleatur.erasure import engine

    memory.remember("old", subject="Alice", space=Space("user1"))
    monkeypatch.setattr(engine, "finish_pending", lambda memory, request: request)
    memory.erase_all(user_id="user1", request_id="ACC-1", basis=BASIS, requester="dpo")
    monkeypatch.undo()
    late = memory.remember("written in the gap", subject="Alice", space=Space("user2"))
    with Memory.open(store_path, from_bytes(MASTER)) as reopened:  # finishes the pending destruction
        assert reopened.get(late.id, space=Space("user2")).text == "written in the gap"
        assert reopened.erasure_request("ACC-1").status is RequestStatus.COMPLETE


def test_a_crash_before_the_keys_go_leaves_no_plaintext_after_reopening(tmp_path: Path) -> None:
    script = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).parent.parent / "src")!r})
from deleatur import Memory, from_bytes
m = Memory.open({str(tmp_path / "m.db")!r}, from_bytes(bytes(range(32))), create=True)
m.new_signing_key()
for i in range(50):
    m.remember(f"qzcrashsecret{{i}} about alice", subject="Alice")
m.keys.destroy_ids = lambda ids: os._exit(9)   # dies right after the store commit
m.erase("Alice", request_id="R1", basis="Art. 17(1)(a)", requester="dpo")
"""
    assert subprocess.run([sys.executable, "-c", script], check=False).returncode == 9
    with Memory.open(tmp_path / "m.db", from_bytes(MASTER)) as memory:
        request = memory.erasure_request("R1")
        assert request.status is RequestStatus.COMPLETE
        assert request.counts["keys_destroyed"] == 1
        assert not memory.keys.has_key(memory.tenant, memory._subject_ref("alice"))
    for path in store_files(tmp_path / "m.db"):
        assert b"qzcrashsecret" not in path.read_bytes(), path


def test_a_crash_between_a_hard_delete_and_its_scrub_is_scrubbed_on_the_next_open(tmp_path: Path) -> None:
    """rectify --erase-previous commits, then dies before truncating the -wal, which still
    holds the earlier values' pages (readable under the subject's live key): the next
    open truncates it, before its first call, not when it closes."""
    script = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).parent.parent / "src")!r})
from deleatur import Memory, from_bytes
m = Memory.open({str(tmp_path / "m.db")!r}, from_bytes(bytes(range(32))), create=True)
m.new_signing_key()
first = m.remember("Alice phone +100", subject="Alice", key="alice::phone")
(row,) = m.backend.rows(m.tenant, [first.id])
open({str(tmp_path / "ciphertext")!r}, "wb").write(row.ciphertext)
m.backend.scrub()
m.backend.scrub = lambda **_: os._exit(9)   # dies right after the commit
m.rectify("alice::phone", "Alice phone +200", reason="wrong", actor="dpo", erase_previous=True)
"""
    assert subprocess.run([sys.executable, "-c", script], check=False).returncode == 9
    ciphertext = (tmp_path / "ciphertext").read_bytes()
    assert any(ciphertext in path.read_bytes() for path in store_files(tmp_path / "m.db"))  # the crash left it
    with Memory.open(tmp_path / "m.db", from_bytes(MASTER)) as memory:
        for path in store_files(tmp_path / "m.db"):
            assert ciphertext not in path.read_bytes(), path
        assert not memory.backend.scrub_pending()
        assert [r.text for r in memory.history("alice::phone")] == ["Alice phone +200"]


def test_a_crash_before_an_account_erasures_scrub_is_scrubbed_on_the_next_open(tmp_path: Path) -> None:
    """The account erasure rewrites rows that named the user (API key scopes, decisions)
    beside the rows it deletes: killed after its keys are gone but before its scrub, the
    next open still scrubs, so the user id is in no byte of any file."""
    script = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).parent.parent / "src")!r})
from deleatur import Memory, Role, Space, from_bytes
m = Memory.open({str(tmp_path / "m.db")!r}, from_bytes(bytes(range(32))), create=True)
m.new_signing_key()
m.create_principal("app", Role.MEMBER, scopes=["cust_qzwombat"])
m.remember("a note", subject="Ann", space=Space("cust_qzwombat"))
m.backend.scrub()
Memory._scrub = lambda self, wait=True: os._exit(9)
m.erase_all(user_id="cust_qzwombat", request_id="ACC-1", basis="Art. 17(1)(a)", requester="dpo")
"""
    assert subprocess.run([sys.executable, "-c", script], check=False).returncode == 9
    with Memory.open(tmp_path / "m.db", from_bytes(MASTER)) as memory:
        assert memory.erasure_request("ACC-1").status is RequestStatus.COMPLETE
        for path in store_files(tmp_path / "m.db"):
            assert b"cust_qzwombat" not in path.read_bytes(), path


def test_opening_a_store_marked_for_a_scrub_does_not_wait_for_a_reader(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that keeps a removal's -wal from being truncated (a long export) must not
    make every open wait out the busy timeout: the open tries once, and the mark stays."""
    from deleatur import sqlitefile

    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.remember("x", subject="a", key="k")
        reader = apsw.Connection(str(store_path), flags=apsw.SQLITE_OPEN_READONLY)
        reader.execute("BEGIN").fetchall()
        reader.execute("SELECT count(*) FROM records").fetchall()
        monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 200)
        memory.rectify("k", "y", reason="wrong", actor="dpo", erase_previous=True)
        assert memory.backend.scrub_pending()
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 600_000)  # a wait would hang the test
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert memory.backend.scrub_pending()
    reader.execute("COMMIT").fetchall()
    reader.close()
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert not memory.backend.scrub_pending()


def test_a_reader_blocking_the_wal_truncation_is_stated(store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deleatur import sqlitefile

    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 100)
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        reader = _erased_behind_a_reader(memory, store_path)
        held = memory.certificate("R1")["certificate"]
        assert held["erasure"]["wal_truncated"] is False
        assert any("write-ahead log" in line for line in held["scope_statement"]["does_not_cover"])
        reader.execute("COMMIT").fetchall()
        reader.close()
        issued = memory.certificate("R1")["certificate"]
        assert issued["erasure"]["wal_truncated"] is True
    for path in store_files(store_path):
        assert b"qzwalsecret" not in path.read_bytes(), path


def _erased_behind_a_reader(memory: Memory, store_path: Path) -> apsw.Connection:
    """Alice erased (request R1) while a reader holds a snapshot: its -wal is not truncated."""
    memory.new_signing_key()
    memory.remember("before", subject="Bob")
    reader = apsw.Connection(str(store_path), flags=apsw.SQLITE_OPEN_READONLY)
    reader.execute("BEGIN").fetchall()
    reader.execute("SELECT count(*) FROM records").fetchall()  # an open read snapshot
    memory.remember("qzwalsecret", subject="Alice")
    request = memory.erase("Alice", request_id="R1", basis=BASIS, requester="dpo").request
    assert request is not None and request.counts[WAL_NOT_TRUNCATED] == 1
    return reader


def test_a_certificate_says_of_the_wal_what_its_request_says(store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that ends while the certificate is being made: the -wal was not truncated
    when the request was settled, and the certificate said so in its request's counts
    while claiming the -wal truncated, from a second try. One try, and one fact."""
    from deleatur import sqlitefile

    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 100)
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        reader = _erased_behind_a_reader(memory, store_path)
        reader.execute("COMMIT").fetchall()
        reader.close()
        real, tries = memory._truncate_wals, []

        def held_through_the_first_try(*, wait: bool = True) -> bool:
            tries.append(wait)
            return len(tries) > 1 and real(wait=wait)

        monkeypatch.setattr(memory, "_truncate_wals", held_through_the_first_try)
        held = memory.certificate("R1")["certificate"]
        assert len(tries) == 1  # one wait for the reader, not one more before signing
        stored = memory.erasure_requests()[0].counts
        assert held["erasure"]["wal_truncated"] is False and held["request"]["counts"] == stored
        assert stored[WAL_NOT_TRUNCATED] == 1
        issued = memory.certificate("R1")
        assert issued["certificate"]["erasure"]["wal_truncated"] is True
        assert WAL_NOT_TRUNCATED not in issued["certificate"]["request"]["counts"]
        assert verify_certificate(issued, expected_key=memory.public_key()).ok


def test_a_later_scrub_clears_what_the_request_said_of_the_wal(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever truncates the -wal once the reader is gone (here, another process opening
    the store) updates the request: its listing no longer says the -wal was kept."""
    from deleatur import sqlitefile

    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 100)
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        reader = _erased_behind_a_reader(memory, store_path)
        Memory.open(store_path, from_bytes(MASTER)).close()  # cannot truncate it yet
        assert memory.erasure_requests()[0].counts[WAL_NOT_TRUNCATED] == 1
        reader.execute("COMMIT").fetchall()
        reader.close()
        Memory.open(store_path, from_bytes(MASTER)).close()
        assert WAL_NOT_TRUNCATED not in memory.erasure_requests()[0].counts
        assert not memory.backend.scrub_pending()


def test_a_scrub_keeps_the_mark_of_a_removal_committed_after_it_truncated(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """That removal's pages may be in the -wal the scrub truncated before they came."""
    from deleatur import sqlitefile
    from deleatur.store import sqlite as backend_module

    with (
        Memory.open(store_path, from_bytes(MASTER), create=True) as memory,
        Memory.open(store_path, from_bytes(MASTER)) as other,
    ):
        with memory.backend.atomic():
            memory.backend.scrub_after_commit()
        real = sqlitefile.scrub  # the backend's own name for it is patched
        removals: list[apsw.Connection] = []

        def then_a_removal(conn: apsw.Connection, *, wait: bool = True) -> bool:
            clean = real(conn, wait=wait)
            if not removals:
                removals.append(conn)
                with other.backend.atomic():
                    other.backend.scrub_after_commit()
            return clean

        monkeypatch.setattr(backend_module, "scrub", then_a_removal)
        assert memory.backend.scrub(settled=memory.backend.scrub_mark())
        assert memory.backend.scrub_pending()
        monkeypatch.undo()
        assert memory.backend.scrub(settled=memory.backend.scrub_mark())
        assert not memory.backend.scrub_pending()


def test_a_reader_of_the_key_store_keeps_the_erasure_from_claiming_its_wal_clean(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The destroyed key's page stays in the key store's -wal while a reader holds an
    older snapshot of it: the request and certificate say so, and the next status read
    empties it, so no byte of the destroyed key is left in the key store's files."""
    from deleatur import sqlitefile

    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 100)
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        memory.remember("qzkeysecret", subject="Alice")
        ref = memory._subject_ref("alice")
        ((wrapped,),) = memory.keys._conn.execute("SELECT wrapped FROM data_keys WHERE subject_ref = ?", (ref,))
        assert isinstance(wrapped, bytes)
        reader = apsw.Connection(str(memory.keys.path), flags=apsw.SQLITE_OPEN_READONLY)
        reader.execute("BEGIN").fetchall()
        reader.execute("SELECT count(*) FROM data_keys").fetchall()  # an open read snapshot
        request = memory.erase("Alice", request_id="R1", basis=BASIS, requester="dpo").request
        assert request is not None and request.counts["wal_not_truncated"] == 1
        assert memory.certificate("R1")["certificate"]["erasure"]["wal_truncated"] is False
        reader.execute("COMMIT").fetchall()
        reader.close()
        assert "wal_not_truncated" not in memory.erasure_request("R1").counts
        assert memory.certificate("R1")["certificate"]["erasure"]["wal_truncated"] is True
        for path in store_files(memory.keys.path):
            assert wrapped not in path.read_bytes(), path


def test_a_key_destroyed_through_another_handle_is_not_used_from_a_cache(store_path: Path) -> None:
    """A server's handle keeps unwrapped keys in memory; an erasure through another handle
    (a CLI, another worker) must reach them: after it, no call through the server's handle
    decrypts with the destroyed key or names the erased subject."""
    with (
        Memory.open(store_path, from_bytes(MASTER), create=True) as memory,
        Memory.open(store_path, from_bytes(MASTER)) as server,
    ):
        memory.new_signing_key()
        record = memory.remember("Ottoline's secret", subject="Ottoline Vexby")
        server.remember("Bob's note", subject="Bob")
        (row,) = memory.backend.rows(memory.tenant, [record.id])
        assert server.get(record.id).text == "Ottoline's secret"  # the key is cached in the server
        server.export_json(io.StringIO(), subject="Ottoline Vexby")  # an audit entry sealing the name
        assert "ottoline vexby" in {e.subject for e in server.audit_entries()}
        memory.erase("Ottoline Vexby", request_id="R1", basis=BASIS, requester="dpo")
        assert "ottoline vexby" not in {e.subject for e in server.audit_entries()}
        with pytest.raises(KeyStoreError):
            server.keys.key_by_id(row.key_id)  # as a copy of the database taken before would need
        assert server.recall("note")[0].record.text == "Bob's note"  # other keys still serve


def test_a_writer_never_takes_a_newer_key_that_an_erasure_is_yet_to_destroy(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer reads the subject's key K1, then waits for the lock; meanwhile K1 is
    erased, a new record brings K2, and a second erasure commits with K2 pending. Under
    the lock the writer must not fall back on K2: its record would outlive its key, and
    no later erasure of the subject could read (and so erase) it."""
    from deleatur.erasure import engine

    with Memory.open(store_path, from_bytes(MASTER), create=True) as other:
        other.new_signing_key()
        other.remember("Alice's first note", subject="Alice")
    writer = Memory.open(store_path, from_bytes(MASTER))
    other = Memory.open(store_path, from_bytes(MASTER))
    real_settle = engine.settle

    def meanwhile(subject_refs: dict[str, bytes]) -> object:
        keys = Memory._data_keys(writer, subject_refs)  # the writer has read K1, and holds no lock
        other.erase("Alice", request_id="R1", basis=BASIS, requester="dpo")
        other.remember("Alice's second note", subject="Alice")  # K2
        monkeypatch.setattr(engine, "settle", lambda memory, request: request)  # R2 stops before its keys
        other.erase("Alice", request_id="R2", basis=BASIS, requester="dpo")
        monkeypatch.setattr(engine, "settle", real_settle)
        return keys

    monkeypatch.setattr(writer, "_data_keys", meanwhile)
    record = writer.remember("Alice's third note", subject="Alice")
    other.close()
    writer.close()
    with Memory.open(store_path, from_bytes(MASTER)) as memory:  # finishes R2
        assert memory.erasure_request("R2").status is RequestStatus.COMPLETE
        assert memory.get(record.id).text == "Alice's third note"
        done = memory.erase("Alice", request_id="R3", basis=BASIS, requester="dpo").request
        assert done is not None and done.counts["records"] == 1


def test_a_restriction_is_never_sealed_under_a_key_an_erasure_is_yet_to_destroy(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deleatur.erasure import engine

    memory.remember("Alice's note", subject="Alice")
    monkeypatch.setattr(engine, "settle", lambda memory, request: request)  # committed, keys pending
    memory.erase("Alice", request_id="R1", basis=BASIS, requester="dpo")
    monkeypatch.undo()
    restriction = memory.restrict("Alice", reason="contested accuracy", actor="dpo")
    engine.finish_all_pending(memory)
    assert memory.erasure_request("R1").status is RequestStatus.COMPLETE
    assert [r.reason for r in memory.restrictions()] == ["contested accuracy"]  # still readable
    assert restriction.subject == memory.restrictions()[0].subject


def test_a_missing_signing_key_stops_writes_not_reads(memory: Memory, store_path: Path) -> None:
    record = memory.remember("x", subject="a")
    saved = memory.signing_key_path.read_bytes()
    os.unlink(memory.signing_key_path)
    with Memory.open(store_path, from_bytes(MASTER)) as reopened:
        assert reopened.get(record.id).text == "x"
        # The read is audited all the same; its entry waits, uncovered, for the key.
        report = reopened.verify_log()
        assert [c.name for c in report.checks if c.passed is False] == ["coverage"]
        with pytest.raises(KeyStoreError, match=r"signing key .* is missing"):
            reopened.remember("y", subject="a")
        with pytest.raises(KeyStoreError):
            reopened.erase("a", request_id="R1", basis=BASIS, requester="dpo")
    memory.signing_key_path.write_bytes(saved)
    memory.signing_key_path.chmod(0o600)  # restored as a backup holds it: owner-only
    with Memory.open(store_path, from_bytes(MASTER)) as restored:
        restored.checkpoint()
        assert restored.verify_log().ok


def test_a_key_rotated_by_another_process_is_the_one_a_running_handle_signs_with(store_path: Path) -> None:
    """`keys rotate` beside a running server: the server's handles, which read the key
    when they opened, must sign with the new one, or the log holds checkpoints that the
    key current at their size did not sign, and fails verification for good."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as made:
        made.new_signing_key()
    with Memory.open(store_path, from_bytes(MASTER)) as server, Memory.open(store_path, from_bytes(MASTER)) as cli:
        server.remember("before the rotation", subject="Ann")
        server.checkpoint()
        old = server.public_key()
        new = cli.rotate_signing_key()
        assert server.public_key().vkey == new.verifier.vkey != old.vkey
        server.remember("Ann's note", subject="Ann")
        server.checkpoint()  # a checkpoint asked for, as a receipt or `close` asks for one
        server.erase("Ann", request_id="R1", basis=BASIS, requester="dpo")  # signs its checkpoint
        report = server.verify_log()
        assert report.ok, report
        certificate = server.certificate("R1")
        assert verify_certificate(certificate, expected_key=new.verifier).ok
        assert certificate["certificate"]["public_key"] == new.verifier.vkey
        newer = server.rotate_signing_key()  # endorsed by the key current now, not the one it opened with
        cli.remember("after the second rotation", subject="Bo")  # the CLI's handle takes it up too
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        report = memory.verify_log()
        assert report.ok, report
        assert memory.public_key().vkey == newer.verifier.vkey


def test_a_rotation_waiting_for_the_lock_keeps_its_new_key_when_another_process_opens(store_path: Path) -> None:
    """Until the rotation commits, its new key is an unannounced pending file: another
    process opening the store must leave it, or the rotation logs a key nobody holds."""
    from deleatur.crypto.signing import pending_path, write_signer
    from deleatur.log.note import Signer

    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        pending = pending_path(memory.signing_key_path)
        write_signer(pending, Signer.generate(memory.log.origin))  # written, lock not yet taken
    with Memory.open(store_path, from_bytes(MASTER)) as other:
        other.remember("meanwhile", subject="a")
    assert pending.exists()


def test_a_write_lock_held_past_the_busy_timeout_is_a_clear_503_not_an_internal_error(
    memory: Memory, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deleatur import StoreBusyError, sqlitefile
    from deleatur.servers.errors import error_info

    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 100)
    with _write_locked(store_path), pytest.raises(StoreBusyError, match="nothing was changed") as busy:
        memory.remember("waits", subject="a")  # a long maintenance job holds the lock elsewhere
    info = error_info(busy.value)
    assert (info.status, info.code, busy.value.exit_code) == (503, "store_busy", 1)
    assert [r.text for r in memory.list()] == []
    assert memory.remember("then goes through", subject="a").text == "then goes through"
    # A retry of a complete erasure that meets a busy store leaves the request as it was.
    memory.erase("a", request_id="R1", basis=BASIS, requester="dpo")
    with _write_locked(store_path), pytest.raises(StoreBusyError):
        memory.erase("a", request_id="R1", basis=BASIS, requester="dpo")
    done = memory.erasure_request("R1")
    assert done.status is RequestStatus.COMPLETE and done.counts["records"] == 1


def test_a_key_store_held_past_the_busy_timeout_is_named_as_such(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deleatur import KeyStoreBusyError, sqlitefile
    from deleatur.servers.errors import error_info

    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 100)
    with _write_locked(memory.keys.path), pytest.raises(KeyStoreBusyError, match="no key was made") as busy:
        memory.remember("about someone new", subject="Newcomer")
    assert (error_info(busy.value).status, error_info(busy.value).code) == (503, "key_store_busy")
    assert list(memory.list()) == []


def test_a_first_try_refuses_a_held_lock_soon_and_changes_nothing(
    memory: Memory, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deleatur import KeyStoreBusyError, StoreBusyError, sqlitefile

    memory.remember("known", subject="a")
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 600_000)  # a wait would hang the test
    with _write_locked(store_path), sqlitefile.first_try() as attempt:
        with pytest.raises(StoreBusyError, match=r"holds the write lock.*nothing was changed"):
            memory.remember("refused", subject="a")
        assert attempt.refused and not attempt.committed
    with _write_locked(store_path), sqlitefile.first_try() as attempt:
        # A new subject's data key commits first; a retry would find it and use it.
        with pytest.raises(StoreBusyError, match="holds the write lock"):
            memory.remember("refused", subject="Someone new")
        assert attempt.refused
    with _write_locked(memory.keys.path), sqlitefile.first_try() as attempt:
        with pytest.raises(KeyStoreBusyError, match="no key was made"):
            memory.remember("refused too", subject="Another newcomer")
        assert attempt.refused
    assert [r.text for r in memory.list()] == ["known"]


def test_a_first_try_that_has_committed_waits_for_a_later_lock(
    memory: Memory, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half a call is never abandoned for a retry: once the attempt committed, the lock
    is waited for as usual (here until the shortened busy timeout)."""
    from deleatur import StoreBusyError, sqlitefile

    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 100)
    with sqlitefile.first_try() as attempt:
        memory.remember("first half", subject="a")
        assert attempt.committed
        with _write_locked(store_path), pytest.raises(StoreBusyError, match=r"held for over 0\.1 s"):
            memory.remember("second half", subject="a")
        assert not attempt.refused
    with _write_locked(store_path), pytest.raises(StoreBusyError, match=r"held for over 0\.1 s"):
        memory.remember("outside any attempt", subject="a")  # waits, as before


def test_a_first_try_leaves_a_dead_erasures_keys_to_a_call_that_may_wait(
    memory: Memory, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An erasure died before destroying its keys; a write of its subject must destroy
    them first, and truncate the key store's -wal, which may wait for a reader: a first
    try refuses that work, changing nothing, so a server does it off its event loop."""
    from deleatur import StoreBusyError, sqlitefile
    from deleatur.erasure import engine

    memory.remember("Alice's old phone", subject="Alice")
    monkeypatch.setattr(engine, "finish_pending", lambda memory, request: request)  # the process dies here
    request = memory.erase("Alice", request_id="R1", basis=BASIS, requester="dpo").request
    assert request is not None and request.status is RequestStatus.KEYS_PENDING
    monkeypatch.undo()
    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 600_000)  # a wait would hang the test
    ref = memory._subject_ref("alice")
    with sqlitefile.first_try() as attempt:
        with pytest.raises(StoreBusyError, match="destroying data keys may wait"):
            memory.remember("Alice's new phone", subject="Alice")
        assert attempt.refused and attempt.patient and not attempt.committed
    assert memory.keys.has_key(memory.tenant, ref) and list(memory.list()) == []
    memory.remember("Alice's new phone", subject="Alice")  # where it may wait
    assert [r.text for r in memory.list()] == ["Alice's new phone"]
    assert memory.erasure_request("R1").status is RequestStatus.COMPLETE


def test_an_erasure_whose_scrub_never_ran_gets_no_certificate_claiming_a_clean_wal(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request is recorded complete before the -wal is truncated: a process that dies
    in between, while a reader holds the -wal, left a request that says nothing of it. Its
    certificate, issued meanwhile by another handle, must not take that for a clean -wal."""
    from deleatur import sqlitefile

    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 100)  # the reader stays till told
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        memory.remember("qzneverscrubbed", subject="Alice")
    dying = Memory.open(store_path, from_bytes(MASTER))
    reader = apsw.Connection(str(store_path))
    reader.execute("BEGIN").fetchall()
    reader.execute("SELECT count(*) FROM meta").fetchall()  # an open read snapshot

    class Died(BaseException):
        pass

    def die(*, wait: bool = True) -> bool:
        raise Died

    monkeypatch.setattr(dying, "_scrub", die)
    with pytest.raises(Died):
        dying.erase("Alice", request_id="R1", basis=BASIS, requester="dpo")
    with Memory.open(store_path, from_bytes(MASTER)) as after:
        assert after.certificate("R1")["certificate"]["erasure"]["wal_truncated"] is False
        assert after.erasure_request("R1").counts[WAL_NOT_TRUNCATED] == 1
        reader.execute("COMMIT").fetchall()
        reader.close()
        assert after.certificate("R1")["certificate"]["erasure"]["wal_truncated"] is True
        assert WAL_NOT_TRUNCATED not in after.erasure_request("R1").counts
    assert not any(b"qzneverscrubbed" in path.read_bytes() for path in store_files(store_path))


def test_a_scrub_clears_no_mark_of_keys_destroyed_after_it_truncated_the_key_store(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One handle truncates the key store's -wal; then another erases, and a reader of
    the key store keeps the destroyed key in its -wal. The first handle's scrub goes on to
    the store's -wal: it must leave the erasure's mark and its request's flag."""
    from deleatur.sqlitefile import scrubs_unwaited_during

    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
    with (
        Memory.open(store_path, from_bytes(MASTER)) as memory,
        Memory.open(store_path, from_bytes(MASTER)) as other,
    ):
        memory.remember("about Alice", subject="Alice")
        readers: list[apsw.Connection] = []
        truncate_keys = other.keys.scrub

        def then_an_erasure(*, wait: bool = True) -> bool:
            clean = truncate_keys(wait=wait)
            reader = apsw.Connection(str(memory.keys.path))
            reader.execute("BEGIN").fetchall()
            reader.execute("SELECT count(*) FROM sqlite_master").fetchall()
            readers.append(reader)
            with scrubs_unwaited_during(lambda: True):  # as a server does while an export reads
                memory.erase("Alice", request_id="R1", basis=BASIS, requester="dpo")
            return clean

        monkeypatch.setattr(other.keys, "scrub", then_an_erasure)
        other._scrub()
        monkeypatch.undo()
        assert other.backend.scrub_pending()
        with scrubs_unwaited_during(lambda: True):  # the reader stays till told
            assert other.erasure_request("R1").counts[WAL_NOT_TRUNCATED] == 1
            assert other.certificate("R1")["certificate"]["erasure"]["wal_truncated"] is False
        readers[0].execute("COMMIT").fetchall()
        readers[0].close()
        assert other.certificate("R1")["certificate"]["erasure"]["wal_truncated"] is True
        assert not other.backend.scrub_pending()
