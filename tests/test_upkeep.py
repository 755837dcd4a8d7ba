"""Upkeep in the background: a server's commits leave copying the -wal into the database
to a thread of their own, rather than each few hundredth commit waiting for it."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import apsw
import pytest

from deleatur import AccessDeniedError, Memory, Role, StoreError, from_bytes, sqlitefile
from deleatur.sqlitefile import WalCopier, connect
from deleatur.store import sqlite as sqlite_store

MARK = 32  # pages: the -wal is copied once a commit leaves it this long
PAGE = 4096


@pytest.fixture
def conn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[apsw.Connection]:
    monkeypatch.setattr(sqlitefile, "WAL_AUTOCHECKPOINT_PAGES", MARK)
    made = connect(tmp_path / "db", create=True)
    made.execute("CREATE TABLE t(x BLOB)")
    yield made
    made.close()


def _commit_pages(conn: apsw.Connection, pages: int) -> None:
    """One transaction that adds about ``pages`` pages to the -wal."""
    with conn:
        for _ in range(pages):
            conn.execute("INSERT INTO t VALUES (?)", (os.urandom(PAGE - 200),))


def _wal_pages(tmp_path: Path) -> int:
    return (tmp_path / "db-wal").stat().st_size // PAGE


def _copier(
    tmp_path: Path,
    conn: apsw.Connection,
    copied: Callable[[], None],
    tidy: Callable[[apsw.Connection], None] | None = None,
) -> WalCopier:
    return WalCopier(tmp_path / "db", conn, tidy=tidy, copied=copied)


def test_commits_past_the_mark_leave_the_copy_to_the_thread(tmp_path: Path, conn: apsw.Connection) -> None:
    # Control: on its own, the connection copies the -wal as it commits, and the -wal
    # begins again, so it never holds much more than one transaction.
    for _ in range(4):
        _commit_pages(conn, 2 * MARK)
    assert _wal_pages(tmp_path) < 4 * MARK

    tried, go_on = threading.Event(), threading.Event()

    def copied() -> None:
        tried.set()
        assert go_on.wait(30)  # the thread copies nothing more until the test says so

    copier = _copier(tmp_path, conn, copied)
    try:
        _commit_pages(conn, 2 * MARK)
        assert tried.wait(30)  # the thread copied (and nothing else did)
        for _ in range(4):
            _commit_pages(conn, 2 * MARK)
        # With the thread held, nothing copied these commits: the -wal grew by all of them.
        assert _wal_pages(tmp_path) >= 4 * 2 * MARK
    finally:
        go_on.set()
        copier.close()


def test_the_thread_copies_and_the_wal_begins_again(tmp_path: Path, conn: apsw.Connection) -> None:
    tried = threading.Event()
    copier = _copier(tmp_path, conn, tried.set)
    try:
        _commit_pages(conn, 4 * MARK)
        assert tried.wait(30)
        _commit_pages(conn, 1)
        # Everything before was copied into the database, so that commit began the -wal
        # again: it is all the -wal holds.
        frames, copied = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
        assert frames < MARK
        assert copied == frames
        assert conn.execute("SELECT count(*) FROM t").fetchall() == [(4 * MARK + 1,)]
    finally:
        copier.close()


def test_closing_stops_the_thread_and_gives_the_commits_their_copies_back(
    tmp_path: Path, conn: apsw.Connection
) -> None:
    copier = _copier(tmp_path, conn, lambda: None)
    thread = copier._thread
    copier.close()
    copier.close()  # closing again does nothing
    assert not thread.is_alive()
    for _ in range(4):
        _commit_pages(conn, 2 * MARK)
    assert _wal_pages(tmp_path) < 4 * MARK  # the connection copies as it commits again


def _copiers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("deleatur -wal copier")]


def test_a_handle_runs_one_copier_until_it_closes(memory: Memory) -> None:
    before = len(_copiers())
    memory.upkeep_in_background()
    memory.upkeep_in_background()  # again: nothing more
    assert len(_copiers()) == before + 1
    principal, _ = memory.create_principal("ops", Role.ADMIN)
    with pytest.raises(AccessDeniedError, match="only the handle that opened the store"):
        memory.as_principal(principal).upkeep_in_background()
    memory.close()
    assert len(_copiers()) == before
    with pytest.raises(StoreError, match="closed"):
        memory.upkeep_in_background()


def test_a_handle_dropped_without_closing_stops_its_copier(store_path: Path) -> None:
    """Its thread held the store's connection open for the life of the process."""
    before = len(_copiers())
    memory = Memory.open(store_path, from_bytes(bytes(32)), create=True)
    memory.upkeep_in_background()
    memory.remember("x", subject="s")
    assert len(_copiers()) == before + 1
    del memory
    gc.collect()
    assert len(_copiers()) == before


class _PausingFile(apsw.VFSFile):
    """A file whose syncs wait while ``pause`` is set (in the threads ``pausing`` says):
    a checkpoint syncs as it copies, holding the checkpoint lock."""

    pause = threading.Event()
    inside = threading.Event()
    go_on = threading.Event()
    pausing: Callable[[], bool] = staticmethod(lambda: True)

    def xSync(self, flags: int) -> None:
        if self.pause.is_set() and self.pausing():
            self.inside.set()
            assert self.go_on.wait(30)
        super().xSync(flags)


_PAUSING = "deleatur-test-pausing"


class _PausingVFS(apsw.VFS):
    def __init__(self) -> None:
        super().__init__(_PAUSING, "")

    def xOpen(self, name: str | apsw.URIFilename | None, flags: list[int]) -> apsw.VFSFile:
        return _PausingFile("", name, flags)


def test_a_scrub_waits_for_another_connections_checkpoint(
    tmp_path: Path, conn: apsw.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite never waits for the lock another checkpoint holds (a copier's, another
    process's): a scrub, which must leave the -wal empty after a removal, tries again
    until it can, rather than report the -wal not truncated."""
    for event in ("pause", "inside", "go_on"):
        monkeypatch.setattr(_PausingFile, event, threading.Event())
    vfs = _PausingVFS()
    other = apsw.Connection(str(tmp_path / "db"), vfs=_PAUSING)
    other.execute("PRAGMA schema_version").fetchall()  # so it knows the -wal
    conn.execute("PRAGMA wal_autocheckpoint = 0").fetchall()
    _commit_pages(conn, 2 * MARK)
    tried = threading.Event()
    real = sqlitefile._busy_handler

    def noting() -> Callable[[int], bool]:
        retry = real()

        def noted(prior: int) -> bool:
            tried.set()
            return retry(prior)

        return noted

    monkeypatch.setattr(sqlitefile, "_busy_handler", noting)
    _PausingFile.pause.set()
    checkpoint = threading.Thread(target=lambda: other.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE))
    checkpoint.start()
    try:
        assert _PausingFile.inside.wait(30)  # the other checkpoint holds its lock
        scrubbed: list[bool] = []
        scrubbing = threading.Thread(target=lambda: scrubbed.append(sqlitefile.scrub(conn)))
        scrubbing.start()
        assert tried.wait(30)  # the scrub found the lock held, and waits
        _PausingFile.go_on.set()
        scrubbing.join()
        assert scrubbed == [True]
        assert (tmp_path / "db-wal").stat().st_size == 0
    finally:
        _PausingFile.pause.clear()
        _PausingFile.go_on.set()
        checkpoint.join()
        other.close()
        vfs.unregister()


def test_writes_made_during_the_copy_do_not_keep_the_wal_from_beginning_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy takes a while, and a server commits meanwhile: those frames are copied too,
    holding the write lock briefly, so that the next commit begins the -wal again. Copied
    only up to where the copy began, the -wal would never begin again under continuous
    writes, and would grow for good."""
    monkeypatch.setattr(sqlitefile, "WAL_AUTOCHECKPOINT_PAGES", MARK)
    in_the_copier = staticmethod(lambda: threading.current_thread().name.startswith("deleatur -wal"))
    monkeypatch.setattr(_PausingFile, "pausing", in_the_copier)
    for event in ("pause", "inside", "go_on"):
        monkeypatch.setattr(_PausingFile, event, threading.Event())
    vfs = _PausingVFS()
    conn = apsw.Connection(str(tmp_path / "db"), vfs=_PAUSING)
    conn.set_busy_timeout(30_000)
    tried, go_on = threading.Event(), threading.Event()

    def copied() -> None:
        tried.set()
        assert go_on.wait(30)  # no other copy runs until the check below is made

    copier = None
    try:
        for pragma in ("PRAGMA journal_mode = WAL", "CREATE TABLE t(x BLOB)"):
            conn.execute(pragma).fetchall()
        _PausingFile.pause.set()
        copier = WalCopier(tmp_path / "db", conn, copied=copied)
        _commit_pages(conn, 2 * MARK)
        assert _PausingFile.inside.wait(30)  # the thread is copying
        _commit_pages(conn, 2 * MARK)  # committed during the copy
        _PausingFile.pause.clear()
        _PausingFile.go_on.set()
        assert tried.wait(30)  # that copy has ended, and the thread waits
        _commit_pages(conn, 1)
        frames, _ = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
        assert frames < MARK  # that commit began the -wal again
    finally:
        _PausingFile.pause.clear()
        _PausingFile.go_on.set()
        go_on.set()
        if copier is not None:
            copier.close()
        conn.close()
        vfs.unregister()


def test_the_thread_makes_its_tidy_every_so_many_commits(
    tmp_path: Path, conn: apsw.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upkeep given to the copier runs in its thread, once per TIDY_EVERY_COMMITS commits,
    on its connection as the store's connections write (what it frees zeroed, no sync of
    its own), and its commit copies nothing into the database: only the thread copies,
    once a commit has left the -wal past the mark."""
    monkeypatch.setattr(sqlitefile, "TIDY_EVERY_COMMITS", 3)
    monkeypatch.setattr(sqlitefile, "WAL_AUTOCHECKPOINT_PAGES", 100_000)
    tidied: list[tuple[str, int, int]] = []
    tried = threading.Event()

    def tidy(own: apsw.Connection) -> None:
        (secure,) = own.execute("PRAGMA secure_delete").fetchall()[0]
        (synchronous,) = own.execute("PRAGMA synchronous").fetchall()[0]
        assert isinstance(secure, int) and isinstance(synchronous, int)
        tidied.append((threading.current_thread().name, secure, synchronous))
        with own:
            own.execute("INSERT INTO t VALUES (x'00')")

    database = (tmp_path / "db").stat().st_size
    copier = _copier(tmp_path, conn, tried.set, tidy)
    try:
        _commit_pages(conn, 1100)  # past SQLite's own mark for a commit to copy the -wal (1,000)
        _commit_pages(conn, 1)
        assert not tried.is_set() and tidied == []
        _commit_pages(conn, 1)
        assert tried.wait(30)
        assert tidied == [(copier._thread.name, 1, 1)]  # secure_delete on, synchronous NORMAL
        assert (tmp_path / "db").stat().st_size == database  # nothing copied into it
    finally:
        copier.close()


def test_a_tidy_that_failed_is_tried_after_the_next_commit(
    tmp_path: Path, conn: apsw.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlitefile, "TIDY_EVERY_COMMITS", 3)
    tries: list[int] = []
    tried = threading.Event()

    def tidy(_own: apsw.Connection) -> None:
        tries.append(len(tries))
        if len(tries) == 1:
            raise apsw.BusyError("database is locked")

    copier = _copier(tmp_path, conn, tried.set, tidy)
    try:
        for _ in range(3):
            _commit_pages(conn, 1)
        assert tried.wait(30)
        tried.clear()
        _commit_pages(conn, 1)
        assert tried.wait(30)
        assert tries == [0, 1]
    finally:
        copier.close()


def _index_segments(store_path: Path) -> int:
    """The segments of the store's full-text index (each has rows in FTS5's ft_idx)."""
    raw = apsw.Connection(str(store_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        (count,) = raw.execute("SELECT count(DISTINCT segid) FROM ft_idx").fetchall()[0]
    finally:
        raw.close()
    assert isinstance(count, int)
    return count


@pytest.mark.parametrize("upkeep", [True, False])
def test_upkeep_merges_the_segments_small_writes_leave(
    memory: Memory, store_path: Path, upkeep: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each write transaction adds a segment to the full-text index, which FTS5 merges
    only as enough pages have been written: a recall reads every segment. With upkeep,
    they are merged every so many commits (without, the control, they stay)."""
    # Three: a level of three segments is merged only at usermerge 2 (FTS5's default, 4,
    # would leave them).
    monkeypatch.setattr(sqlitefile, "TIDY_EVERY_COMMITS", 3)
    tried = threading.Event()
    monkeypatch.setattr(sqlite_store, "WalCopier", partial(WalCopier, copied=tried.set))
    if upkeep:
        memory.upkeep_in_background()
    for i in range(3):
        memory.remember(f"note {i} of a small write", subject="Ada")  # a commit each
    if upkeep:
        assert tried.wait(30)
        assert _index_segments(store_path) == 1
    else:
        assert _index_segments(store_path) == 3
    assert [h.record.text for h in memory.recall("small write", limit=20)] != []
