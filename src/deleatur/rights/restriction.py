"""Restriction of processing (Art. 18).

A restricted subject's records are kept, still readable by id and listable (the
subject keeps the right of access), but never recalled, and new writes about the
subject are refused unless the caller says they serve a legal claim
(Art. 18(2)). Setting and lifting a restriction are log entries that name the
subject only by a pseudonym keyed by its data key. The reason is stored
encrypted under that key, so erasing the subject erases the reason too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..clock import from_isoformat, isoformat
from ..crypto.keystore import _frame
from ..errors import IntegrityError, InvalidInputError, NotFoundError
from ..log.entries import Entry, EventType
from ..model import canonical_subject, check_stated, check_who

if TYPE_CHECKING:
    from ..memory import Memory

_NONCE = 12
RESTRICTION_NEEDS_REASON = "a restriction needs a reason"


class RestrictedSubjectError(InvalidInputError):
    """Processing of this subject is restricted (Art. 18)."""


@dataclass(frozen=True, slots=True)
class Restriction:
    subject: str  # the pseudonym
    reason: str | None  # None once the subject's key is gone
    actor: str
    since: int

    def to_json(self) -> dict[str, Any]:
        return {"subject": self.subject, "reason": self.reason, "actor": self.actor, "since": isoformat(self.since)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Restriction:
        return cls(data["subject"], data["reason"], data["actor"], from_isoformat(data["since"]))


def _aad(memory: Memory, subject_ref: bytes) -> bytes:
    return _frame(("deleatur/restriction/v1", memory.backend.store_id, memory.tenant, subject_ref))


def restrict(memory: Memory, subject: str, *, reason: str, actor: str) -> Restriction:
    canonical = canonical_subject(subject)
    check_stated(reason, "reason", missing=RESTRICTION_NEEDS_REASON)
    actor = check_who(actor, "actor", missing="a restriction needs an actor")
    ref = memory._subject_ref(canonical)
    with memory._logged() as events:
        # Under the lock, as a write: the reason is sealed under a key no erasure is about to destroy.
        aead = memory._key_not_pending(ref)[1]
        pseudonym = memory.keys.pseudonym(memory.tenant, ref, canonical)
        assert pseudonym is not None  # the key was just read, and only a pending key is destroyed
        for row in memory.backend.restrictions(memory.tenant, ref):
            # Restated, a restriction kept no trace of its first reason, actor and time.
            kept = Restriction(pseudonym, _reason(memory, aead, ref, row), str(row["actor"]), int(row["since"]))
            if kept.reason != reason.strip():
                raise RestrictedSubjectError(
                    f"this subject is already restricted, since {isoformat(kept.since)} by {kept.actor}, for another"
                    " reason: lift the restriction first to restate it"
                )
            return kept  # a retry of the same restriction changes nothing
        nonce = memory._random(_NONCE)
        now = memory._clock()
        sealed = nonce + aead.encrypt(nonce, reason.strip().encode("utf-8"), _aad(memory, ref))
        memory.backend.put_restriction(
            {
                "tenant": memory.tenant,
                "subject_ref": ref,
                "pseudonym": pseudonym,
                "reason": sealed,
                "actor": actor,
                "since": now,
            }
        )
        fields = {"tenant": memory.tenant, "subject": pseudonym, "actor": actor}
        events.append((Entry(EventType.RESTRICT, now, fields), None))
    return Restriction(pseudonym, reason.strip(), actor, now)


def unrestrict(memory: Memory, subject: str, *, actor: str) -> None:
    canonical = canonical_subject(subject)
    actor = check_who(actor, "actor", missing="lifting a restriction needs an actor")
    ref = memory._subject_ref(canonical)
    # A subject restricted before anything was stored about them got a key for the
    # restriction alone (its sealed reason, its pseudonym): lifted, it is a key of which
    # nothing is stored, and goes as one. The key store commits apart from the store, so
    # the key is marked first: a crash between the two commits leaves a mark, which the
    # next collection settles either way (a key still in use, by the restriction or by
    # records, keeps it), where a mark made after the restriction went could be lost and
    # the key with it kept for good. The call's end collects it unless it is in use.
    memory.keys.mark(memory.keys.key_ids(memory.tenant, [ref]))
    with memory._logged() as events:
        found = memory.backend.restrictions(memory.tenant, ref)
        if not found or not memory.backend.delete_restriction(memory.tenant, ref):
            raise NotFoundError("this subject is not restricted")
        now = memory._clock()
        fields = {"tenant": memory.tenant, "subject": str(found[0]["pseudonym"]), "actor": actor}
        events.append((Entry(EventType.UNRESTRICT, now, fields), None))
    memory.backend.scrub()


def check_writable(memory: Memory, subject_refs: list[bytes], *, for_legal_claim: bool | None) -> None:
    """Refuse a change to a restricted subject's records. ``for_legal_claim`` None: the
    call has no such exemption (retiring a record serves no claim)."""
    if for_legal_claim:
        return
    if memory.backend.any_restricted(memory.tenant, subject_refs):
        raise RestrictedSubjectError(
            "processing of this subject is restricted (Art. 18); "
            + (
                "its records are only kept until the restriction is lifted"
                if for_legal_claim is None
                else "a write serving a legal claim must say so (for_legal_claim / --for-legal-claim)"
            )
        )


def _reason(memory: Memory, aead: AESGCM, ref: bytes, row: Mapping[str, Any]) -> str:
    sealed = bytes(row["reason"])
    try:
        return aead.decrypt(sealed[:_NONCE], sealed[_NONCE:], _aad(memory, ref)).decode()
    except InvalidTag:
        raise IntegrityError("a restriction's reason failed authentication") from None


def restrictions(memory: Memory) -> list[Restriction]:
    out = []
    for row in memory.backend.restrictions(memory.tenant):
        ref = bytes(row["subject_ref"])
        reason = None
        if memory.keys.has_key(memory.tenant, ref):
            reason = _reason(memory, memory.keys.key_for_subject(memory.tenant, ref)[1], ref, row)
        out.append(Restriction(str(row["pseudonym"]), reason, str(row["actor"]), int(row["since"])))
    return out
