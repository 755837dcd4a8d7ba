"""Audit retention: pruning old ``call`` entries without breaking verification.

A pruned entry keeps its place in the tree: its stored bytes are replaced by a
marker, ``0x00`` followed by its RFC 9162 leaf hash, so every subtree hash,
checkpoint and proof stays valid, while the entry's content (actor, user tokens,
subject pseudonyms) is gone. Only ``call`` entries are pruned; the events about
data (writes, tombstones, keys, restrictions) stay, so certificates can still be
issued for old erasures.

Each pruning appends a *retention anchor*, an entry under the next signed
checkpoint that says what it pruned::

    {"type": "retention", "from": a, "upto": b, "count": n, "digest": hex, "before": t}

``digest`` is SHA-256 over the (index as 8 bytes big-endian, leaf hash) pairs of
the entries it pruned, all of which lie in ``[from, upto)``; anchors cover
consecutive ranges. The verifier checks that every pruned entry is accounted for
by exactly one anchor, so pruning without saying so, or saying one thing and
pruning another, fails verification.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

MARKER = b"\x00"
_LEAF = 32
_INDEX = struct.Struct(">Q")


def pruned_leaf(raw: bytes) -> bytes | None:
    """The leaf hash a pruned entry kept, or None for an entry that is whole."""
    if len(raw) == 1 + _LEAF and raw[:1] == MARKER:
        return raw[1:]
    return None


def pruned(leaf: bytes) -> bytes:
    return MARKER + leaf


def digest(pairs: Iterable[tuple[int, bytes]]) -> str:
    h = hashlib.sha256()
    for index, leaf in pairs:
        h.update(_INDEX.pack(index) + leaf)
    return h.hexdigest()


class AnchorChecker:
    """Streams over the log's entries in order and matches pruned entries to anchors."""

    def __init__(self) -> None:
        self.waiting: list[tuple[int, bytes]] = []
        self.covered_upto = 0
        self.anchors = 0
        self.problem: str | None = None

    def pruned(self, index: int, leaf: bytes) -> None:
        self.waiting.append((index, leaf))

    def anchor(self, index: int, fields: dict[str, object]) -> None:
        start, upto, count, claimed = (fields.get(k) for k in ("from", "upto", "count", "digest"))
        if not (isinstance(start, int) and isinstance(upto, int) and isinstance(count, int)):
            self._fail(f"retention anchor {index} is malformed")
            return
        if start != self.covered_upto or not start <= upto <= index:
            self._fail(f"retention anchor {index} covers [{start}, {upto}), not the range after the previous anchor")
            return
        mine = [(i, leaf) for i, leaf in self.waiting if i < upto]
        self.waiting = [(i, leaf) for i, leaf in self.waiting if i >= upto]
        if len(mine) != count or digest(mine) != claimed:
            self._fail(f"retention anchor {index} does not match the {len(mine)} entries pruned in [{start}, {upto})")
        self.covered_upto = upto
        self.anchors += 1

    def finish(self) -> tuple[bool, str]:
        if self.waiting:
            self._fail(f"entry {self.waiting[0][0]} was pruned without a retention anchor")
        if self.problem is not None:
            return False, self.problem
        if not self.anchors:
            return True, "no entry pruned"
        return True, f"every pruned entry accounted for by {self.anchors} retention anchor(s)"

    def _fail(self, problem: str) -> None:
        self.problem = self.problem or problem
