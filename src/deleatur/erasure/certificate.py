"""Portable erasure certificates.

A certificate is JSON: a ``certificate`` body and an Ed25519 ``signature`` over
its canonical bytes (keys sorted, no whitespace, ASCII; prefixed by the context
string of its format, ``deleatur/erasure-certificate/v2\\n``). Every field, the
issue time included, is under that signature. The body carries the request, every
tombstone and (from v2) the erasure's own log entry, each with its Merkle inclusion
proof, the signed checkpoint they are proven under, the public key, the store
identity and a scope statement.

v1 carried no erasure entry: what it states beyond its tombstones (the receipt time,
the kind, a request that erased nothing) rests on the issuer's signature alone. Its
certificates still verify, checked against their tombstones.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..clock import isoformat
from ..errors import IntegrityError, InvalidInputError
from ..log.checkpoint import Checkpoint
from ..log.entries import Entry, EntryError, EventType
from ..store.protocol import WAL_NOT_TRUNCATED
from .requests import SUBJECT_KEY_DESTROYED, ErasureRequest, RequestStatus, one_month_after
from .scope import scope_statement

if TYPE_CHECKING:
    from ..memory import Memory

FORMAT = "deleatur-erasure-certificate/v2"
#: Every format this release verifies, with the context string its signature covers.
CONTEXTS = {
    "deleatur-erasure-certificate/v1": b"deleatur/erasure-certificate/v1\n",
    FORMAT: b"deleatur/erasure-certificate/v2\n",
}


def canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def signed_message(body: dict[str, Any]) -> bytes:
    """What the signature covers: the context of the body's format (one of :data:`CONTEXTS`),
    so a v1 signature cannot pass for a v2 body, then the body."""
    return CONTEXTS[body["format"]] + canonical(body)


@dataclass(frozen=True, slots=True)
class Stated:
    """What a certificate states about its erasure that the erasure's log entries state
    too, or bound: each is compared with them (:func:`contradiction`) by the issuer, from
    the stored request row anyone writing the store's files can edit, and by the verifier."""

    request_id: str
    tenant: str
    kind: str
    basis: str
    records: int
    keys_destroyed: int
    received_at: int
    completed_at: int
    deadline: int


def contradiction(stated: Stated, tombstones: Sequence[Entry], erasure: Entry | None) -> str | None:
    """How ``stated`` contradicts the erasure's tombstones and its erasure entry (None: a
    v1 certificate carries none), or None if it does not. The message names the field,
    never its value: a forged certificate may carry anything."""
    if stated.deadline != one_month_after(stated.received_at):
        return "the deadline is not one month after the request's receipt"
    logged = [*tombstones, *([] if erasure is None else [erasure])]
    if erasure is not None:
        if erasure.type is not EventType.ERASURE or erasure.fields.get("request") != stated.request_id:
            return "the erasure entry is not this request's"
        if erasure.fields.get("records") != stated.records:
            return "the number of records erased is not the one the erasure entry states"
        # Logged from this release on; an older entry leaves them to the signature.
        if erasure.fields.get("received", stated.received_at) != stated.received_at:
            return "the request's receipt time is not the one the erasure entry states"
        if erasure.fields.get("kind", stated.kind) != stated.kind:
            return "the request's kind is not the one the erasure entry states"
        keys = erasure.fields.get("keys")
        if keys is not None and (not isinstance(keys, list) or len(keys) != stated.keys_destroyed):
            return "the number of data keys destroyed is not the one the erasure entry states"
    if any(entry.fields.get("basis") != stated.basis for entry in logged):
        return "the request's basis is not the one its log entries state"
    if any(entry.fields.get("tenant") != stated.tenant for entry in logged):
        return "the tenant is not the one the erasure's log entries state"
    times = {entry.time for entry in logged}
    if len(times) > 1:
        return "the erasure's log entries state different times"
    # Received before it was carried out, completed once its keys were destroyed after it.
    # (The issue time is the issuer's clock, perhaps another process's: nothing bounds it.)
    if any(not stated.received_at <= time <= stated.completed_at for time in times):
        return "the request's receipt and completion do not enclose the time its log entries state"
    return None


def _erasure_entry(memory: Memory, request: ErasureRequest) -> tuple[int, bytes, Entry]:
    """The request's erasure entry: logged right after its tombstones in one append (see
    the engine), or, for a request that erased nothing, found by its id."""
    if request.tombstones:
        after = request.tombstones[-1] + 1
        found = memory.backend.log_entries(after, after + 1)
    else:
        found = memory.backend.log_entries_naming(request.id)
    for index, raw in found:
        try:
            entry = Entry.decode(raw)
        except EntryError:
            continue  # a pruned call entry, whose stored leaf hash happened to hold the id
        if (
            entry.type is EventType.ERASURE
            and entry.fields.get("request") == request.id
            and entry.fields.get("tenant") == memory.tenant
        ):
            return index, raw, entry
    raise IntegrityError(f"the log holds no erasure entry of request {request.id}", request_id=request.id)


def _proven(memory: Memory, index: int, raw: bytes, size: int) -> dict[str, Any]:
    return {
        "index": index,
        "entry": base64.b64encode(raw).decode(),
        "proof": [base64.b64encode(h).decode() for h in memory.log.inclusion_proof(index, size)],
    }


def _subject_key_destroyed(memory: Memory, request: ErasureRequest) -> bool:
    """Whether this erasure destroyed the subject's data key: as it recorded, not as the
    key store holds now, after later erasures (which may have destroyed a key this one
    kept) and writes (which may have made the subject a new key). A request recorded
    before it said so: its plan destroyed the key exactly when none of the subject's
    records stayed beyond its scope; if it then destroyed no key, the key was already
    gone or another erasure's to destroy, and the key store says which."""
    assert request.subject_ref is not None
    counts = request.counts
    if SUBJECT_KEY_DESTROYED in counts:
        return bool(counts[SUBJECT_KEY_DESTROYED])
    if counts.get("kept_in_other_spaces", 0):
        return False
    return counts.get("keys_destroyed", 0) > 0 or not memory.keys.has_key(memory.tenant, request.subject_ref)


def build_certificate(memory: Memory, request: ErasureRequest, *, beyond_scopes_hidden: bool = False) -> dict[str, Any]:
    """``beyond_scopes_hidden``: the certificate of a key scoped to some users, without the
    counts beyond its scopes (which still tell what the erasure did with the key)."""
    key_destroyed = None if request.subject_ref is None else _subject_key_destroyed(memory, request)
    if beyond_scopes_hidden:
        request = request.beyond_scopes_hidden()
    request_id = request.id
    if request.status is not RequestStatus.COMPLETE:
        raise InvalidInputError(
            f"erasure request {request_id} is {request.status.value}; only a complete erasure has a certificate",
            request_id=request_id,
        )
    signer = memory.log.signer
    if signer is None:
        raise memory._no_signer()
    note = memory._checkpoint()
    size = Checkpoint.parse(note.text).size
    # As the request says, which the caller settled just now (truncating the -wal if it
    # was not yet, and saying so if a reader still kept it): the -wal holds none of this
    # erasure's page images once it was truncated after it, whatever was written since.
    wal_truncated = WAL_NOT_TRUNCATED not in request.counts
    subjects = request.counts.get("subjects", 0)
    destroyed = request.counts.get("keys_destroyed", 0)
    raws = [(index, memory.log.entry(index)) for index in request.tombstones]
    erasure_index, erasure_raw, erasure_entry = _erasure_entry(memory, request)
    completed = request.completed_at or request.received_at
    stated = Stated(
        request_id=request_id,
        tenant=memory.tenant,
        kind=request.kind.value,
        basis=request.basis,
        records=len(request.record_ids),
        keys_destroyed=destroyed,
        received_at=request.received_at,
        completed_at=completed,
        deadline=request.deadline,
    )
    # The request's row is not signed: anyone who can write the store's files can edit
    # its basis or times, and the certificate would sign the edit. What the log holds,
    # under the store's checkpoints, is what the erasure was.
    problem = contradiction(stated, [Entry.decode(raw) for _, raw in raws], erasure_entry)
    if problem is not None:
        raise IntegrityError(
            f"erasure request {request_id} contradicts its log entries ({problem}): its stored row was altered;"
            " no certificate is issued",
            request_id=request_id,
        )
    if key_destroyed is not None:
        other_keys_kept = max(subjects - destroyed, 0) if key_destroyed else max(subjects - destroyed - 1, 0)
    else:
        key_destroyed = subjects > 0 and destroyed >= subjects
        other_keys_kept = 0 if key_destroyed else subjects - destroyed
    records = len(request.record_ids)
    body = {
        "format": FORMAT,
        "issued_at": isoformat(memory._clock()),
        "store": {"store_id": memory.backend.store_id, "origin": memory.log.origin, "tenant": memory.tenant},
        "request": {
            "id": request.id,
            "kind": request.kind.value,
            "subject": request.subject_pseudonym,
            "scope": request.scope.to_json(),
            "basis": request.basis,
            "received_at": isoformat(request.received_at),
            "completed_at": isoformat(completed),
            "deadline": isoformat(request.deadline),
            "counts": request.counts,
        },
        "erasure": {
            "records": records,
            "record_ids": list(request.record_ids),
            # A keyed blind index (HMAC under the store's master key), not the name:
            # it lets a verifier holding the store check no record of the subject is live
            # within the erasure's scope (the store keeps the key of its pseudonyms).
            "subject_ref": None if request.subject_ref is None else request.subject_ref.hex(),
            "key_destroyed": key_destroyed,
            "keys_destroyed": destroyed,
            "subjects": subjects,
            "wal_truncated": wal_truncated,
        },
        "tombstones": [_proven(memory, index, raw, size) for index, raw in raws],
        "erasure_entry": _proven(memory, erasure_index, erasure_raw, size),
        "checkpoint": note.format(),
        "public_key": signer.verifier.vkey,
        "scope_statement": scope_statement(
            kind=request.kind.value,
            records=records,
            key_destroyed=key_destroyed,
            kept_elsewhere=request.counts.get("kept_in_other_spaces", 0),
            other_keys_kept=other_keys_kept,
            wal_truncated=wal_truncated,
        ),
    }
    signature = signer.sign_bytes(signed_message(body))
    return {"certificate": body, "signature": base64.b64encode(signature).decode()}
