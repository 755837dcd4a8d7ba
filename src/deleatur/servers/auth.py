"""Who calls a server: a bearer API key on HTTP, the local operator on stdio.

Each request is served by ``memory.as_principal(principal)``, a view of a leased
handle on which the library authorizes and audits every call as that principal.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import AuthenticationError, InvalidInputError
from ..memory import Memory
from ..model import json_depth, loads_unique
from .defaults import DEFAULT_MAX_SESSIONS, DEFAULT_SESSIONS_PER_PRINCIPAL
from .errors import ErrorInfo, error_info
from .pool import HandlePool

SESSION_HEADER = "mcp-session-id"
#: Sent with every 401, as RFC 6750 asks.
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="deleatur"'}


def bearer_token(authorization: str | None) -> str:
    """The API key of an ``Authorization: Bearer <key>`` header."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError("this server needs an API key: send 'Authorization: Bearer <key>'")
    return token.strip()


def as_caller(memory: Memory, api_key: str) -> Memory:
    """The view of ``memory`` that acts for the principal of ``api_key``."""
    return memory.as_principal(memory.authenticate(api_key))


@dataclass(slots=True)
class _Session:
    principal: str
    #: Requests of the session in flight (an open GET stream included).
    busy: int = 0
    #: When the last one ended.
    idle_since: float = 0.0


class BearerGate:
    """Refuses, with 401, every HTTP request without a valid API key before it reaches
    ``app`` (the MCP transport, which would otherwise open a session first), and binds
    each MCP session to the principal that opened it: another key presenting its
    session id is told the session does not exist (404), so it can neither listen to
    the session's stream nor end it.

    It also caps the live sessions of each principal (``per_principal``; more get 429
    ``too_many_sessions``) and of everyone (``max_sessions``; more get 503 ``busy``), so
    that no key can take every session the server holds. A session stops counting when
    its principal ends it (DELETE) or when it has had no request in flight for
    ``idle_timeout`` seconds, which must be the transport's own: then the SDK has ended
    it too. The SDK tells the HTTP layer nothing when it ends a session, so the gate
    keeps the same clock: it sees every request of every session, and each ends here
    after it ended in the SDK, so the gate frees a slot no sooner than the SDK does. A session the SDK
    ended otherwise (a crash) holds its slot until its idle time would have run out."""

    def __init__(
        self,
        app: ASGIApp,
        pool: HandlePool,
        *,
        idle_timeout: float,
        per_principal: int = DEFAULT_SESSIONS_PER_PRINCIPAL,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if per_principal < 1 or max_sessions < 1 or not idle_timeout > 0:
            raise ValueError("session limits and the idle timeout must be positive")
        self.app = app
        self.pool = pool
        self.idle_timeout = idle_timeout
        self.per_principal = per_principal
        self.max_sessions = max_sessions
        # The transport's clock (anyio's), so that both measure the same idle time.
        self.clock = clock or anyio.current_time
        self.sessions: dict[str, _Session] = {}
        #: Each principal's live sessions, and the sessions being opened for it now:
        #: counted from admission on, so that requests sent at once cannot all pass.
        self.held: dict[str, set[str]] = {}
        self.opening: Counter[str] = Counter()

    def _principal(self, api_key: str) -> str:
        with self.pool.lease() as memory:
            return memory.authenticate(api_key).id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            api_key = bearer_token(headers.get("authorization"))
            principal = await anyio.to_thread.run_sync(self._principal, api_key)
        except AuthenticationError as exc:
            await _refuse(error_info(exc), scope, receive, send, CHALLENGE)
            return
        receive, repeated = await _read_body(scope, receive)
        if repeated is not None:
            await _refuse(repeated, scope, receive, send)
            return
        session_id = headers.get(SESSION_HEADER)
        if session_id is None:
            refusal = self._admit(principal)
            if refusal is not None:
                await _refuse(refusal, scope, receive, send)
                return
            await self._open(principal, scope, receive, send)
            return
        session = self.sessions.get(session_id)
        if session is not None and not self._live(session):
            self._forget(session_id)  # the SDK has ended it, or is about to
            session = None
        # A session the gate did not see opened (or that ended) is nobody's to use.
        if session is None or session.principal != principal:
            await _refuse(ErrorInfo(404, "no_such_session", "no such MCP session"), scope, receive, send)
            return
        await self._use(session_id, session, scope, receive, send)

    def _live(self, session: _Session) -> bool:
        return session.busy > 0 or self.clock() - session.idle_since < self.idle_timeout

    def _forget(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return  # already ended
        held = self.held[session.principal]
        held.discard(session_id)
        if not held:
            del self.held[session.principal]

    def _prune(self, session_ids: Iterable[str]) -> None:
        """Forget those of ``session_ids`` that have ended."""
        for session_id in [s for s in session_ids if not self._live(self.sessions[s])]:
            self._forget(session_id)

    def _admit(self, principal: str) -> ErrorInfo | None:
        """Count a session being opened for ``principal`` in, or say why not. No await
        between the count and the check: the event loop runs one request here at a time."""
        self._prune(self.held.get(principal, ()))
        holds = len(self.held.get(principal, ())) + self.opening[principal]
        if holds >= self.per_principal:
            return ErrorInfo(
                429,
                "too_many_sessions",
                f"the principal of this API key holds {holds} MCP sessions, the most one principal"
                f" may: end one (DELETE with its Mcp-Session-Id), or wait: a session ends once it has"
                f" had no request for {self.idle_timeout:g} s",
            )
        if len(self.sessions) + self.opening.total() >= self.max_sessions:
            self._prune(self.sessions)  # rarely: only with the server full
            if len(self.sessions) + self.opening.total() >= self.max_sessions:
                message = f"the server holds {self.max_sessions} MCP sessions, as many as it may; try again later"
                return ErrorInfo(503, "busy", message)
        self.opening[principal] += 1
        return None

    async def _open(self, principal: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Let the transport open a session for ``principal`` (counted in ``opening``),
        and hold it from when, as the transport does, it answers with the session's id
        and a status below 400, unless the opening request then fails."""
        opening, opened = True, None

        async def bind(message: Message) -> None:
            nonlocal opening, opened
            if message["type"] == "http.response.start" and opening:
                opening = False
                self._opened(principal)
                session_id = Headers(raw=message.get("headers", [])).get(SESSION_HEADER)
                if session_id is not None and message["status"] < 400:
                    opened = session_id
                    self.sessions[session_id] = _Session(principal, busy=1)
                    self.held.setdefault(principal, set()).add(session_id)
            await send(message)

        try:
            await self.app(scope, receive, bind)
        except BaseException:
            if opened is not None:
                self._forget(opened)  # as the transport discards it
            raise
        finally:
            if opening:
                self._opened(principal)
            elif opened in self.sessions:
                self._ended_request(self.sessions[opened])

    def _opened(self, principal: str) -> None:
        self.opening[principal] -= 1
        if not self.opening[principal]:
            del self.opening[principal]

    async def _use(self, session_id: str, session: _Session, scope: Scope, receive: Receive, send: Send) -> None:
        ended = False

        async def watch(message: Message) -> None:
            nonlocal ended
            if message["type"] == "http.response.start":
                # The transport's DELETE ends the session (the app has no other DELETE).
                ended = scope["method"] == "DELETE" and 200 <= message["status"] < 300
            await send(message)

        session.busy += 1
        try:
            await self.app(scope, receive, watch)
        finally:
            self._ended_request(session)
            if ended:
                self._forget(session_id)

    def _ended_request(self, session: _Session) -> None:
        session.busy -= 1
        session.idle_since = self.clock()


#: The most of a body read to check it: the SDK's own limit (4 MiB), past which it answers 413.
_MAX_CHECKED_BODY = 4 * 1024 * 1024


async def _read_body(scope: Scope, receive: Receive) -> tuple[Receive, ErrorInfo | None]:
    """A POST's body read whole (up to the SDK's limit) and checked (:func:`misread`);
    and what the transport then receives: the same messages again."""
    if scope["method"] != "POST":
        return receive, None
    declared = Headers(scope=scope).get("content-length", "")
    if declared.isdigit() and int(declared) > _MAX_CHECKED_BODY:
        return receive, None  # the SDK refuses it (413) without reading it: so must this
    messages: list[Message] = []
    size, more = 0, True
    while more and size <= _MAX_CHECKED_BODY:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    refusal = None
    if not more and size <= _MAX_CHECKED_BODY:
        refusal = misread(b"".join(m.get("body", b"") for m in messages), "the request body")

    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    return replay, refusal


def misread(message: str | bytes, what: str, *, unread_too: bool = False) -> ErrorInfo | None:
    """The refusal of a JSON-RPC ``message`` that the SDK's parser would misread: one that
    repeats a key in one object, which it reads with the key's last value (so a tool call
    naming ``user_id`` twice reached the second user, where the HTTP API refuses the same
    body), or holds an integer of more digits than Python converts. So is one holding an
    escaped lone surrogate (``"\\ud800"``), which the SDK's parser refuses, and its stdio
    transport then left unanswered. None for any other; with ``unread_too``, what the
    SDK's parser cannot read at all is refused too: a message that is not JSON, or nests
    deeper than :data:`MAX_MESSAGE_DEPTH`, which its HTTP transport answers as a parse
    error and its stdio transport left unanswered, its client waiting for good."""
    try:
        parsed = loads_unique(message, what)
    except InvalidInputError as exc:
        return ErrorInfo(422, "invalid_request", exc.message)
    except ValueError:
        return ErrorInfo(400, "invalid_request", f"{what} is not JSON") if unread_too else None
    except RecursionError:
        return _too_deep(what) if unread_too else None
    if unread_too and json_depth(parsed, what) > MAX_MESSAGE_DEPTH:
        return _too_deep(what)
    try:
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return ErrorInfo(422, "invalid_request", f"{what} holds a string that is not valid UTF-8 (a lone surrogate)")
    return None


#: The deepest a message may nest (a tool call's arguments, metadata 32 levels deep,
#: fit well within it); the SDK's parser gives up at 200.
MAX_MESSAGE_DEPTH = 100


def _too_deep(what: str) -> ErrorInfo:
    return ErrorInfo(422, "invalid_request", f"{what} is nested more than {MAX_MESSAGE_DEPTH} levels deep")


#: JSON-RPC's code for an error of the server's own (its range -32000 to -32099).
_SERVER_ERROR = -32000


def jsonrpc_refusal(info: ErrorInfo, request_id: Any = None) -> dict[str, Any]:
    """The JSON-RPC error answering the request ``request_id`` (None: one the server could
    not read), which an MCP client shows its caller; its ``data`` is the error as every
    deleatur server reports it, stable code and all."""
    error = {"code": _SERVER_ERROR, "message": f"{info.code}: {info.message}", "data": info.to_json()["error"]}
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


async def _refuse(
    info: ErrorInfo, scope: Scope, receive: Receive, send: Send, headers: dict[str, str] | None = None
) -> None:
    """A :func:`jsonrpc_refusal` with the error's HTTP status: the SDK's client shows any other
    body of an error status as "Server returned an error response", so an agent could not
    tell a bad key from a full server."""
    await JSONResponse(jsonrpc_refusal(info), status_code=info.status, headers=headers)(scope, receive, send)
