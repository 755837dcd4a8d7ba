"""Signed decision snapshots: exactly the beliefs a decision used, provably.

A snapshot's signed body is canonical JSON (keys sorted, no whitespace, ASCII),
signed with the store's log key over ``deleatur/decision/v1\\n`` + body::

    {"format": "deleatur-decision/v1", "id", "store", "tenant", "space", "space_salt",
     "time", "actor", "summary", "beliefs": [{"record", "key", "value", "salt",
     "confidence", "log_index", "redacted"}], "redactions": [{"by", "request",
     "records", "time", "previous"}]}

``log_index`` is the record's write entry in the log; ``previous`` is the hash of
the body a redaction replaced. The body's SHA-256 is logged (a ``decision`` entry).
Each belief carries a random ``salt``, sealed and redacted with its value: the
hashes of bodies that held an erased value cannot be used to confirm a guess of it.
The id and the space are signed, so a row cannot be swapped for another decision
or moved to another space unnoticed. ``space_salt`` (random; absent from snapshots
made before it existed) does for the space's ids what a belief's salt does for its
value: an account erasure blanks it with the ids.

At rest, each belief's key and value are sealed under its subject's data key and
the summary under a key of the tenant's decisions; erasing a subject therefore
shreds old copies in backups too. The erasure itself redacts: it blanks the
erased records' keys, values and salts in every snapshot that used them, re-signs
the snapshot, and logs a ``redact`` entry linking the old and new body hashes.
``rectify --erase-previous`` redacts the values it hard-deletes the same way. An
account erasure also replaces the space of the decisions made in the erased spaces
with the erasure request's pseudonyms (a redaction with no records): a user id can
name a person.

The summary is not redacted: it describes the decision and must not name people
(it is sealed under the tenant's decisions key, which no erasure destroys).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, InvalidInputError, NotFoundError, quoted
from ..ids import check_record_id
from ..log.entries import Entry, EventType
from ..log.note import Verifier
from ..model import Space, SpaceFilter, check_stated, check_type
from ..rights.restriction import check_writable

if TYPE_CHECKING:
    from ..memory import Memory

Events = list[tuple[Entry, str | None]]

FORMAT = "deleatur-decision/v1"
CONTEXT = b"deleatur/decision/v1\n"
MAX_SUMMARY_BYTES = 16 * 1024
MAX_BELIEFS = 1000
DECISION_NEEDS_SUMMARY = "a decision needs a summary"


def canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


@dataclass(frozen=True, slots=True)
class Decision:
    """A snapshot as :func:`explain` returns it, its signature checked."""

    body: dict[str, Any]
    hash: str
    signed_by: str  # the verifier key name and id

    @property
    def id(self) -> str:
        return str(self.body["id"])

    def to_json(self) -> dict[str, Any]:
        return {"decision": self.body, "sha256": self.hash, "signed_by": self.signed_by, "signature": "verified"}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decision:
        """The snapshot a server checked and sent (``to_json``); it is not checked again here."""
        return cls(dict(data["decision"]), data["sha256"], data["signed_by"])


def summary_key_ref(memory: Memory, tenant: str) -> bytes:
    """The reference of ``tenant``'s key for decision summaries: a data key that names no
    one, which no erasure destroys and no collection of unused keys either."""
    return memory.keys.index.ref("decision-summaries", tenant)


def _seal(memory: Memory, subject_ref: bytes, value: Any) -> str:
    sealed = memory.keys.seal(memory.tenant, subject_ref, json.dumps(value))
    if sealed is None:
        raise IntegrityError("a belief's subject has no data key")
    return sealed


def _unseal(memory: Memory, sealed: str) -> Any:
    plain = memory.keys.unseal(sealed)
    if plain is None:
        raise IntegrityError("a snapshot holds a value whose key is gone but was not redacted")
    return json.loads(plain)


def record(
    memory: Memory, summary: str, used: Sequence[str], space: Space, events: Events, *, for_legal_claim: bool
) -> Decision:
    """Inside the caller's write transaction. Using a restricted subject's records is
    processing (Art. 18): refused unless ``for_legal_claim``."""
    check_stated(summary, "summary", missing=DECISION_NEEDS_SUMMARY, max_bytes=MAX_SUMMARY_BYTES)
    ids = list(dict.fromkeys(used))
    if not ids or len(ids) > MAX_BELIEFS:
        raise InvalidInputError(f"a decision uses 1 to {MAX_BELIEFS} records")
    signer = memory.log.signer
    if signer is None:
        raise memory._no_signer()
    beliefs, sealed, refs = [], [], []
    for record_id in ids:
        row = memory.backend.get(memory.tenant, check_record_id(record_id, "used"))
        if row is None or row.space != space:
            raise NotFoundError(f"no record {record_id} in this space", record_id=record_id)
        refs.append(row.subject_ref)
        rec = memory._decrypt(row)
        indexes = memory.backend.log_indexes_of(record_id)
        salt = memory._random(16).hex()
        belief = {
            "record": rec.id,
            "key": rec.key,
            "value": rec.text,
            "salt": salt,
            "confidence": rec.confidence,
            "log_index": indexes[0] if indexes else None,
            "redacted": False,
        }
        beliefs.append(belief)
        hidden = {**belief, "key": None, "value": None, "salt": None}
        sealed.append({**hidden, "sealed": _seal(memory, row.subject_ref, [rec.key, rec.text, salt])})
    check_writable(memory, refs, for_legal_claim=for_legal_claim)
    # The summary key is a data key like a subject's, under a blind reference of the tenant.
    summary_ref = summary_key_ref(memory, memory.tenant)
    memory.keys.key_for_subject(memory.tenant, summary_ref)
    now = memory._clock()
    body = {
        "format": FORMAT,
        "id": memory._ids.new(),
        "store": memory.backend.store_id,
        "tenant": memory.tenant,
        "space": {"user_id": space.user_id, "agent_id": space.agent_id, "run_id": space.run_id},
        "space_salt": memory._random(16).hex(),
        "time": now,
        "actor": memory.principal.id,
        "summary": summary.strip(),
        "beliefs": beliefs,
        "redactions": [],
    }
    stored = {**body, "summary": _seal(memory, summary_ref, body["summary"]), "beliefs": sealed}
    digest = _store(memory, body, stored, space, ids, replace=False)
    events.append(
        (Entry(EventType.DECISION, now, {"tenant": memory.tenant, "decision": body["id"], "hash": digest}), None)
    )
    return Decision(body, digest, f"{signer.name}+{signer.key_id.hex()}")


def _store(
    memory: Memory, body: dict[str, Any], stored: dict[str, Any], space: Space, uses: Sequence[str], *, replace: bool
) -> str:
    signer = memory.log.signer
    assert signer is not None
    message = canonical(body)
    digest = hashlib.sha256(message)
    memory.backend.put_decision(
        {
            "tenant": memory.tenant,
            "id": body["id"],
            "user_id": space.user_id,
            "agent_id": space.agent_id,
            "run_id": space.run_id,
            "created_at": body["time"],
            "body": canonical(stored),
            "key_id": signer.key_id.hex(),
            "signature": signer.sign_bytes(CONTEXT + message),
            "hash": digest.digest(),
        },
        uses,
        replace=replace,
    )
    return digest.hexdigest()


def _open(memory: Memory, row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the signed body, the stored form) of a snapshot row."""
    stored = json.loads(bytes(row["body"]))
    beliefs = []
    for belief in stored["beliefs"]:
        plain = {k: v for k, v in belief.items() if k != "sealed"}
        if not belief["redacted"]:
            plain["key"], plain["value"], plain["salt"] = _unseal(memory, belief["sealed"])
        beliefs.append(plain)
    body = {**stored, "summary": _unseal(memory, stored["summary"]), "beliefs": beliefs}
    return body, stored


def explain(memory: Memory, decision_id: str, space: Space, verifiers: Iterable[Verifier]) -> Decision:
    row = memory.backend.decision(memory.tenant, check_type(decision_id, str, "decision_id"))
    if row is None or Space(row["user_id"], row["agent_id"], row["run_id"]) != space:
        raise NotFoundError(f"no decision {quoted(decision_id)} in this space")
    return _verified(memory, decision_id, row, verifiers)


def explain_any(memory: Memory, decision_id: str, verifiers: Iterable[Verifier]) -> Decision:
    """:func:`explain` in whatever space the decision was made (for exports, which
    show only the beliefs about what they export)."""
    row = memory.backend.decision(memory.tenant, decision_id)
    if row is None:
        raise NotFoundError(f"no decision {quoted(decision_id)}")
    return _verified(memory, decision_id, row, verifiers)


def _verified(memory: Memory, decision_id: str, row: dict[str, Any], verifiers: Iterable[Verifier]) -> Decision:
    body, _ = _open(memory, row)
    message = canonical(body)
    digest = hashlib.sha256(message)
    space = {"user_id": row["user_id"], "agent_id": row["agent_id"], "run_id": row["run_id"]}
    # Numbered like every verification: which check failed is what the caller needs.
    if digest.digest() != bytes(row["hash"]):
        raise IntegrityError(f"decision {decision_id}: check 1 (hash) failed: the stored body was altered")
    signer = next((v for v in verifiers if v.key_id.hex() == row["key_id"]), None)
    if signer is None or not signer.verify_bytes(CONTEXT + message, bytes(row["signature"])):
        raise IntegrityError(f"decision {decision_id}: check 2 (signature) failed")
    if (body.get("id"), body.get("tenant"), body.get("space")) != (decision_id, memory.tenant, space):
        raise IntegrityError(f"decision {decision_id}: check 3 (identity) failed: the row holds another decision")
    return Decision(body, digest.hexdigest(), f"{signer.name}+{signer.key_id.hex()}")


def _snapshots(
    memory: Memory, decision_ids: Iterable[str]
) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]]:
    """Each snapshot's row, signed body, stored form and the hash of its body."""
    for decision_id in decision_ids:
        row = memory.backend.decision(memory.tenant, decision_id)
        assert row is not None
        body, stored = _open(memory, row)
        yield row, body, stored, hashlib.sha256(canonical(body)).hexdigest()


def _re_sign(
    memory: Memory,
    body: dict[str, Any],
    stored: dict[str, Any],
    space: Space,
    *,
    redaction: dict[str, Any],
    events: Events,
) -> None:
    """Replace a snapshot with ``body`` (and its stored form) plus ``redaction``, re-signed,
    and log the link from the hash of the body it replaces (``redaction["previous"]``)."""
    body = {**body, "redactions": [*body["redactions"], redaction]}
    stored = {**stored, "redactions": body["redactions"]}
    digest = _store(memory, body, stored, space, (), replace=True)
    fields = {
        "tenant": memory.tenant,
        "decision": body["id"],
        "old": redaction["previous"],
        "new": digest,
        "request": redaction["request"],
    }
    events.append((Entry(EventType.REDACT, redaction["time"], fields), None))


def pseudonymize_spaces(
    memory: Memory, scope: SpaceFilter, pseudonym: Callable[[str], str], events: Events, *, request_id: str, now: int
) -> int:
    """An account erasure's: the decisions made in the erased spaces keep their space only
    as the request's own pseudonyms (which nothing links back to the ids), re-signed, with
    a redaction that says so. Inside the erasure's transaction; returns how many."""
    moved = 0
    for row, body, stored, previous in _snapshots(memory, memory.backend.decisions_in(memory.tenant, scope)):
        space = Space(*(pseudonym(name) if name else "" for name in (row["user_id"], row["agent_id"], row["run_id"])))
        # Without its salt, the hash of the body it replaces confirms no guess of the ids.
        moved_to: dict[str, Any] = {
            "space": {"user_id": space.user_id, "agent_id": space.agent_id, "run_id": space.run_id}
        }
        if "space_salt" in body:
            moved_to["space_salt"] = None
        redaction = {"by": "account erasure", "request": request_id, "records": [], "time": now, "previous": previous}
        _re_sign(memory, {**body, **moved_to}, {**stored, **moved_to}, space, redaction=redaction, events=events)
        moved += 1
    return moved


def redact(
    memory: Memory, erased: Sequence[str], request_id: str, now: int, events: Events, *, by: str = "erasure"
) -> int:
    """Blank the erased records in every snapshot that used them and re-sign it.

    Inside the hard delete's transaction (an erasure's, before any key is destroyed,
    or a rectification's). Returns how many snapshots were redacted."""
    gone = set(erased)
    redacted = 0
    for row, body, stored, previous in _snapshots(memory, memory.backend.decisions_using(memory.tenant, gone)):
        hit = sorted(b["record"] for b in body["beliefs"] if b["record"] in gone and not b["redacted"])
        if not hit:
            continue
        blank = {"key": None, "value": None, "salt": None, "redacted": True}
        new_beliefs = [{**b, **blank} if b["record"] in gone else b for b in body["beliefs"]]
        new_sealed = [
            {**{k: v for k, v in b.items() if k != "sealed"}, **blank} if b["record"] in gone else b
            for b in stored["beliefs"]
        ]
        redaction = {"by": by, "request": request_id, "records": hit, "time": now, "previous": previous}
        space = Space(row["user_id"], row["agent_id"], row["run_id"])
        new_body, new_stored = {**body, "beliefs": new_beliefs}, {**stored, "beliefs": new_sealed}
        _re_sign(memory, new_body, new_stored, space, redaction=redaction, events=events)
        redacted += 1
    return redacted
