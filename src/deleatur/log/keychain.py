"""Following a log's signing keys across rotations, with a pinned key alone.

`keys rotate` logs a ``key`` entry naming the new key, its predecessor, and the
predecessor's Ed25519 signature over ``deleatur/key-rotation/v1\\n<new vkey>\\n``
(:func:`~deleatur.log.tlog.rotation_message`); the checkpoint at the rotation is
signed by both keys. Verifiers pin one key; an artifact (a certificate, a receipt,
a checkpoint) may be signed by another key of the same log. Which one may be
trusted depends on the direction:

* **A later key** is vouched for by the pinned one: the endorsement in its
  announcement is the pinned key's own signature (or a chain of them). This is
  what a witness needs to follow a rotation (:meth:`Witness.update_log
  <deleatur.log.witness.Witness.update_log>`).
* **An earlier key** is *not* vouched for by its own endorsements: anyone can make
  a key and have it sign "my successor is the pinned key". What vouches for it is
  the pinned key's signature over a tree that logs the chain from that earlier key
  up to the pinned key: every announcement proven included (RFC 9162 §2.1.3) under
  a checkpoint the pinned key signed, each endorsed by the key before it. The
  artifact must then be signed by the key *current* at its tree size (the last one
  announced before it, the rule ``log verify`` applies: a retired key signs no
  later tree), and its tree must be a prefix of the pinned key's tree (RFC 9162
  §2.1.4 consistency), so a retired key that leaked cannot vouch for a tree of its
  own making. The proofs come from the log itself (a store, read-only), so an
  earlier key is accepted only with ``--store``; offline, the verifier names the key
  that signed and says how to check it.

Nothing here needs a private key.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import NotFoundError
from .checkpoint import Checkpoint
from .entries import Entry, EntryError, EventType
from .merkle import (
    NodeReader,
    ProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)
from .note import Note, NoteError, Verifier, describe, signers_of
from .verify import announce_key

#: A key entry as a proof carries it: index, the entry's bytes, its inclusion proof.
KeyEntryProof = tuple[int, bytes, Sequence[bytes]]


class LogSource(Protocol):
    """The read-only view of a log that proving a key chain needs (a store's files)."""

    def log_size(self) -> int: ...

    def key_entries(self, size: int) -> list[tuple[int, bytes]]: ...

    def log_node(self, level: int, index: int) -> bytes: ...

    def checkpoints_after(self, size: int) -> Iterator[tuple[int, str]]: ...


def proven_key_chain(entries: Iterable[KeyEntryProof], anchor: Checkpoint) -> list[tuple[int, Verifier]]:
    """The keys the given entries announce, oldest first with the index announcing each,
    after proving every entry included in ``anchor``'s tree and every key endorsed by
    the one before it. The entries start at the log's first key: a chain that starts
    later, or skips a key, fails the endorsement check. Raises :class:`NoteError`."""
    keys: list[tuple[int, Verifier]] = []
    for index, raw, proof in entries:
        try:
            verify_inclusion(index, anchor.size, leaf_hash(raw), proof, anchor.root)
            entry = Entry.decode(raw)
        except ProofError as exc:
            raise NoteError(f"key entry {index} is not in the tree of size {anchor.size}: {exc.message}") from None
        except EntryError as exc:
            raise NoteError(f"key entry {index}: {exc.message}") from None
        if entry.type is not EventType.KEY:
            raise NoteError(f"entry {index} is not a key announcement")
        problem = announce_key(entry, index, keys)
        if problem is not None:
            raise NoteError(problem)
    return keys


def key_entry_proofs(source: LogSource, size: int) -> list[KeyEntryProof]:
    """Every key announcement among the first ``size`` entries of ``source``, each with
    its inclusion proof in the tree of that size (to be checked against a signed root)."""
    try:
        return [
            (index, raw, inclusion_proof(index, size, source.log_node))
            for index, raw in source.key_entries(size)
            if Entry.canonical_type(raw) == EventType.KEY
        ]
    except EntryError as exc:
        raise NoteError(f"a key entry is malformed: {exc.message}") from None
    except NotFoundError as exc:
        raise NoteError(f"the log cannot prove its key entries: {exc.message}") from None


def unproven_hint(signer: str, pinned: Verifier) -> str:
    """Why an artifact signed by another key than the pinned one fails offline, and what
    to do: the proof that an earlier key is endorsed up to the pinned one is in the log."""
    return (
        f"signed by {signer}, not by the pinned key {describe(pinned)}; if that is a key this log "
        "used before a rotation, pass --store to check it is endorsed through the log's key chain "
        "up to the pinned key, or pin it (`deleatur keys show` lists the log's keys)"
    )


@dataclass(frozen=True, slots=True)
class KeyChain:
    """The keys of a log up to a pinned key, proven by a checkpoint the pinned key
    signed: ``keys`` ends with ``pinned``, each entry announcing them is in ``anchor``'s
    tree, each key endorsed by the one before it. ``node`` reads the log's stored hashes,
    for the consistency proofs that tie an earlier key's tree to ``anchor``."""

    pinned: Verifier
    anchor: Checkpoint
    keys: tuple[tuple[int, Verifier], ...]
    node: NodeReader

    @classmethod
    def from_log(cls, pinned: Verifier, source: LogSource) -> KeyChain:
        """Prove the chain from ``source``'s entries, anchored at the first stored
        checkpoint after the pinned key's announcement that the pinned key signed (the
        checkpoint at its rotation, which its predecessor signed too). Raises
        :class:`NoteError` naming what is missing."""
        announced = None
        for index, raw in source.key_entries(source.log_size()):
            try:
                entry = Entry.decode(raw)
            except EntryError:
                continue  # proven, or refused, with the whole chain below
            if entry.type is EventType.KEY and entry.fields.get("vkey") == pinned.vkey:
                announced = index
                break
        if announced is None:
            raise NoteError(f"the store's log never announced the pinned key {describe(pinned)}")
        for _, text in source.checkpoints_after(announced):
            try:
                note = Note.parse(text)
                anchor = Checkpoint.parse(note.text)
            except NoteError:
                continue
            if any(pinned.matches(s) and pinned.verify(note.text, s) for s in note.signatures):
                break
        else:
            raise NoteError(f"the store holds no checkpoint signed by the pinned key {describe(pinned)}")
        keys = proven_key_chain(key_entry_proofs(source, anchor.size), anchor)
        at = next((i for i, (_, k) in enumerate(keys) if k == pinned), None)
        if at is None:
            raise NoteError(f"the key chain the pinned key signed does not reach {describe(pinned)}")
        return cls(pinned, anchor, tuple(keys[: at + 1]), source.log_node)

    def signer_of(self, note: Note) -> Verifier:
        """The key that signed checkpoint ``note``: the pinned key, or the earlier key of
        the chain current at its tree size, whose tree the anchor extends. Raises
        :class:`NoteError` naming the key that signed, if it is neither."""
        checkpoint = Checkpoint.parse(note.text)
        if checkpoint.origin != self.anchor.origin:
            raise NoteError(f"the checkpoint is of log {checkpoint.origin}, not {self.anchor.origin}")
        if any(self.pinned.matches(s) and self.pinned.verify(note.text, s) for s in note.signatures):
            return self.pinned
        current = [key for at, key in self.keys if at < checkpoint.size][-1:]
        if not current or current[0] == self.pinned or checkpoint.size > self.anchor.size:
            raise NoteError(
                f"signed by {signers_of(note)}, which is not the key the log's chain up to the pinned key "
                f"{describe(self.pinned)} had at tree size {checkpoint.size}"
            )
        key = current[0]
        if not any(key.matches(s) and key.verify(note.text, s) for s in note.signatures):
            raise NoteError(
                f"signed by {signers_of(note)}, not by {describe(key)}, the earlier key the log's chain "
                f"endorses up to the pinned key at tree size {checkpoint.size}"
            )
        try:
            proof = consistency_proof(checkpoint.size, self.anchor.size, self.node)
            verify_consistency(checkpoint.size, self.anchor.size, checkpoint.root, self.anchor.root, proof)
        except ProofError as exc:
            raise NoteError(
                f"the tree {describe(key)} signed is not a prefix of the one the pinned key signed: {exc.message}"
            ) from None
        except NotFoundError as exc:
            raise NoteError(f"the store cannot prove consistency: {exc.message}") from None
        return key

    def endorsement(self, key: Verifier) -> str:
        """How ``key`` is trusted, for a passing check's detail."""
        if key == self.pinned:
            return ""
        return f", an earlier key endorsed through the log's key chain up to the pinned key {describe(self.pinned)}"
