"""The audit trail: the log's entries as a tenant sees them, and its verification
with an auditor's own memory of the last checkpoint it verified.

The trail *is* the verifiable log: every call is a ``call`` entry beside the
entries about data (writes, tombstones, restrictions, exports). Showing it
decrypts what the caller may: a subject sealed under its data key is shown by
name to an unscoped principal with ``read`` while the key lives, and never once
the subject is erased.

Verification re-derives the whole Merkle tree (see :mod:`deleatur.log.verify`).
A log cut back together with its newest checkpoint still looks whole from the
inside; only a reader who remembers a later checkpoint can tell. ``state`` is
that memory: a file the auditor keeps (ideally off the store's machine). Each
passing verification records the newest checkpoint there, and the next one must
prove the log still extends it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError
from ..log.entries import Entry, EventType
from ..log.note import Note, NoteError, Verifier
from ..log.report import Report
from ..log.retention import pruned_leaf
from ..model import check_int, check_optional, check_type
from .principals import Capability

if TYPE_CHECKING:
    from ..memory import Memory


@dataclass(frozen=True, slots=True)
class AuditEntry:
    index: int
    entry: Entry
    #: The subject's name, when the entry sealed one and the caller may read it.
    subject: str | None = None

    def to_json(self) -> dict[str, Any]:
        fields = {k: v for k, v in self.entry.fields.items() if k != "sealed"}
        out: dict[str, Any] = {"index": self.index, "type": self.entry.type.value, "time": self.entry.time, **fields}
        if self.subject is not None:
            out["subject_name"] = self.subject
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AuditEntry:
        """An entry read back from ``to_json``; the sealed subject it leaves out is absent."""
        fields = {k: v for k, v in data.items() if k not in ("index", "type", "time", "subject_name")}
        return cls(data["index"], Entry(EventType(data["type"]), data["time"], fields), data.get("subject_name"))


def entries(
    memory: Memory,
    *,
    start: int = 0,
    limit: int | None = None,
    calls_only: bool = False,
    actor: str | None = None,
) -> Iterator[AuditEntry]:
    """The entries of the caller's tenant (and the store-wide key announcements),
    oldest first, from log index ``start``. Bad arguments are refused at once."""
    check_int(start, "start", low=0)
    check_type(calls_only, bool, "calls_only")
    check_optional(actor, str, "actor")
    if limit is not None:
        check_int(limit, "limit", low=1)
    return _entries(memory, start, limit, calls_only, actor)


def _entries(
    memory: Memory, start: int, limit: int | None, calls_only: bool, actor: str | None
) -> Iterator[AuditEntry]:
    principal = memory.principal
    may_unseal = principal.scopes is None and Capability.READ in principal.capabilities
    shown = 0
    for index, raw in memory.backend.log_entries(start):
        if pruned_leaf(raw) is not None:
            continue  # pruned by audit retention: nothing left to show
        entry = Entry.decode(raw)
        tenant = entry.fields.get("tenant")
        if tenant is not None and tenant != memory.tenant:
            continue
        if calls_only and entry.type is not EventType.CALL:
            continue
        if actor is not None and entry.fields.get("actor") != actor:
            continue
        sealed = entry.fields.get("sealed")
        name = memory.keys.unseal(sealed) if may_unseal and isinstance(sealed, str) else None
        yield AuditEntry(index, entry, name)
        shown += 1
        if limit is not None and shown >= limit:
            return


def verify(
    memory: Memory, *, pinned_keys: list[Verifier] | None = None, state: Path | None = None, size: int | None = None
) -> Report:
    pinned = None
    if state is not None and not state.parent.is_dir():
        raise InvalidInputError(f"cannot keep the auditor state in {state}: no directory {state.parent}")
    if state is not None and state.exists():
        try:
            pinned = Note.parse(state.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, NoteError):
            raise InvalidInputError(f"{state} is not an auditor state file (a signed checkpoint)") from None
    report = memory._verify_log(pinned_keys=pinned_keys, pinned_checkpoint=pinned, size=size)
    if report.ok and state is not None:
        latest = memory.backend.checkpoint(size)
        if latest is not None:
            _write_atomically(state, latest[1])
    return report


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
