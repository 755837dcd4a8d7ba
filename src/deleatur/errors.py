"""The one error tree of deleatur.

Every error the library raises on purpose derives from :class:`DeleaturError`;
the shells map ``exit_code`` to the process exit status::

    DeleaturError                        exit 1 unless a subclass says otherwise
    ├── InvalidInputError                exit 2: the caller's input is wrong
    │   ├── NotFoundError                exit 2: unknown id, key or store
    │   ├── erasure.engine.AmbiguousSubjectError      several spellings; allow_ambiguous
    │   ├── erasure.engine.ConfirmationRequiredError  an agent must present its token
    │   ├── erasure.engine.RequestIdReusedError       an id already names another erasure
    │   └── rights.restriction.RestrictedSubjectError processing restricted (Art. 18)
    ├── StoreError                       exit 2: the store cannot be used as given
    │   ├── NotADeleaturStoreError       the file is not a deleatur store
    │   ├── SchemaVersionError           the store was written by a newer deleatur
    │   └── StoreBusyError               exit 1: another process held the write lock
    │                                    past the busy timeout (HTTP 503; try again)
    ├── KeyStoreError                    the keys protecting the store
    │   ├── MasterKeyError               exit 2: master key missing or wrong
    │   ├── SigningKeyMissingError       exit 2: the log's signing key file is gone: restore it
    │   ├── ExposedKeyFileError          exit 2: a secret key file other users may read
    │   ├── DataKeyDestroyedError        the subject's data key is gone (crypto-shredded)
    │   └── KeyStoreBusyError            another process holds the key store's lock
    ├── AuthenticationError              exit 3: no principal has this API key
    ├── AccessDeniedError                exit 3: the principal lacks a capability or
    │                                    scope (names which; the denial is audited)
    ├── IntegrityError                   stored bytes fail authentication, or a log
    │                                    would be made to contradict itself
    ├── servers.errors.ServerBusyError   a server has no room for the work now (HTTP 503)
    ├── log.tlog.LogError                exit 2: no signing key, size out of range,
    │                                    a rotation beside another
    ├── log.merkle.ProofError            a Merkle proof does not verify (names the step)
    ├── log.note.NoteError               a signed note, key string or signature is bad
    │   └── log.receipt.ReceiptError     a receipt file cannot be read
    ├── log.entries.EntryError           a log entry is not canonical
    └── log.witness.WitnessError         exit 2: the witness refuses (``status`` is
        ├── UnknownLogError              the tlog-witness HTTP status: 404, 403,
        ├── UntrustedCheckpointError     409 with the witness's latest size, 422)
        ├── ConflictError
        └── InconsistentError

Errors carry context (``subject``, ``record_id``, ``request_id``) as attributes so
that shells can report it, but their messages never contain record text: an
error message ends up in logs, and logs must not hold erased plaintext.
"""

from __future__ import annotations

#: The most of a caller's value an error message quotes: the message is sent back, and
#: logged, whole (an id of 10,000 characters was quoted twice over MCP).
QUOTED_MAX = 64


def quoted(value: object) -> str:
    """``repr(value)`` for an error message, cut to :data:`QUOTED_MAX` characters."""
    shown = repr(value)
    return shown if len(shown) <= QUOTED_MAX else shown[: QUOTED_MAX - 1] + "…"


class DeleaturError(Exception):
    """Root of every error deleatur raises on purpose."""

    exit_code = 1
    #: An erasure refused after its request was recorded, as failed, under ``request_id``:
    #: retried under that id, it is completed, not left open beside a new one.
    request_recorded = False
    #: The message a server sends its remote callers, where ``message`` names what only
    #: the server's operator should see (a file's path); None: the message itself.
    remote_message: str | None = None

    def __init__(
        self,
        message: str,
        *,
        subject: str | None = None,
        record_id: str | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.subject = subject
        self.record_id = record_id
        self.request_id = request_id

    @property
    def retry_note(self) -> str | None:
        """What a shell tells the caller of an erasure refused after its request was
        recorded (:attr:`request_recorded`); None for any other error."""
        if not self.request_recorded:
            return None
        return f"request {self.request_id} recorded as failed: retry under this request id"


class InvalidInputError(DeleaturError):
    """The caller passed something deleatur refuses (empty text, bad JSON, ...)."""

    exit_code = 2


class NotFoundError(InvalidInputError):
    """An id, key or store the caller named does not exist (in the caller's space)."""


class StoreError(DeleaturError):
    """The store file cannot be opened or used as asked."""

    exit_code = 2


class NotADeleaturStoreError(StoreError):
    """The file exists but was not written by deleatur."""


class SchemaVersionError(StoreError):
    """The store's schema is newer than this version of deleatur understands."""


class StoreBusyError(StoreError):
    """Another connection held the write lock for longer than the busy timeout (or at
    all, for a call that must not wait: ``sqlitefile.first_try``), and nothing was
    changed: a moment's condition, not the caller's input."""

    exit_code = 1


class KeyStoreError(DeleaturError):
    """Something is wrong with the keys that protect the store."""


class MasterKeyError(KeyStoreError):
    """The master key is missing, malformed, or not the one the store was made with."""

    exit_code = 2


class SigningKeyMissingError(KeyStoreError):
    """The file of the signing key the log announced last is gone: the store cannot sign
    until it is restored (a new key would not be endorsed by the one the log names)."""

    exit_code = 2


class ExposedKeyFileError(KeyStoreError):
    """A secret key file (master key, signing key, witness key) is open to other users,
    or owned by one: deleatur will not use a key someone else may have read or replaced."""

    exit_code = 2
    remote_message = (
        "a key file on the server is open to other users: the store cannot be used until its operator restricts it"
    )


class DataKeyDestroyedError(KeyStoreError):
    """The subject's data key no longer exists, so its records cannot be read."""


class KeyStoreBusyError(KeyStoreError, StoreBusyError):
    """Another process held the key store's write lock for longer than the busy timeout."""


class AuthenticationError(DeleaturError):
    """An API key is malformed, unknown or revoked. The message never says which."""

    exit_code = 3


class AccessDeniedError(DeleaturError):
    """The principal may not make this call: ``missing`` names the capability or scope."""

    exit_code = 3

    def __init__(self, message: str, *, missing: str, request_id: str | None = None) -> None:
        super().__init__(message, request_id=request_id)
        self.missing = missing


class IntegrityError(DeleaturError):
    """Stored ciphertext failed authentication: the file was altered or corrupted."""


__all__ = [
    "AccessDeniedError",
    "AuthenticationError",
    "DataKeyDestroyedError",
    "DeleaturError",
    "IntegrityError",
    "InvalidInputError",
    "KeyStoreError",
    "MasterKeyError",
    "NotADeleaturStoreError",
    "NotFoundError",
    "SchemaVersionError",
    "SigningKeyMissingError",
    "StoreError",
]
