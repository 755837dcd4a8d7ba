"""Verifying an erasure certificate offline, with the public key alone.

This module depends on no private key: it needs the certificate, optionally the
key and an earlier checkpoint the reader pinned, and optionally read-only access
to the store's files. It runs these checks, in order:

 1. format              the certificate parses and is a version we know
 2. signature           the body's Ed25519 signature verifies (under the pinned key, if pinned)
 3. checkpoint          the checkpoint is signed by the same key
 4. tombstones          every tombstone is this request's, and included under the checkpoint
 5. attests_erasure     at least one record was erased, the request is complete
 6. scope_intact        the scope statement is exactly what the certificate's facts imply
 7. pinned_checkpoint   (--expected-checkpoint) the certificate's checkpoint and the pinned
                        one are consistent, by a proof from the store's log
 8. store_identity      (--store) the store is the one the certificate was issued from
 9. store_log           (--store) the store's log still holds the tombstones and the tree
10. store_absent        (--store) no erased id is live, no live record has the subject,
                        and the subject's key is gone from the key store
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..errors import NotFoundError
from ..log.checkpoint import Checkpoint
from ..log.entries import Entry, EntryError, EventType
from ..log.merkle import ProofError, consistency_proof, leaf_hash, subtree_root, verify_consistency, verify_inclusion
from ..log.note import Note, NoteError, Verifier
from ..log.report import Report
from ..store.evidence import StoreEvidence
from .certificate import FORMAT, signed_message
from .scope import scope_statement


class _Invalid(Exception):
    pass


def _b64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise _Invalid("a base64 field is not a string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _Invalid("a base64 field is malformed") from None


def verify_certificate(
    document: Any,
    *,
    expected_key: Verifier | None = None,
    expected_checkpoint: Note | None = None,
    store: StoreEvidence | None = None,
) -> Report:
    report = Report("erasure certificate")
    try:
        body = document["certificate"]
        signature = _b64(document["signature"])
        if body["format"] != FORMAT:
            raise _Invalid(f"unknown format {body['format']!r}")
        key = Verifier.from_vkey(body["public_key"])
        note = Note.parse(body["checkpoint"])
        checkpoint = Checkpoint.parse(note.text)
        request, erasure, store_id = body["request"], body["erasure"], body["store"]
        tenant = str(store_id["tenant"])
        record_ids = [str(r) for r in erasure["record_ids"]]
    except (KeyError, TypeError, _Invalid, NoteError) as exc:
        detail = exc.message if isinstance(exc, NoteError) else f"malformed certificate ({exc})"
        report.add("format", False, detail)
        return report
    report.add("format", True, f"{FORMAT}, request {request.get('id')}")

    trusted = key
    if expected_key is not None and expected_key.vkey != key.vkey:
        report.add("signature", False, "signed by a different key than the pinned one")
        trusted = expected_key
    elif key.verify_bytes(signed_message(body), signature):
        report.add("signature", True, f"every field signed by {key.name} ({key.key_id.hex()})")
    else:
        report.add("signature", False, "the signature over the certificate does not verify")

    if any(trusted.matches(s) and trusted.verify(note.text, s) for s in note.signatures):
        report.add("checkpoint", True, f"tree of {checkpoint.size} entries signed by the same key")
    else:
        report.add("checkpoint", False, "the checkpoint is not signed by the certificate's key")

    report.add("tombstones", *_tombstones(body, checkpoint, record_ids, str(request.get("id"))))

    attested = len(record_ids) > 0 and len(body.get("tombstones", [])) == len(record_ids)
    report.add(
        "attests_erasure",
        attested,
        f"{len(record_ids)} record(s) erased" if attested else "this certificate attests no erasure (zero records)",
    )

    try:
        expected_scope = scope_statement(
            kind=str(request["kind"]),
            records=int(erasure["records"]),
            key_destroyed=bool(erasure["key_destroyed"]),
            kept_elsewhere=int(request["counts"].get("kept_in_other_spaces", 0)),
            other_keys_kept=_other_keys_kept(erasure),
            wal_truncated=bool(erasure["wal_truncated"]),
        )
        intact = expected_scope == body["scope_statement"] and int(erasure["records"]) == len(record_ids)
    except (KeyError, TypeError, ValueError, AttributeError):
        intact = False
    report.add(
        "scope_intact", intact, "matches the certificate's facts" if intact else "the scope statement was altered"
    )

    if expected_checkpoint is None:
        report.add("pinned_checkpoint", None, "no checkpoint pinned")
        report.notes.append(
            "NOT ANCHORED: no --expected-checkpoint; an operator holding the signing key could have "
            "rewritten the log and signed this certificate over it. Pin a checkpoint you obtained "
            "earlier, or one a witness cosigned."
        )
    else:
        report.add("pinned_checkpoint", *_pinned(expected_checkpoint, trusted, checkpoint, store))
    if expected_key is None:
        report.notes.append(
            "KEY NOT PINNED: the key inside the certificate was trusted; a forged certificate carries its "
            "own key. Pass --expected-pubkey with the store's key obtained out of band."
        )

    if store is None:
        for name in ("store_identity", "store_log", "store_absent"):
            report.add(name, None, "no --store given")
        report.notes.append("ABSENCE NOT CHECKED: pass --store to check the erased records are gone from the store.")
        return report
    same = store.store_id == store_id.get("store_id") and checkpoint.origin == f"deleatur/{store.store_id}"
    report.add(
        "store_identity",
        same,
        f"store {store.store_id}" if same else "the certificate was issued by another store",
    )
    report.add("store_log", *_store_log(body, checkpoint, store))
    report.add("store_absent", *_absent(store, tenant, record_ids, erasure))
    return report


def _other_keys_kept(erasure: dict[str, Any]) -> int:
    subjects, destroyed = int(erasure.get("subjects", 0)), int(erasure.get("keys_destroyed", 0))
    if erasure.get("subject_ref") is None:
        return 0 if erasure.get("key_destroyed") else subjects - destroyed
    return max(subjects - destroyed, 0) if erasure.get("key_destroyed") else max(subjects - destroyed - 1, 0)


def _tombstones(
    body: dict[str, Any], checkpoint: Checkpoint, record_ids: list[str], request_id: str
) -> tuple[bool, str]:
    seen: list[str] = []
    try:
        for item in body["tombstones"]:
            index, entry = int(item["index"]), _b64(item["entry"])
            proof = [_b64(p) for p in item["proof"]]
            parsed = Entry.decode(entry)
            if parsed.type is not EventType.TOMBSTONE or parsed.fields.get("request") != request_id:
                return False, f"entry {index} is not a tombstone of request {request_id}"
            verify_inclusion(index, checkpoint.size, leaf_hash(entry), proof, checkpoint.root)
            seen.append(str(parsed.record))
    except (KeyError, TypeError, ValueError, _Invalid, EntryError) as exc:
        return False, f"a tombstone is malformed ({exc})"
    except ProofError as exc:
        return False, exc.message
    if sorted(seen) != sorted(record_ids):
        return False, "the tombstones do not name exactly the erased records"
    return True, f"{len(seen)} tombstone(s) included in the tree of size {checkpoint.size}"


def _pinned(pinned: Note, key: Verifier, checkpoint: Checkpoint, store: StoreEvidence | None) -> tuple[bool, str]:
    try:
        old = Checkpoint.parse(pinned.text)
    except NoteError as exc:
        return False, f"pinned checkpoint is malformed: {exc.message}"
    if not any(key.matches(s) and key.verify(pinned.text, s) for s in pinned.signatures):
        return False, "the pinned checkpoint is not signed by the certificate's key"
    if old.origin != checkpoint.origin:
        return False, "the pinned checkpoint is from another log"
    if old.size == checkpoint.size:
        ok = old.root == checkpoint.root
        return ok, "same tree as the pinned checkpoint" if ok else "two different trees of the same size"
    if store is None:
        return False, "a consistency proof needs the store's log: pass --store"
    small, large = sorted((old, checkpoint), key=lambda c: c.size)
    try:
        proof = consistency_proof(small.size, large.size, store.log_node)
        verify_consistency(small.size, large.size, small.root, large.root, proof)
    except ProofError as exc:
        return False, f"not consistent with the pinned checkpoint: {exc.message}"
    except NotFoundError as exc:
        return False, f"the store cannot prove consistency: {exc.message}"
    return True, f"consistent with the pinned checkpoint of size {old.size}"


def _store_log(body: dict[str, Any], checkpoint: Checkpoint, store: StoreEvidence) -> tuple[bool, str]:
    size = store.log_size()
    if size < checkpoint.size:
        return False, f"the store's log has {size} entries, fewer than the certificate's {checkpoint.size}"
    for item in body["tombstones"]:
        if store.log_entry(int(item["index"])) != _b64(item["entry"]):
            return False, f"tombstone {item['index']} is missing from the store's log"
    try:
        if subtree_root(0, checkpoint.size, store.log_node) != checkpoint.root:
            return False, "the store's log no longer produces the certificate's tree"
    except NotFoundError:
        return False, "the store's log is missing hashes of the certificate's tree"
    return True, f"the store's log ({size} entries) still holds the certified tree"


def _absent(store: StoreEvidence, tenant: str, record_ids: list[str], erasure: dict[str, Any]) -> tuple[bool, str]:
    live = store.live_ids(tenant, record_ids)
    if live:
        return False, f"{len(live)} erased record(s) are live again, e.g. {live[0]}"
    ref_hex = erasure.get("subject_ref")
    if ref_hex is not None:
        ref = bytes.fromhex(str(ref_hex))
        if store.live_subject_rows(tenant, ref):
            return False, "a live record has the erased subject (re-inserted under a new id?)"
        if erasure.get("key_destroyed") and store.has_key(tenant, ref):
            return False, "the subject's data key is still in the key store"
    return True, f"none of the {len(record_ids)} record(s) is live, nor any record of the subject"
