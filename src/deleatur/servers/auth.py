"""Who calls a server: a bearer API key on HTTP, the local operator on stdio.

Each request is served by ``memory.as_principal(principal)``, a view of a leased
handle on which the library authorizes and audits every call as that principal.
"""

from __future__ import annotations

import anyio.to_thread
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import AuthenticationError
from ..memory import Memory
from .errors import error_info
from .pool import HandlePool

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
    ``app`` (the MCP transport, which would otherwise open a session first)."""

    def __init__(self, app: ASGIApp, pool: HandlePool) -> None:
        self.app = app
        self.pool = pool

    def _check(self, api_key: str) -> None:
        with self.pool.lease() as memory:
            memory.authenticate(api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                api_key = bearer_token(Headers(scope=scope).get("authorization"))
                await anyio.to_thread.run_sync(self._check, api_key)
            except AuthenticationError as exc:
                info = error_info(exc)
                await JSONResponse(info.to_json(), status_code=info.status, headers=CHALLENGE)(scope, receive, send)
                return
        await self.app(scope, receive, send)
