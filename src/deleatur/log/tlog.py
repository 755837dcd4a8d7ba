"""The store's transparency log: append entries, sign checkpoints, make proofs.

Entries and complete-subtree hashes live in the store's own database (through
the backend protocol), so an operation and the log entries describing it commit
in one transaction. Appending reads the O(log n) peaks of the tree and writes
O(1) amortized nodes per entry; proofs read O(log n) stored hashes.

Whoever can write to the database can add entries, and the subtree hashes to match,
without any of the store's keys; a checkpoint the store then signed over them would
vouch for them as its own. So each entry carries a MAC under a key derived from the
master key, and before signing a tree the log checks the entries no checkpoint it
signed covers yet: their MACs, and the stored hashes against the tree rebuilt from
them on top of that checkpoint's. A tree this handle built itself on one it had
checked, with no other connection committing since, is signed without reading it back.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Callable, Sequence

from ..clock import Clock
from ..errors import DeleaturError, IntegrityError
from ..store.protocol import Backend
from .checkpoint import Checkpoint
from .entries import Entry, EntryError, EventType
from .merkle import CompactRange, NodeReader, consistency_proof, inclusion_proof, leaf_hash, subtree_root
from .note import Note, NoteError, Signer
from .retention import pruned_leaf

#: mac(index, leaf hash): an entry's MAC under the store's secret (EntryAuthenticator).
EntryMac = Callable[[int, bytes], bytes]

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


def leaf_of(raw: bytes) -> bytes:
    """The leaf hash of a stored entry, whole or pruned by audit retention."""
    leaf = pruned_leaf(raw)
    return leaf_hash(raw) if leaf is None else leaf


class TransparencyLog:
    def __init__(self, backend: Backend, *, origin: str, signer: Signer | None, mac: EntryMac, clock: Clock) -> None:
        self.backend = backend
        self.origin = origin
        self.signer = signer
        self._mac = mac
        self._clock = clock
        # The tree's right edge after our last committed append, valid while no other
        # connection has committed (PRAGMA data_version unchanged) and the size agrees;
        # "authentic" if every entry and stored hash of the log up to it is known good:
        # checked before a signing, or appended since by this handle on such a tree.
        self._cache: CompactRange | None = None
        self._cache_authentic = False
        self._uncommitted: CompactRange | None = None
        self._uncommitted_authentic = False
        self._uncommitted_start = 0  # the size of the log the last append built on
        self._cache_version = self._uncommitted_version = -1
        # The last checkpoint this handle signed: its note as stored, the checkpoint, and
        # the key that signed it (see _own_anchor).
        self._signed_here: tuple[str, Checkpoint, bytes] | None = None

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
        version = self.backend.data_version()
        cached, self._cache = self._cache, None
        if cached is not None and cached.size == start and self._cache_version == version:
            # No other connection committed since our last committed append, and the
            # size agrees: the cached right edge is the log's.
            compact, authentic = cached, self._cache_authentic
        else:
            compact = CompactRange(start, self.backend.log_nodes(CompactRange.peak_positions(start)))
            authentic = False
        rows: list[tuple[bytes, str | None, bytes]] = []
        nodes: list[tuple[int, int, bytes]] = []
        for entry, record_id in entries:
            raw = entry.encode()
            leaf = leaf_hash(raw)
            rows.append((raw, record_id, self._mac(compact.size, leaf)))
            nodes += compact.append(leaf)
        self.backend.log_append(start, rows, nodes)
        self._uncommitted, self._uncommitted_authentic = compact, authentic
        self._uncommitted_start = start
        # A transaction that rolled back leaves this tree behind: another connection's
        # commit since (and only that could bring the log back to its size) retires it.
        self._uncommitted_version = version
        return start

    def entry_mac(self, index: int, raw: bytes) -> bytes:
        """The MAC entry ``index`` must carry (for a store upgraded to schema v16)."""
        return self._mac(index, leaf_of(raw))

    def committed(self) -> None:
        """The transaction of the last append committed (or, in a write group, its
        savepoint was released): its tree may be reused."""
        self._cache, self._uncommitted = self._uncommitted, None
        self._cache_authentic = self._uncommitted_authentic
        self._cache_version = self.backend.data_version()

    def rolled_back(self) -> None:
        """A write group's transaction rolled back: the trees its appends made are gone."""
        self._cache = self._uncommitted = None

    def sign_appended(self) -> Note:
        """Sign the tree the last ``append`` made, in the same transaction: if it was
        built on a tree already checked, its root is known from the peaks and nothing is
        read back. The size is new, so no checkpoint of it can exist (the store refuses a
        second one if it somehow did)."""
        if self.signer is None:
            raise LogError("this store has no signing key; run `deleatur keys new`")
        assert self._uncommitted is not None
        compact = self._authentic(self._uncommitted.size, (self.signer,))
        checkpoint = Checkpoint(self.origin, compact.size, compact.root())
        note = Note(checkpoint.body(), (self.signer.sign(checkpoint.body()),))
        self.backend.put_checkpoint(compact.size, note.format(), replace=False)
        self._signed_here = (note.format(), checkpoint, self.signer.key_id)
        return note

    def checkpoint(self, *extra_signers: Signer) -> Note:
        """Sign the current tree head (inside the caller's transaction) and store it.

        A log must never sign two different roots for one size: an existing
        checkpoint of this size must carry the same root.
        """
        if self.signer is None:
            raise LogError("this store has no signing key; run `deleatur keys new`")
        size = self.backend.log_size()
        checkpoint = Checkpoint(self.origin, size, self._authentic(size, (self.signer, *extra_signers)).root())
        body = checkpoint.body()
        existing = self.backend.checkpoint(size)
        if existing is not None and not existing[1].startswith(body + "\n"):
            raise IntegrityError(f"refusing to sign a second, different checkpoint for size {size}")
        note = Note(body, tuple(s.sign(body) for s in (self.signer, *extra_signers)))
        if existing is None or extra_signers:
            self.backend.put_checkpoint(size, note.format(), replace=True)
            self._signed_here = (note.format(), checkpoint, self.signer.key_id)
        return note

    # -- what the store signs ------------------------------------------------------

    def _authentic(self, size: int, signers: Sequence[Signer]) -> CompactRange:
        """The tree of the log's first ``size`` entries, once it is known that the
        store's own writers made it (raises IntegrityError otherwise): the tree this
        handle is building in its transaction, or the one it last committed, if it was
        checked (no other connection has committed since); else checked now."""
        version = self.backend.data_version()
        edge: CompactRange | None = None
        if self._uncommitted is not None and self._uncommitted_version == version:
            edge, authentic = self._uncommitted, self._uncommitted_authentic
        elif self._cache is not None and self._cache_version == version:
            edge, authentic = self._cache, self._cache_authentic
        if edge is not None and edge.size == size:
            if authentic:
                return edge
            if edge is self._uncommitted:
                # The handle made its own entries on the stored tree of the log's first
                # entries, which the check covers (its peaks included): what it appends
                # next in this transaction needs no check, nor do its own entries (two
                # writers taking turns checked each other's entries and their own).
                self._checked_tree(self._uncommitted_start, signers)
                self._uncommitted_authentic = True
                return edge
            checked = self._checked_tree(size, signers)
            # The handle's tree is the stored one, now checked: what it appends next on
            # top of it, after it commits, needs no check.
            self._cache_authentic = True
            return checked
        return self._checked_tree(size, signers)

    def _checked_tree(self, size: int, signers: Sequence[Signer]) -> CompactRange:
        """The tree of the first ``size`` entries, rebuilt from the entries after the
        newest stored checkpoint one of ``signers`` signed (the whole log if there is
        none) on top of the stored hashes that checkpoint's root vouches for. Each of
        those entries must carry its MAC, and every stored hash they complete must be
        the one rebuilt; the first that is not is named in an IntegrityError, and
        nothing is signed. The cost is that of the unsigned tail, not of the log."""
        anchor = self._anchor(size, signers)
        start = 0 if anchor is None else anchor.size
        compact = CompactRange(start, self.backend.log_nodes(CompactRange.peak_positions(start)))
        if anchor is not None and compact.root() != anchor.root:
            raise IntegrityError(
                f"the log's stored subtree hashes at tree size {start} do not give the root this store signed"
                " there: the database was altered; nothing was signed"
            )
        made: list[tuple[int, int, bytes]] = []
        for index, raw, mac in self.backend.log_entries_with_macs(start, size):
            leaf = leaf_of(raw)
            if index != compact.size or mac is None or not hmac.compare_digest(mac, self._mac(index, leaf)):
                raise IntegrityError(
                    f"log entry {compact.size} was not written with this store's keys (its MAC is missing or"
                    " wrong, or the entry is missing): the database was altered, or an older release wrote to it"
                    " after the upgrade; nothing was signed over it"
                )
            made += compact.append(leaf)
        if compact.size != size:
            raise IntegrityError(f"log entry {compact.size} is missing; nothing was signed")
        stored = self.backend.log_nodes([(level, index) for level, index, _ in made])
        for (level, index, digest), found in zip(made, stored, strict=True):
            if found != digest:
                raise IntegrityError(
                    f"the log's stored hash of subtree {level}/{index} does not match its entries:"
                    " the database was altered; nothing was signed"
                )
        return compact

    def _anchor(self, size: int, signers: Sequence[Signer]) -> Checkpoint | None:
        """The newest stored checkpoint one of ``signers`` signed (a row that is not
        one is someone else's, and passed over), None if there is none; refused if it
        is of a tree larger than the log: entries it covers are gone. Or the one this
        handle last signed, if it may stand in for it (see _own_anchor)."""
        own = self._own_anchor(size, signers)
        if own is not None:
            return own
        verifiers = [signer.verifier for signer in signers]
        for stored, text in self.backend.checkpoints(newest_first=True):
            try:
                note = Note.parse(text)
                checkpoint = Checkpoint.parse(note.text)
            except NoteError:
                continue
            signed = any(v.matches(s) and v.verify(note.text, s) for s in note.signatures for v in verifiers)
            if not signed or checkpoint.origin != self.origin or checkpoint.size != stored:
                continue
            if stored > size:
                raise IntegrityError(
                    f"the log has {size} entries, fewer than the {stored} of a checkpoint this store signed:"
                    " entries were removed; nothing was signed"
                )
            return checkpoint
        return None

    def _own_anchor(self, size: int, signers: Sequence[Signer]) -> Checkpoint | None:
        """The checkpoint this handle last signed, if the store holds it as signed (its
        transaction committed, and nobody changed it) and no checkpoint of a larger tree
        than ``size``: its tree was checked before it was signed, so it needs no
        signature verified, where the newest, another writer's, would (an Ed25519
        verification at each signing of two writers taking turns). The entries after it
        are checked as any unsigned tail is."""
        if self._signed_here is None:
            return None
        text, checkpoint, key_id = self._signed_here
        if checkpoint.size > size or all(signer.key_id != key_id for signer in signers):
            return None
        newest = self.backend.checkpoint()
        if newest is None or newest[0] > size:
            return None  # the scan decides, and refuses what covers entries that are gone
        stored = newest if newest[0] == checkpoint.size else self.backend.checkpoint(checkpoint.size)
        return checkpoint if stored is not None and stored[1] == text else None

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

    def written(self, index: int) -> Entry | None:
        """Entry ``index`` if the store wrote it (it carries its MAC, and is whole and
        canonical), else None."""
        for at, raw, mac in self.backend.log_entries_with_macs(index, index + 1):
            if mac is not None and hmac.compare_digest(mac, self.entry_mac(at, raw)):
                try:
                    return Entry.decode(raw)
                except EntryError:
                    return None
        return None
