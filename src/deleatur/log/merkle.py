"""Merkle hash trees exactly as RFC 6962 §2.1 / RFC 9162 §2.1 define them.

Hashes: a leaf is SHA-256(0x00 || entry), an interior node SHA-256(0x01 || left
|| right); a tree of n > 1 leaves splits at k, the largest power of two smaller
than n (not at the midpoint). The empty tree's hash is SHA-256 of nothing.

Proof *generation* works over stored hashes of complete subtrees: ``node(level,
index)`` returns the hash of leaves [index * 2**level, (index + 1) * 2**level).
Any range the RFC recursion visits is aligned, so it decomposes into O(log n)
such nodes, and a proof costs O(log n) reads. Proof *verification* follows the
RFC 9162 algorithms step by step and needs nothing but hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

from ..errors import DeleaturError

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

#: node(level, index) -> hash of the complete subtree at that position.
NodeReader = Callable[[int, int], bytes]


class ProofError(DeleaturError):
    """A Merkle proof does not verify; the message says which step failed."""


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def split_point(n: int) -> int:
    """k: the largest power of two strictly smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def subtree_root(start: int, end: int, node: NodeReader) -> bytes:
    """MTH(D[start:end]) for an aligned range, from stored complete subtrees."""
    size = end - start
    if size == 0:
        return EMPTY_ROOT
    if size & (size - 1) == 0:
        return node(size.bit_length() - 1, start // size)
    k = split_point(size)
    return node_hash(subtree_root(start, start + k, node), subtree_root(start + k, end, node))


def inclusion_proof(index: int, size: int, node: NodeReader) -> list[bytes]:
    """PATH(m, D[n]) of RFC 6962 §2.1.1, leaf's sibling first."""
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is outside a tree of size {size}")
    path: list[bytes] = []
    start, end = 0, size
    while end - start > 1:
        k = split_point(end - start)
        if index < start + k:
            path.append(subtree_root(start + k, end, node))
            end = start + k
        else:
            path.append(subtree_root(start, start + k, node))
            start += k
    path.reverse()
    return path


def consistency_proof(old_size: int, new_size: int, node: NodeReader) -> list[bytes]:
    """PROOF(m, D[n]) = SUBPROOF(m, D[n], true) of RFC 6962 §2.1.2."""
    if not 0 <= old_size <= new_size:
        raise ProofError(f"no consistency proof from size {old_size} to size {new_size}")
    if old_size in (0, new_size):
        return []
    path: list[bytes] = []
    start, end, complete = 0, new_size, True
    while True:
        size, m = end - start, old_size - start
        if m == size:
            if not complete:
                path.append(subtree_root(start, end, node))
            break
        k = split_point(size)
        if m <= k:
            path.append(subtree_root(start + k, end, node))
            end = start + k
        else:
            path.append(subtree_root(start, start + k, node))
            start += k
            complete = False
    path.reverse()
    return path


def _check_arguments(step: str, sizes: tuple[object, ...], hashes: tuple[object, ...], proof: object) -> None:
    """Arguments of the wrong type fail as a proof that does not verify, not as the
    TypeError of whichever operation meets them first."""
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in sizes):
        raise ProofError(f"{step}: tree sizes and indexes must be integers")
    if not all(isinstance(h, bytes) for h in hashes):
        raise ProofError(f"{step}: hashes must be bytes")
    if not isinstance(proof, list | tuple) or not all(isinstance(p, bytes) for p in proof):
        raise ProofError(f"{step}: the proof must be a list of hashes (bytes)")


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> None:
    """RFC 9162 §2.1.3.2; raises :class:`ProofError` naming the failed step."""
    _check_arguments("inclusion", (index, size), (leaf, root), proof)
    if index >= size or index < 0:
        raise ProofError(f"inclusion: leaf index {index} is not below tree size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if len(p) != HASH_SIZE:
            raise ProofError("inclusion: a proof element is not a SHA-256 hash")
        if sn == 0:
            raise ProofError("inclusion: the proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("inclusion: the proof is shorter than the tree is deep")
    if r != root:
        raise ProofError("inclusion: the computed root does not match the tree head")


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> None:
    """RFC 9162 §2.1.4.2; raises :class:`ProofError` naming the failed step."""
    _check_arguments("consistency", (old_size, new_size), (old_root, new_root), proof)
    if old_size < 0 or old_size > new_size:
        raise ProofError(f"consistency: size {old_size} cannot precede size {new_size}")
    if old_size == new_size:
        if proof:
            raise ProofError("consistency: equal sizes take an empty proof")
        if old_root != new_root:
            raise ProofError("consistency: two tree heads of the same size have different roots")
        return
    if old_size == 0:
        if proof:
            raise ProofError("consistency: the empty tree takes an empty proof")
        return
    if not proof:
        raise ProofError("consistency: the proof is empty")
    if any(len(p) != HASH_SIZE for p in proof):
        raise ProofError("consistency: a proof element is not a SHA-256 hash")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("consistency: the proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("consistency: the proof is shorter than the tree is deep")
    if fr != old_root:
        raise ProofError("consistency: the proof does not lead to the old root")
    if sr != new_root:
        raise ProofError("consistency: the proof does not lead to the new root")


class CompactRange:
    """The right edge of a tree: one root per set bit of its size, largest first.

    Appending a leaf returns the complete subtrees it finishes, so a store can
    persist every complete node with O(1) amortized writes per leaf.
    """

    def __init__(self, size: int = 0, peaks: Iterable[bytes] = ()) -> None:
        self.size = size
        self.peaks = list(peaks)
        if len(self.peaks) != bin(size).count("1"):
            raise ProofError(f"a tree of size {size} has {bin(size).count('1')} peaks, not {len(self.peaks)}")

    @staticmethod
    def peak_positions(size: int) -> list[tuple[int, int]]:
        """(level, index) of each peak of a tree of ``size`` leaves, largest first."""
        out: list[tuple[int, int]] = []
        start = 0
        for level in range(size.bit_length() - 1, -1, -1):
            if size >> level & 1:
                out.append((level, start >> level))
                start += 1 << level
        return out

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Add a leaf hash; returns every (level, index, hash) completed, the leaf included."""
        index = self.size
        made = [(0, index, leaf)]
        current, level = leaf, 0
        # Each trailing 1 bit of the old size is a peak that now has a right sibling.
        while index >> level & 1:
            current = node_hash(self.peaks.pop(), current)
            level += 1
            made.append((level, index >> level, current))
        self.peaks.append(current)
        self.size += 1
        return made

    def root(self) -> bytes:
        if not self.peaks:
            return EMPTY_ROOT
        acc = self.peaks[-1]
        for peak in reversed(self.peaks[:-1]):
            acc = node_hash(peak, acc)
        return acc


def root_of(leaves: Iterable[bytes]) -> bytes:
    """The root of a tree of already-hashed leaves (streams; O(log n) memory)."""
    compact = CompactRange()
    for leaf in leaves:
        compact.append(leaf)
    return compact.root()
