"""The store's transparency log: append entries, sign checkpoints, make proofs.

Entries and complete-subtree hashes live in the store's own database (through
the backend protocol), so an operation and the log entries describing it commit
in one transaction. Appending reads the O(log n) peaks of the tree and writes
O(1) amortized nodes per entry; proofs read O(log n) stored hashes.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence

from ..clock import Clock
from ..errors import DeleaturError, IntegrityError
from ..store.protocol import Backend
from .checkpoint import Checkpoint
from .entries import Entry, EventType
from .merkle import CompactRange, NodeReader, consistency_proof, inclusion_proof, leaf_hash, subtree_root
from .note import Note, Signer, Verifier
from .retention import pruned_leaf

ROTATION_CONTEXT = b"deleatur/key-rotation/v1\n"


class LogError(DeleaturError):
    """The log cannot do what was asked (no signing key, size out of range, ...)."""

    exit_code = 2


def rotation_message(new_vkey: str) -> bytes:
    """What the outgoing key signs to endorse its successor."""
    return ROTATION_CONTEXT + new_vkey.encode() + b"\n"


class _Recorder:
    """Collects the node positions a proof needs, so they are read in one query."""

    def __init__(self) -> None:
        self.positions: list[tuple[int, int]] = []

    def __call__(self, level: int, index: int) -> bytes:
        self.positions.append((level, index))
        return bytes(32)


class TransparencyLog:
    def __init__(self, backend: Backend, *, origin: str, signer: Signer | None, clock: Clock) -> None:
        self.backend = backend
        self.origin = origin
        self.signer = signer
        self._clock = clock
        self._appended: tuple[int, bytes] | None = None
        # The tree's right edge after our last committed append, valid while no other
        # connection has committed (PRAGMA data_version unchanged) and the size agrees.
        self._cache: CompactRange | None = None
        self._uncommitted: CompactRange | None = None
        self._cache_version = -1

    # -- reading stored hashes -----------------------------------------------------

    def _batched(self, compute: Callable[[NodeReader], list[bytes]]) -> list[bytes]:
        """Run ``compute`` once to learn which stored hashes it reads, fetch them in
        one query, then run it for real."""
        recorder = _Recorder()
        compute(recorder)
        hashes = dict(zip(recorder.positions, self.backend.log_nodes(recorder.positions), strict=True))
        return compute(lambda level, index: hashes[(level, index)])

    def entry(self, index: int) -> bytes:
        for _, raw in self.backend.log_entries(index, index + 1):
            if pruned_leaf(raw) is not None:
                raise LogError(f"entry {index} was pruned by audit retention; only its leaf hash remains")
            return raw
        raise LogError(f"the log has no entry {index}")

    def root(self, size: int) -> bytes:
        self._check_size(size)
        return self._batched(lambda node: [subtree_root(0, size, node)])[0]

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        self._check_size(size)
        return self._batched(lambda node: inclusion_proof(index, size, node))

    def consistency_proof(self, old_size: int, new_size: int) -> list[bytes]:
        self._check_size(new_size)
        return self._batched(lambda node: consistency_proof(old_size, new_size, node))

    def _check_size(self, size: int) -> None:
        current = self.backend.log_size()
        if not 0 <= size <= current:
            raise LogError(f"tree size {size} is outside the log (which has {current} entries)")

    # -- appending -----------------------------------------------------------------

    def append(self, entries: Sequence[tuple[Entry, str | None]]) -> int:
        """Append inside the caller's transaction; returns the index of the first entry."""
        start = self.backend.log_size()
        cached, self._cache = self._cache, None
        if cached is not None and cached.size == start and self._cache_version == self.backend.data_version():
            # No other connection committed since our last committed append, and the
            # size agrees: the cached right edge is the log's.
            compact = cached
        else:
            compact = CompactRange(start, self.backend.log_nodes(CompactRange.peak_positions(start)))
        encoded = [(entry.encode(), record_id) for entry, record_id in entries]
        nodes = [node for raw, _ in encoded for node in compact.append(leaf_hash(raw))]
        self.backend.log_append(start, encoded, nodes)
        self._appended = (compact.size, compact.root())
        self._uncommitted = compact
        return start

    def committed(self) -> None:
        """The transaction of the last append committed (or, in a write group, its
        savepoint was released): its tree may be reused."""
        self._cache, self._uncommitted = self._uncommitted, None
        self._cache_version = self.backend.data_version()

    def rolled_back(self) -> None:
        """A write group's transaction rolled back: the trees its appends made are gone."""
        self._cache = self._uncommitted = None

    def sign_appended(self) -> Note:
        """Sign the tree the last ``append`` made, in the same transaction: its root is
        already known from the peaks, so nothing is read back. The size is new, so no
        checkpoint of it can exist (the store refuses a second one if it somehow did)."""
        if self.signer is None:
            raise LogError("this store has no signing key; run `deleatur keys new`")
        assert self._appended is not None
        size, root = self._appended
        body = Checkpoint(self.origin, size, root).body()
        note = Note(body, (self.signer.sign(body),))
        self.backend.put_checkpoint(size, note.format(), replace=False)
        return note

    def checkpoint(self, *extra_signers: Signer) -> Note:
        """Sign the current tree head (inside the caller's transaction) and store it.

        A log must never sign two different roots for one size: an existing
        checkpoint of this size must carry the same root.
        """
        if self.signer is None:
            raise LogError("this store has no signing key; run `deleatur keys new`")
        size = self.backend.log_size()
        body = Checkpoint(self.origin, size, self.root(size)).body()
        existing = self.backend.checkpoint(size)
        if existing is not None and not existing[1].startswith(body + "\n"):
            raise IntegrityError(f"refusing to sign a second, different checkpoint for size {size}")
        note = Note(body, tuple(s.sign(body) for s in (self.signer, *extra_signers)))
        if existing is None or extra_signers:
            self.backend.put_checkpoint(size, note.format(), replace=True)
        return note

    def latest_checkpoint(self) -> Note:
        found = self.backend.checkpoint()
        if found is None:
            raise LogError("the log has no checkpoint yet")
        return Note.parse(found[1])

    def announce_key(self, new: Signer, *, previous: Signer | None) -> int:
        """Log a signing key. The first key stands alone; each later one is endorsed
        by the key it replaces, so a verifier that pins the first can follow them."""
        fields: dict[str, object] = {"vkey": new.verifier.vkey}
        if previous is not None:
            fields["previous"] = previous.verifier.vkey
            fields["endorsement"] = base64.b64encode(previous.sign_bytes(rotation_message(new.verifier.vkey))).decode()
        index = self.append([(Entry(EventType.KEY, self._clock(), fields), None)])
        self.backend.put_signing_key(new.key_id.hex(), new.verifier.vkey, index, self._clock())
        return index

    def verifiers(self) -> list[Verifier]:
        """Every signing key this log has announced (the store's own view: pin one for trust)."""
        return [Verifier.from_vkey(vkey) for _, vkey, _, _ in self.backend.signing_keys()]
