"""deleatur: agent memory in which every data-subject right is built in.

The public surface is re-exported here; everything else is internal.
"""

from .access.audit import AuditEntry, AuditTrail
from .access.batch import AuditBatch, WriteGroup
from .access.principals import Capability, Principal, Role
from .crypto.master import MasterKeySource, from_bytes, from_environment, from_file, from_hex, from_passphrase
from .decisions.snapshots import Decision
from .erasure.engine import AmbiguousSubjectError, ConfirmationRequiredError, ErasureResult, RequestIdReusedError
from .erasure.plan import ErasurePlan
from .erasure.requests import ErasureRequest, RequestKind, RequestStatus
from .erasure.verify import verify_certificate
from .errors import (
    AccessDeniedError,
    AuthenticationError,
    DataKeyDestroyedError,
    DeleaturError,
    ExposedKeyFileError,
    IntegrityError,
    InvalidInputError,
    KeyStoreBusyError,
    KeyStoreError,
    MasterKeyError,
    NotADeleaturStoreError,
    NotFoundError,
    SchemaVersionError,
    SigningKeyMissingError,
    StoreBusyError,
    StoreError,
)
from .log.checkpoint import Checkpoint
from .log.cosignature import CosignatureVerifier, Cosigner
from .log.entries import Entry, EventType
from .log.merkle import ProofError, verify_consistency, verify_inclusion
from .log.note import Note, NoteError, Signer, Verifier
from .log.receipt import Receipt, verify_receipt
from .log.report import Check, Report
from .log.tlog import LogError
from .log.tlogproof import TlogProof
from .log.witness import Witness, WitnessError
from .memory import Memory, StoreInfo
from .model import Hit, NewMemory, Record, Space, SpaceFilter, Status, canonical_subject
from .rights.restriction import RestrictedSubjectError, Restriction

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "AmbiguousSubjectError",
    "AuditBatch",
    "AuditEntry",
    "AuditTrail",
    "AuthenticationError",
    "Capability",
    "Check",
    "Checkpoint",
    "ConfirmationRequiredError",
    "CosignatureVerifier",
    "Cosigner",
    "DataKeyDestroyedError",
    "Decision",
    "DeleaturError",
    "Entry",
    "ErasurePlan",
    "ErasureRequest",
    "ErasureResult",
    "EventType",
    "ExposedKeyFileError",
    "Hit",
    "IntegrityError",
    "InvalidInputError",
    "KeyStoreBusyError",
    "KeyStoreError",
    "LogError",
    "MasterKeyError",
    "MasterKeySource",
    "Memory",
    "NewMemory",
    "NotADeleaturStoreError",
    "NotFoundError",
    "Note",
    "NoteError",
    "Principal",
    "ProofError",
    "Receipt",
    "Record",
    "Report",
    "RequestIdReusedError",
    "RequestKind",
    "RequestStatus",
    "RestrictedSubjectError",
    "Restriction",
    "Role",
    "SchemaVersionError",
    "Signer",
    "SigningKeyMissingError",
    "Space",
    "SpaceFilter",
    "Status",
    "StoreBusyError",
    "StoreError",
    "StoreInfo",
    "TlogProof",
    "Verifier",
    "Witness",
    "WitnessError",
    "WriteGroup",
    "__version__",
    "canonical_subject",
    "from_bytes",
    "from_environment",
    "from_file",
    "from_hex",
    "from_passphrase",
    "verify_certificate",
    "verify_consistency",
    "verify_inclusion",
    "verify_receipt",
]
