"""The C2SP tlog-proof file (c2sp.org/tlog-proof): an offline inclusion proof.

c2sp.org/tlog-proof@v1
[extra <base64>]
index <n>
<base64 hash>            one per line, leaf's sibling first
<empty line>
<signed checkpoint, verbatim>
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from .merkle import HASH_SIZE
from .note import Note, NoteError, b64decode

HEADER = "c2sp.org/tlog-proof@v1"


@dataclass(frozen=True, slots=True)
class TlogProof:
    index: int
    proof: tuple[bytes, ...]
    checkpoint: Note
    extra: bytes | None = None

    def format(self) -> str:
        lines = [HEADER]
        if self.extra is not None:
            lines.append("extra " + base64.b64encode(self.extra).decode())
        lines.append(f"index {self.index}")
        lines += [base64.b64encode(h).decode() for h in self.proof]
        return "\n".join(lines) + "\n\n" + self.checkpoint.format()

    @classmethod
    def parse(cls, data: str) -> TlogProof:
        if not isinstance(data, str):
            raise NoteError(f"tlog-proof: must be text (a str), not {type(data).__name__}")
        head, sep, checkpoint = data.partition("\n\n")
        if not sep:
            raise NoteError("tlog-proof: no empty line before the checkpoint")
        lines = head.split("\n")
        if lines[0] != HEADER:
            raise NoteError(f"tlog-proof: first line must be {HEADER}")
        rest = lines[1:]
        extra = None
        if rest and rest[0].startswith("extra "):
            extra = b64decode(rest.pop(0)[6:], "tlog-proof extra")
        if not rest or not rest[0].startswith("index "):
            raise NoteError("tlog-proof: missing index line")
        index_text = rest.pop(0)[6:]
        if not index_text.isdigit() or (index_text != "0" and index_text.startswith("0")):
            raise NoteError("tlog-proof: index must be a decimal with no leading zeroes")
        hashes = tuple(b64decode(line, "tlog-proof hash") for line in rest)
        if any(len(h) != HASH_SIZE for h in hashes):
            raise NoteError("tlog-proof: every proof line must be a 32-byte hash")
        return cls(int(index_text), hashes, Note.parse(checkpoint), extra)
