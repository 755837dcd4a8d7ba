"""Verifying an erasure certificate offline, with the public key alone.

This module depends on no private key: it needs the certificate, optionally the
key and an earlier checkpoint the reader pinned, and optionally read-only access
to the store's files. It runs these checks, in order:

 1. format              the certificate parses (no object repeats a key, and nothing but the
                        certificate and its signature is beside them) and is a version we know
 2. signature           the body's Ed25519 signature verifies (under the pinned key, if pinned;
                        with --store, also under an earlier key the log proves endorsed up to
                        the pinned one, see :mod:`deleatur.log.keychain`; offline, such a
                        certificate fails naming its key: it cannot carry a chain up to a key
                        made after it was issued, so the format is unchanged)
 3. checkpoint          the checkpoint is signed by the same key
 4. tombstones          every tombstone, and (from v2) the erasure entry, is this request's,
                        included under the checkpoint, and states what the certificate states:
                        basis, tenant, records, receipt and kind, its time between the request's
                        receipt and completion (and the deadline one month after receipt)
 5. attests_erasure     a tombstone for each record erased; or none, for nothing was held
 6. scope_intact        the scope statement is exactly what the certificate's facts imply
 7. pinned_checkpoint   (--expected-checkpoint) the certificate's checkpoint and the pinned
                        one are consistent, by a proof from the store's log
 8. store_identity      (--store) the store is the one the certificate was issued from: its id
                        and log, and its log announced the certificate's key, the key current
                        at the certified size (announcements proven in the certified tree)
 9. store_log           (--store) the store's log still holds the tombstones, and its entries
                        re-derive the certified tree (not its stored hashes, which need not match)
10. store_absent        (--store) within the erasure's scope: no erased id is live, no live
                        record has the subject, no data key the erasure entry says it destroyed
                        is in the key store (by id), and (if the certificate says it was
                        destroyed) the subject's key from before the erasure is gone
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from ..clock import from_isoformat
from ..crypto.keystore import REF_SIZE
from ..errors import InvalidInputError, NotFoundError
from ..ids import is_record_id
from ..log.checkpoint import Checkpoint
from ..log.entries import Entry, EntryError, EventType
from ..log.keychain import KeyChain, key_entry_proofs, proven_key_chain, unproven_hint
from ..log.merkle import CompactRange, ProofError, consistency_proof, leaf_hash, verify_consistency, verify_inclusion
from ..log.note import Note, NoteError, Verifier, b64decode, check_key_name, describe, parse_verifier, signers_of
from ..log.report import Report
from ..log.retention import pruned_leaf
from ..model import check_tenant, loads_document
from ..store.evidence import StoreEvidence
from .certificate import CONTEXTS, FORMAT, Stated, contradiction, signed_message
from .requests import NOTHING_HELD, is_request_id, space_pseudonym
from .scope import VERSIONS, scope_statement


class _Invalid(Exception):
    """A field of the certificate is missing or has the wrong shape. The message names
    the field, never its value: a forged certificate may carry anything."""


_T = TypeVar("_T")
_KINDS: dict[type, str] = {dict: "an object", list: "a list", str: "a string", int: "an integer", bool: "a boolean"}


def _field(parent: dict[str, Any], key: str, kind: type[_T], where: str, default: _T | None = None) -> _T:
    """``parent[key]`` if it is a ``kind`` (a JSON integer is never a boolean); else
    ``default`` when the key is absent and a default is given; else :class:`_Invalid`."""
    name = f"{where}.{key}" if where else key
    if key not in parent:
        if default is not None:
            return default
        raise _Invalid(f"{name} is missing")
    value = parent[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _Invalid(f"{name} is not {_KINDS[kind]}")
    return value


def _count(parent: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = _field(parent, key, int, where, default)
    if value < 0:
        raise _Invalid(f"{where}.{key} is negative")
    return value


def _b64(value: Any, name: str) -> bytes:
    if not isinstance(value, str):
        raise _Invalid(f"{name} is not {_KINDS[str]}")
    try:
        return b64decode(value, name)
    except NoteError as exc:
        raise _Invalid(exc.message) from None


@dataclass(frozen=True, slots=True)
class _Logged:
    """A log entry the certificate carries, with its inclusion proof."""

    index: int
    entry: bytes
    proof: list[bytes]


def _logged(item: Any, where: str) -> _Logged:
    if not isinstance(item, dict):
        raise _Invalid(f"{where} is not {_KINDS[dict]}")
    index, entry = _count(item, "index", where), _b64(item.get("entry"), f"{where}.entry")
    proof = [_b64(p, f"{where}.proof[{j}]") for j, p in enumerate(_field(item, "proof", list, where))]
    return _Logged(index, entry, proof)


@dataclass(frozen=True, slots=True)
class _Entries:
    """The certificate's tombstones and its erasure entry (None in a v1 certificate),
    each checked for shape (not for inclusion)."""

    tombstones: list[_Logged]
    erasure: _Logged | None

    @classmethod
    def of(cls, body: dict[str, Any]) -> _Entries:
        items = _field(body, "tombstones", list, "certificate")
        tombstones = [_logged(item, f"certificate.tombstones[{i}]") for i, item in enumerate(items)]
        if body["format"] != FORMAT:
            return cls(tombstones, None)
        return cls(tombstones, _logged(body.get("erasure_entry"), "certificate.erasure_entry"))

    def all(self) -> list[_Logged]:
        return [*self.tombstones, *([] if self.erasure is None else [self.erasure])]


def pinned_key_for(certificate: Any, pubkey: str) -> Verifier:
    """The pinned key ``pubkey`` (a verifier key, or 64 hex digits of a raw Ed25519 key)
    for verifying ``certificate`` (its parsed JSON): a raw key is named after the log the
    certificate says it comes from, or "deleatur" if it names none that is a key name. A
    damaged certificate must still reach :func:`verify_certificate`, which names the
    check it fails. Raises NoteError for a key that is neither form."""
    body = certificate.get("certificate") if isinstance(certificate, dict) else None
    store = body.get("store") if isinstance(body, dict) else None
    origin = store.get("origin") if isinstance(store, dict) else None
    try:
        name = check_key_name(origin) if isinstance(origin, str) else "deleatur"
    except NoteError:
        name = "deleatur"
    return parse_verifier(pubkey, name)


def verify_certificate(
    document: Any,
    *,
    expected_key: Verifier | None = None,
    expected_checkpoint: Note | None = None,
    store: StoreEvidence | None = None,
) -> Report:
    """Verify ``document``: the certificate's JSON text (str or bytes), which check 1
    reads strictly (see :func:`deleatur.model.loads_document`), or the value parsed
    from it. Pass the text: parsed by ``json.loads``, a document that repeats a key
    has lost the values a reader keeping the first one would read, unsigned."""
    report = Report("erasure certificate")
    try:
        if isinstance(document, str | bytes):
            try:
                document = loads_document(document, "the document")
            except InvalidInputError as exc:
                raise _Invalid(exc.message) from None
        if not isinstance(document, dict):
            raise _Invalid(f"the document is not {_KINDS[dict]}")
        if document.keys() - {"certificate", "signature"}:
            # Every member of the body is signed; one beside it is not, and a reader may
            # take it for part of the certificate.
            raise _Invalid("the document has a member besides certificate and signature, which nothing signs")
        body = _field(document, "certificate", dict, "")
        signature = _b64(document.get("signature"), "signature")
        version = _field(body, "format", str, "certificate")
        if version not in CONTEXTS:
            raise _Invalid(f"certificate.format is not one of {', '.join(CONTEXTS)}")
        key = Verifier.from_vkey(_field(body, "public_key", str, "certificate"))
        note = Note.parse(_field(body, "checkpoint", str, "certificate"))
        checkpoint = Checkpoint.parse(note.text)
        request = _field(body, "request", dict, "certificate")
        request_id = _field(request, "id", str, "certificate.request")
        if not is_request_id(request_id):
            raise _Invalid("certificate.request.id is not a request id")
        erasure = _field(body, "erasure", dict, "certificate")
        store_id = _field(body, "store", dict, "certificate")
        tenant = _field(store_id, "tenant", str, "certificate.store")
        try:
            check_tenant(tenant)  # it is looked up in the store's evidence
        except InvalidInputError:
            raise _Invalid("certificate.store.tenant is not a tenant name") from None
        record_ids = _field(erasure, "record_ids", list, "certificate.erasure")
        if not all(is_record_id(r) for r in record_ids):
            raise _Invalid("certificate.erasure.record_ids holds a value that is not a record id")
        try:
            message = signed_message(body)
        except (TypeError, ValueError):
            raise _Invalid("the certificate holds a value JSON cannot represent") from None
    except _Invalid as exc:
        report.add("format", False, f"malformed certificate: {exc}")
        return report
    except NoteError as exc:
        report.add("format", False, exc.message)
        return report
    report.add("format", True, f"{version}, request {request_id}")

    trusted, endorsement = key, ""
    if expected_key is not None and expected_key.vkey != key.vkey:
        try:
            endorsement = _endorsed(expected_key, key, note, store)
        except NoteError as exc:
            report.add("signature", False, exc.message)
            trusted = expected_key
    if trusted is key:
        if key.verify_bytes(message, signature):
            report.add("signature", True, f"every field signed by {describe(key)}{endorsement}")
        else:
            report.add("signature", False, "the signature over the certificate does not verify")

    if any(trusted.matches(s) and trusted.verify(note.text, s) for s in note.signatures):
        report.add("checkpoint", True, f"tree of {checkpoint.size} entries signed by the same key")
    else:
        whose = "the certificate's key" if trusted is key else "the pinned key"
        report.add("checkpoint", False, f"the checkpoint is not signed by {whose}")

    # Parsed once for the two checks that read them, each reporting a malformed list itself.
    entries: _Entries | _Invalid
    try:
        entries = _Entries.of(body)
    except _Invalid as exc:
        entries = exc
    report.add("tombstones", *_tombstones(entries, checkpoint, record_ids, body, tenant=tenant, request_id=request_id))
    report.add("attests_erasure", *_attests(body, record_ids))
    report.add("scope_intact", *_scope_intact(body, request, erasure, record_ids))

    if expected_checkpoint is None:
        report.add("pinned_checkpoint", None, "no checkpoint pinned")
        report.notes.append(
            "NOT ANCHORED: no checkpoint pinned; an operator holding the signing key could have "
            "rewritten the log and signed this certificate over it. Pin a checkpoint you obtained "
            "earlier, or one a witness cosigned (`deleatur verify --expected-checkpoint`)."
        )
    else:
        report.add("pinned_checkpoint", *_pinned(expected_checkpoint, trusted, expected_key, checkpoint, store))
    if expected_key is None:
        report.notes.append(
            "KEY NOT PINNED: the key inside the certificate was trusted; a forged certificate carries its "
            "own key. Pin the store's key, obtained out of band (--expected-pubkey; expected_pubkey over HTTP"
            " and MCP)."
        )

    if store is None:
        for name in ("store_identity", "store_log", "store_absent"):
            report.add(name, None, "the store was not consulted")
        report.notes.append(
            "ABSENCE NOT CHECKED: the store was not consulted; `deleatur verify --store`, run where its files"
            " are, checks the erased records are gone from it."
        )
        return report
    report.add("store_identity", *_store_identity(store_id, key, checkpoint, store))
    report.add("store_log", *_store_log(entries, checkpoint, store))
    report.add(
        "store_absent", *_absent(store, request, erasure, record_ids, entries, tenant=tenant, request_id=request_id)
    )
    return report


def _attests(body: dict[str, Any], record_ids: list[str]) -> tuple[bool, str]:
    tombstones = body.get("tombstones")
    count = len(tombstones) if isinstance(tombstones, list) else 0
    if count != len(record_ids):
        return False, f"{len(record_ids)} record(s) erased but {count} tombstone(s) to attest them"
    if not record_ids:
        # A request about someone the store held nothing on must still be answered, and
        # the answer shown: the certificate attests that answer, its statement saying
        # that it covers nothing (scope_intact), never an erasure.
        return True, NOTHING_HELD
    return True, f"{len(record_ids)} record(s) erased"


def _scope_intact(
    body: dict[str, Any], request: dict[str, Any], erasure: dict[str, Any], record_ids: list[str]
) -> tuple[bool, str]:
    statement = body.get("scope_statement")
    version = statement.get("version") if isinstance(statement, dict) else None
    if version not in VERSIONS:
        return False, f"the scope statement's version {version!r} is not one this verifier knows"
    try:
        records = _count(erasure, "records", "certificate.erasure")
        expected = scope_statement(
            version=version,
            kind=_field(request, "kind", str, "certificate.request"),
            records=records,
            key_destroyed=_field(erasure, "key_destroyed", bool, "certificate.erasure"),
            kept_elsewhere=_count(
                _field(request, "counts", dict, "certificate.request"),
                "kept_in_other_spaces",
                "certificate.request.counts",
                0,
            ),
            other_keys_kept=_other_keys_kept(erasure),
            wal_truncated=_field(erasure, "wal_truncated", bool, "certificate.erasure"),
        )
    except _Invalid as exc:
        return False, f"the scope statement cannot be rebuilt: {exc}"
    if records != len(record_ids):
        return False, f"the certificate counts {records} record(s) but names {len(record_ids)}"
    if expected != statement:
        return False, "the scope statement was altered"
    return True, "matches the certificate's facts"


def _other_keys_kept(erasure: dict[str, Any]) -> int:
    where = "certificate.erasure"
    subjects, destroyed = _count(erasure, "subjects", where, 0), _count(erasure, "keys_destroyed", where, 0)
    key_destroyed = _field(erasure, "key_destroyed", bool, where)
    if erasure.get("subject_ref") is None:
        return 0 if key_destroyed else subjects - destroyed
    return max(subjects - destroyed, 0) if key_destroyed else max(subjects - destroyed - 1, 0)


def _time(parent: dict[str, Any], key: str, where: str) -> int:
    try:
        return from_isoformat(_field(parent, key, str, where))
    except ValueError:
        raise _Invalid(f"{where}.{key} is not a time") from None


def _stated(body: dict[str, Any], *, tenant: str, request_id: str) -> Stated:
    """What the certificate states that its log entries state too (see :class:`Stated`)."""
    request = body["request"]
    where = "certificate.request"
    return Stated(
        request_id=request_id,
        tenant=tenant,
        kind=_field(request, "kind", str, where),
        basis=_field(request, "basis", str, where),
        records=_count(body["erasure"], "records", "certificate.erasure"),
        keys_destroyed=_count(body["erasure"], "keys_destroyed", "certificate.erasure", 0),
        received_at=_time(request, "received_at", where),
        completed_at=_time(request, "completed_at", where),
        deadline=_time(request, "deadline", where),
    )


def _tombstones(
    entries: _Entries | _Invalid,
    checkpoint: Checkpoint,
    record_ids: list[str],
    body: dict[str, Any],
    *,
    tenant: str,
    request_id: str,
) -> tuple[bool, str]:
    if isinstance(entries, _Invalid):
        return False, f"the tombstones are malformed: {entries}"
    seen: list[str] = []
    tombstones: list[Entry] = []
    try:
        for i, item in enumerate(entries.tombstones):
            try:
                parsed = Entry.decode(item.entry)
            except EntryError as exc:
                return False, f"a tombstone is malformed: certificate.tombstones[{i}].entry: {exc.message}"
            if parsed.type is not EventType.TOMBSTONE or parsed.fields.get("request") != request_id:
                return False, f"entry {item.index} is not a tombstone of request {request_id}"
            verify_inclusion(item.index, checkpoint.size, leaf_hash(item.entry), item.proof, checkpoint.root)
            seen.append(str(parsed.record))
            tombstones.append(parsed)
        erasure = None
        if entries.erasure is not None:
            item = entries.erasure
            try:
                erasure = Entry.decode(item.entry)
            except EntryError as exc:
                return False, f"the erasure entry is malformed: certificate.erasure_entry.entry: {exc.message}"
            verify_inclusion(item.index, checkpoint.size, leaf_hash(item.entry), item.proof, checkpoint.root)
    except ProofError as exc:
        return False, exc.message
    if sorted(seen) != sorted(record_ids):
        return False, "the tombstones do not name exactly the erased records"
    try:
        problem = contradiction(_stated(body, tenant=tenant, request_id=request_id), tombstones, erasure)
    except _Invalid as exc:
        return False, f"the certificate cannot be compared with its log entries: {exc}"
    if problem is not None:
        return False, problem
    if erasure is None:
        return True, (
            f"{len(seen)} tombstone(s) included in the tree of size {checkpoint.size}, stating the certificate's"
            " basis; a v1 certificate carries no erasure entry, so its receipt time and kind rest on its signature"
        )
    detail = (
        f"{len(seen)} tombstone(s) and the erasure entry included in the tree of size {checkpoint.size},"
        " stating the certificate's basis, records and times"
    )
    if "received" not in erasure.fields:
        detail += "; the erasure was logged before its receipt time was, which rests on the signature"
    return True, detail


def _endorsed(pinned: Verifier, key: Verifier, note: Note, store: StoreEvidence | None) -> str:
    """Accept a certificate signed by ``key``, an earlier key than the pinned one, only if
    the store's log proves the chain from it up to the pinned key (see
    :mod:`deleatur.log.keychain`): its own checkpoint must be signed by ``key`` as the
    key current at its size. Returns how it is trusted; raises :class:`NoteError`.
    Offline there is no proof: a certificate carries the checkpoint it was issued under,
    and the key chain up to a key made after it exists only in the later log."""
    if store is None:
        raise NoteError(unproven_hint(describe(key), pinned))
    chain = KeyChain.from_log(pinned, store)
    if chain.signer_of(note) != key:
        raise NoteError(f"the certificate's key {describe(key)} did not sign its checkpoint as the log's key then")
    return chain.endorsement(key)


def _announced_keys(checkpoint: Checkpoint, store: StoreEvidence) -> list[tuple[int, Verifier]]:
    """The keys the store's log announced within the certified tree, oldest first with the
    index announcing each: read from the log's entries, each proven in the tree the
    certificate's checkpoint signs and endorsed by the key before it (not from a table the
    store keeps beside its log, which anyone writing its files can add a key to). Raises
    :class:`NoteError`."""
    if checkpoint.size > store.log_size():
        # No such tree in this store (and perhaps no integer SQLite holds).
        raise NoteError(f"the store's log has fewer entries than the certified tree of {checkpoint.size}")
    return proven_key_chain(key_entry_proofs(store, checkpoint.size), checkpoint)


def _key_chain(key: Verifier, checkpoint: Checkpoint, store: StoreEvidence) -> list[Verifier]:
    """The keys the store's log announced within the certified tree up to ``key``, each
    endorsed by the one before it: the keys that signed this log's earlier checkpoints.
    Only ``key`` if the chain does not hold (each entry is proven in the certified tree,
    which ``key`` signed, so a key entry added to the store's files does not count)."""
    try:
        keys = [k for _, k in _announced_keys(checkpoint, store)]
    except NoteError:
        return [key]
    return keys[: keys.index(key) + 1] if key in keys else [key]


def _pinned(
    pinned: Note, key: Verifier, pinned_key: Verifier | None, checkpoint: Checkpoint, store: StoreEvidence | None
) -> tuple[bool, str]:
    try:
        old = Checkpoint.parse(pinned.text)
    except NoteError as exc:
        return False, f"pinned checkpoint is malformed: {exc.message}"
    # A checkpoint pinned before a key rotation is signed by an earlier key of the chain;
    # one pinned after it, by the pinned key itself (which the reader trusts).
    signers = [key] if store is None else _key_chain(key, checkpoint, store)
    if pinned_key is not None:
        signers.append(pinned_key)
    if not any(v.matches(s) and v.verify(pinned.text, s) for s in pinned.signatures for v in signers):
        if store is None:
            return False, (
                f"the pinned checkpoint is signed by {signers_of(pinned)}, not by the certificate's key (if it"
                " was signed before a key rotation, pass --store to check the key chain)"
            )
        return False, (
            f"the pinned checkpoint is signed by {signers_of(pinned)}: neither the certificate's key nor a key"
            " it was endorsed by"
        )
    if old.origin != checkpoint.origin:
        return False, "the pinned checkpoint is from another log"
    if old.size == checkpoint.size:
        ok = old.root == checkpoint.root
        return ok, "same tree as the pinned checkpoint" if ok else "two different trees of the same size"
    if store is None:
        return False, "a consistency proof needs the store's log: pass --store"
    small, large = sorted((old, checkpoint), key=lambda c: c.size)
    if large.size > store.log_size():
        return False, "the store's log is shorter than the trees a consistency proof spans"
    try:
        proof = consistency_proof(small.size, large.size, store.log_node)
        verify_consistency(small.size, large.size, small.root, large.root, proof)
    except ProofError as exc:
        return False, f"not consistent with the pinned checkpoint: {exc.message}"
    except NotFoundError as exc:
        return False, f"the store cannot prove consistency: {exc.message}"
    return True, f"consistent with the pinned checkpoint of size {old.size}"


def _store_identity(
    store_id: dict[str, Any], key: Verifier, checkpoint: Checkpoint, store: StoreEvidence
) -> tuple[bool, str]:
    try:
        claimed = _field(store_id, "store_id", str, "certificate.store")
    except _Invalid as exc:
        return False, f"the certificate does not name its store: {exc}"
    if claimed != store.store_id or checkpoint.origin != f"deleatur/{store.store_id}":
        return False, "the certificate was issued by another store"
    # Ids and origin are public: anyone can sign the store's real tree under a key of
    # their own with the same name. Issued by this store means signed by a key its log
    # announced, and the one current at the certified size (a retired key signs no later
    # tree, as `log verify` requires of every checkpoint).
    try:
        announced = _announced_keys(checkpoint, store)
    except NoteError as exc:
        return False, f"the store's log cannot show which keys it announced: {exc.message}"
    if key not in (k for _, k in announced):
        return False, f"the certificate's key {describe(key)} is not one the store's log announced"
    current = announced[-1][1]
    if key != current:
        return False, (
            f"the certificate's key {describe(key)} was replaced by {describe(current)} before the certified"
            f" tree of size {checkpoint.size}"
        )
    return True, f"store {store.store_id}, whose log announced the certificate's key {describe(key)}"


def _store_log(entries: _Entries | _Invalid, checkpoint: Checkpoint, store: StoreEvidence) -> tuple[bool, str]:
    size = store.log_size()
    if size < checkpoint.size:
        return False, f"the store's log has {size} entries, fewer than the certificate's {checkpoint.size}"
    if isinstance(entries, _Invalid):
        return False, f"the tombstones cannot be looked up: {entries}"
    for item in entries.all():
        # An index past the certified tree is not one of its entries (and may not fit the store's integers).
        stored = None if item.index >= checkpoint.size else store.log_entry(item.index)
        if stored != item.entry:
            what = "the erasure entry" if item is entries.erasure else "tombstone"
            return False, f"{what} {item.index} is {'missing from' if stored is None else 'changed in'} the store's log"
    # From the entries themselves: the stored subtree hashes are a cache for proofs, and
    # an entry edited beside them leaves them producing the certified root.
    tree = CompactRange()
    for index, raw in store.log_entries(checkpoint.size):
        if index != tree.size:
            return False, f"entry {tree.size} of the certified tree is missing from the store's log"
        leaf = pruned_leaf(raw)  # audit retention keeps a pruned entry's leaf hash
        tree.append(leaf_hash(raw) if leaf is None else leaf)
    if tree.size != checkpoint.size:
        return False, f"entry {tree.size} of the certified tree is missing from the store's log"
    if tree.root() != checkpoint.root:
        return False, "the store's log entries no longer produce the certificate's tree: an entry in it was changed"
    return True, f"the store's log ({size} entries) still holds the certified tree, re-derived from its entries"


def _subject_ref(erasure: dict[str, Any]) -> bytes | None:
    value = erasure.get("subject_ref")
    if value is None:
        return None
    name = "certificate.erasure.subject_ref"
    if not isinstance(value, str):
        raise _Invalid(f"{name} is neither null nor {_KINDS[str]}")
    try:
        ref = bytes.fromhex(value)
    except ValueError:
        raise _Invalid(f"{name} is not hexadecimal") from None
    if len(ref) != REF_SIZE:
        raise _Invalid(f"{name} is not {REF_SIZE} bytes")
    return ref


_LEVELS = ("user_id", "agent_id", "run_id")


def _request_scope(request: dict[str, Any]) -> tuple[str | None, ...]:
    """The request's scope as its certificate states it: each level a pseudonym, or None
    for any."""
    scope = _field(request, "scope", dict, "certificate.request")
    levels = []
    for level in _LEVELS:
        if level not in scope:
            raise _Invalid(f"certificate.request.scope.{level} is missing")
        value = scope[level]
        if value is not None and not isinstance(value, str):
            raise _Invalid(f"certificate.request.scope.{level} is neither null nor {_KINDS[str]}")
        levels.append(value)
    return tuple(levels)


def _within(scope: tuple[str | None, ...], key: bytes, space: tuple[str, ...]) -> bool:
    return all(want is None or want == space_pseudonym(key, have) for want, have in zip(scope, space, strict=True))


def _destroyed_keys(entries: _Entries | _Invalid) -> list[bytes] | None:
    """The ids of the data keys the certificate's erasure entry says it destroyed; None if
    it names none (a v1 certificate, or an erasure logged before its entry did)."""
    if isinstance(entries, _Invalid) or entries.erasure is None:
        return None
    try:
        keys = Entry.decode(entries.erasure.entry).fields.get("keys")
    except EntryError as exc:
        raise _Invalid(f"certificate.erasure_entry.entry: {exc.message}") from None
    if keys is None:
        return None
    try:
        return [bytes.fromhex(key) for key in keys]
    except (TypeError, ValueError):
        raise _Invalid("the erasure entry's keys are not key ids") from None


def _absent(
    store: StoreEvidence,
    request: dict[str, Any],
    erasure: dict[str, Any],
    record_ids: list[str],
    entries: _Entries | _Invalid,
    *,
    tenant: str,
    request_id: str,
) -> tuple[bool, str]:
    """Checked within the erasure's scope, as its certificate states it: a record of the
    subject in a space the erasure did not reach (another user's, say) is no failure of
    this erasure, while one inside it is, whatever its id."""
    try:
        ref = _subject_ref(erasure)
        key_destroyed = _field(erasure, "key_destroyed", bool, "certificate.erasure")
        scope = _request_scope(request)
        completed = _time(request, "completed_at", "certificate.request")
        destroyed = _destroyed_keys(entries)
    except _Invalid as exc:
        return False, f"absence cannot be checked: {exc}"
    live = store.live_ids(tenant, record_ids)
    if live:
        return False, f"{len(live)} erased record(s) are live again, e.g. {live[0]}"
    detail = f"none of the {len(record_ids)} erased record(s) is live"
    if destroyed:
        # By id, which the key's wrapping binds: a destroyed key put back from a backup
        # keeps it (its creation time, which nothing authenticates, can say anything).
        back = store.key_ids_present(destroyed)
        if back:
            return False, f"a data key this erasure destroyed is in the key store again (key {back[0].hex()})"
        detail += f", none of the {len(destroyed)} data key(s) it destroyed is back in the key store"
    if ref is None:
        return True, detail
    spaces = store.live_subject_spaces(tenant, ref)
    held = sum(count for *_, count in spaces)
    inside: int | None = None  # a request recorded before the store kept its scope's key
    where = ""
    if all(level is None for level in scope):
        inside, where = held, " in the tenant"
    elif (key := store.scope_key(tenant, request_id)) is not None:
        inside, where = sum(n for *space, n in spaces if _within(scope, key, tuple(space))), " within its scope"
    if inside:
        return False, "a live record of the subject lies within the erasure's scope (re-inserted under a new id?)"
    if inside is None and held:
        detail += (
            f"; {held} live record(s) of the subject could not be placed in or out of the erasure's scope"
            " (the store keeps no key for this request's scope), so only the erased ids were checked"
        )
    else:
        detail += f", nor any record of the subject{where}"
        if held:
            detail += f" ({held} outside it, which this erasure did not reach)"
    if key_destroyed:
        # A key made after the erasure is a later write's (inside the scope, its records
        # fail above): only one from before it is the key that was to be destroyed. Told
        # by its creation time, which the key store does not authenticate: for an erasure
        # whose entry names no key ids (above), and for a key of the subject that another
        # erasure, still pending, was destroying.
        created = store.key_created_at(tenant, ref)
        if created is not None and created <= completed:
            return False, "the subject's data key is still in the key store"
        detail += "; the subject's data key from before the erasure is gone"
        if destroyed is None:
            detail += " (by its creation time, which the key store does not authenticate: no key id is logged)"
    return True, detail
