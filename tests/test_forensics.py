"""Removed data must be gone from every byte of every file the store writes."""

from __future__ import annotations

from pathlib import Path

import apsw

from deleatur import Memory, NewMemory

from .conftest import store_files

SECRET = "zqxjvplumbusquark"
RECTIFIED = "wrongvaluexylophonics"


def _raw(store_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in store_files(store_path))


def _vocabulary(store_path: Path) -> set[str]:
    # A separate read-only connection, as a forensic examiner would open the file.
    conn = apsw.Connection(str(store_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS _unused(x)")  # temp schema is writable on a read-only db
        conn.execute("CREATE VIRTUAL TABLE temp.v USING fts5vocab(main, ft, row)")
        return {str(term) for (term,) in conn.execute("SELECT term FROM temp.v")}
    finally:
        conn.close()


def _fill(memory: Memory, n: int) -> None:
    memory.remember_many(
        NewMemory(f"ordinary note number {i} about topic {i % 37}", subject=f"person {i % 50}") for i in range(n)
    )


def test_hard_deleted_text_is_in_no_file_and_no_index(memory: Memory, store_path: Path) -> None:
    _fill(memory, 2000)
    doomed = memory.remember(f"Alice's code word is {SECRET}", subject="Alice")
    _fill(memory, 2000)
    # Positive control: the term is really on disk (in the full-text index) before removal,
    # so the absence below is a finding and not an artefact of where we looked.
    assert SECRET.encode() in _raw(store_path)
    assert SECRET in _vocabulary(store_path)

    assert memory._hard_delete([doomed.id]) == 1

    assert SECRET.encode() not in _raw(store_path)
    assert SECRET not in _vocabulary(store_path)
    wal = store_path.with_name(store_path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    assert len(memory.recall("ordinary note")) == 10  # the rest is intact


def test_retired_and_superseded_values_leave_the_index(memory: Memory, store_path: Path) -> None:
    _fill(memory, 500)
    record = memory.remember(f"temporary {SECRET}", subject="a")
    memory.forget(record_id=record.id)
    memory.backend.scrub()
    # Retired records stay in history (encrypted), but their terms are purged from the index.
    assert SECRET not in _vocabulary(store_path)
    assert SECRET.encode() not in _raw(store_path)
    assert memory.get(record.id).text == f"temporary {SECRET}"


def test_rectify_erase_previous_leaves_no_trace(memory: Memory, store_path: Path) -> None:
    _fill(memory, 1000)
    memory.remember(f"phone is {RECTIFIED}", subject="Alice", key="alice::phone")
    memory.remember("phone is superseded second", subject="Alice", key="alice::phone")
    # The active value is in the index; the superseded one was purged from it on supersession.
    memory.rectify("alice::phone", "phone is +100", reason="inaccurate", actor="dpo", erase_previous=True)
    assert RECTIFIED.encode() not in _raw(store_path)
    assert RECTIFIED not in _vocabulary(store_path)
    assert [r.text for r in memory.history("alice::phone")] == ["phone is +100"]
