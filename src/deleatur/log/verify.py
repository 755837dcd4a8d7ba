"""Verifying a whole log from its entries, with the public key alone.

The verifier re-derives the Merkle tree from the entries and checks, in order:

 1. entries       indexes run 0..n-1 and every entry is canonical
 2. key_chain     the first key is the pinned one (if pinned); each later key is
                  endorsed by the key before it
 3. signatures    every checkpoint is signed by a key announced before its size
 4. roots         every checkpoint's root equals the re-derived root at its size
 5. coverage      the newest checkpoint covers every entry (a dropped tail or an
                  unsigned addition fails here)
 6. stored_tree   the stored subtree hashes that proofs are built from match
 7. pinned        the log is consistent with a checkpoint pinned by the reader, signed
                  by the pinned key or, the key chain holding, by any key of it (an
                  earlier key is covered by the pinned key's checkpoints, checks 2-4)
 8. retention     every entry pruned by audit retention is accounted for by a
                  retention anchor (see :mod:`deleatur.log.retention`)
 9. key_list      (a store's log) the store's list of its signing keys is the keys
                  the log announces: a key someone added to the list, and the store
                  would report as its own, fails here

Nothing here needs a private key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from .checkpoint import Checkpoint
from .entries import Entry, EntryError, EventType
from .merkle import CompactRange, ProofError, leaf_hash, verify_consistency
from .note import Note, NoteError, Verifier, b64decode, describe, signers_of
from .report import Report
from .retention import AnchorChecker, pruned_leaf
from .tlog import rotation_message

StoredLevel = Callable[[int], Iterator[tuple[int, bytes]]]


def announce_key(entry: Entry, index: int, keys: list[tuple[int, Verifier]]) -> str | None:
    """Add an announced key to ``keys``; returns a problem, or None."""
    vkey = entry.fields.get("vkey")
    if not isinstance(vkey, str):
        return f"key entry {index} has no verifier key"
    try:
        new = Verifier.from_vkey(vkey)
    except NoteError as exc:
        return f"key entry {index}: {exc.message}"
    if keys:
        previous = keys[-1][1]
        endorsement = entry.fields.get("endorsement")
        if entry.fields.get("previous") != previous.vkey or not isinstance(endorsement, str):
            return f"key entry {index} is not endorsed by the key it replaces"
        try:
            endorsed = previous.verify_bytes(rotation_message(vkey), b64decode(endorsement, "endorsement"))
        except NoteError:
            endorsed = False
        if not endorsed:
            return f"key entry {index}: the endorsement by the previous key does not verify"
    keys.append((index, new))
    return None


def verify_log(
    entries: Iterable[tuple[int, bytes]],
    checkpoints: Iterable[tuple[int, str]],
    stored_level: StoredLevel,
    *,
    pinned_keys: list[Verifier] | None = None,
    pinned_checkpoint: Note | None = None,
    consistency: Callable[[int, int], list[bytes]] | None = None,
    listed_keys: Iterable[tuple[str, str, int]] | None = None,
    pin_with: str = "deleatur log verify --expected-checkpoint FILE",
    key_with: str = "deleatur log verify --expected-pubkey",
) -> Report:
    """``listed_keys``: the store's list of its signing keys (key id, verifier key, index of
    the announcing entry), compared with the log's announcements in check 9. ``pin_with``
    and ``key_with`` name, in the notes of an unpinned verification, the command that
    pins a checkpoint and a key (the notes reach HTTP and MCP callers too, who pin
    neither: the command is where they can)."""
    report = Report("log")
    cps = sorted(checkpoints)
    notes_by_size: dict[int, Note] = {}
    parse_problem = None
    for size, text in cps:
        try:
            notes_by_size[size] = Note.parse(text)
        except NoteError as exc:
            parse_problem = f"checkpoint of size {size} is malformed: {exc.message}"

    compact = CompactRange()
    keys: list[tuple[int, Verifier]] = []
    roots: dict[int, bytes] = {}
    # The roots to re-derive: every checkpoint's, and the pinned one's, so that check 7
    # can tell an edit inside the pinned tree from one after it.
    wanted = sorted({*notes_by_size, *_size_of(pinned_checkpoint)})
    entry_problem = key_problem = tree_problem = None
    cursors: dict[int, Iterator[tuple[int, bytes]]] = {}
    expected_index = 0
    if 0 in wanted:
        roots[0] = compact.root()
    next_wanted = 0
    anchors = AnchorChecker()
    for index, raw in entries:
        if index != expected_index:
            entry_problem = entry_problem or f"entry {expected_index} is missing (found {index})"
        expected_index = index + 1
        leaf = pruned_leaf(raw)
        if leaf is not None:
            anchors.pruned(index, leaf)
        else:
            leaf = leaf_hash(raw)
            try:
                kind = Entry.canonical_type(raw)
                if kind == EventType.KEY:
                    key_problem = key_problem or announce_key(Entry.decode(raw), index, keys)
                elif kind == EventType.RETENTION:
                    anchors.anchor(index, dict(Entry.decode(raw).fields))
            except EntryError as exc:
                entry_problem = entry_problem or f"entry {index}: {exc.message}"
        for level, node_index, digest in compact.append(leaf):
            cursor = cursors.setdefault(level, stored_level(level))
            stored = next(cursor, None)
            if tree_problem is None and stored != (node_index, digest):
                tree_problem = f"stored hash of subtree {level}/{node_index} does not match the entries"
        while next_wanted < len(wanted) and wanted[next_wanted] <= compact.size:
            if wanted[next_wanted] == compact.size:
                roots[compact.size] = compact.root()
            next_wanted += 1
    size = compact.size
    for level, cursor in cursors.items():
        if tree_problem is None and next(cursor, None) is not None:
            tree_problem = f"stored subtrees at level {level} go beyond the entries"

    report.add("entries", entry_problem is None, entry_problem or f"{size} entries, indexes contiguous, all canonical")

    pinned_at = -1
    if pinned_keys:
        # Trust starts at the pinned key; keys announced before it are not vouched for.
        pinned_at = next((at for at, k in keys if any(k.vkey == p.vkey for p in pinned_keys)), -2)
        if key_problem is None and pinned_at == -2:
            key_problem = "no key in the log's key chain is the pinned key"
    elif not keys and key_problem is None:
        key_problem = "the log announces no signing key"
    report.add("key_chain", key_problem is None, key_problem or f"{len(keys)} key(s), each endorsed by its predecessor")

    sig_problem = parse_problem
    for cp_size, note in notes_by_size.items():
        # Each checkpoint must carry the signature of the key current at its size (the
        # last announced before it): a retired key cannot sign later trees. Checkpoints
        # after the pinned key's announcement are thereby signed by the pinned key or
        # a key it endorsed; earlier ones are prefixes of those, re-derived above.
        current = [k for at, k in keys if at < cp_size][-1:]
        try:
            Checkpoint.parse(note.text)
            if not any(v.matches(s) and v.verify(note.text, s) for s in note.signatures for v in current):
                raise NoteError("not signed by the log's key current at that size")
        except NoteError as exc:
            sig_problem = sig_problem or f"checkpoint of size {cp_size}: {exc.message}"
    report.add("signatures", sig_problem is None, sig_problem or f"{len(notes_by_size)} checkpoint(s) signed")

    root_problem = None
    for cp_size, note in notes_by_size.items():
        try:
            cp = Checkpoint.parse(note.text)
        except NoteError:
            continue
        if cp_size > size:
            root_problem = root_problem or f"checkpoint of size {cp_size} is beyond the {size} entries present"
        elif cp.size != cp_size or roots.get(cp_size) != cp.root:
            root_problem = root_problem or f"checkpoint of size {cp_size} has a root the entries do not produce"
    report.add("roots", root_problem is None, root_problem or "every checkpoint root re-derived from the entries")

    latest = max(notes_by_size, default=None)
    if latest is None:
        report.add("coverage", False, "the log has no checkpoint")
    elif latest != size:
        report.add(
            "coverage",
            False,
            f"the newest checkpoint covers {latest} of {size} entries (entries were cut with their "
            "checkpoint, a writer stopped before signing, or they were added without the store's keys; "
            "`deleatur log checkpoint` signs them if the store wrote them, and otherwise refuses, naming "
            "the first it did not)",
        )
    else:
        report.add("coverage", True, f"the newest checkpoint covers all {size} entries")

    report.add("stored_tree", tree_problem is None, tree_problem or "stored subtree hashes match the entries")

    if pinned_checkpoint is None:
        report.add("pinned", None, "no earlier checkpoint pinned")
        report.notes.append(
            "NOT ANCHORED: no checkpoint pinned, so the log was checked against itself only; "
            "whoever holds the signing key can rewrite or trim it and re-sign. Pin a checkpoint "
            f"you obtained earlier or one cosigned by a witness (`{pin_with}`)."
        )
    else:
        report.add(
            "pinned",
            *_pinned(
                pinned_checkpoint,
                size=size,
                roots=roots,
                consistency=consistency,
                pinned_keys=pinned_keys,
                keys=keys if key_problem is None else [],
            ),
        )
    report.add("retention", *anchors.finish())
    if listed_keys is not None:
        report.add("key_list", *_key_list(listed_keys, keys))
    if not pinned_keys:
        report.notes.append(
            f"KEY NOT PINNED: the log's own first key was trusted; pin a key obtained out of band (`{key_with}`)."
        )
    return report


def _size_of(pinned: Note | None) -> list[int]:
    """The pinned checkpoint's tree size, if it has one that parses (check 7 says if not)."""
    try:
        return [] if pinned is None else [Checkpoint.parse(pinned.text).size]
    except NoteError:
        return []


def _key_list(listed: Iterable[tuple[str, str, int]], keys: list[tuple[int, Verifier]]) -> tuple[bool, str]:
    announced = [(key.key_id.hex(), key.vkey, at) for at, key in keys]
    rows = list(listed)
    for key_id, vkey, index in rows:
        if (key_id, vkey, index) not in announced:
            return False, (
                f"the store lists signing key {key_id} as announced at entry {index}, which the log does not "
                "announce there: the list was altered (the store refuses to report or use it)"
            )
    for key_id, vkey, index in announced:
        if (key_id, vkey, index) not in rows:
            return False, f"the log announces signing key {key_id} at entry {index}, which the store does not list"
    return True, f"the store lists the {len(rows)} key(s) the log announces, and no other"


def _pinned(
    pinned: Note,
    *,
    size: int,
    roots: dict[int, bytes],
    consistency: Callable[[int, int], list[bytes]] | None,
    pinned_keys: list[Verifier] | None,
    keys: list[tuple[int, Verifier]],
) -> tuple[bool, str]:
    try:
        old = Checkpoint.parse(pinned.text)
    except NoteError as exc:
        return False, f"pinned checkpoint is malformed: {exc.message}"
    # With the key chain proven (``keys`` is empty otherwise), every key of it may have
    # signed the pinned checkpoint: a later key is endorsed by the pinned one, and an
    # earlier one is in the tree that checkpoints signed by the pinned key cover (checks
    # 2-4), the chain from it to the pinned key included; see deleatur.log.keychain. The
    # consistency proof below then ties the pinned tree to the log's.
    candidates = [*(pinned_keys or []), *(k for _, k in keys)]
    signer = next((v for s in pinned.signatures for v in candidates if v.matches(s) and v.verify(pinned.text, s)), None)
    if signer is None:
        known = next(
            (f"{describe(k)}, announced at entry {at}" for at, k in keys if any(map(k.matches, pinned.signatures))),
            None,
        )
        if known is not None:
            return False, f"pinned checkpoint's signature by {known}, does not verify"
        return False, (
            f"pinned checkpoint is signed by {signers_of(pinned)}, not by the pinned key nor any key of this "
            "log's key chain" + ("" if keys else " (which does not verify: see key_chain)")
        )
    if old.size > size:
        return False, f"the log has {size} entries, fewer than the pinned checkpoint's {old.size}: it was truncated"
    if roots.get(old.size) != old.root:
        return False, (
            f"the log's first {old.size} entries do not produce the pinned checkpoint's root: an entry before"
            f" index {old.size} was changed, or the log was rewritten"
        )
    current_root = roots.get(size)
    if consistency is None or current_root is None:
        return False, "the current tree has no signed checkpoint to prove consistency against"
    try:
        verify_consistency(old.size, size, old.root, current_root, consistency(old.size, size))
    except ProofError as exc:
        # The pinned tree's own entries re-derive its root (above): what fails is the
        # log after it, whose entries and stored hashes disagree (checks 4 and 6 say where).
        return False, (
            f"the entries of the pinned checkpoint's tree (size {old.size}) are intact, but the stored hashes"
            f" do not prove the log's {size} entries extend it: an entry at index {old.size} or later, or a"
            f" stored hash, was changed ({exc.message})"
        )
    by = "" if not pinned_keys or signer in pinned_keys else f", signed by {describe(signer)} of the key chain"
    return True, f"consistent with the pinned checkpoint of size {old.size}{by}"
