"""Who calls a server: a bearer API key on HTTP, the local operator on stdio.

Each request is served by ``memory.as_principal(principal)``, a view of a leased
handle on which the library authorizes and audits every call as that principal.
"""

from __future__ import annotations

from collections import OrderedDict

import anyio.to_thread
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import AuthenticationError
from ..memory import Memory
from .errors import ErrorInfo, error_info
from .pool import HandlePool

SESSION_HEADER = "mcp-session-id"
#: Sessions whose owner the gate remembers; the oldest are forgotten first, and a
#: forgotten session can no longer be used by anyone (its client opens a new one).
MAX_SESSIONS = 10_000
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


class BearerGate:
    """Refuses, with 401, every HTTP request without a valid API key before it reaches
    ``app`` (the MCP transport, which would otherwise open a session first), and binds
    each MCP session to the principal that opened it: another key presenting its
    session id is told the session does not exist (404), so it can neither listen to
    the session's stream nor end it."""

    def __init__(self, app: ASGIApp, pool: HandlePool) -> None:
        self.app = app
        self.pool = pool
        self.owners: OrderedDict[str, str] = OrderedDict()

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
            info = error_info(exc)
            await JSONResponse(info.to_json(), status_code=info.status, headers=CHALLENGE)(scope, receive, send)
            return
        session = headers.get(SESSION_HEADER)
        # A session the gate did not see opened (or has forgotten) is nobody's to use.
        if session is not None and self.owners.get(session) != principal:
            info = ErrorInfo(404, "no_such_session", "no such MCP session")
            await JSONResponse(info.to_json(), status_code=404)(scope, receive, send)
            return

        async def bind(message: Message) -> None:
            if message["type"] == "http.response.start" and session is None:
                opened = Headers(raw=message.get("headers", [])).get(SESSION_HEADER)
                if opened is not None:
                    self.owners[opened] = principal
                    if len(self.owners) > MAX_SESSIONS:
                        self.owners.popitem(last=False)
            await send(message)

        await self.app(scope, receive, bind)
