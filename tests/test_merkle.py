"""RFC 6962 / RFC 9162 Merkle trees: the reference vectors and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deleatur.log.merkle import (
    EMPTY_ROOT,
    CompactRange,
    ProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root_of,
    split_point,
    verify_consistency,
    verify_inclusion,
)

# The leaves and roots used by the Certificate Transparency and transparency-dev
# implementations (transparency-dev/merkle testonly/constants.go).
LEAVES = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                     "606162636465666768696a6b6c6d6e6f")]  # fmt: skip
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
INCLUSION = [
    (0, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (5, 8, ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (0, 1, []),
]  # fmt: skip
CONSISTENCY = [
    (1, 1, []),
    (1, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (6, 8, ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 5, ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
    (2, 8, ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
]  # fmt: skip


class MemoryTree:
    """Complete-subtree hashes kept in a dict, as the store keeps them in a table."""

    def __init__(self, leaves: list[bytes]) -> None:
        self.nodes: dict[tuple[int, int], bytes] = {}
        self.compact = CompactRange()
        for leaf in leaves:
            for level, index, digest in self.compact.append(leaf):
                self.nodes[(level, index)] = digest

    def node(self, level: int, index: int) -> bytes:
        return self.nodes[(level, index)]


REFERENCE = MemoryTree([leaf_hash(x) for x in LEAVES])


def _root(size: int) -> bytes:
    return root_of(leaf_hash(x) for x in LEAVES[:size])


def test_reference_roots() -> None:
    assert EMPTY_ROOT.hex() == ROOTS[0]
    for size in range(len(LEAVES) + 1):
        assert _root(size).hex() == ROOTS[size], size


def test_split_is_the_rfc_one_not_the_midpoint() -> None:
    assert [split_point(n) for n in (2, 3, 4, 5, 6, 7, 8, 9, 1000)] == [1, 2, 2, 4, 4, 4, 4, 8, 512]


@pytest.mark.parametrize(("index", "size", "expected"), INCLUSION)
def test_reference_inclusion_proofs(index: int, size: int, expected: list[str]) -> None:
    proof = inclusion_proof(index, size, REFERENCE.node)
    assert [p.hex() for p in proof] == expected
    verify_inclusion(index, size, leaf_hash(LEAVES[index]), proof, _root(size))


@pytest.mark.parametrize(("old", "new", "expected"), CONSISTENCY)
def test_reference_consistency_proofs(old: int, new: int, expected: list[str]) -> None:
    proof = consistency_proof(old, new, REFERENCE.node)
    assert [p.hex() for p in proof] == expected
    verify_consistency(old, new, _root(old), _root(new), proof)


def _tree(size: int) -> MemoryTree:
    return MemoryTree([leaf_hash(i.to_bytes(4, "big")) for i in range(size)])


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8 % len(out)] ^= 1 << (bit % 8)
    return bytes(out)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=1, max_value=300), st.data())
def test_every_inclusion_proof_verifies_and_any_flipped_bit_fails(size: int, data: st.DataObject) -> None:
    tree = _tree(size)
    root = tree.compact.root()
    index = data.draw(st.integers(min_value=0, max_value=size - 1))
    leaf = tree.node(0, index)
    proof = inclusion_proof(index, size, tree.node)
    verify_inclusion(index, size, leaf, proof, root)
    bit = data.draw(st.integers(min_value=0, max_value=255))
    with pytest.raises(ProofError):
        verify_inclusion(index, size, _flip(leaf, bit), proof, root)
    with pytest.raises(ProofError):
        verify_inclusion(index, size, leaf, proof, _flip(root, bit))
    if proof:
        which = data.draw(st.integers(min_value=0, max_value=len(proof) - 1))
        bad = [*proof[:which], _flip(proof[which], bit), *proof[which + 1 :]]
        with pytest.raises(ProofError):
            verify_inclusion(index, size, leaf, bad, root)
        with pytest.raises(ProofError):
            verify_inclusion(index, size, leaf, proof[:-1], root)
    with pytest.raises(ProofError):
        verify_inclusion(index, size, leaf, [*proof, leaf], root)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=1, max_value=300), st.data())
def test_every_consistency_proof_verifies_and_any_flipped_bit_fails(new: int, data: st.DataObject) -> None:
    old = data.draw(st.integers(min_value=1, max_value=new))
    tree = _tree(new)
    old_root = MemoryTree([tree.node(0, i) for i in range(old)]).compact.root()
    new_root = tree.compact.root()
    proof = consistency_proof(old, new, tree.node)
    verify_consistency(old, new, old_root, new_root, proof)
    bit = data.draw(st.integers(min_value=0, max_value=255))
    with pytest.raises(ProofError):
        verify_consistency(old, new, _flip(old_root, bit), new_root, proof)
    with pytest.raises(ProofError):
        verify_consistency(old, new, old_root, _flip(new_root, bit), proof)
    if proof:
        which = data.draw(st.integers(min_value=0, max_value=len(proof) - 1))
        bad = [*proof[:which], _flip(proof[which], bit), *proof[which + 1 :]]
        with pytest.raises(ProofError):
            verify_consistency(old, new, old_root, new_root, bad)


def test_compact_range_matches_recomputation() -> None:
    for size in range(0, 70):
        tree = _tree(size)
        assert tree.compact.root() == root_of(tree.node(0, i) for i in range(size))
        assert [tree.node(level, index) for level, index in CompactRange.peak_positions(size)] == tree.compact.peaks
