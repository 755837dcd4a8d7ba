"""The store's verifiable log: events, checkpoints, receipts, rotation, tampering."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import apsw
import pytest

from deleatur import IntegrityError, InvalidInputError, Memory, NewMemory, NotFoundError, from_bytes
from deleatur.log.checkpoint import Checkpoint
from deleatur.log.entries import Entry, EntryError, EventType, commitment
from deleatur.log.merkle import ProofError, verify_consistency
from deleatur.log.note import Note, NoteError, Signer, open_note
from deleatur.log.receipt import Receipt, ReceiptError, verify_receipt

from .conftest import MASTER, store_files, truncate_log


def _entries(memory: Memory) -> list[Entry]:
    return [Entry.decode(raw) for _, raw in memory.backend.log_entries()]


def _events(memory: Memory) -> list[Entry]:
    """The entries about data, without the audit entry every call adds."""
    return [e for e in _entries(memory) if e.type is not EventType.CALL]


def _conn(memory: Memory) -> apsw.Connection:
    conn = memory.backend._conn  # type: ignore[attr-defined]
    assert isinstance(conn, apsw.Connection)
    return conn


def _failed(memory: Memory, **kwargs: object) -> list[str]:
    report = memory.verify_log(**kwargs)  # type: ignore[arg-type]
    return [c.name for c in report.failed]


def test_every_operation_is_logged_without_content(memory: Memory, store_path: Path) -> None:
    first = memory.remember("Alice's phone is +100 555", subject="Alice Smith", key="alice::phone")
    memory.remember("Alice's phone is +100 556", subject="Alice Smith", key="alice::phone")
    memory.rectify("alice::phone", "Alice's phone is +100 557", reason="typo", actor="dpo")
    memory.forget(key="alice::phone")
    types = [e.type for e in _events(memory)]
    assert types == [EventType.KEY, EventType.WRITE, EventType.WRITE, EventType.RECTIFY, EventType.RETIRE]
    assert _events(memory)[1].fields["commitment"] == commitment(first.nonce, "alice::phone", first.text).hex()
    assert _events(memory)[2].fields["supersedes"] == first.id
    calls = [e.fields["action"] for e in _entries(memory) if e.type is EventType.CALL]
    assert calls == ["log.new_key", "remember", "remember", "rectify", "forget"]
    raw = b"".join(r for _, r in memory.backend.log_entries()).lower()
    for needle in (b"alice", b"smith", b"phone", b"+100", b"typo", b"dpo"):
        assert needle not in raw


def test_a_checkpoint_is_signed_after_every_batch(memory: Memory) -> None:
    memory.remember_many([NewMemory(f"note {i}", subject="a") for i in range(10)])
    latest = memory.backend.checkpoint()
    assert latest is not None
    # the key, the new-key call, ten writes and the write call, under one signed head
    assert latest[0] == memory.backend.log_size() == 13
    note = Note.parse(latest[1])
    open_note(note, memory.announced_keys())
    assert Checkpoint.parse(note.text).root == memory.log.root(13)


def test_the_commitment_is_salted(memory: Memory) -> None:
    a = memory.remember("same text", subject="a", key="k1")
    b = memory.remember("same text", subject="a", key="k1")
    ea, eb = _events(memory)[1:3]
    assert ea.fields["commitment"] != eb.fields["commitment"]
    assert a.nonce != b.nonce


def test_receipt_verifies_with_the_public_key_alone(memory: Memory) -> None:
    record = memory.remember("hello", subject="a")
    memory.remember_many([NewMemory(f"later {i}", subject="b") for i in range(20)])
    receipt = Receipt.loads(json.dumps(memory.receipt(record.id).to_json()))
    assert "hello" not in json.dumps(receipt.to_json())
    key = memory.announced_keys()
    assert verify_receipt(receipt, key, pinned=True).ok


@pytest.mark.parametrize("field", ["record_id", "entry", "tlog_proof"])
@pytest.mark.parametrize("value", [None, -1, 1.5, 2**64, {}, [], "x", "bad \ud800"], ids=repr)
def test_a_malformed_receipt_is_refused_as_such(memory: Memory, field: str, value: object) -> None:
    """A receipt comes from anyone: a field of the wrong type or shape is a malformed
    receipt, never a TypeError (an HTTP 500 before)."""
    receipt = memory.receipt(memory.remember("hello", subject="a").id).to_json()
    with pytest.raises(ReceiptError, match="receipt is malformed"):
        Receipt.from_json({**receipt, field: value})


def test_tampered_receipts_fail_in_the_named_check(memory: Memory) -> None:
    record = memory.remember("hello", subject="a")
    other = memory.remember("other", subject="a")
    receipt = memory.receipt(record.id)
    keys = memory.announced_keys()

    stranger = Signer.generate(memory.log.origin)
    assert [c.name for c in verify_receipt(receipt, [stranger.verifier], pinned=True).failed] == [
        "checkpoint_signature",
        "inclusion",
    ]

    entry = bytearray(receipt.entry)
    entry[entry.index(b"commitment") + 14] ^= 1  # one hex digit of the commitment: still a well-formed entry
    forged = Receipt(record.id, bytes(entry), receipt.proof)
    assert [c.name for c in verify_receipt(forged, keys, pinned=True).failed] == ["inclusion"]
    garbled = Receipt(record.id, receipt.entry + b" ", receipt.proof)
    assert [c.name for c in verify_receipt(garbled, keys, pinned=True).failed] == ["entry", "inclusion"]

    wrong_record = Receipt(other.id, receipt.entry, receipt.proof)
    assert [c.name for c in verify_receipt(wrong_record, keys, pinned=True).failed] == ["entry"]


def test_unpinned_receipt_check_says_so(memory: Memory) -> None:
    record = memory.remember("hello", subject="a")
    report = verify_receipt(memory.receipt(record.id), memory.announced_keys(), pinned=False)
    assert report.ok
    assert any("KEY NOT PINNED" in n for n in report.notes)


def test_log_verifies_clean(memory: Memory) -> None:
    memory.remember_many([NewMemory(f"note {i}", subject=f"s{i % 3}") for i in range(50)])
    memory.forget(record_id=next(iter(memory.list())).id)
    report = memory.verify_log(pinned_keys=memory.announced_keys()[:1])
    assert report.ok, report.lines()
    assert report.lines()[-1] == "VERDICT: PASS"


def test_edited_entry_is_caught(memory: Memory) -> None:
    memory.remember_many([NewMemory(f"note {i}", subject="a") for i in range(5)])
    raw = next(r for i, r in memory.backend.log_entries(3, 4))
    edited = raw.replace(b'"tenant":"default"', b'"tenant":"defaulu"')
    _conn(memory).execute("UPDATE log_entries SET entry = ? WHERE idx = 3", (edited,))
    failed = _failed(memory)
    assert "roots" in failed
    assert "stored_tree" in failed


def test_dropped_last_entry_is_caught(memory: Memory) -> None:
    memory.remember_many([NewMemory(f"note {i}", subject="a") for i in range(5)])
    _conn(memory).execute("DELETE FROM log_entries WHERE idx = (SELECT max(idx) FROM log_entries)")
    failed = _failed(memory)
    assert "coverage" in failed
    assert "roots" in failed


def test_reordered_entries_are_caught(memory: Memory) -> None:
    memory.remember_many([NewMemory(f"note {i}", subject="a") for i in range(5)])
    rows = dict(memory.backend.log_entries())
    conn = _conn(memory)
    conn.execute("UPDATE log_entries SET entry = ? WHERE idx = 2", (rows[3],))
    conn.execute("UPDATE log_entries SET entry = ? WHERE idx = 3", (rows[2],))
    assert "roots" in _failed(memory)


def test_checkpoint_signed_by_another_key_is_caught(memory: Memory) -> None:
    memory.remember("x", subject="a")
    size, text = memory.backend.checkpoint() or (0, "")
    intruder = Signer.generate(memory.log.origin)
    forged = Note(Note.parse(text).text, (intruder.sign(Note.parse(text).text),)).format()
    _conn(memory).execute("UPDATE log_checkpoints SET note = ? WHERE size = ?", (forged, size))
    assert _failed(memory) == ["signatures"]


def test_two_roots_for_one_size_are_refused(memory: Memory) -> None:
    memory.remember("x", subject="a")
    size, text = memory.backend.checkpoint() or (0, "")
    real = Checkpoint.parse(Note.parse(text).text)
    other = Checkpoint(real.origin, real.size, bytes(32))
    with pytest.raises(ProofError, match="same size have different roots"):
        verify_consistency(size, size, real.root, other.root, [])
    # The log itself never signs a second root for a size it already signed.
    signer = memory.log.signer
    assert signer is not None
    forged = Note(other.body(), (signer.sign(other.body()),)).format()
    _conn(memory).execute("UPDATE log_checkpoints SET note = ? WHERE size = ?", (forged, size))
    with pytest.raises(IntegrityError, match="second, different checkpoint"), memory.backend.atomic():
        memory.log.checkpoint()
    assert "roots" in _failed(memory)


def test_truncation_with_checkpoint_deleted_needs_a_pinned_checkpoint(memory: Memory) -> None:
    """A peer's audit chain passes after its newest row and checkpoint are deleted.
    Ours passes on its own too (and its note says why that proves little); against
    a checkpoint the reader pinned earlier it fails."""
    memory.remember("first", subject="a")
    early = memory.checkpoint()
    memory.remember_many([NewMemory("second", subject="a"), NewMemory("third", subject="a")])
    later = memory.checkpoint()
    early_size = Checkpoint.parse(early.text).size

    # Cutting into a batch leaves entries no checkpoint covers: caught without any pin.
    truncate_log(memory, early_size + 1)
    assert _failed(memory) == ["coverage"]

    # Cutting the whole newest batch and its checkpoint leaves a self-consistent log.
    truncate_log(memory, early_size)
    alone = memory.verify_log()
    assert alone.ok
    assert any("NOT ANCHORED" in n for n in alone.notes)
    assert _failed(memory, pinned_checkpoint=later) == ["pinned"]
    assert memory.verify_log(pinned_checkpoint=early).ok  # what the early reader saw is still there


def test_log_rewritten_and_resigned_by_the_key_holder_fails_the_pin(memory: Memory) -> None:
    memory.remember_many([NewMemory(f"note {i}", subject="a") for i in range(4)])
    pinned = memory.checkpoint()
    size = memory.backend.log_size()
    # The operator rewrites entry 2 and rebuilds every hash and checkpoint with the real key.
    rows = [raw for _, raw in memory.backend.log_entries()]
    rows[2] = rows[2].replace(b'"tenant":"default"', b'"tenant":"rewritten"')
    conn = _conn(memory)
    for table in ("log_entries", "log_nodes", "log_checkpoints"):
        conn.execute(f"DELETE FROM {table}")
    with memory.backend.atomic():
        memory.log.append([(Entry.decode(r), None) for r in rows])
        memory.log.checkpoint()
    assert memory.backend.log_size() == size
    assert memory.verify_log().ok  # self-consistent: only an anchor can tell
    assert _failed(memory, pinned_checkpoint=pinned) == ["pinned"]


def test_rotation_keeps_old_proofs_verifiable(memory: Memory) -> None:
    first_key = memory.announced_keys()[0]
    before = memory.remember("before rotation", subject="a")
    old_receipt = memory.receipt(before.id)
    old_checkpoint = memory.checkpoint()
    memory.rotate_signing_key()
    new_key = memory.announced_keys()[-1]
    assert new_key.vkey != first_key.vkey
    after = memory.remember("after rotation", subject="a")
    assert verify_receipt(old_receipt, [first_key], pinned=True).ok
    assert verify_receipt(memory.receipt(after.id), [new_key], pinned=True).ok
    assert not verify_receipt(memory.receipt(after.id), [first_key], pinned=True).ok
    # Pinned to the first key, a verifier follows the endorsed chain to the new one.
    report = memory.verify_log(pinned_keys=[first_key], pinned_checkpoint=old_checkpoint)
    assert report.ok, report.lines()
    kinds = [e.type for e in _entries(memory)]
    assert kinds.count(EventType.KEY) == 2
    # The rotation checkpoint carries both signatures.
    rotation_size = memory.backend.signing_keys()[-1][2] + 1
    found = memory.backend.checkpoint(rotation_size)
    assert found is not None
    assert {s.key_id for s in Note.parse(found[1]).signatures} == {first_key.key_id, new_key.key_id}


def test_unendorsed_key_announcement_is_caught(memory: Memory) -> None:
    memory.remember("x", subject="a")
    intruder = Signer.generate(memory.log.origin)
    entry = Entry(EventType.KEY, 1, {"vkey": intruder.verifier.vkey, "previous": memory.announced_keys()[0].vkey,
                                     "endorsement": base64.b64encode(bytes(64)).decode()})  # fmt: skip
    with memory.backend.atomic():
        memory.log.append([(entry, None)])
        memory.log.checkpoint()
    assert _failed(memory) == ["key_chain"]


def test_reopening_finishes_an_interrupted_rotation(memory: Memory, store_path: Path) -> None:
    new = Signer.generate(memory.log.origin)
    from deleatur.crypto.signing import pending_path, write_signer

    old = memory.log.signer
    assert old is not None
    write_signer(pending_path(memory.signing_key_path), new)
    with memory.backend.atomic():  # the rotation committed, then the process died
        memory.log.announce_key(new, previous=old)
        memory.log.signer = new
        memory.log.checkpoint(old)
    with Memory.open(store_path, from_bytes(MASTER)) as reopened:
        assert reopened.log.signer is not None
        assert reopened.log.signer.key_id == new.key_id
        assert not pending_path(memory.signing_key_path).exists()


def test_signing_key_is_0600_and_not_in_the_database(memory: Memory, store_path: Path) -> None:
    signer = memory.log.signer
    assert signer is not None
    assert memory.signing_key_path.stat().st_mode & 0o777 == 0o600
    seed = base64.b64decode(signer.skey.split("+", 4)[4])[1:]
    for path in store_files(store_path):
        if path != memory.signing_key_path:
            assert seed not in path.read_bytes()


def test_a_foreign_signing_key_file_is_refused(memory: Memory, store_path: Path) -> None:
    from deleatur import KeyStoreError
    from deleatur.crypto.signing import write_signer

    memory.signing_key_path.unlink()  # a secret is never written over another file
    write_signer(memory.signing_key_path, Signer.generate(memory.log.origin))
    with pytest.raises(KeyStoreError, match="is not this store's current key"):
        Memory.open(store_path, from_bytes(MASTER))


def test_malformed_notes_are_refused() -> None:
    with pytest.raises(NoteError, match="empty line"):
        Note.parse("no signatures\n")
    with pytest.raises(NoteError, match="em dash"):
        Note.parse("text\n\n- name AAAA\n")
    with pytest.raises(NoteError, match="newline"):
        Checkpoint.parse("origin\n1\nroot")
    with pytest.raises(NoteError, match="leading zeroes"):
        Checkpoint.parse(f"origin\n01\n{base64.b64encode(bytes(32)).decode()}\n")


def test_a_forged_chain_that_endorses_the_pinned_key_fails(memory: Memory) -> None:
    """Someone who edits the database and knows only the public key rewrites the log:
    their own key first, the real key 'endorsed' by it, every checkpoint signed by
    their key. Pinned to the real key, verification must fail."""
    from deleatur.log.note import Verifier

    real = memory.announced_keys()[0]
    memory.remember("x", subject="a")
    conn = _conn(memory)
    for table in ("log_entries", "log_nodes", "log_checkpoints", "signing_keys"):
        conn.execute(f"DELETE FROM {table}")
    fake = Signer.generate(memory.log.origin)

    class PublicOnly:
        def __init__(self, verifier: Verifier) -> None:
            self.verifier = verifier
            self.key_id = verifier.key_id

    memory.log.signer = fake
    with memory.backend.atomic():
        memory.log.announce_key(fake, previous=None)
        memory.log.announce_key(PublicOnly(real), previous=fake)  # type: ignore[arg-type]
        memory.log.append([(Entry(EventType.WRITE, 1, {"record": "forged", "tenant": "default"}), None)])
        memory.log.checkpoint()
    assert _failed(memory, pinned_keys=[real]) == ["signatures"]


def test_single_writes_close_together_share_a_checkpoint(store_path: Path, clock: object) -> None:
    from .conftest import FakeClock

    assert isinstance(clock, FakeClock)
    memory = Memory.open(store_path, from_bytes(MASTER), clock=clock, create=True, checkpoint_interval_us=100_000)
    memory.new_signing_key()
    memory.remember("one", subject="a")
    signed = memory.backend.checkpoint()
    memory.remember("two", subject="a")  # within the interval: no new checkpoint yet
    assert memory.backend.checkpoint() == signed
    reader = Memory.open(store_path, from_bytes(MASTER), clock=clock)
    assert "coverage" in [c.name for c in reader.verify_log().failed]  # others see the tail uncovered
    assert memory.verify_log().ok  # the writer's own view signs what it wrote first
    assert memory.backend.checkpoint() != signed
    reader.close()
    clock.advance(0.2)
    memory.remember("three", subject="a")  # past it: this write signs, covering "two" too
    latest = memory.backend.checkpoint()
    assert latest is not None
    assert latest[0] == memory.backend.log_size()
    memory.remember("four", subject="a")
    record = memory.remember("five", subject="a")
    assert memory.receipt(record.id) is not None  # a receipt signs what it needs
    memory.remember("six", subject="a")
    memory.erase("a", request_id="R1", basis="Art. 17(1)(a)", requester="dpo")  # an erasure always signs
    assert memory.backend.checkpoint()[0] == memory.backend.log_size()  # type: ignore[index]
    memory.remember("seven", subject="b")
    memory.close()  # closing signs the tail
    with Memory.open(store_path, from_bytes(MASTER)) as reopened:
        assert reopened.verify_log().ok


@pytest.mark.parametrize(
    "raw",
    [
        b'{"time":1,"type":"tombstone","v":1,"x":' + b"9" * 5000 + b"}",  # past Python's digit limit
        b'{"time":1,"type":"tombstone","v":1,"x":' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"time":1e999,"type":"tombstone","v":1}',
    ],
    ids=["huge integer", "deep nesting", "infinite time"],
)
def test_an_entry_json_cannot_hold_is_not_canonical(raw: bytes) -> None:
    """Entries arrive in certificates and receipts from anyone: a parse error of any kind
    is an EntryError (a failed check), never a ValueError or RecursionError (an HTTP 500)."""
    with pytest.raises(EntryError):
        Entry.decode(raw)
    with pytest.raises(EntryError):
        Entry.canonical_type(raw)


def test_a_verifier_beside_a_writer_verifies_as_of_the_checkpoint_it_signed(store_path: Path) -> None:
    """A writer signs checkpoints at an interval, so another handle verifying meanwhile
    finds entries no checkpoint covers yet, which it cannot tell from a cut log's tail:
    as of the checkpoint the writer signs on request, the log verifies."""
    with Memory.open(store_path, from_bytes(MASTER), create=True, checkpoint_interval_us=3_600_000_000) as writer:
        writer.new_signing_key()
        size = Checkpoint.parse(writer.checkpoint().text).size
        writer.remember("written after the checkpoint", subject="a")  # not signed for an hour
        with Memory.open(store_path, from_bytes(MASTER)) as verifier:
            assert not verifier.verify_log().ok  # the unsigned tail, as a cut log would show
            assert verifier.verify_log(size=size).ok
            assert verifier.verify_audit(size=size).ok
            with pytest.raises(NotFoundError):
                verifier.verify_log(size=size + 1)


def test_a_verification_leaves_an_uncovered_tail_as_it_found_it(store_path: Path, clock: object) -> None:
    """A writer that stopped before signing (a crash) leaves a tail no checkpoint covers.
    Every verification reports it, the second as the first: verifying writes nothing, and
    a handle that wrote nothing signs nothing as it closes. The next write signs it."""
    from .conftest import FakeClock

    assert isinstance(clock, FakeClock)
    writer = Memory.open(store_path, from_bytes(MASTER), clock=clock, create=True, checkpoint_interval_us=100_000)
    writer.new_signing_key()
    writer.remember("signed", subject="a")
    writer.remember("within the interval: left unsigned", subject="a")
    writer.keys.close()  # the process dies: no close(), no signing
    writer.backend.close()
    for _ in range(2):
        with Memory.open(store_path, from_bytes(MASTER), clock=clock) as verifier:
            assert [c.name for c in verifier.verify_log().failed] == ["coverage"]
    with Memory.open(store_path, from_bytes(MASTER), clock=clock) as later:
        later.remember("a later write signs the log to its end", subject="b")
    with Memory.open(store_path, from_bytes(MASTER), clock=clock) as verifier:
        assert verifier.verify_log().ok


def test_verify_receipt_refuses_arguments_of_the_wrong_type(memory: Memory) -> None:
    receipt = memory.receipt(memory.remember("kept", subject="a").id)
    key = memory.public_key()
    with pytest.raises(InvalidInputError, match="receipt must be a Receipt"):
        verify_receipt(receipt.to_json(), [key], pinned=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="trusted must be a list"):
        verify_receipt(receipt, key, pinned=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="pinned must be True or False"):
        verify_receipt(receipt, [key], pinned=1)  # type: ignore[arg-type]
    assert verify_receipt(receipt, [key], pinned=True).ok


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_edited_entry_is_placed_before_or_after_the_pinned_checkpoint(memory: Memory, where: str) -> None:
    """Check 7 re-derives the pinned tree's root from the entries: an edit inside it is
    named so, and one after it no longer blames the pinned checkpoint's tree."""
    memory.remember_many([NewMemory(f"n{i}", subject=f"p{i}") for i in range(6)])
    pinned = memory.checkpoint()
    size = Checkpoint.parse(pinned.text).size
    memory.remember_many([NewMemory(f"m{i}", subject=f"q{i}") for i in range(6)])
    memory.checkpoint()
    index = size - 2 if where == "before" else size + 3
    [(_, raw)] = list(memory.backend.log_entries(index, index + 1))
    assert b'"type":"write"' in raw
    _conn(memory).execute(
        "UPDATE log_entries SET entry = ? WHERE idx = ?", (raw.replace(b'"time":1', b'"time":2'), index)
    )
    report = memory.verify_log(pinned_keys=memory.announced_keys()[:1], pinned_checkpoint=pinned)
    [detail] = [c.detail for c in report.failed if c.name == "pinned"]
    if where == "before":
        assert detail.startswith(f"the log's first {size} entries do not produce the pinned checkpoint's root")
    else:
        assert detail.startswith(f"the entries of the pinned checkpoint's tree (size {size}) are intact")
        assert f"an entry at index {size} or later" in detail
    assert f"subtree 0/{index} does not match" in next(c.detail for c in report.failed if c.name == "stored_tree")
