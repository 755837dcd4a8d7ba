"""Erasure requests as first-class records, with their Art. 12(3) deadline."""

from __future__ import annotations

import calendar
import enum
import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeGuard

from ..clock import from_datetime, from_isoformat, isoformat, to_datetime
from ..errors import InvalidInputError
from ..model import SpaceFilter, erased_ref

if TYPE_CHECKING:
    from ..memory import Memory

_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


class RequestStatus(enum.StrEnum):
    #: Records, index terms and tombstones committed; subject keys not yet destroyed.
    KEYS_PENDING = "keys_pending"
    COMPLETE = "complete"
    FAILED = "failed"


class RequestKind(enum.StrEnum):
    SUBJECT = "subject"
    ACCOUNT = "account"
    #: A retention purge (Art. 5(1)(e)): expired records, or records older than a cutoff.
    RETENTION = "retention"


def is_request_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and _REQUEST_ID.fullmatch(value) is not None


def check_request_id(value: str) -> str:
    if not is_request_id(value):
        raise InvalidInputError(
            "request id must be 1-64 characters of letters, digits and . _ : - (starting with a letter or digit)"
        )
    return value


def reached_users(memory: Memory, user_ids: Iterable[str]) -> dict[str, str]:
    """Users as an erasure request keeps them: full blind references (not the audit
    log's short tokens, since they decide who may read the request), by reference."""
    return {memory._user_ref(user): user for user in user_ids}


def space_pseudonym(key: bytes, value: str) -> str:
    """A user, agent or run id as a request's scope keeps it: keyed by a one-time key of
    that request (see :attr:`ErasureRequest.scope_key`)."""
    return "psn:" + hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:32]


#: What the store answers to a request that matched no record: it is recorded all the
#: same, for the controller must show it answered, and its certificate says so.
NOTHING_HELD = "nothing was held: no record matched this request within its scope, so none was erased"
#: What a purge answers that found no record due: it records no request (see the engine).
NOTHING_DUE = "nothing to purge: no record is due, and no request was recorded (the audit log has the call)"


def one_month_after(micros: int) -> int:
    """Art. 12(3): one month from receipt, the same day of the next month (or its last day)."""
    start = to_datetime(micros)
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    day = min(start.day, calendar.monthrange(year, month)[1])
    return from_datetime(datetime(year, month, day, start.hour, start.minute, start.second, tzinfo=start.tzinfo))


#: A subject erasure's count: 1 if it destroyed the subject's data key (or found it gone,
#: or left it to another erasure destroying it), 0 if it kept it (records beyond its scope).
SUBJECT_KEY_DESTROYED = "subject_key_destroyed"
#: The counts of records beyond an erasure's scope, not shown to a key scoped to users.
BEYOND_SCOPES = ("kept_in_other_spaces", "derived_outside_scope")


@dataclass(frozen=True, slots=True)
class ErasureRequest:
    """An erasure request. ``subject_ref``, ``pending_keys`` and ``fingerprint`` are the
    store's own: the reference and the fingerprint are keyed by the index key, which no
    erasure destroys, so outside the store they would link requests about one subject
    that its pseudonym keeps apart. The JSON form leaves them out, so a request read
    back from JSON (a remote client's) has none, and equality does not look at them."""

    id: str
    tenant: str
    kind: RequestKind
    subject_pseudonym: str | None
    subject_ref: bytes | None = field(compare=False)
    scope: SpaceFilter
    basis: str
    requester: str
    received_at: int
    completed_at: int | None
    status: RequestStatus
    error: str | None
    counts: dict[str, int] = field(default_factory=dict)
    record_ids: tuple[str, ...] = ()
    tombstones: tuple[int, ...] = ()
    #: Ids of the data keys committed for destruction and not yet destroyed.
    pending_keys: tuple[bytes, ...] = field(default=(), compare=False)
    #: A keyed digest of what was asked (kind, subject, scope): a reused request id
    #: must ask for the same erasure.
    fingerprint: bytes = field(default=b"", compare=False)
    #: The users the erasure reached, as blind references (see :func:`reached_users`);
    #: None for the whole tenant. Internal, like the fingerprint: not in the JSON.
    users: tuple[str, ...] | None = field(default=None, compare=False)
    #: The one-time key of the scope's pseudonyms, kept (in the store only, never in the
    #: JSON nor the certificate) by a subject erasure limited to some spaces: with it,
    #: ``verify --store`` tells a live record of the subject inside the scope (a
    #: re-insertion) from one outside it. None where the whole tenant was the scope, for
    #: an account erasure (whose pseudonyms replace the ids in its decisions: they must
    #: not be re-linked), and for requests recorded before the store kept it.
    scope_key: bytes | None = field(default=None, compare=False)

    def beyond_scopes_hidden(self) -> ErasureRequest:
        """The request as a key scoped to some users sees it (see
        :meth:`ErasurePlan.beyond_scopes_hidden`); the certificate still states them."""
        counts = {k: v for k, v in self.counts.items() if k not in BEYOND_SCOPES}
        return replace(self, counts=counts)

    @property
    def deadline(self) -> int:
        return one_month_after(self.received_at)

    def deadline_met(self, now: int) -> bool | None:
        """True or False once decided; None while open and not yet late."""
        if self.completed_at is not None and self.status is RequestStatus.COMPLETE:
            return self.completed_at <= self.deadline
        return False if now > self.deadline else None

    def phases(self) -> list[dict[str, Any]]:
        """Where the request stands, phase by phase, for status endpoints.

        Erasure is synchronous today: records, index terms and tombstones go in one
        transaction, then the keys. The phases are named now so that a later
        asynchronous cascade adds phases without changing the shape callers read.
        """
        erased = "failed" if self.status is RequestStatus.FAILED else "done"
        keys = {RequestStatus.FAILED: "not_started", RequestStatus.KEYS_PENDING: "pending"}.get(self.status, "done")
        done_at = None if self.completed_at is None else isoformat(self.completed_at)
        return [
            {"name": "received", "status": "done", "at": isoformat(self.received_at)},
            {"name": "records_erased", "status": erased, "at": done_at if erased == "done" else None},
            {"name": "keys_destroyed", "status": keys, "at": done_at if keys == "done" else None},
        ]

    def to_row(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "id": self.id,
            "kind": self.kind.value,
            "subject_pseudonym": self.subject_pseudonym,
            "subject_ref": self.subject_ref,
            "scope": json.dumps(self.scope.to_json(), sort_keys=True),
            "basis": self.basis,
            "requester": self.requester,
            "received_at": self.received_at,
            "completed_at": self.completed_at,
            "status": self.status.value,
            "error": self.error,
            "counts": json.dumps(self.counts, sort_keys=True),
            "record_ids": json.dumps(list(self.record_ids)),
            "tombstones": json.dumps(list(self.tombstones)),
            "pending_keys": json.dumps([k.hex() for k in self.pending_keys]),
            "fingerprint": self.fingerprint,
            "users": None if self.users is None else " ".join(self.users),
            "scope_key": self.scope_key,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ErasureRequest:
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            kind=RequestKind(row["kind"]),
            subject_pseudonym=row["subject_pseudonym"],
            subject_ref=None if row["subject_ref"] is None else bytes(row["subject_ref"]),
            scope=SpaceFilter(**json.loads(row["scope"])),
            basis=row["basis"],
            requester=row["requester"],
            received_at=int(row["received_at"]),
            completed_at=None if row["completed_at"] is None else int(row["completed_at"]),
            status=RequestStatus(row["status"]),
            error=row["error"],
            counts={str(k): int(v) for k, v in json.loads(row["counts"]).items()},
            record_ids=tuple(json.loads(row["record_ids"])),
            tombstones=tuple(int(i) for i in json.loads(row["tombstones"])),
            pending_keys=tuple(bytes.fromhex(k) for k in json.loads(row["pending_keys"])),
            fingerprint=bytes(row["fingerprint"]),
            users=None if row["users"] is None else tuple(row["users"].split()),
            scope_key=None if row["scope_key"] is None else bytes(row["scope_key"]),
        )

    def to_json(self, now: int) -> dict[str, Any]:
        """The request as `deleatur requests` shows it: no subject name, only its pseudonym."""
        return {
            "id": self.id,
            "tenant": self.tenant,
            "kind": self.kind.value,
            "subject": self.subject_pseudonym,
            "scope": self.scope.to_json(),
            "basis": self.basis,
            "requester": self.requester,
            "received_at": isoformat(self.received_at),
            "completed_at": None if self.completed_at is None else isoformat(self.completed_at),
            "deadline": isoformat(self.deadline),
            "deadline_met": self.deadline_met(now),
            "status": self.status.value,
            "error": self.error,
            "counts": self.counts,
            "record_ids": list(self.record_ids),
            "tombstones": list(self.tombstones),
            "phases": self.phases(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ErasureRequest:
        """The request :meth:`to_json` printed, without the store's own references."""
        completed_at = data["completed_at"]
        return cls(
            id=data["id"],
            tenant=data["tenant"],
            kind=RequestKind(data["kind"]),
            subject_pseudonym=data["subject"],
            subject_ref=None,
            scope=SpaceFilter(**data["scope"]),
            basis=data["basis"],
            requester=data["requester"],
            received_at=from_isoformat(data["received_at"]),
            completed_at=None if completed_at is None else from_isoformat(completed_at),
            status=RequestStatus(data["status"]),
            error=data["error"],
            counts=dict(data["counts"]),
            record_ids=tuple(data["record_ids"]),
            tombstones=tuple(data["tombstones"]),
        )


def within_scopes(memory: Memory, request: ErasureRequest) -> tuple[str, ...] | None:
    """The user ids of the caller's scopes that ``request`` reached, if it reached only
    those; None if it reached anyone else (or the whole tenant)."""
    scopes = memory.principal.scopes
    if scopes is None or request.users is None:
        return None
    named = {user_reference(memory, s): s for s in scopes}
    return tuple(named[ref] for ref in request.users) if all(ref in named for ref in request.users) else None


def user_reference(memory: Memory, user_id: str) -> str:
    """How a request's ``users`` name a user id, or the erased user that a scope kept by
    reference (``erased-user:`` and the reference) stands for."""
    ref = erased_ref(user_id)
    return memory._user_ref(user_id) if ref is None else ref.hex()
