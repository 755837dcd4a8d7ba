"""What someone who can write to the database, but holds neither the signing key nor the
master key, can make the store's own signer vouch for: nothing. Each entry carries a MAC
under the master key, and the store checks the entries and hashes no checkpoint of its
covers before it signs them. Nor can they give the store a signing key: its keys are
the ones its log announces, whatever its list of them says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from deleatur import IntegrityError, Memory, from_bytes
from deleatur.log.checkpoint import Checkpoint
from deleatur.log.entries import Entry, EventType
from deleatur.log.merkle import CompactRange, leaf_hash
from deleatur.log.note import Note, Signer, Verifier
from deleatur.log.receipt import Receipt
from deleatur.log.tlogproof import TlogProof
from deleatur.store import schema

from .conftest import MASTER, Cli, FakeClock


def _open(store_path: Path, clock: FakeClock, **kwargs: object) -> Memory:
    return Memory.open(store_path, from_bytes(MASTER), clock=clock, checkpoint_interval_us=0, **kwargs)  # type: ignore[arg-type]


def _made(store_path: Path, clock: FakeClock) -> tuple[Verifier, Note]:
    """A store with some history: its first key, and the checkpoint a verifier pinned."""
    with _open(store_path, clock, create=True) as memory:
        memory.new_signing_key()
        memory.remember("Alice likes tea", subject="Alice")
        return memory.public_key(), memory.checkpoint()


def _rows(conn: apsw.Connection, sql: str, *args: object) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in conn.execute(sql, args)]


def _forge_tail(store_path: Path, *entries: Entry) -> int:
    """Append entries, and the subtree hashes they complete, as a writer of the file can:
    the tree's peaks read from the file, the new hashes computed as the store computes
    them. Returns the index of the first."""
    conn = apsw.Connection(str(store_path))
    try:
        ((size,),) = _rows(conn, "SELECT coalesce(max(idx) + 1, 0) FROM log_entries")
        peaks = [
            _rows(conn, "SELECT hash FROM log_nodes WHERE pos = ?", level << 50 | i)[0][0]
            for level, i in CompactRange.peak_positions(size)
        ]
        tree = CompactRange(size, peaks)
        with conn:
            for offset, entry in enumerate(entries):
                raw = entry.encode()
                conn.execute("INSERT INTO log_entries(idx, entry) VALUES (?, ?)", (size + offset, raw))
                for level, i, digest in tree.append(leaf_hash(raw)):
                    conn.execute("INSERT INTO log_nodes(pos, hash) VALUES (?, ?)", (level << 50 | i, digest))
        return int(size)
    finally:
        conn.close()


def _rebuild_nodes(conn: apsw.Connection) -> None:
    """Every stored subtree hash made again from the entries, as they now are."""
    conn.execute("DELETE FROM log_nodes")
    tree = CompactRange()
    for (raw,) in _rows(conn, "SELECT entry FROM log_entries ORDER BY idx"):
        for level, i, digest in tree.append(leaf_hash(raw)):
            conn.execute("INSERT INTO log_nodes(pos, hash) VALUES (?, ?)", (level << 50 | i, digest))


def _write_refused(store_path: Path, clock: FakeClock, match: str) -> None:
    """An ordinary write is refused, signing nothing; so is closing the handle, which
    cannot sign the entry that recorded the refusal, and closes its files all the same."""
    memory = _open(store_path, clock)
    with pytest.raises(IntegrityError, match=match):
        memory.remember("an ordinary write", subject="Bob")
    with pytest.raises(IntegrityError, match=match):
        memory.close()


def _checkpoints(store_path: Path) -> list[int]:
    conn = apsw.Connection(str(store_path))
    try:
        return [int(size) for (size,) in conn.execute("SELECT size FROM log_checkpoints ORDER BY size")]
    finally:
        conn.close()


_FORGED_TOMBSTONE = Entry(
    EventType.TOMBSTONE, 1, {"basis": "Art. 17(1)(a)", "record": "r", "request": "FAKE", "tenant": "default"}
)


def test_an_ordinary_write_refuses_to_sign_a_forged_tail(store_path: Path, clock: FakeClock) -> None:
    vkey, pinned = _made(store_path, clock)
    forged = _forge_tail(store_path, _FORGED_TOMBSTONE, _FORGED_TOMBSTONE)
    signed_before = _checkpoints(store_path)
    memory = _open(store_path, clock)
    with pytest.raises(IntegrityError, match=f"log entry {forged} was not written with this store's keys"):
        memory.remember("an ordinary write", subject="Bob")
    with pytest.raises(IntegrityError, match=f"log entry {forged} "):
        memory.checkpoint()
    assert _checkpoints(store_path) == signed_before  # nothing signed
    # Reads go on (their audit entries recorded, unsigned): the operator can look at the log.
    trail = memory.audit_entries()
    assert [a.entry.fields["request"] for a in trail if a.entry.type is EventType.TOMBSTONE] == ["FAKE", "FAKE"]
    report = memory.verify_log(pinned_keys=[vkey], pinned_checkpoint=pinned)
    assert [c.name for c in report.failed] == ["coverage", "pinned"]
    assert "otherwise refuses" in report.checks[4].detail
    assert any(note.startswith(f"NOT SIGNED: log entry {forged} ") for note in report.notes)
    # The handle cannot sign what it recorded either: closing says why, and closes.
    with pytest.raises(IntegrityError, match=f"log entry {forged} "):
        memory.close()
    memory.close()
    assert _checkpoints(store_path) == signed_before


def test_entries_rewritten_under_deleted_checkpoints_are_not_signed(store_path: Path, clock: FakeClock) -> None:
    """Deleting the checkpoints after size S widens the unsigned tail back to S; entries
    rewritten there, with every subtree hash made again, fail their MACs."""
    _, pinned = _made(store_path, clock)
    with _open(store_path, clock) as memory:
        memory.remember("Bob likes coffee", subject="Bob")
        memory.erase("Bob", request_id="DSAR-1", basis="Art. 17(1)(a)", requester="dpo")
    start = int(pinned.text.split("\n")[1])
    conn = apsw.Connection(str(store_path))
    with conn:
        conn.execute("DELETE FROM log_checkpoints WHERE size > ?", (start,))
        ((index, raw),) = _rows(
            conn,
            "SELECT idx, entry FROM log_entries WHERE idx >= ? AND instr(entry, ?) > 0",
            start,
            b'"action":"erase"',
        )
        rewritten = raw.replace(b'"actor":"local-operator"', b'"actor":"someone-else"')
        assert rewritten != raw
        conn.execute("UPDATE log_entries SET entry = ? WHERE idx = ?", (rewritten, index))
        _rebuild_nodes(conn)
    conn.close()
    _write_refused(store_path, clock, f"log entry {index} ")
    assert _checkpoints(store_path)[-1] == start


def test_stored_hashes_that_do_not_match_the_entries_are_not_signed(store_path: Path, clock: FakeClock) -> None:
    """The store's own entries, unsigned within the checkpoint interval, under a subtree hash
    someone replaced: the signer rebuilds the tree from the entries and refuses."""
    _made(store_path, clock)
    memory = Memory.open(store_path, from_bytes(MASTER), clock=clock, checkpoint_interval_us=3_600_000_000)
    memory.remember("signed at once: the handle's first write", subject="a")
    memory.remember("left unsigned for the interval", subject="a")
    size = memory.backend.log_size()
    conn = apsw.Connection(str(store_path))
    with conn:
        conn.execute("UPDATE log_nodes SET hash = ? WHERE pos = ?", (bytes(32), size - 1))  # the last leaf
    conn.close()
    with pytest.raises(IntegrityError, match=f"stored hash of subtree 0/{size - 1} does not match its entries"):
        memory.sign_pending()
    memory.keys.close()
    memory.backend.close()


def test_a_log_cut_below_a_signed_checkpoint_is_not_signed_again(store_path: Path, clock: FakeClock) -> None:
    _made(store_path, clock)
    signed = _checkpoints(store_path)
    conn = apsw.Connection(str(store_path))
    with conn:
        conn.execute("DELETE FROM log_entries WHERE idx >= ?", (signed[-1] - 1,))
        _rebuild_nodes(conn)
    conn.close()
    with _open(store_path, clock) as memory:
        with pytest.raises(IntegrityError, match="entries were removed"):
            memory.checkpoint()
        # Nor is a tree of entries written in their place: the tree a write is made on is
        # checked first, and it is shorter than the checkpoint.
        with pytest.raises(IntegrityError, match="entries were removed"):
            memory.remember("an ordinary write", subject="b")
        # (The refusal's own entry brings the log back to the checkpoint's size, which
        # closing then finds signed: it signs nothing, and does not fail.)
    assert _checkpoints(store_path) == signed


def test_log_checkpoint_refuses_a_forged_tail_as_the_coverage_check_says(cli: Cli, tmp_path: Path) -> None:
    assert cli("init")[0] == 0
    store = tmp_path / "cli.db"
    assert cli("remember", "a note", "--subject", "a")[0] == 0
    forged = _forge_tail(store, _FORGED_TOMBSTONE)
    code, out, _ = cli("log", "verify")
    assert code == 1
    assert "otherwise refuses" in out
    code, _, err = cli("log", "checkpoint")
    assert code == 1
    assert f"log entry {forged} was not written with this store's keys" in err
    assert "VERDICT: FAIL (check 5 coverage)" in cli("log", "verify")[1]


def test_handles_sign_each_others_entries(store_path: Path, clock: FakeClock) -> None:
    """Two handles (as two processes) append in turn, each leaving entries the other
    signs: both hold the master key, so each authenticates the other's entries."""
    _made(store_path, clock)
    lazy = Memory.open(store_path, from_bytes(MASTER), clock=clock, checkpoint_interval_us=3_600_000_000)
    with _open(store_path, clock) as eager:
        for i in range(3):
            lazy.remember(f"lazy {i}", subject="a")  # the first signs, the rest wait an hour
            eager.remember(f"eager {i}", subject="b")  # signs the lazy handle's entries with its own
            assert eager.backend.checkpoint() is not None
        lazy.remember("unsigned", subject="a")
    lazy.close()  # signs its own entry, on top of the eager handle's checkpoint
    with _open(store_path, clock) as memory:
        assert memory.verify_log().ok


def test_a_handle_signs_its_own_appends_without_reading_them_back(
    store_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _made(store_path, clock)
    with _open(store_path, clock) as memory:
        memory.remember("the first write checks the log's unsigned tail", subject="a")
        reads: list[tuple[int, int]] = []
        read = memory.backend.log_entries_with_macs

        def counted(start: int, end: int) -> Iterator[tuple[int, bytes, bytes | None]]:
            reads.append((start, end))
            return read(start, end)

        monkeypatch.setattr(memory.backend, "log_entries_with_macs", counted)
        for i in range(5):
            memory.remember(f"note {i}", subject="a")
        assert reads == []
        with _open(store_path, clock) as other:
            other.remember("another connection commits", subject="b")
        memory.remember("checked again: the tail is the other handle's", subject="a")
        assert len(reads) == 1


def test_an_upgraded_store_trusts_its_entries_once_and_no_older_writer_after(
    store_path: Path, clock: FakeClock
) -> None:
    """Schema v16: the entries of a v15 store (its unsigned tail too) get their MACs the
    first time it is opened with its master key, and it goes on signing; an entry written
    without a MAC after that (by a v15 process still running) is refused."""
    with Memory.open(store_path, from_bytes(MASTER), clock=clock, create=True) as memory:
        memory.new_signing_key()
        memory.remember("before the upgrade", subject="a")
    conn = apsw.Connection(str(store_path))
    conn.execute("ALTER TABLE log_entries DROP COLUMN mac")
    conn.execute("PRAGMA user_version = 15")
    conn.close()
    tail = _forge_tail(store_path, _FORGED_TOMBSTONE)  # a v15 writer's unsigned entry: trusted on upgrade
    with _open(store_path, clock) as memory:
        assert not memory.backend.log_macs_pending()
        memory.remember("after the upgrade", subject="a")
        assert memory.verify_log().ok
        assert memory.backend.checkpoint() == (memory.backend.log_size(), memory.checkpoint().format())
    conn = apsw.Connection(str(store_path))
    assert conn.execute("SELECT count(*) FROM log_entries WHERE mac IS NULL").fetchall() == [(0,)]
    assert conn.execute("PRAGMA user_version").fetchall() == [(max(schema.MIGRATIONS),)]
    conn.close()
    later = _forge_tail(store_path, _FORGED_TOMBSTONE)
    assert later > tail
    _write_refused(store_path, clock, f"log entry {later} ")


def _list_key(store_path: Path, key: Signer, index: int) -> None:
    conn = apsw.Connection(str(store_path))
    with conn:
        conn.execute(
            "INSERT INTO signing_keys(key_id, vkey, log_index, created_at) VALUES (?, ?, ?, 0)",
            (key.key_id.hex(), key.verifier.vkey, index),
        )
    conn.close()


def test_a_key_added_to_the_stores_list_is_neither_reported_nor_trusted(store_path: Path, clock: FakeClock) -> None:
    real, _ = _made(store_path, clock)
    intruder = Signer.generate(real.name)
    _list_key(store_path, intruder, -1)
    with _open(store_path, clock) as memory:
        for listing in (memory.signing_keys, memory.announced_keys):
            with pytest.raises(
                IntegrityError, match=f"signing key {intruder.key_id.hex()} as announced at log entry -1"
            ):
                listing()
        report = memory.verify_log(pinned_keys=[real])
        assert [c.name for c in report.failed] == ["key_list"]
        assert report.checks[-1].number == 9
        assert intruder.key_id.hex() in report.checks[-1].detail


def test_keys_show_and_an_unpinned_receipt_check_refuse_a_key_added_to_the_list(cli: Cli, tmp_path: Path) -> None:
    assert cli("init")[0] == 0
    store = tmp_path / "cli.db"
    assert cli("remember", "a note", "--subject", "a")[0] == 0
    origin = cli("keys", "export-public")[1].strip().split("+")[0]
    intruder = Signer.generate(origin)
    _list_key(store, intruder, -1)
    code, _, err = cli("keys", "show")
    assert code == 1
    assert intruder.key_id.hex() in err and "was altered" in err
    code, out, _ = cli("log", "verify")
    assert code == 1 and "FAIL  9 key_list" in out
    # A receipt the intruder's key signed, for a write that never happened, checked
    # against the store's own keys (no --key): refused, not passed.
    record = "01a0c450-6c40-760a-9e62-9e8f05520000"
    raw = Entry(EventType.WRITE, 1, {"commitment": "00" * 32, "record": record, "tenant": "default"}).encode()
    body = Checkpoint(origin, 1, leaf_hash(raw)).body()
    forged = Receipt(record, raw, TlogProof(0, (), Note(body, (intruder.sign(body),))))
    (tmp_path / "r.json").write_text(json.dumps(forged.to_json()))
    code, out, err = cli("verify-receipt", str(tmp_path / "r.json"))
    assert (code, out) == (1, ""), err
    assert intruder.key_id.hex() in err


def test_a_listed_key_that_differs_from_its_announcement_fails(store_path: Path, clock: FakeClock) -> None:
    _made(store_path, clock)
    intruder = Signer.generate("deleatur/x")
    conn = apsw.Connection(str(store_path))
    with conn:
        conn.execute("UPDATE signing_keys SET vkey = ?", (intruder.verifier.vkey,))
    conn.close()
    with _open(store_path, clock) as memory:
        with pytest.raises(IntegrityError, match="is no announcement of it the store wrote"):
            memory.signing_keys()
        assert [c.name for c in memory.verify_log().failed] == ["key_list"]


def test_the_keys_of_a_rotated_log_are_its_announcements(store_path: Path, clock: FakeClock) -> None:
    first, _ = _made(store_path, clock)
    with _open(store_path, clock) as memory:
        second = memory.rotate_signing_key().verifier
        memory.remember("after the rotation", subject="a")
        assert [(k["vkey"], k["current"]) for k in memory.signing_keys()] == [(first.vkey, False), (second.vkey, True)]
        assert memory.announced_keys() == [first, second]
        report = memory.verify_log(pinned_keys=[first])
        assert report.ok
        assert report.checks[-1].detail == "the store lists the 2 key(s) the log announces, and no other"


def test_handles_taking_turns_check_from_their_own_last_checkpoint(
    store_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each signing after the other handle's verified the other's newest checkpoint (an
    Ed25519 verification at every turn): a handle now checks the entries after the
    checkpoint it signed last, which needs none. A forged entry in that tail is still
    refused, and an anchor whose stored note was changed is none (the handle verifies
    the newest checkpoint instead)."""
    _made(store_path, clock)
    verified: list[bytes] = []
    verify = Verifier.verify

    def counted(self: Verifier, text: str, signature: Any) -> bool:
        verified.append(self.key_id)
        return verify(self, text, signature)

    first, second = _open(store_path, clock), _open(store_path, clock)
    first.remember("first", subject="a")
    second.remember("second", subject="b")  # each has now signed once
    monkeypatch.setattr(Verifier, "verify", counted)
    for i in range(3):
        first.remember(f"first {i}", subject="a")
        second.remember(f"second {i}", subject="b")
    assert verified == []
    conn = apsw.Connection(str(store_path))
    with conn:  # the first handle's last checkpoint, its note changed
        conn.execute("UPDATE log_checkpoints SET note = note || ' ' WHERE size = ?", (_checkpoints(store_path)[-2],))
    conn.close()
    first.remember("anchored on the second's checkpoint", subject="a")
    assert verified
    _forge_tail(store_path, _FORGED_TOMBSTONE)
    for handle in (second, first):
        with pytest.raises(IntegrityError, match="was not written with this store's keys"):
            handle.remember("over a forged entry", subject="a")
        with pytest.raises(IntegrityError, match="was not written with this store's keys"):
            handle.close()  # it cannot sign its refusal's entry either; its files are closed
