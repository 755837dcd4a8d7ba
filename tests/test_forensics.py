"""Removed data must be gone from every byte of every file the store writes."""

from __future__ import annotations

import shutil
from pathlib import Path

import apsw
import pytest

from deleatur import Memory, NewMemory, Space, sqlitefile
from deleatur.model import EVERYWHERE

from .conftest import store_files

SECRET = "zqxjvplumbusquark"
RECTIFIED = "wrongvaluexylophonics"
SHORT_LIVED = "okapiquillfernwhistle"


def _raw(store_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in store_files(store_path))


def _vocabulary(store_path: Path) -> str:
    """Every term of the full-text index, one per line (terms carry their space's
    token as a prefix, so look for words as substrings)."""
    # A separate read-only connection, as a forensic examiner would open the file.
    conn = apsw.Connection(str(store_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS _unused(x)")  # temp schema is writable on a read-only db
        conn.execute("CREATE VIRTUAL TABLE temp.v USING fts5vocab(main, ft, row)")
        return "\n".join(str(term) for (term,) in conn.execute("SELECT term FROM temp.v"))
    finally:
        conn.close()


def _term(memory: Memory, word: str) -> str:
    """The index term of ``word`` in the default space: the index holds no word itself."""
    return memory._index_terms(Space(), [word])[0]


def _stored(term: str) -> bytes:
    """What of ``term`` is on disk whole: FTS5 stores a term after the prefix it shares with
    the term before it (the space's token and, sorted among thousands, a few hex digits)."""
    return term[-10:].encode()


def _fill(memory: Memory, n: int) -> None:
    memory.remember_many(
        NewMemory(f"ordinary note number {i} about topic {i % 37}", subject=f"person {i % 50}") for i in range(n)
    )


def test_hard_deleted_text_is_in_no_file_and_no_index(memory: Memory, store_path: Path) -> None:
    _fill(memory, 2000)
    doomed = memory.remember(f"Alice's code word is {SECRET}", subject="Alice")
    _fill(memory, 2000)
    # Positive control: the word's term is really on disk (in the full-text index) before
    # removal, so the absence below is a finding and not an artefact of where we looked;
    # the word itself never is.
    term = _term(memory, SECRET)
    assert _stored(term) in _raw(store_path)
    assert term in _vocabulary(store_path)
    assert SECRET.encode() not in _raw(store_path)

    assert memory._hard_delete([doomed.id]) == 1

    assert _stored(term) not in _raw(store_path)
    assert term not in _vocabulary(store_path)
    wal = store_path.with_name(store_path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    assert len(memory.recall("ordinary note")) == 10  # the rest is intact


def test_retired_and_superseded_values_leave_the_index(memory: Memory, store_path: Path) -> None:
    _fill(memory, 500)
    record = memory.remember(f"temporary {SECRET}", subject="a")
    memory.forget(record_id=record.id)
    memory.backend.scrub()
    # Retired records stay in history (encrypted), but their terms are purged from the index.
    assert _term(memory, SECRET) not in _vocabulary(store_path)
    assert _stored(_term(memory, SECRET)) not in _raw(store_path)
    assert memory.get(record.id).text == f"temporary {SECRET}"


def test_values_superseded_within_a_batch_leave_the_index(memory: Memory, store_path: Path) -> None:
    # remember_many makes its index writes at the end of the batch: the deletion of an
    # earlier value, and nothing at all for a value both written and superseded in it.
    _fill(memory, 500)
    memory.remember(f"first {SECRET}", subject="a", key="a::code")
    batch = memory.remember_many(
        [
            NewMemory(f"second {SHORT_LIVED}", subject="a", key="a::code"),
            NewMemory("ordinary filler", subject="b"),
            NewMemory("third value", subject="a", key="a::code"),
        ]
    )
    memory.backend.scrub()
    for word in (SECRET, SHORT_LIVED):
        assert _term(memory, word) not in _vocabulary(store_path)
        assert _stored(_term(memory, word)) not in _raw(store_path)
    assert [h.record.id for h in memory.recall("value")] == [batch[2].id]
    assert [r.text for r in memory.history("a::code")] == [f"first {SECRET}", f"second {SHORT_LIVED}", "third value"]


def test_rectify_erase_previous_leaves_no_trace(memory: Memory, store_path: Path) -> None:
    _fill(memory, 1000)
    memory.remember(f"phone is {RECTIFIED}", subject="Alice", key="alice::phone")
    memory.remember("phone is superseded second", subject="Alice", key="alice::phone")
    # The active value is in the index; the superseded one was purged from it on supersession.
    assert _stored(_term(memory, RECTIFIED)) in _raw(store_path)  # in the superseded value's old pages
    memory.rectify("alice::phone", "phone is +100", reason="inaccurate", actor="dpo", erase_previous=True)
    assert _stored(_term(memory, RECTIFIED)) not in _raw(store_path)
    assert _term(memory, RECTIFIED) not in _vocabulary(store_path)
    assert [r.text for r in memory.history("alice::phone")] == ["phone is +100"]


@pytest.mark.parametrize("upkeep", [False, True], ids=["commits copy the wal", "a thread copies the wal"])
def test_erasure_leaves_no_plaintext_and_shreds_old_backups(
    memory: Memory, store_path: Path, tmp_path: Path, upkeep: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Distinctive text of one subject among thousands — a derived record and a rectified
    value included — is gone from every byte after the erasure, and a database copy made
    before it cannot be decrypted for that subject any more, while others still can. So
    too for a server's handle, whose -wal a thread copies into the database (often, here)."""
    from deleatur import DataKeyDestroyedError, from_bytes
    from deleatur.memory import keystore_path

    from .conftest import MASTER

    if upkeep:
        monkeypatch.setattr(sqlitefile, "WAL_AUTOCHECKPOINT_PAGES", 64)
        memory.upkeep_in_background()
    _fill(memory, 3000)
    secrets = ["quixoticzebrafjord", "wrongvaluexylophonics", "rectifiedmarmalade", "derivedkumquatnebula"]
    first = memory.remember(f"Alice said {secrets[0]}", subject="Alice Quartermain", key="alice::code")
    memory.remember(f"Alice code {secrets[1]}", subject="Alice Quartermain", key="alice::phone")
    memory.rectify("alice::phone", f"Alice code {secrets[2]}", reason="typo", actor="dpo")
    memory.remember(f"Summary {secrets[3]}", subject="Team", derived_from=[first.id])
    kept = memory.remember("Bob's unrelated note", subject="Bob")
    _fill(memory, 1000)
    memory.backend.scrub()
    backup_dir = tmp_path / "backup"
    backup_dir.mkdir()
    shutil.copy(store_path, backup_dir / "mem.db")  # a backup taken before the erasure
    raw = _raw(store_path)
    terms = [_term(memory, secret) for secret in secrets]
    assert _stored(terms[0]) in raw  # positive control: the index held the active terms
    assert _stored(terms[3]) in raw
    assert not any(secret.encode() in raw for secret in secrets)  # and never the words

    memory.erase("Alice Quartermain", request_id="DSAR-17", basis="Art. 17(1)(a)", requester="dpo")

    raw = _raw(store_path)
    vocabulary = _vocabulary(store_path)
    for secret, term in zip(secrets, terms, strict=True):
        assert secret.encode() not in raw, secret
        assert _stored(term) not in raw, secret
        assert term not in vocabulary, secret
    assert b"quartermain" not in raw.lower()
    for path in store_files(store_path):
        if path.name.endswith("-wal"):
            assert path.stat().st_size == 0, path

    # Restore the old database copy beside today's key store.
    shutil.copy(keystore_path(store_path), keystore_path(backup_dir / "mem.db"))
    with Memory.open(backup_dir / "mem.db", from_bytes(MASTER)) as restored:
        assert restored.get(kept.id).text == "Bob's unrelated note"
        with pytest.raises(DataKeyDestroyedError):
            restored.get(first.id)
        subject_rows = list(
            restored.backend.select_any(
                restored.tenant, EVERYWHERE, subject_ref=restored._subject_ref("alice quartermain")
            )
        )
        assert len(subject_rows) == 3  # history included: all three versions are in the copy...
        for row in subject_rows:
            with pytest.raises(DataKeyDestroyedError):
                restored._decrypt(row)  # ...and none can be read


def test_every_file_the_store_writes_is_owner_only(memory: Memory, store_path: Path) -> None:
    """The index holds the words of the text: no other local user may read any file,
    the -wal and -shm of an open store included."""
    memory.remember("qzsecret words of a person", subject="Alice")
    files = store_files(store_path)
    assert {p.name.removeprefix(store_path.name) for p in files} >= {"", "-wal", "-shm", ".keys"}
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: "0o600" for p in files}


def test_the_store_files_hold_no_word_of_any_record(memory: Memory, store_path: Path) -> None:
    """Records are encrypted and the index holds keyed hashes of their words: a live
    record's words are in no byte either, in any space."""
    memory.remember(f"Alice's code word is {SECRET}", subject="Alice", space=Space("u1", "bot"))
    memory.remember(f"Bob's is {SHORT_LIVED}", subject="Bob")
    _fill(memory, 300)
    raw = _raw(store_path).lower()
    for word in (SECRET, SHORT_LIVED, "alice", "ordinary", "topic"):
        assert word.encode() not in raw, word
    assert [h.record.subject for h in memory.recall(SECRET, space=Space("u1", "bot"))] == ["alice"]


def test_an_erasure_over_many_index_pages_leaves_no_word(memory: Memory, store_path: Path) -> None:
    """FTS5 keeps, as page separators in ft_idx, fragments of terms that secure-delete
    removed, until it next merges their segment. With small pages many of an erased
    subject's terms are separators; those fragments are of hashes, never of words."""
    conn = memory.backend._conn  # type: ignore[attr-defined]
    conn.execute("INSERT INTO ft(ft, rank) VALUES ('pgsz', 64)")
    for start in range(0, 300, 100):
        memory.remember_many(
            NewMemory(f"Zelda note {i} zqsecretword{i} xylophonique", subject="Zelda Quux")
            for i in range(start, start + 100)
        )
        memory.remember("Bob likes tea", subject="Bob")
    memory.erase("Zelda Quux", request_id="DSAR-Z", basis="Art. 17(1)(a)", requester="dpo")
    raw = _raw(store_path).lower()
    for word in (b"zqsecretword", b"xylophonique", b"zelda"):
        assert word not in raw, word
    assert [h.record.subject for h in memory.recall("tea")] == ["bob", "bob", "bob"]
