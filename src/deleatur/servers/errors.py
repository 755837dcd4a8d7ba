"""Library errors as the servers report them: an HTTP status and a stable code.

The code is part of the API (clients branch on it); the message is the
library's, which never quotes record text.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..erasure.engine import AmbiguousSubjectError, ConfirmationRequiredError, RequestIdReusedError
from ..errors import (
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
    NotFoundError,
    SigningKeyMissingError,
    StoreBusyError,
    StoreError,
)
from ..log.entries import EntryError
from ..log.merkle import ProofError
from ..log.note import NoteError
from ..log.tlog import LogError
from ..rights.restriction import RestrictedSubjectError


class ServerBusyError(DeleaturError):
    """A server refuses work it has no room for now (503); the caller may retry."""


class ResultTooLargeError(DeleaturError):
    """An answer would be larger than a server sends in one piece; the message says
    where to get it instead. Retrying the same call will not help."""


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    status: int
    code: str
    message: str
    #: For a 403: the capability (or "scope") the principal lacks.
    missing: str | None = None
    #: The call's request id (its audit entry's), or the erasure request it recorded as
    #: failed, which a retry under the same id completes.
    request_id: str | None = None

    def to_json(self) -> dict[str, object]:
        detail: dict[str, object] = {"code": self.code, "message": self.message}
        if self.missing is not None:
            detail["missing"] = self.missing
        if self.request_id is not None:
            detail["request_id"] = self.request_id
        return {"error": detail}


# The most specific class of an error's MRO that is listed here decides.
_STATUS: dict[type[DeleaturError], tuple[int, str]] = {
    AuthenticationError: (401, "unauthenticated"),
    AccessDeniedError: (403, "access_denied"),
    NotFoundError: (404, "not_found"),
    AmbiguousSubjectError: (409, "ambiguous_subject"),
    ConfirmationRequiredError: (428, "confirmation_required"),
    RequestIdReusedError: (409, "request_id_reused"),
    RestrictedSubjectError: (409, "subject_restricted"),
    InvalidInputError: (422, "invalid_input"),
    NoteError: (422, "invalid_signed_note"),
    EntryError: (422, "invalid_log_entry"),
    ProofError: (422, "proof_failed"),
    LogError: (409, "log_error"),
    DataKeyDestroyedError: (410, "data_key_destroyed"),
    MasterKeyError: (503, "master_key_error"),
    KeyStoreError: (500, "key_store_error"),
    # Not the keys' failure: the server's operator must restore a file, and the call can then be made again.
    SigningKeyMissingError: (503, "signing_key_missing"),
    ExposedKeyFileError: (503, "key_file_exposed"),
    KeyStoreBusyError: (503, "key_store_busy"),
    StoreBusyError: (503, "store_busy"),
    StoreError: (503, "store_unavailable"),
    ServerBusyError: (503, "busy"),
    ResultTooLargeError: (422, "result_too_large"),
    IntegrityError: (500, "integrity_error"),
}


def error_info(exc: BaseException) -> ErrorInfo:
    """How a server reports ``exc``. An error deleatur did not raise on purpose is
    reported by its type name only: its message may quote data."""
    if isinstance(exc, DeleaturError):
        for cls in type(exc).__mro__:
            if cls in _STATUS:
                status, code = _STATUS[cls]
                missing = exc.missing if isinstance(exc, AccessDeniedError) else None
                return ErrorInfo(status, code, exc.remote_message or exc.message, missing, exc.request_id)
        return ErrorInfo(500, "deleatur_error", exc.remote_message or exc.message, request_id=exc.request_id)
    return ErrorInfo(500, "internal", f"internal error ({type(exc).__name__})")


# The servers' own refusals of a request no library call saw: status, and the class a
# client raises for the code.
_SERVER_CODES: dict[str, tuple[int, type[DeleaturError]]] = {
    "invalid_request": (422, InvalidInputError),
    "body_too_large": (413, InvalidInputError),
    "no_such_route": (404, NotFoundError),
    "method_not_allowed": (405, DeleaturError),
}

#: Every stable code a server answers with, and its HTTP status (the README lists
#: them all; a test compares the two). ``http_error`` is left out: it is any other
#: status the HTTP stack answers with, and has none of its own.
ERROR_CODES: dict[str, int] = (
    {code: status for status, code in _STATUS.values()}
    | {code: status for code, (status, _) in _SERVER_CODES.items()}
    | {"deleatur_error": 500, "internal": 500}  # the fallbacks of error_info
)

# A client raises the class the server's code names.
_CLASS_OF: dict[str, type[DeleaturError]] = {code: cls for cls, (_, code) in _STATUS.items()} | {
    code: cls for code, (_, cls) in _SERVER_CODES.items()
}


def remote_error(status: int, payload: object) -> DeleaturError:
    """The library error a server reported in ``{"error": {"code", "message"}}``, with
    the HTTP ``status`` and ``code`` as attributes (a DeleaturError if the code is unknown)."""
    detail = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(detail, dict):
        detail = {}
    code, message = str(detail.get("code", "http_error")), str(detail.get("message", f"HTTP {status}"))
    cls = _CLASS_OF.get(code, DeleaturError)
    if issubclass(cls, AccessDeniedError):
        error: DeleaturError = cls(message, missing=str(detail.get("missing", "")))
    else:
        error = cls(message)
    request_id = detail.get("request_id")
    error.request_id = request_id if isinstance(request_id, str) else None
    error.status = status  # type: ignore[attr-defined]
    error.code = code  # type: ignore[attr-defined]
    return error
