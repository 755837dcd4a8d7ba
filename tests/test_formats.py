"""Byte formats pinned by golden files, and serialization round trips.

Ed25519 signatures are deterministic (RFC 8032), so a fixed seed gives fixed
bytes. Regenerate with DELEATUR_REGENERATE_GOLDEN=1 only when a format change is
intended, and say so in the commit.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from deleatur.log.checkpoint import Checkpoint
from deleatur.log.cosignature import Cosigner
from deleatur.log.entries import Entry, EventType
from deleatur.log.merkle import leaf_hash
from deleatur.log.note import Note, Signer, sign_note
from deleatur.log.tlogproof import TlogProof
from deleatur.log.witness import format_request, parse_request

from .test_merkle import LEAVES, REFERENCE, _root

GOLDEN = Path(__file__).parent / "golden"
SIGNER = Signer("example.com/deleatur-golden", Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
WITNESS = Cosigner("witness.example/golden", Ed25519PrivateKey.from_private_bytes(bytes(range(32, 64))))


def _golden(name: str, actual: str) -> None:
    path = GOLDEN / name
    if os.environ.get("DELEATUR_REGENERATE_GOLDEN"):
        path.write_text(actual, encoding="utf-8")
    assert actual == path.read_text(encoding="utf-8"), f"{name} changed: a format change needs a new golden file"


def _checkpoint() -> Note:
    return sign_note(Checkpoint(SIGNER.name, 8, _root(8)).body(), SIGNER)


def test_keys_golden() -> None:
    _golden("keys.txt", f"{SIGNER.verifier.vkey}\n{SIGNER.skey}\n{WITNESS.verifier.vkey}\n")


def test_signed_checkpoint_golden() -> None:
    _golden("checkpoint.txt", _checkpoint().format())


def test_cosigned_checkpoint_golden() -> None:
    note = _checkpoint()
    _golden("cosigned-checkpoint.txt", note.with_signatures([WITNESS.cosign(note.text, 1_790_000_000)]).format())


def test_tlog_proof_golden() -> None:
    from deleatur.log.merkle import inclusion_proof

    proof = TlogProof(5, tuple(inclusion_proof(5, 8, REFERENCE.node)), _checkpoint(), extra=LEAVES[5])
    _golden("index-5.tlog-proof", proof.format())
    assert TlogProof.parse(proof.format()) == proof
    assert leaf_hash(LEAVES[5]) == REFERENCE.node(0, 5)


def test_log_entries_golden() -> None:
    entries = [
        Entry(EventType.KEY, 1_790_000_000_000_000, {"vkey": SIGNER.verifier.vkey}),
        Entry(EventType.WRITE, 1_790_000_000_000_001, {"record": "01a22a03-19d9-75ea-b6f8-0a895b612b14",
              "tenant": "default", "commitment": "00" * 32}),
        Entry(EventType.RETIRE, 1_790_000_000_000_002, {"record": "01a22a03-19d9-75ea-b6f8-0a895b612b14",
              "tenant": "ünïcode"}),
        Entry(EventType.RECTIFY, 1_790_000_000_000_003, {"record": "01a22a03-19d9-75ea-b6f8-0a895b612b15",
              "tenant": "default", "commitment": "11" * 32, "supersedes": "01a22a03-19d9-75ea-b6f8-0a895b612b14",
              "erased": ["01a22a03-19d9-75ea-b6f8-0a895b612b14"]}),
        Entry(EventType.ERASURE, 1_790_000_000_000_005, {"request": "DSAR-17", "basis": "Art. 17(1)(a)",
              "tenant": "default", "records": 1, "received": 1_790_000_000_000_004, "kind": "subject",
              "keys": [bytes(range(16)).hex()]}),
    ]  # fmt: skip
    _golden("log-entries.txt", "".join(e.encode().decode("ascii") + "\n" for e in entries))


def test_add_checkpoint_request_golden() -> None:
    from deleatur.log.merkle import consistency_proof

    old = 3
    body = format_request(old, consistency_proof(old, 8, REFERENCE.node), _checkpoint())
    _golden("add-checkpoint.txt", body)
    assert parse_request(body)[0] == old


_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30)


@given(
    st.sampled_from(list(EventType)),
    st.integers(min_value=0, max_value=2**62),
    st.dictionaries(st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=8),
                    st.one_of(_text, st.integers(), st.lists(_text, max_size=3)), max_size=5),
)  # fmt: skip
def test_entries_round_trip(kind: EventType, time: int, fields: dict[str, object]) -> None:
    fields = {k: v for k, v in fields.items() if k not in {"v", "type", "time"}}
    entry = Entry(kind, time, fields)
    assert Entry.decode(entry.encode()) == entry


@given(
    st.lists(_text.filter(lambda t: "\n" not in t and t.strip() == t), min_size=1, max_size=4),
    st.integers(min_value=0, max_value=2**40),
)
def test_checkpoints_and_notes_round_trip(lines: list[str], size: int) -> None:
    cp = Checkpoint(lines[0], size, bytes(range(32)), tuple(lines[1:]))
    assert Checkpoint.parse(cp.body()) == cp
    note = sign_note(cp.body(), SIGNER)
    assert Note.parse(note.format()) == note


def test_non_canonical_entries_are_refused() -> None:
    from deleatur.log.entries import EntryError

    with pytest.raises(EntryError, match="canonical"):
        Entry.decode(b'{"v":1, "type":"retire","time":1}')
    with pytest.raises(EntryError, match="type the canonical form does not allow"):
        Entry(EventType.WRITE, 1, {"x": 1.5})
