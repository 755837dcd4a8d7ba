"""C2SP tlog-checkpoint bodies (c2sp.org/tlog-checkpoint): the signed tree head.

<origin>\\n<decimal tree size>\\n<base64 root hash>\\n[extension lines]
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from .merkle import HASH_SIZE
from .note import NoteError, b64decode, check_text


@dataclass(frozen=True, slots=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.origin or "\n" in self.origin:
            raise NoteError("checkpoint origin must be one non-empty line")
        if self.size < 0:
            raise NoteError("checkpoint tree size must not be negative")
        if len(self.root) != HASH_SIZE:
            raise NoteError("checkpoint root must be a 32-byte hash")
        if any(not line or "\n" in line for line in self.extensions):
            raise NoteError("checkpoint extension lines must be non-empty single lines")

    def body(self) -> str:
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode(), *self.extensions]
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        check_text(text)
        lines = text[:-1].split("\n")
        if len(lines) < 3:
            raise NoteError("a checkpoint has at least three lines: origin, size, root")
        origin, size, root, *extensions = lines
        if not size.isdigit() or (size != "0" and size.startswith("0")) or not size.isascii():
            raise NoteError("checkpoint tree size must be a decimal with no leading zeroes")
        return cls(origin, int(size), b64decode(root, "checkpoint root"), tuple(extensions))
