"""Portable erasure certificates.

A certificate is JSON: a ``certificate`` body and an Ed25519 ``signature`` over
its canonical bytes (keys sorted, no whitespace, ASCII; prefixed by the context
string ``deleatur/erasure-certificate/v1\\n``). Every field, the issue time
included, is under that signature. The body carries the request, every
tombstone with its Merkle inclusion proof, the signed checkpoint they are proven
under, the public key, the store identity and a scope statement.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

from ..clock import isoformat
from ..errors import InvalidInputError
from ..log.checkpoint import Checkpoint
from ..store.protocol import WAL_NOT_TRUNCATED
from .requests import ErasureRequest, RequestStatus
from .scope import scope_statement

if TYPE_CHECKING:
    from ..memory import Memory

FORMAT = "deleatur-erasure-certificate/v1"
CONTEXT = b"deleatur/erasure-certificate/v1\n"


def canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def signed_message(body: Any) -> bytes:
    return CONTEXT + canonical(body)


def build_certificate(memory: Memory, request: ErasureRequest) -> dict[str, Any]:
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
    tombstones = []
    for index in request.tombstones:
        entry = memory.log.entry(index)
        proof = memory.log.inclusion_proof(index, size)
        tombstones.append(
            {
                "index": index,
                "entry": base64.b64encode(entry).decode(),
                "proof": [base64.b64encode(h).decode() for h in proof],
            }
        )
    subjects = request.counts.get("subjects", 0)
    destroyed = request.counts.get("keys_destroyed", 0)
    if request.subject_ref is not None:
        key_destroyed = not memory.keys.has_key(memory.tenant, request.subject_ref)
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
            "completed_at": isoformat(request.completed_at or request.received_at),
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
        "tombstones": tombstones,
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
