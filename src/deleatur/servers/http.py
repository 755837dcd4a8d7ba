"""The HTTP API (FastAPI, served by uvicorn): ``deleatur serve http``.

Every route calls one library method on a leased handle and returns its JSON;
errors come back as ``{"error": {"code", "message"}}`` with the status and the
stable code of :mod:`.errors`. OpenAPI is at ``/openapi.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, unquote_to_bytes

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__, sqlitefile
from ..access.principals import Capability
from ..clock import isoformat, system_clock
from ..erasure.engine import ErasureResult
from ..errors import AuthenticationError, DeleaturError, InvalidInputError, StoreBusyError
from ..log.report import Report
from ..memory import Memory
from ..model import MAX_RECALL, Space, SpaceFilter, loads_envelope, loads_unique
from ..sqlitefile import first_try, scrubs_unwaited_during
from .auth import CHALLENGE, as_caller
from .calls import (
    MAX_AUDIT_SCAN,
    MAX_EXPORTS,
    MAX_PAGE,
    MAX_PAGE_BYTES,
    Exports,
    audit_page,
    check_certificate,
    check_receipt,
    history_page,
    list_page,
    new_request_id,
    on_behalf,
    public_key,
)
from .defaults import DEFAULT_BASIS, DEFAULT_HANDLES, DEFAULT_MAX_BODY_BYTES
from .errors import ErrorInfo, error_info
from .groupcommit import Alone, CommitGroups, Group
from .lane import Lanes
from .pool import HandlePool

# Pauses of a request between tries for a lock another process holds: short at first,
# since a write holds it for well under a millisecond, and at most 10 ms.
_FIRST_PAUSE_S = 0.5e-3
_MOST_PAUSE_S = 10e-3

T = TypeVar("T")

# Parameter types; at module level so FastAPI can resolve them (annotations are strings here).
User = Annotated[str, Query(description="user_id of the memory space.")]
Agent = Annotated[str, Query(description="agent_id of the memory space.")]
Run = Annotated[str, Query(description="run_id of the memory space.")]
VerifiedSize = Annotated[
    int | None,
    Query(
        ge=0,
        le=2**62,
        description="Verify the log as its stored checkpoint of this tree size left it."
        " Without it, the server signs what it appended itself and verifies the log as it is then.",
    ),
]
Idempotency = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="The erasure's request id: repeating it returns the first result. Without it a new id is made.",
    ),
]
Confirm = Annotated[str | None, Query(description="The token a dry run issued (agents must present one).")]
Requester = Annotated[
    str | None,
    Query(description="On whose behalf the caller erases; recorded as '<requester> (via <caller>)'."),
]
Basis = Annotated[str, Query(description="Legal basis of the erasure, stated in its certificate.")]
RequireConfirmation = Annotated[
    bool, Query(description="Refuse the erasure without a dry run's token, whoever the caller is.")
]
Limit = Annotated[int, Query(ge=1, le=1000)]
RecallLimit = Annotated[int, Query(ge=1, le=MAX_RECALL)]


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="A stable code, e.g. `not_found`, `invalid_input`, `invalid_request`.")
    message: str = Field(description="The library's message; it never quotes record text.")
    missing: str | None = Field(default=None, description="For a 403: the capability, or `scope`, the key lacks.")
    request_id: str | None = Field(
        default=None,
        description="The call's request id (its audit entry's); for an erasure, the request it recorded as failed,"
        " which a retry under the same id (Idempotency-Key) completes.",
    )


class ErrorBody(BaseModel):
    """What every refusal and failure answers (``ErrorInfo.to_json``)."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorDetail


_WHY = {
    401: "No API key, or one that is not valid (`unauthenticated`), whatever else the request gets wrong.",
    403: "The key's principal lacks a capability or a scope (`access_denied`; `missing` names it).",
    404: "Unknown record, key, request, decision, restriction or checkpoint (`not_found`).",
    409: "The store's state refuses it (`subject_restricted`, `ambiguous_subject`, `request_id_reused`, `log_error`).",
    410: "The subject's data key was destroyed meanwhile (`data_key_destroyed`).",
    413: "The body is over the server's limit (`body_too_large`).",
    422: "Bad input: refused by the library (`invalid_input`, ...) or a malformed request (`invalid_request`):"
    " a field or query parameter the route does not take, a path or query value not UTF-8 once percent-decoded.",
    428: "This caller must confirm the erasure with a dry run's token (`confirmation_required`).",
    500: "An internal failure (`integrity_error`, `key_store_error`, `internal`).",
    503: "The store, its keys or the server cannot take the call now (`store_unavailable`, `key_store_busy`, `busy`).",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The documented error answers: every one is an :class:`ErrorBody`."""
    return {status: {"model": ErrorBody, "description": _WHY[status]} for status in statuses}


# What a route can answer besides success, by what it does; every route may also
# answer 401, 403, 422 (if only for a query parameter it does not take), 500 and 503
# (given to the app as a whole).
_READ = _errors(410)
_LOOKUP = _errors(404, 410)
_WRITE = _errors(404, 409, 410, 413)
_CHECK = _errors(413)
_ERASE = _errors(409, 413, 428)


class _Rest(PathConvertor):
    """The rest of the path, line breaks included (Starlette's ``path`` stops at one):
    a subject or user id that the library refuses is refused by the library (422), and
    does not miss its route (404)."""

    regex = "(?s:.*)"


register_url_convertor("rest", _Rest())


#: The caller's API key, set per request before its route runs in a worker thread
#: (which runs in a copy of the request's context).
_API_KEY: ContextVar[str] = ContextVar("deleatur_api_key")
_BEARER = HTTPBearer(auto_error=False, description="An API key from `deleatur principals create`.")


async def _authenticated(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
    """Every /v1 route needs a bearer key; whose it is is checked with the call."""
    if credentials is None:
        raise AuthenticationError("this API needs an API key: send 'Authorization: Bearer <key>'")
    _API_KEY.set(credentials.credentials)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    #: The member that holds a signed document to verify, if the body has one: read as the
    #: text it has in the body (see _Request).
    document: ClassVar[str | None] = None


class SpaceBody(_Body):
    user_id: str = "default"
    agent_id: str = ""
    run_id: str = ""

    def space(self) -> Space:
        return Space(self.user_id, self.agent_id, self.run_id)


class RememberBody(SpaceBody):
    text: str
    subject: str
    key: str | None = None
    metadata: dict[str, Any] | None = None
    source: str | None = None
    confidence: float | None = None
    derived_from: list[str] = Field(default_factory=list)
    expires_at: int | str | None = Field(
        default=None,
        description="Microseconds since the epoch, an ISO 8601 time (UTC if no offset), or a delay like 30d.",
    )
    for_legal_claim: bool = False


class SearchBody(SpaceBody):
    q: str = Field(description="Words to search for (BM25); a query too long for a URL fits here.")
    limit: int = Field(default=10, ge=1, le=MAX_RECALL)


class ForgetBody(SpaceBody):
    id: str | None = None
    key: str | None = None


class RectifyBody(SpaceBody):
    key: str
    text: str
    reason: str
    actor: str | None = Field(
        default=None, description="On whose behalf the caller corrects it; recorded as '<actor> (via <caller>)'."
    )
    erase_previous: bool = False
    for_legal_claim: bool = False


class ErasurePlanBody(_Body):
    subject: str | None = Field(default=None, description="Omit, with user_id set, for an account erasure plan.")
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    issue_token: bool = False
    # The token confirms these as well as the plan: the erasure must give the same.
    basis: str = Field(default=DEFAULT_BASIS, description="The legal basis the erasure will state.")
    requester: str | None = Field(default=None, description="On whose behalf the erasure will be made.")


class PurgeBody(_Body):
    older_than_days: float | None = None
    request_id: str | None = None
    dry_run: bool = False
    issue_token: bool = False
    confirmation: str | None = Field(default=None, description="The token a dry run issued (agents must present one).")


class DecisionBody(SpaceBody):
    summary: str = Field(description="What was decided; describe the decision, do not name people in it.")
    used: list[str] = Field(description="Ids of the records (beliefs) the decision used.")
    for_legal_claim: bool = False


class RestrictBody(_Body):
    subject: str
    reason: str
    actor: str | None = Field(
        default=None, description="On whose behalf the caller restricts; recorded as '<actor> (via <caller>)'."
    )


class VerifyReceiptBody(_Body):
    document: ClassVar[str | None] = "receipt"

    receipt: dict[str, Any] | str = Field(
        description="The receipt: its JSON object, read as the exact text it has in this body, or that text"
        " as a string. Either way, one that repeats a key in an object, or has a member besides its four,"
        " is refused (422 `invalid_signed_note`), as `deleatur verify-receipt` refuses it."
    )
    key: str | None = Field(default=None, description="The log's verifier key, obtained out of band.")


class VerifyCertificateBody(_Body):
    document: ClassVar[str | None] = "certificate"

    certificate: dict[str, Any] | str = Field(
        description="The certificate: its JSON object, verified as the exact text it has in this body, or"
        " that text as a string (as issued, or kept in a file). Either way, a key repeated in one of its"
        " objects, or a member beside `certificate` and `signature`, fails check 1, as `deleatur verify`"
        " reports it; a string that is not JSON is refused (422 `invalid_input`)."
    )
    expected_pubkey: str | None = None


class _Request(Request):
    """A request whose JSON body may not repeat a key in any object: parsed by the
    library's rule, since Starlette's json.loads keeps the last value silently. But for
    a signed document sent to be verified (``document``, the member named by the route's
    body model): the library reads it, as its text, and it is the verifier's to fail."""

    document: str | None = None

    async def json(self) -> Any:
        try:
            if self.document is not None:
                return loads_envelope(await self.body(), "the request body", self.document)
            return loads_unique(await self.body(), "the request body")
        except InvalidInputError as exc:
            # FastAPI reads the body inside a handler that lets only HTTPException through.
            raise StarletteHTTPException(422, exc.message) from None


@dataclass(frozen=True)
class _Refused:
    """A try of a call that found a lock held, and changed nothing (sqlitefile.first_try)."""

    error: StoreBusyError
    patient: bool  # it must be made where it may wait long, not tried again later


def _first_try(work: Callable[[], T]) -> T | _Refused:
    """What ``work`` returns, made under :func:`sqlitefile.first_try`; or, if it found a
    lock held elsewhere and changed nothing, that refusal, to make it again later."""
    with first_try() as attempt:
        try:
            return work()
        except StoreBusyError as exc:
            if not attempt.to_try_again:
                raise
            return _Refused(exc, attempt.patient)


def _pauses() -> Iterator[float]:
    """The pauses before each new try of a refused call: doubling, up to the most."""
    pause = _FIRST_PAUSE_S
    while True:
        yield pause
        pause = min(pause * 2, _MOST_PAUSE_S)


def _query_names(dependant: Dependant) -> Iterator[str]:
    """The query parameters a route takes: its own and its dependencies'."""
    yield from (field.alias for field in dependant.query_params)
    for sub in dependant.dependencies:
        yield from _query_names(sub)


def _utf8(encoded: bytes) -> str | None:
    """The text of ``encoded``, or None if it is not UTF-8 (a surrogate encoded in UTF-8
    included: Python's decoder refuses it)."""
    try:
        return encoded.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _url_errors(scope: Scope, known: frozenset[str]) -> list[dict[str, Any]]:
    """What a route would misread in the request's URL, as validation errors: a path or
    a query parameter whose percent-decoding is not UTF-8 (the server decodes it with
    U+FFFD in place of the bad bytes, so an erasure would name another subject), and a
    query parameter the route does not take (ignored, a misspelt ``user_id`` would erase
    in every user, an unsupported ``dry_run`` would erase for real), or one given twice
    (the last would win, as a repeated key of a JSON body, which is refused too: no
    route takes a list in its query)."""
    not_utf8 = "not valid UTF-8 once percent-decoded"
    errors: list[dict[str, Any]] = []
    raw_path = scope.get("raw_path")  # optional in ASGI; uvicorn always gives it
    if raw_path is not None and _utf8(unquote_to_bytes(raw_path)) is None:
        errors.append({"type": "utf8", "loc": ("path",), "msg": not_utf8})
    unknown: dict[str, None] = {}  # each named once, in the order given
    seen: dict[str, int] = {}
    # Split as Starlette splits it, but decoded as Latin-1, which keeps every byte.
    for raw_name, raw_value in parse_qsl(
        scope["query_string"].decode("latin-1"), keep_blank_values=True, encoding="latin-1"
    ):
        name = _utf8(raw_name.encode("latin-1"))
        if name is None:
            errors.append({"type": "utf8", "loc": ("query",), "msg": f"a parameter name is {not_utf8}"})
            continue
        if _utf8(raw_value.encode("latin-1")) is None:
            errors.append({"type": "utf8", "loc": ("query", name), "msg": not_utf8})
        if name not in known:
            unknown[name] = None
        seen[name] = seen.get(name, 0) + 1
    errors += [
        {"type": "extra_forbidden", "loc": ("query", name), "msg": "Extra inputs are not permitted"} for name in unknown
    ]
    errors += [
        {"type": "repeated", "loc": ("query", name), "msg": f"given {times} times: give it once"}
        for name, times in seen.items()
        if times > 1 and name in known
    ]
    return errors


class _Route(APIRoute):
    """Every route refuses a URL it would misread (:func:`_url_errors`) before it runs,
    and reads its body as a :class:`_Request`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        known = frozenset(_query_names(self.dependant))
        # The body model of a verify route names the member its signed document is in.
        bodies = [field.field_info.annotation for field in self.dependant.body_params]
        document = next((b.document for b in bodies if isinstance(b, type) and issubclass(b, _Body)), None)

        async def strict(request: Request) -> Response:
            errors = _url_errors(request.scope, known)
            if errors:
                raise RequestValidationError(errors)
            read = _Request(request.scope, request.receive)
            read.document = document
            return await handle(read)

        return strict


class BodyLimit:
    """413 for a body over ``limit`` bytes, by its Content-Length or, for a chunked
    body, as soon as the bytes read pass it: the 413 is sent at once, the app is told
    the client left, and whatever it answers then is dropped."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(send)
            return
        seen = 0
        started = refused = False

        async def counted() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit and not started:
                refused = True
                await self._refuse(send)
                return {"type": "http.disconnect"}
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, tracked)

    async def _refuse(self, send: Send) -> None:
        info = ErrorInfo(413, "body_too_large", f"request body over {self.limit} bytes")
        await JSONResponse(info.to_json(), status_code=413)({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def _failed(exc: Exception) -> JSONResponse:
    """The answer to a call that raised ``exc`` (the lanes' and the app's handlers')."""
    return _error(error_info(exc))


def _error(info: ErrorInfo) -> JSONResponse:
    return JSONResponse(info.to_json(), status_code=info.status, headers=CHALLENGE if info.status == 401 else None)


def _erasure_accepted(result: ErasureResult) -> JSONResponse:
    """202 with where to follow the request; a repeated request id answers the same.
    ``request`` is the whole request; the members beside it came first, and stay."""
    request = result.request
    assert request is not None
    status_url = f"/v1/erasures/{request.id}"
    body: dict[str, Any] = {
        "request_id": request.id,
        "status": request.status.value,
        "requested_at": isoformat(request.received_at),
        "completed_at": None if request.completed_at is None else isoformat(request.completed_at),
        "counts": request.counts,
        "status_url": status_url,
        # A request that found nothing has one too: it says that nothing was held.
        "certificate_url": f"/v1/erasures/{request.id}/certificate",
        **result.to_json(system_clock()),
    }
    return JSONResponse(body, status_code=202, headers={"Location": status_url})


class _LongReads:
    """The reads the server makes on handles of its own that last as long as a large log
    makes them (a whole-log verification), each keeping the -wal from being truncated
    meanwhile. Called, it says whether one is live, in this
    process or, marked beside the store (sqlitefile.long_read), in another (a worker of
    ``--workers N``, another server): while one is, a request's scrub waits for no
    reader (sqlitefile.scrubs_unwaited_during), and as each ends its handle truncates
    the -wal if a scrub made meanwhile could not."""

    def __init__(self) -> None:
        self._live = 0
        self._lock = threading.Lock()
        self._store: Path | None = None

    def __call__(self) -> bool:
        return self._live > 0 or (self._store is not None and sqlitefile.long_read_marked(self._store))

    def serving(self, memory: Memory) -> AbstractContextManager[None]:
        """Around a request's call on ``memory``: its scrubs wait for no long read."""
        self._store = memory.backend.files()[0]
        return scrubs_unwaited_during(self)

    @contextmanager
    def of(self, memory: Memory) -> Iterator[None]:
        """Counts the block as a long read on ``memory``, whose reads must all have ended
        as the block does: the scrub is made on its connection."""
        with self._lock:
            self._live += 1
        try:
            with sqlitefile.long_read(memory.backend.files()[0]):
                yield
        finally:
            with self._lock:
                self._live -= 1
            # Waits for readers only once no other long read is live: the last to end does.
            # A lock held past the busy timeout leaves the store marked for the next
            # removal or open to truncate, rather than cut short a finished export.
            with scrubs_unwaited_during(self), contextlib.suppress(StoreBusyError):
                memory.finish_scrub()


_EXPORT_CHUNK = 64 * 1024
_DONE = object()


class _Cancelled(Exception):
    """The client went away: the export stops instead of waiting on a full queue."""


class _ChunkWriter:
    """What the library's export writes to, from its own thread: text gathered into
    chunks and queued for the event loop, which sends them as the response body."""

    def __init__(self, chunks: queue.Queue[object], stop: threading.Event) -> None:
        self._chunks = chunks
        self._stop = stop
        self._parts: list[str] = []
        self._size = 0

    def write(self, text: str) -> int:
        self._parts.append(text)
        self._size += len(text)
        if self._size >= _EXPORT_CHUNK:
            self.flush()
        return len(text)

    def flush(self) -> None:
        if self._parts:
            chunk, self._parts, self._size = "".join(self._parts), [], 0
            self.put(chunk)

    def put(self, item: object) -> None:
        while True:  # a bounded queue: the export runs no further ahead than the client reads
            try:
                self._chunks.put(item, timeout=0.5)
                return
            except queue.Full:
                if self._stop.is_set():
                    raise _Cancelled from None


async def _stream_export(
    exports: Exports,
    open_memory: Callable[[], Memory],
    api_key: str,
    subject: str | None,
    user_id: str | None,
) -> AsyncIterator[str]:
    """Run the export in a thread on a handle of its own, so the pool's handle stays
    free for other requests meanwhile. Returns the body's chunks once the first exists,
    or raises what the export raised before writing anything. A failure after that
    aborts the response (no final chunk), so a client cannot take a cut export for a
    whole one. The caller has counted the export in ``exports``.

    The export reads the store a page at a time, no read open while it waits for its
    client: a removal meanwhile truncates the -wal at once, and what it removed is not
    exported after it (see Memory.export_json)."""
    chunks: queue.Queue[object] = queue.Queue(maxsize=4)
    stop = threading.Event()
    writer = _ChunkWriter(chunks, stop)

    def run() -> None:
        try:
            # The library's export ends its reads as it returns or raises.
            with open_memory() as memory:
                as_caller(memory, api_key).export_json(writer, subject=subject, user_id=user_id)
                writer.flush()
            writer.put(_DONE)
        except _Cancelled:
            return
        except BaseException as exc:
            try:
                writer.put(exc)
            except _Cancelled:
                return
        finally:
            exports.end()

    threading.Thread(target=run, name="deleatur-export", daemon=True).start()
    first = await anyio.to_thread.run_sync(chunks.get)
    if isinstance(first, BaseException):
        raise first

    async def body() -> AsyncIterator[str]:
        item = first
        try:
            while isinstance(item, str):
                yield item
                item = await anyio.to_thread.run_sync(chunks.get)
            if isinstance(item, BaseException):
                raise item
        finally:
            stop.set()

    return body()


@contextlib.asynccontextmanager
async def _shut_down_after(executor: ThreadPoolExecutor) -> AsyncIterator[None]:
    try:
        yield
    finally:
        executor.shutdown(wait=False)  # its thread ends once its last work has


class API(FastAPI):
    """The API, with the lanes of recall and remember (:mod:`.lane`) in front of it."""

    lanes: Lanes | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.lanes is None:
            await super().__call__(scope, receive, send)
        else:
            await self.lanes(scope, receive, send, super().__call__)


def create_app(
    open_memory: Callable[[], Memory],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    handles: int = DEFAULT_HANDLES,
    max_page_bytes: int = MAX_PAGE_BYTES,
    sign_every_write: bool = False,
) -> API:
    """The API over the store ``open_memory`` opens, at most ``handles`` times: no more
    library calls run at once than there are handles (the others wait in the event
    loop, not in threads). Each runs in a worker thread on a leased handle, except
    that with one handle (the default) the memory routes run in the event loop itself
    (see ``serve``). A page of ``GET /v1/memories`` or ``/v1/history`` holds at most
    ``max_page_bytes`` (``calls.list_page``).

    ``sign_every_write``, for a store other server processes serve too (``--workers
    N``): each handle signs every write in its own transaction. A verification signs
    what its own handles appended, and entries a live process left for its next
    checkpoint would fail its coverage check, as a crashed writer's tail rightly does."""

    def opened() -> Memory:
        memory = open_memory()
        try:
            memory.upkeep_in_background()
        except BaseException:
            memory.close()
            raise
        if sign_every_write:
            memory.checkpoint_interval_us = 0
        return memory

    pool = HandlePool(opened, limit=handles)
    exports = Exports(MAX_EXPORTS)
    workers = anyio.CapacityLimiter(handles)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        for task in tail:  # the handle's close() signs what it would have
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        pool.close()

    app = API(
        title="deleatur",
        version=__version__,
        description="Agent memory with every GDPR data-subject right built in.",
        lifespan=lifespan,
        dependencies=[Depends(_authenticated)],
        responses=_errors(401, 403, 422, 500, 503),
        # A path with a trailing slash is no route: redirected, it was answered 307 with
        # no body, before any key was asked for.
        redirect_slashes=False,
    )
    app.router.route_class = _Route
    app.state.pool = pool
    # The lanes (.lane) stand in front of every middleware: one added here would not see
    # recall and remember (tests/test_lane.py says which there are).
    app.add_middleware(BodyLimit, limit=max_body_bytes)

    @app.exception_handler(DeleaturError)
    async def _deleatur_error(_: Request, exc: DeleaturError) -> JSONResponse:
        return _failed(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        refused = await unproved(request)
        if refused is not None:
            return refused
        # Field locations and reasons only: pydantic's "input" echoes the caller's data.
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return _error(ErrorInfo(422, "invalid_request", where))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code in (400, 422):  # a body the route would misread
            refused = await unproved(request)
            if refused is not None:
                return refused
        if exc.status_code == 400:
            # FastAPI's answer to a body that is not UTF-8 or too deeply nested to parse:
            # a malformed request like any other.
            why = "the body could not be parsed as JSON: it is not UTF-8, or nested too deeply"
            return _error(ErrorInfo(422, "invalid_request", why))
        code = {404: "no_such_route", 405: "method_not_allowed", 422: "invalid_request"}.get(
            exc.status_code, "http_error"
        )
        return _error(ErrorInfo(exc.status_code, code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return _failed(exc)

    # With one handle, whoever uses it, a call in the loop or one in a thread, holds
    # `turn`, taken in the loop in arrival order (asyncio's lock: free, it costs no
    # await). So a call sent to a thread holds up the calls behind it only while it
    # runs, and they go back to the loop after it: they never queue on the thread pool,
    # where under steady load the queue never empties.
    turn = asyncio.Lock()
    retrying = asyncio.Lock()  # held by the refused request now trying again
    # A scrub would wait for a verification's read for as long as it lasts, holding the
    # handle, and with one handle `turn` too: none does meanwhile.
    long_reads = _LongReads()

    async def serve(
        call: Callable[[Memory], T], *, inline: bool = False, reads: bool = False, writes: bool = False
    ) -> T:
        """Run one library call on a leased handle, as the principal of the request's API
        key (see ``on_store``).

        With one handle, calls are group-committed (``groupcommit``): ``reads``, a call
        that reads records and writes nothing but its audit entry, puts that entry in the
        open group of reads; ``writes``, a call that writes a record in one transaction
        and removes nothing, waits in the queue of writes, which are made together in one
        transaction. Either is answered once what it wrote is committed: one transaction
        for many calls rather than one each. (Not for a read of the log: the library's
        trail shows the reading call's own entry, which a group writes after it.) Any
        other call writes the open group of reads first; a queued write has not run yet,
        and runs when its queue is flushed."""
        api_key = _API_KEY.get()
        joined: set[Group] = set()

        def work(memory: Memory) -> T:
            if groups is not None and reads:
                with groups.collecting(memory, joined):
                    return call(as_caller(memory, api_key))
            return call(as_caller(memory, api_key))

        if groups is not None and writes:
            made = await groups.write(lambda memory: call(as_caller(memory, api_key)))
            if not isinstance(made, Alone):
                return made
            # Refused in its group by a lock held elsewhere, having changed nothing: it is
            # made on its own, as any call.
        try:
            return await on_store(work, inline=inline, grouped=reads, reads=reads)
        finally:
            if groups is not None and joined:
                await groups.written(joined)

    async def on_store(work: Callable[[Memory], T], *, inline: bool, grouped: bool = False, reads: bool = False) -> T:
        """Run ``work`` on a leased handle: in a worker thread, or, for an ``inline`` call
        (one that takes no lock but the write lock, and reads or writes a record or two),
        in the event loop itself when there is one handle, which spares the thread's cost
        (a fifth of the throughput, BENCHMARKS.md). Unless ``grouped`` (``work`` joins the
        open group of reads, or writes it), the open group is written first, so the log
        lists calls in the order they ran. ``reads``: ``work`` writes nothing itself (its
        entry goes to a group), so it need not queue behind a refused writer.

        No call holds the handle while another process holds a lock it needs: a try
        waits for a lock at most ``FIRST_TRY_WAIT_MS`` (sqlitefile.first_try), then gives
        the handle back having changed nothing, and the request tries again after a
        pause, until ``BUSY_TIMEOUT_MS`` after it began (then 503 store_busy). Meanwhile
        the handle serves the other requests, those that need no lock included. Work that
        may wait long for other connections (finishing a dead erasure's key destruction)
        is done in a thread that waits as long as it must."""
        give_up = time.monotonic() + sqlitefile.BUSY_TIMEOUT_MS / 1000
        loop = asyncio.get_running_loop()

        def run() -> T:
            with pool.lease() as memory, long_reads.serving(memory):
                if groups is not None and not grouped:
                    # If a lock held elsewhere refuses this, the try changed nothing, and
                    # is made again later.
                    groups.write_open(memory)
                try:
                    return work(memory)
                finally:
                    if memory.unsigned and handles == 1:
                        loop.call_soon_threadsafe(sign_tail_later, memory.checkpoint_interval_us / 1e6)

        def tried() -> T | _Refused:
            return _first_try(run)

        async def on_handle(work: Callable[[], T | _Refused], *, in_loop: bool) -> T | _Refused:
            if handles != 1:
                return await anyio.to_thread.run_sync(work, limiter=workers)
            async with turn:
                # An export thread's reads, brief as they are, would have a call's WAL
                # checkpoint wait in the loop, which must keep draining the export. Nor before
                # the handle is open: opening finishes what a crash left (keys to
                # destroy, a -wal to truncate), which may wait for other connections.
                if in_loop and not exports.live and pool.idle:
                    return work()
                return await anyio.to_thread.run_sync(work)

        if inline and retrying.locked() and not (reads and groups is not None):
            # A refused request is waiting for a lock held elsewhere: a try in the loop
            # would stall it up to FIRST_TRY_WAIT_MS for every request arriving, so this
            # one queues behind that one instead, and tries when its turn comes. A read
            # whose entry goes to a group takes no lock: it goes ahead.
            result: T | _Refused = _Refused(
                StoreBusyError("another process holds the store's write lock; nothing was changed: try again"),
                patient=False,
            )
        else:
            result = await on_handle(tried, in_loop=inline)
        if isinstance(result, _Refused) and not result.patient:
            # One refused request at a time tries again, so that however many wait, the
            # loop spends at most one try's wait per pause on them; one that waited for
            # its turn tries at once (the one before it may just have gone through).
            # Never cancelled while a try runs: a try that went through must be answered.
            waited = retrying.locked()
            acquired = False
            with anyio.move_on_after(max(give_up - time.monotonic(), 0)):
                await retrying.acquire()
                acquired = True
            if acquired:
                try:
                    pauses = _pauses()
                    while isinstance(result, _Refused) and not result.patient and time.monotonic() < give_up:
                        if not waited:
                            await anyio.sleep(next(pauses))
                        waited = False
                        result = await on_handle(tried, in_loop=inline)
                finally:
                    retrying.release()
        if not isinstance(result, _Refused):
            return result
        if not result.patient:
            raise result.error  # the lock stayed held past the busy timeout
        done = await on_handle(run, in_loop=False)
        assert not isinstance(done, _Refused)
        return done

    # Made after serve and on_store, which use it (as closures do, once called).
    groups = CommitGroups(lambda commit: on_store(commit, inline=True, grouped=True)) if handles == 1 else None
    tail: list[asyncio.Task[None]] = []  # the signing of the handle's tail, while one is due

    def sign_tail_later(delay: float) -> None:
        """Once a call has left entries unsigned on the (one) handle: sign them when its
        checkpoint interval has passed, unless a write has by then. So a server that goes
        idle leaves no tail for `log verify` to find uncovered (which the handle's next
        write, or its close, would otherwise sign, however long that takes)."""
        if not tail:
            tail.append(asyncio.ensure_future(sign_tail(delay)))

    async def sign_tail(delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            # The operator's own handle: sign_pending is not audited, and signs only if
            # the handle still has entries no checkpoint covers.
            await on_store(lambda memory: memory.sign_pending(), inline=True)
        except DeleaturError:
            pass  # a lock held past the busy timeout: the next call schedules it again
        finally:
            tail.clear()

    async def unproved(request: Request) -> JSONResponse | None:
        """The answer to a request refused before its call (a URL or a body it would
        misread) if its API key is missing or not valid, else None: only a caller with
        a valid key learns what is wrong, which names the route's parameters and fields.
        The key is checked alone, as the call would have checked it, so a refused one is
        audited once, and nothing that the request says reaches any other library call."""
        try:
            await _authenticated(await _BEARER(request))
            api_key = _API_KEY.get()
            await on_store(lambda m: m.authenticate(api_key), inline=True)
        except DeleaturError as exc:
            return _error(error_info(exc))
        return None

    verifying = asyncio.Lock()  # one whole-log verification at a time

    async def verified(verify: Callable[[Memory, int | None], Report], size: int | None) -> dict[str, object]:
        """A whole-log verification, seconds of reading on a large log: on a handle of
        its own in a thread, one at a time, so the shared handle serves every other
        request meanwhile (a verification on it held up every tenant's calls).

        Without ``size``, each of the pool's handles first signs the entries it appended
        itself (``Memory.sign_pending``: a tail another connection left after them is
        covered with them, a checkpoint covering a prefix), and the verification reads
        the log as it was at that moment: its read snapshot begins before any of them
        appends anything more (the pool lends none meanwhile), so every entry it sees
        that no checkpoint covers fails the coverage check, as on the shared handle
        before. While another process holds the write lock that
        signing needs, the handles are not held: they serve other requests, and the
        signing is tried again, as a call is (``on_store``).

        While the snapshot is open, no scrub waits for it (``long_reads``): an erasure
        made meanwhile answers at once, its request saying the -wal was not truncated,
        and the verification truncates the -wal once its snapshot has ended."""
        api_key = _API_KEY.get()

        def opened() -> tuple[Memory, Memory, ExitStack]:
            stack = ExitStack()
            memory = stack.enter_context(open_memory())
            try:
                view = as_caller(memory, api_key)
            except BaseException:
                stack.close()
                raise
            return memory, view, stack

        def sign(shared: Memory) -> None:
            as_caller(shared, api_key).sign_pending()

        def signed_then_begun(memory: Memory, stack: ExitStack, patient: bool) -> _Refused | None:
            # Every handle held until the snapshot has begun: none appends between its
            # signing and then, so every entry the snapshot holds is signed or foreign (a
            # handle not signed, or leased again once signed, left entries that were not).
            # But not while a lock held elsewhere is waited for: that would keep every
            # request waiting too. A signing that finds one gives up at once, having
            # changed nothing, and all are given back; the next try signs on every handle
            # again, what they appended meanwhile included. Each signing is a try of its
            # own: one handle's commit does not make the next one wait.
            with pool.lease_all() as leased:
                for shared in leased:
                    if patient:
                        sign(shared)
                    elif (refused := _first_try(partial(sign, shared))) is not None:
                        return refused
                # Closed in reverse: the snapshot ends, then the long read, whose handle
                # truncates the -wal if a removal made meanwhile could not.
                stack.enter_context(long_reads.of(memory))
                stack.enter_context(memory.read_snapshot())
            return None

        # Every step on the verification's own handle runs in this one thread: its read
        # snapshot holds the handle's turn (Memory), which is a thread's.
        pinned = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deleatur-verify")

        async def in_pinned(work: Callable[[], T]) -> T:
            return await asyncio.get_running_loop().run_in_executor(pinned, work)

        async def begun(memory: Memory, stack: ExitStack, patient: bool) -> _Refused | None:
            # `turn`, so that with one handle no call in the loop waits for it there; with
            # several nothing else takes `turn`: it costs nothing then.
            async with turn:
                return await in_pinned(partial(signed_then_begun, memory, stack, patient))

        async with verifying, _shut_down_after(pinned):
            # Opened first, without `turn`: opening may finish a crash's work and wait.
            memory, view, stack = await in_pinned(opened)
            try:
                if Capability.VERIFY not in view.principal.capabilities:
                    # Refused, and audited, by the verification's own guard, which names
                    # it, before anything is signed or read for it (signing would refuse
                    # it too, naming log.sign, which the caller never asked for).
                    await in_pinned(partial(verify, view, size))
                # With a size too: signing is the guarded call that refuses (and audits) a
                # caller that may not verify before a snapshot is opened for it. Refused
                # tries are made again after a pause, as on_store makes them, until the
                # busy timeout (then 503 store_busy); one refused before work that may wait
                # long (see sqlitefile.Attempt.patient) is made again waiting as it must.
                give_up = time.monotonic() + sqlitefile.BUSY_TIMEOUT_MS / 1000
                pauses, patient = _pauses(), False
                while (refused := await begun(memory, stack, patient)) is not None:
                    if not refused.patient and time.monotonic() >= give_up:
                        raise refused.error  # the lock stayed held past the busy timeout
                    patient = refused.patient
                    if not patient:
                        await anyio.sleep(next(pauses))
                report = await in_pinned(partial(verify, view, size))
            finally:
                # In a thread (closing signs a checkpoint and truncates the -wal, which may
                # wait), and even if the request is cancelled: an open snapshot keeps the
                # -wal, erased data included, from being truncated.
                with anyio.CancelScope(shield=True):
                    await in_pinned(stack.close)
            return report.to_json()

    # -- memories --------------------------------------------------------------------

    @app.post("/v1/memories", status_code=201, tags=["memories"], responses=_WRITE)
    async def remember(body: RememberBody) -> dict[str, Any]:
        """Write one memory; a new value for an existing key supersedes the old one."""
        # Grouped: a supersession retires the old value, and removes nothing.
        return await serve(
            lambda m: m.remember(
                body.text,
                subject=body.subject,
                space=body.space(),
                key=body.key,
                metadata=body.metadata,
                source=body.source,
                confidence=body.confidence,
                derived_from=body.derived_from,
                expires_at=body.expires_at,
                for_legal_claim=body.for_legal_claim,
            ).to_json(),
            inline=True,
            writes=True,
        )

    async def search(q: str, space: Callable[[], Space], limit: int) -> dict[str, Any]:
        # The space is made inside the call, as every route's arguments are checked: a bad
        # key is refused (401, audited) before a bad space is (422).
        return {"hits": await serve(lambda m: m.recall_json(q, space=space(), limit=limit), inline=True, reads=True)}

    @app.get("/v1/memories/search", tags=["memories"], responses=_READ)
    async def recall(
        q: Annotated[str, Query(description="Words to search for (BM25).")],
        limit: RecallLimit = 10,
        user_id: User = "default",
        agent_id: Agent = "",
        run_id: Run = "",
    ) -> dict[str, Any]:
        """Full-text search over the active memories of one space, best first."""
        return await search(q, lambda: Space(user_id, agent_id, run_id), limit)

    app.lanes = Lanes(
        search,
        remember,
        RememberBody,
        authenticated=_API_KEY.set,
        url_errors=_url_errors,
        error=_failed,
        most=max_body_bytes,
    )

    @app.post("/v1/memories/search", tags=["memories"], responses=_errors(410, 413))
    async def recall_posted(body: SearchBody) -> dict[str, Any]:
        """The same search, its query in the body: the library takes a query of any
        length (it uses its first words), and a URL cannot carry one over 64 KiB. It also
        keeps the query out of URLs, which proxies and access logs record."""
        return await search(body.q, body.space, body.limit)

    @app.get("/v1/memories/{record_id}", tags=["memories"], responses=_LOOKUP)
    async def get(record_id: str, user_id: User = "default", agent_id: Agent = "", run_id: Run = "") -> dict[str, Any]:
        return await serve(
            lambda m: m.get(record_id, space=Space(user_id, agent_id, run_id)).to_json(), inline=True, reads=True
        )

    @app.get("/v1/memories", tags=["memories"], responses=_READ)
    async def list_(
        subject: str | None = None,
        key: str | None = None,
        history: Annotated[bool, Query(description="Include retired and superseded records.")] = False,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1000,
        after: Annotated[str | None, Query(description="The previous page's `next`.")] = None,
        user_id: User = "default",
        agent_id: Agent = "",
        run_id: Run = "",
    ) -> dict[str, Any]:
        """Records of one space, oldest first (active ones unless ``history``), a page at a
        time: ``next`` is the cursor of the following page, null after the last. A page
        holds at most ``limit`` records and about 4 MiB of them (one larger record comes
        alone): a page may hold fewer than ``limit`` and still have a ``next``."""
        records, cursor = await serve(
            lambda m: list_page(
                m,
                space=Space(user_id, agent_id, run_id),
                subject=subject,
                key=key,
                include_history=history,
                limit=limit,
                after=after,
                max_bytes=max_page_bytes,
            ),
            inline=True,
            reads=True,
        )
        return {"records": [r.to_json() for r in records], "next": cursor}

    @app.get("/v1/history", tags=["memories"], responses=_LOOKUP)
    async def history(
        key: str,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1000,
        after: Annotated[str | None, Query(description="The previous page's `next`.")] = None,
        user_id: User = "default",
        agent_id: Agent = "",
        run_id: Run = "",
    ) -> dict[str, Any]:
        """Every version of a key, oldest first, a page at a time as ``GET /v1/memories``
        pages (``next``, at most ``limit`` records and about 4 MiB of them)."""
        records, cursor = await serve(
            lambda m: history_page(
                m, key=key, space=Space(user_id, agent_id, run_id), limit=limit, after=after, max_bytes=max_page_bytes
            ),
            inline=True,
            reads=True,
        )
        return {"records": [r.to_json() for r in records], "next": cursor}

    @app.post("/v1/forget", tags=["memories"], responses=_WRITE)
    async def forget(body: ForgetBody) -> dict[str, Any]:
        """Retire a memory (by id or key): no longer recalled, kept in history."""
        return await serve(lambda m: m.forget(space=body.space(), record_id=body.id, key=body.key).to_json())

    @app.post("/v1/rectify", tags=["memories"], responses=_WRITE)
    async def rectify(body: RectifyBody) -> dict[str, Any]:
        """Art. 16: supersede the value of a key with a corrected one."""
        return await serve(
            lambda m: m.rectify(
                body.key,
                body.text,
                reason=body.reason,
                actor=on_behalf(m, body.actor, "actor"),
                space=body.space(),
                erase_previous=body.erase_previous,
                for_legal_claim=body.for_legal_claim,
            ).to_json()
        )

    @app.get("/v1/memories/{record_id}/receipt", tags=["log"], responses=_errors(404, 409))
    async def receipt(
        record_id: str, user_id: User = "default", agent_id: Agent = "", run_id: Run = ""
    ) -> dict[str, Any]:
        """A signed write receipt, verifiable later with the public key alone."""
        return await serve(lambda m: m.receipt(record_id, space=Space(user_id, agent_id, run_id)).to_json())

    # -- erasure (Art. 17) -------------------------------------------------------------

    @app.delete("/v1/subjects/{subject:rest}", status_code=202, tags=["erasure"], responses=_ERASE)
    async def erase(
        subject: str,
        idempotency_key: Idempotency = None,
        basis: Basis = DEFAULT_BASIS,
        user_id: Annotated[str | None, Query(description="Only this user's spaces.")] = None,
        agent_id: Annotated[str | None, Query(description="Only this agent's spaces.")] = None,
        run_id: Annotated[str | None, Query(description="Only this run's spaces.")] = None,
        allow_ambiguous: bool = False,
        confirmation: Confirm = None,
        require_confirmation: RequireConfirmation = False,
        requester: Requester = None,
    ) -> JSONResponse:
        """Art. 17: erase every record of a subject (all spaces unless narrowed), with
        signed tombstones, and destroy its key. Answers 202 with the request to follow."""
        result = await serve(
            lambda m: m.erase(
                subject,
                request_id=new_request_id(idempotency_key, "HTTP"),
                basis=basis,
                requester=on_behalf(m, requester, "requester"),
                scope=SpaceFilter(user_id, agent_id, run_id),
                allow_ambiguous=allow_ambiguous,
                confirmation=confirmation,
                require_confirmation=require_confirmation,
            )
        )
        return _erasure_accepted(result)

    @app.delete("/v1/users/{user_id:rest}", status_code=202, tags=["erasure"], responses=_ERASE)
    async def erase_all(
        user_id: str,
        idempotency_key: Idempotency = None,
        basis: Basis = DEFAULT_BASIS,
        agent_id: Annotated[str | None, Query(description="Only this agent's space.")] = None,
        run_id: Annotated[str | None, Query(description="Only this run's space.")] = None,
        confirmation: Confirm = None,
        require_confirmation: RequireConfirmation = False,
        requester: Requester = None,
    ) -> JSONResponse:
        """Account deletion: every space of one user (or one, with agent/run), no other user's."""
        result = await serve(
            lambda m: m.erase_all(
                user_id=user_id,
                agent_id=agent_id,
                run_id=run_id,
                request_id=new_request_id(idempotency_key, "HTTP"),
                basis=basis,
                requester=on_behalf(m, requester, "requester"),
                confirmation=confirmation,
                require_confirmation=require_confirmation,
            )
        )
        return _erasure_accepted(result)

    @app.post("/v1/erasure-plans", tags=["erasure"], responses=_CHECK)
    async def erasure_plan(body: ErasurePlanBody) -> dict[str, Any]:
        """A dry run: what an erasure would remove (and, with ``issue_token``, its token)."""
        # A fresh id, as for an erasure without Idempotency-Key: a fixed one would name every
        # dry run's audit entry after the caller's own erasure of that id.
        request_id = new_request_id(None, "HTTP")
        if body.subject is None:
            result = await serve(
                lambda m: m.erase_all(
                    user_id=body.user_id or "",
                    agent_id=body.agent_id,
                    run_id=body.run_id,
                    request_id=request_id,
                    basis=body.basis,
                    requester=on_behalf(m, body.requester, "requester"),
                    dry_run=True,
                    issue_token=body.issue_token,
                )
            )
        else:
            subject = body.subject
            result = await serve(
                lambda m: m.erase(
                    subject,
                    request_id=request_id,
                    basis=body.basis,
                    requester=on_behalf(m, body.requester, "requester"),
                    scope=SpaceFilter(body.user_id, body.agent_id, body.run_id),
                    dry_run=True,
                    issue_token=body.issue_token,
                )
            )
        return result.to_json(system_clock())

    @app.get("/v1/erasures", tags=["erasure"])
    async def erasures(
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        after: Annotated[str | None, Query(description="The previous page's `next`.")] = None,
    ) -> dict[str, Any]:
        """The erasure requests in the order recorded, with their Art. 12(3) deadlines and
        whether they were met, a page at a time: ``next`` is the cursor of the following
        page, null after the last (a request can name many records)."""
        now = system_clock()
        found = await serve(lambda m: m.erasure_requests(limit=limit + 1, after=after))
        following = found[limit - 1].id if len(found) > limit else None
        return {"requests": [r.to_json(now) for r in found[:limit]], "next": following}

    @app.get("/v1/erasures/{request_id}", tags=["erasure"], responses=_errors(404))
    async def erasure_status(request_id: str) -> dict[str, Any]:
        """A request's status and phases, with timestamps."""
        found = await serve(lambda m: m.erasure_request(request_id))
        return {"request_id": found.id, **found.to_json(system_clock())}

    @app.get("/v1/erasures/{request_id}/certificate", tags=["erasure"], responses=_errors(404, 409))
    async def erasure_certificate(request_id: str) -> dict[str, Any]:
        """The signed erasure certificate, verifiable offline with the public key alone."""
        return await serve(lambda m: m.certificate(request_id))

    @app.post("/v1/certificates/verify", tags=["erasure"], responses=_CHECK)
    async def verify_certificate_route(body: VerifyCertificateBody) -> dict[str, Any]:
        """Verify a certificate offline (pin the key you got out of band with expected_pubkey):
        the report of `deleatur verify`, whose check 1 reads the certificate's text strictly."""

        return await serve(lambda _: check_certificate(body.certificate, body.expected_pubkey).to_json())

    @app.post(
        "/v1/purge",
        tags=["erasure"],
        responses={
            200: {
                "description": "A dry run's plan; or a purge that found nothing due, which records no request.",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            202: {
                "description": "The purge ran: its request, as an erasure's DELETE answers.",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            **_ERASE,
        },
    )
    async def purge(body: PurgeBody) -> Response:
        """Art. 5(1)(e): hard-delete expired records (and those older than older_than_days)."""
        result = await serve(
            lambda m: m.purge(
                older_than_days=body.older_than_days,
                request_id=body.request_id,
                dry_run=body.dry_run,
                issue_token=body.issue_token,
                confirmation=body.confirmation,
            )
        )
        return JSONResponse(result.to_json(system_clock())) if result.request is None else _erasure_accepted(result)

    # -- decisions -------------------------------------------------------------------------

    @app.post("/v1/decisions", status_code=201, tags=["decisions"], responses=_WRITE)
    async def record_decision(body: DecisionBody) -> dict[str, Any]:
        """Sign and keep a snapshot of exactly the beliefs a decision used."""
        return await serve(
            lambda m: m.record_decision(
                body.summary, body.used, space=body.space(), for_legal_claim=body.for_legal_claim
            ).to_json()
        )

    # :rest, so that any id, an empty one or one holding '/' included, reaches the library.
    @app.get("/v1/decisions/{decision_id:rest}", tags=["decisions"], responses=_LOOKUP)
    async def explain_decision(
        decision_id: str, user_id: User = "default", agent_id: Agent = "", run_id: Run = ""
    ) -> dict[str, Any]:
        """The snapshot, its hash and signature checked; erased beliefs appear redacted."""
        return await serve(lambda m: m.explain_decision(decision_id, space=Space(user_id, agent_id, run_id)).to_json())

    # -- restriction, export -------------------------------------------------------------

    @app.post("/v1/restrictions", status_code=201, tags=["rights"], responses=_WRITE)
    async def restrict(body: RestrictBody) -> dict[str, Any]:
        """Art. 18: keep the subject's records but stop recalling them and refuse writes."""
        return await serve(
            lambda m: m.restrict(body.subject, reason=body.reason, actor=on_behalf(m, body.actor, "actor")).to_json()
        )

    @app.get("/v1/restrictions", tags=["rights"])
    async def restrictions() -> dict[str, Any]:
        return {"restrictions": [r.to_json() for r in await serve(lambda m: m.restrictions())]}

    @app.delete("/v1/restrictions/{subject:rest}", tags=["rights"], responses=_errors(404))
    async def unrestrict(
        subject: str,
        actor: Annotated[
            str | None, Query(description="On whose behalf the caller lifts it; recorded as '<actor> (via <caller>)'.")
        ] = None,
    ) -> dict[str, Any]:
        await serve(lambda m: m.unrestrict(subject, actor=on_behalf(m, actor, "actor")))
        return {"unrestricted": True}

    @app.get("/v1/export", tags=["rights"], response_class=StreamingResponse, responses=_READ)
    async def export(subject: str | None = None, user_id: str | None = None) -> StreamingResponse:
        """Art. 15/20: everything held about a subject or a user (deleatur-export/v1),
        streamed as the library writes it: never held whole, never spooled to disk (an
        export is the subject's plaintext, and a temporary file would outlive a later
        erasure in the disk's free blocks). A refusal comes as an error status; a failure
        after the first bytes can only cut the stream short, which leaves invalid JSON."""
        exports.begin()
        chunks = await _stream_export(exports, open_memory, _API_KEY.get(), subject, user_id)
        return StreamingResponse(chunks, media_type="application/json")

    # -- the log ---------------------------------------------------------------------------

    @app.get("/v1/public-key", tags=["log"], responses=_errors(409))
    async def public_key_route() -> dict[str, str]:
        """The log's current verifier key, to give to verifiers out of band."""
        return await serve(public_key)

    @app.get("/v1/checkpoint", tags=["log"], responses=_errors(404, 409))
    async def checkpoint(
        size: Annotated[int | None, Query(ge=0, description="A stored checkpoint's tree size.")] = None,
    ) -> dict[str, Any]:
        """The latest signed checkpoint (a C2SP signed note), or the stored one of ``size``
        with any witness cosignatures."""
        return {"checkpoint": await serve(lambda m: m.checkpoint(size=size).format())}

    @app.get("/v1/audit", tags=["audit"])
    async def audit(
        start: Annotated[int, Query(ge=0, le=2**62)] = 0,
        limit: Limit = 100,
        calls_only: bool = False,
        actor: Annotated[str | None, Query(description="Only this principal's calls.")] = None,
        scan: Annotated[
            int | None, Query(ge=1, description="Read at most this many log entries (or the server's most).")
        ] = None,
    ) -> dict[str, Any]:
        """The audit trail of the caller's tenant, oldest first: every call and every
        write, erasure and export, content-free. A key scoped to users reads only the
        entries about those users, each subject as a pseudonym of its scopes' own. A page
        reads at most ``scan`` of the log's entries, and never more than 5,000: it may hold
        fewer than ``limit`` entries, none even, and still have a ``next``, the ``start`` of
        the following page (null once the log was read to its end)."""
        entries, cursor = await serve(
            lambda m: audit_page(
                m,
                start=start,
                limit=limit,
                calls_only=calls_only,
                actor=actor,
                scan=MAX_AUDIT_SCAN if scan is None else min(scan, MAX_AUDIT_SCAN),
            )
        )
        return {"entries": entries, "next": cursor}

    @app.get("/v1/audit/verify", tags=["audit"], responses=_errors(404))
    async def audit_verify(size: VerifiedSize = None) -> dict[str, Any]:
        """Verify the whole audit trail (the log's Merkle tree and every checkpoint)."""
        return await verified(lambda m, at: m.verify_audit(size=at), size)

    @app.get("/v1/whoami", tags=["audit"])
    async def whoami() -> dict[str, object]:
        """The principal of the API key: role, capabilities, scopes."""
        return await serve(lambda m: m.principal.describe())

    @app.get("/v1/log/verify", tags=["log"], responses=_errors(404))
    async def log_verify(size: VerifiedSize = None) -> dict[str, Any]:
        """Re-derive the whole log and check every checkpoint."""
        return await verified(lambda m, at: m.verify_log(size=at), size)

    @app.post("/v1/receipts/verify", tags=["log"], responses=_CHECK)
    async def verify_receipt_route(body: VerifyReceiptBody) -> dict[str, Any]:
        """Check a write receipt, against the key given or (unpinned) the store's own keys."""

        return await serve(lambda m: check_receipt(m, body.receipt, body.key).to_json())

    return app


__all__ = ["DEFAULT_MAX_BODY_BYTES", "BodyLimit", "create_app"]
