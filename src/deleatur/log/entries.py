"""The content-free events of the log, and their canonical bytes.

An entry is a JSON object serialized canonically: keys sorted, no whitespace,
ASCII only (non-ASCII escaped), integers only (no floats). Every entry carries
``v`` (format version), ``type`` and ``time`` (microseconds since the epoch).
Entries hold ids, counts, hashes of random-salted commitments and public keys —
never record text, subject names, fact keys or an unsalted hash of any of them.
The golden file ``tests/golden/log_entries.txt`` pins the byte format.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..crypto.keystore import _frame
from ..errors import DeleaturError

ENTRY_VERSION = 1
# An entry's canonical JSON, made once: json.dumps makes an encoder for every call given
# options (every call of the library appends an entry).
_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode


class EntryError(DeleaturError):
    """A log entry is malformed."""


class EventType(enum.StrEnum):
    WRITE = "write"
    RETIRE = "retire"
    RECTIFY = "rectify"
    KEY = "key"
    #: One per erased record: record id, request id, legal basis, time. Nothing else.
    TOMBSTONE = "tombstone"
    #: The erasure request itself: request id, basis, tenant, records erased, and (from
    #: this release) when it was received, its kind and the ids of the data keys it destroyed.
    ERASURE = "erasure"
    #: Restriction of processing set or lifted (Art. 18), the subject as a pseudonym.
    RESTRICT = "restrict"
    UNRESTRICT = "unrestrict"
    #: An Art. 15/20 export: what kind (subject or user) and how many records.
    EXPORT = "export"
    #: One per library call (issue 5's audit trail): actor, tenant, users as opaque
    #: tokens, action, outcome, request id; a subject only as a pseudonym and sealed.
    CALL = "call"
    #: A signed decision snapshot was recorded: its id and the hash of its signed body.
    DECISION = "decision"
    #: An erasure redacted a snapshot: the old and new body hashes, and the request.
    REDACT = "redact"
    #: Old call entries were pruned by audit retention (see deleatur.log.retention).
    RETENTION = "retention"


_TYPES = frozenset(t.value for t in EventType)


def commitment(nonce: bytes, key: str | None, text: str) -> bytes:
    """SHA-256 over the record's random nonce, key and text.

    The nonce lives only inside the record's ciphertext: once the record is erased
    (or its subject's key destroyed) the commitment confirms no guessed text.
    """
    return hashlib.sha256(_frame(("deleatur/commitment/v1", nonce, key or "", text))).digest()


def _check(value: Any, path: str) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]")
        return
    raise EntryError(f"log entry field {path} has a type the canonical form does not allow")


@dataclass(frozen=True, slots=True)
class Entry:
    type: EventType
    time: int
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if {"v", "type", "time"} & set(self.fields):
            raise EntryError("log entry fields must not redefine v, type or time")
        for name, value in self.fields.items():
            _check(value, name)

    def encode(self) -> bytes:
        body = {"v": ENTRY_VERSION, "type": self.type.value, "time": self.time, **self.fields}
        return _canonical(body).encode("ascii")

    @staticmethod
    def canonical_type(raw: bytes) -> str:
        """The entry's type, after checking it is canonical — without building an Entry
        (what verifying a million entries needs; ``decode`` does the full check)."""
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, ValueError, RecursionError):
            # ValueError covers JSONDecodeError and integers past Python's digit limit.
            raise EntryError("log entry is not canonical JSON") from None
        if not isinstance(body, dict) or body.get("v") != ENTRY_VERSION or body.get("type") not in _TYPES:
            raise EntryError("log entry has an unknown format version or type")
        if _canonical(body).encode("ascii") != raw:
            raise EntryError("log entry is not in canonical form")
        return str(body["type"])

    @classmethod
    def decode(cls, raw: bytes) -> Entry:
        try:
            body = json.loads(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            # ValueError covers JSONDecodeError and integers past Python's digit limit.
            raise EntryError("log entry is not canonical JSON") from None
        if not isinstance(body, dict) or body.get("v") != ENTRY_VERSION:
            raise EntryError("log entry has an unknown format version")
        try:
            entry = cls(EventType(body.pop("type")), int(body.pop("time")), {k: v for k, v in body.items() if k != "v"})
        except (KeyError, ValueError, TypeError, OverflowError):
            raise EntryError("log entry lacks a valid type or time") from None
        if entry.encode() != raw:
            raise EntryError("log entry is not in canonical form")
        return entry

    @property
    def record(self) -> str | None:
        value = self.fields.get("record")
        return value if isinstance(value, str) else None
