"""The audit trail: the log's entries as a tenant sees them, and its verification
with an auditor's own memory of the last checkpoint it verified.

The trail *is* the verifiable log: every call is a ``call`` entry beside the
entries about data (writes, tombstones, restrictions, exports). Showing it
decrypts what the caller may: a subject sealed under its data key is shown by
name to an unscoped principal with ``read`` while the key lives, and never once
the subject is erased.

A key scoped to users sees only the entries about those users, and nothing that
links a subject to entries beyond them. A subject's pseudonym is the same in every
entry about it, and such a key learns the pseudonym of any name it guesses by naming
it in a call of its own: with the whole trail it would find every other user's
requests about that person. So it is shown

* a ``call`` entry only if the users it names are all within its scopes (a call
  that names none, such as one over the whole tenant, is beyond them);
* a write, rectification or retirement only while its record is held in those
  users' spaces (the record's user goes with an erased record: its tombstone stands
  for it); a tombstone or erasure entry only if its request is within its scopes
  (as for reading the request's status); a decision only if made in one of those
  users' spaces, and its redaction only if the erasure that caused it is within
  them too;
* the log's own entries, about no user (signing keys, retention anchors);
* no export, restriction or lifted restriction, which name no user.

Entries beyond its scopes are left out, not redacted: their number and times would
tell as much. In the entries it is shown, the subject is a pseudonym of the
pseudonym (``spsn:``), keyed by the store and by the key's scopes, so the entries
about one subject within its scopes still link to each other, and to nothing
shown elsewhere or to a key of other scopes; as the pseudonym itself, it cannot be
recomputed from a name once the subject's key is destroyed. The sealed subject,
which names the subject's key, is left out. Verification still reads every entry.

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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..erasure.requests import ErasureRequest, within_scopes
from ..errors import InvalidInputError
from ..log.entries import Entry, EventType
from ..log.note import Note, NoteError, Verifier
from ..log.report import Report
from ..log.retention import pruned_leaf
from ..model import check_int, check_optional, check_type, erased_ref
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


class AuditTrail(Iterator[AuditEntry]):
    """Audit entries from log index ``start``, read as they are iterated (from the log, or
    a server's pages: ``read``). Once they are all read, ``resume`` is the log index a
    later read goes on from (after the last entry read), or None if the log was read to
    its end."""

    def __init__(self, start: int, read: Callable[[AuditTrail], Iterator[AuditEntry]]) -> None:
        self.resume: int | None = start
        self._entries = read(self)

    def __next__(self) -> AuditEntry:
        return next(self._entries)


def entries(
    memory: Memory,
    *,
    start: int = 0,
    limit: int | None = None,
    calls_only: bool = False,
    actor: str | None = None,
    scan: int | None = None,
) -> AuditTrail:
    """The entries of the caller's tenant (and the store-wide entries of the log's own)
    that the caller may see, oldest first, from log index ``start``: up to ``limit``
    of them, however many it skips beyond a scoped caller's scopes or the filters, and
    from no more than ``scan`` of the log's entries (a server's page: a filter that
    matches few would otherwise read the whole log for one). Bad arguments are refused
    at once."""
    check_int(start, "start", low=0)
    check_type(calls_only, bool, "calls_only")
    check_optional(actor, str, "actor")
    if limit is not None:
        check_int(limit, "limit", low=1)
    if scan is not None:
        check_int(scan, "scan", low=1)
    return AuditTrail(
        start,
        lambda trail: _entries(memory, trail, start=start, limit=limit, calls_only=calls_only, actor=actor, scan=scan),
    )


def _entries(
    memory: Memory,
    trail: AuditTrail,
    *,
    start: int,
    limit: int | None,
    calls_only: bool,
    actor: str | None,
    scan: int | None,
) -> Iterator[AuditEntry]:
    principal = memory.principal
    scoped = None if principal.scopes is None else ScopedView(memory, principal.scopes)
    may_unseal = scoped is None and Capability.READ in principal.capabilities
    shown = read = 0
    for index, raw, user in memory.backend.log_entries_with_users(memory.tenant, start):
        # Checked once the next entry is at hand: a read that stops says where the log
        # goes on, and one that read the last entry says it ended.
        if (limit is not None and shown >= limit) or (scan is not None and read >= scan):
            trail.resume = index
            return
        read += 1
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
        if scoped is not None:
            if not scoped.shows(entry, user):
                continue
            shown_entry = AuditEntry(index, scoped.unlinked(entry))
        else:
            sealed = entry.fields.get("sealed")
            name = memory.keys.unseal(sealed) if may_unseal and isinstance(sealed, str) else None
            shown_entry = AuditEntry(index, entry, name)
        yield shown_entry
        shown += 1
    trail.resume = None


class ScopedView:
    """The trail as a key scoped to ``scopes`` sees it (see the module's docstring)."""

    def __init__(self, memory: Memory, scopes: frozenset[str]) -> None:
        self.memory = memory
        self.tokens = frozenset(memory._user_token(s) for s in scopes)
        # The scopes as blind references, as an erased user's scope is kept: the key's
        # pseudonyms stay the same when its erased users are rescoped.
        refs = sorted(ref.hex() if (ref := erased_ref(s)) is not None else memory._user_ref(s) for s in scopes)
        self.scopes = ",".join(refs)
        self.requests: dict[str, bool] = {}
        self.decisions: dict[str, bool] = {}

    def shows(self, entry: Entry, record_user: str | None) -> bool:
        """Whether every user ``entry`` is about is within the scopes; ``record_user`` is
        the user of the record it is about, while the record is held."""
        fields = entry.fields
        match entry.type:
            case EventType.KEY | EventType.RETENTION:
                return True
            case EventType.CALL:
                users = fields.get("users")
                return isinstance(users, list) and bool(users) and self.tokens.issuperset(users)
            case EventType.WRITE | EventType.RECTIFY | EventType.RETIRE:
                return record_user is not None and self._covers(record_user)
            case EventType.TOMBSTONE | EventType.ERASURE:
                return self._request(fields.get("request")) is True
            case EventType.DECISION:
                return self._decision(fields.get("decision"))
            case EventType.REDACT:
                # A rectification's redaction names its new record, not a request.
                return self._decision(fields.get("decision")) and self._request(fields.get("request")) is not False
            case _:
                return False  # exports and restrictions name no user: the whole tenant's

    def unlinked(self, entry: Entry) -> Entry:
        """``entry`` with its subject as this key's scopes see it, and without the sealed
        subject (it names the subject's data key, the same in every entry about them)."""
        fields = {k: v for k, v in entry.fields.items() if k != "sealed"}
        pseudonym = fields.get("subject")
        if isinstance(pseudonym, str):
            ref = self.memory.keys.index.ref("audit-subject", self.memory.tenant, self.scopes, pseudonym)
            fields["subject"] = "spsn:" + ref.hex()[:32]
        return Entry(entry.type, entry.time, fields)

    def shows_redaction(self, redaction: Mapping[str, Any]) -> bool:
        """Whether a decision's redaction is one its ``redact`` entry would be shown for:
        not one by an erasure beyond the scopes, whose request id may name a person."""
        return self._request(redaction.get("request")) is not False

    def _covers(self, user_id: str) -> bool:
        return self.memory.principal.covers([user_id], self.memory._user_ref)

    def _request(self, request_id: object) -> bool | None:
        """Whether the erasure request ``request_id`` is within the scopes; None if there
        is no such request."""
        if not isinstance(request_id, str):
            return None
        if request_id not in self.requests:
            row = self.memory.backend.get_request(self.memory.tenant, request_id)
            if row is None:
                return None
            self.requests[request_id] = within_scopes(self.memory, ErasureRequest.from_row(row)) is not None
        return self.requests[request_id]

    def _decision(self, decision_id: object) -> bool:
        if not isinstance(decision_id, str):
            return False
        if decision_id not in self.decisions:
            row = self.memory.backend.decision(self.memory.tenant, decision_id)
            self.decisions[decision_id] = row is not None and self._covers(str(row["user_id"]))
        return self.decisions[decision_id]


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
    # The trail is pinned by the state an earlier passing verification left (which a
    # first one with --state writes), not by a checkpoint given to it.
    report = memory._verify_log(
        pinned_keys=pinned_keys,
        pinned_checkpoint=pinned,
        size=size,
        pin_with="deleatur audit verify --state FILE, which keeps the checkpoint of each passing verification",
        key_with="deleatur audit verify --expected-pubkey",
    )
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
