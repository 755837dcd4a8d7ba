"""Write receipts: proof, checkable with the public key alone, that a write was logged.

A receipt holds the record's log entry (a salted commitment, no text) and a
C2SP tlog-proof: its index, the inclusion proof and the signed checkpoint. It
carries no nonce, so once the record is erased it confirms no guessed text.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInputError
from ..ids import is_record_id
from ..model import check_items, check_type, loads_document
from .checkpoint import Checkpoint
from .entries import Entry, EntryError, EventType
from .keychain import KeyChain, LogSource, unproven_hint
from .merkle import ProofError, leaf_hash, verify_inclusion
from .note import Note, NoteError, Verifier, b64decode, describe, open_note, signers_of
from .report import Report
from .tlogproof import TlogProof

FORMAT = "deleatur-receipt/v1"


class ReceiptError(NoteError):
    """A receipt file cannot be read."""


@dataclass(frozen=True, slots=True)
class Receipt:
    record_id: str
    entry: bytes
    proof: TlogProof

    @property
    def origin(self) -> str:
        """The log the receipt's checkpoint is of: the name a raw pinned key is given."""
        return Checkpoint.parse(self.proof.checkpoint.text).origin

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "record_id": self.record_id,
            "entry": base64.b64encode(self.entry).decode(),
            "tlog_proof": self.proof.format(),
        }

    @classmethod
    def from_json(cls, data: Any) -> Receipt:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ReceiptError(f"not a {FORMAT} receipt")
        if data.keys() - {"format", "record_id", "entry", "tlog_proof"}:
            # Nothing in a receipt is signed but its checkpoint: a member beside those it
            # checks would be taken by a reader for something the receipt proves.
            raise ReceiptError("receipt is malformed: it has a member besides format, record_id, entry and tlog_proof")
        # Each field is checked for its type: a forged receipt may carry anything, and the
        # report that names its record is sent back as JSON.
        record_id, entry, proof = data.get("record_id"), data.get("entry"), data.get("tlog_proof")
        if not is_record_id(record_id):
            raise ReceiptError("receipt is malformed: record_id is not a record id")
        if not isinstance(entry, str) or not isinstance(proof, str):
            raise ReceiptError("receipt is malformed: entry and tlog_proof must be strings")
        try:
            return cls(record_id=record_id, entry=b64decode(entry, "entry"), proof=TlogProof.parse(proof))
        except ValueError as exc:
            raise ReceiptError(f"receipt is malformed: {exc}") from None
        except NoteError as exc:
            raise ReceiptError(f"receipt is malformed: {exc.message}") from None

    @classmethod
    def loads(cls, text: str) -> Receipt:
        if not isinstance(text, str | bytes):
            raise ReceiptError(f"a receipt must be JSON text, not {type(text).__name__}")
        try:
            data = loads_document(text, "receipt")
        except InvalidInputError as exc:
            raise ReceiptError(exc.message) from None
        return cls.from_json(data)


def verify_receipt(
    receipt: Receipt, trusted: Sequence[Verifier], *, pinned: bool, store: LogSource | None = None
) -> Report:
    """Numbered checks: 1 checkpoint signature, 2 entry, 3 inclusion. A receipt taken
    before a key rotation is signed by an earlier key than a pinned current one: with
    ``store`` (the log, read-only) it is accepted if the log proves that key endorsed up
    to the pinned one (:mod:`deleatur.log.keychain`)."""
    check_type(receipt, Receipt, "receipt")
    trusted = check_items(trusted, Verifier, "trusted")
    check_type(pinned, bool, "pinned")
    report = Report(f"receipt for {receipt.record_id}")
    checkpoint = None
    try:
        detail = _signed_by(receipt.proof.checkpoint, trusted, pinned=pinned, store=store)
        checkpoint = Checkpoint.parse(receipt.proof.checkpoint.text)
        report.add("checkpoint_signature", True, detail)
    except NoteError as exc:
        report.add("checkpoint_signature", False, exc.message)
    try:
        entry = Entry.decode(receipt.entry)
        if entry.type not in (EventType.WRITE, EventType.RECTIFY) or entry.record != receipt.record_id:
            raise EntryError("the entry is not the write of this record")
        if not isinstance(entry.fields.get("commitment"), str):
            raise EntryError("the entry carries no commitment")
        report.add(
            "entry", True, f"a {entry.type.value} of {receipt.record_id}, commitment {entry.fields['commitment']}"
        )
    except EntryError as exc:
        report.add("entry", False, exc.message)
    if checkpoint is None:
        report.add("inclusion", False, "no trusted checkpoint to prove inclusion under")
    else:
        try:
            verify_inclusion(
                receipt.proof.index, checkpoint.size, leaf_hash(receipt.entry), receipt.proof.proof, checkpoint.root
            )
            report.add("inclusion", True, f"entry {receipt.proof.index} is in the tree of size {checkpoint.size}")
        except ProofError as exc:
            report.add("inclusion", False, exc.message.removeprefix("inclusion: "))
    if not pinned:
        report.notes.append(
            "KEY NOT PINNED: the receipt was checked against the store's own key; pin the verifier key you"
            " obtained out of band (--key; key over HTTP and MCP), or a forged store and receipt would pass"
            " together."
        )
    return report


def _signed_by(note: Note, trusted: Sequence[Verifier], *, pinned: bool, store: LogSource | None) -> str:
    try:
        signer = open_note(note, trusted)[0]
        return f"signed by {describe(signer)}"
    except NoteError:
        # A pinned key's signature that fails, or an unpinned check, has nothing to follow.
        if not pinned or any(v.matches(s) for s in note.signatures for v in trusted):
            raise
    if store is None:
        raise NoteError(unproven_hint(signers_of(note), trusted[0]))
    chain = KeyChain.from_log(trusted[0], store)
    key = chain.signer_of(note)
    return f"signed by {describe(key)}{chain.endorsement(key)}"
