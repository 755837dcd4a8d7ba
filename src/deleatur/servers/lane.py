"""The calls agents make most, served without FastAPI's per-request machinery:
``GET /v1/memories/search`` (recall) and ``POST /v1/memories`` (remember).

On these, FastAPI's middleware, routing, dependency solving and validation cost the
server about a third of its requests per second (BENCHMARKS.md, "The lanes"). The
lanes, in front of the app, take a request only when they read it exactly as its
route would: one ``Authorization: Bearer <key>`` header (the first, as the route's),
and a query or body that the route takes as it is (:func:`recall_arguments`,
:func:`remember_body`). They then call the route's own function and answer with its
JSON and its error bodies. Every other request, malformed or merely unusual
(``limit=010``, a body sent in chunks), goes to the app, so that every refusal of
the request itself (401, 413, 422) is the route's own.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import pydantic
import pydantic_core
from fastapi.security.utils import get_authorization_scheme_param
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import DeleaturError, InvalidInputError
from ..model import MAX_RECALL, Space, loads_unique

SEARCH = "/v1/memories/search"
MEMORIES = "/v1/memories"
#: The recall route's query parameters, with the defaults it gives those left out.
DEFAULTS = {"limit": "10", "user_id": "default", "agent_id": "", "run_id": ""}
NAMES = frozenset({"q", *DEFAULTS})
# The limits the route's validation takes as pydantic reads them (digits only, no
# leading zero); any other spelling is left to the route to accept or refuse.
_LIMIT = re.compile(rf"[1-9][0-9]{{0,{len(str(MAX_RECALL)) - 1}}}")
# json.loads nests as deep as the stack has room: a body nested nearly that deep parsed
# in the lane, where the route, deeper in the stack, ran out (its own 422). Bodies that
# open more brackets than this, in strings too, are the route's to read.
_MOST_BRACKETS = 200

Search = Callable[[str, Callable[[], Space], int], Awaitable[dict[str, Any]]]
URLErrors = Callable[[Scope, frozenset[str]], list[Any]]


def _is(scope: Scope, method: str, path: str) -> bool:
    return bool(scope["type"] == "http" and scope["method"] == method and scope["path"] == path)


def _api_key(scope: Scope, url_errors: URLErrors, names: frozenset[str]) -> str | None:
    """The request's API key, as the route's bearer dependency reads it, if its URL is
    one the route takes as it is (``url_errors``, the route's own check: a parameter not
    UTF-8, unknown or repeated); else None."""
    if scope.get("root_path"):
        return None
    authorization = next((value for name, value in scope["headers"] if name == b"authorization"), None)
    scheme, key = get_authorization_scheme_param(None if authorization is None else authorization.decode("latin-1"))
    if scheme.lower() != "bearer" or not key or url_errors(scope, names):
        return None
    return key


def recall_arguments(scope: Scope, url_errors: URLErrors) -> tuple[str, dict[str, str]] | None:
    """The API key and query parameters of a recall request the lane may serve, or None
    if the app must see it."""
    if not _is(scope, "GET", SEARCH):
        return None
    if any(
        name == b"transfer-encoding" or (name == b"content-length" and value != b"0")
        for name, value in scope["headers"]
    ):
        return None  # a body: the app's limit on bodies applies
    key = _api_key(scope, url_errors, NAMES)
    if key is None:
        return None
    params = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
    limit = params.get("limit")
    if "q" not in params or (limit is not None and not (_LIMIT.fullmatch(limit) and int(limit) <= MAX_RECALL)):
        return None
    return key, {**DEFAULTS, **params}


def remember_body(scope: Scope, url_errors: URLErrors, most: int) -> str | None:
    """The API key of a remember request whose body the lane may read, or None if the
    app must see it: a JSON body of a declared length of at most ``most`` bytes (the
    server reads no more than a request declares)."""
    if not _is(scope, "POST", MEMORIES):
        return None
    headers: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        headers.setdefault(name, value)
    length = headers.get(b"content-length", b"")
    if b"transfer-encoding" in headers or headers.get(b"content-type") != b"application/json":
        return None
    if not length.isdigit() or not 0 < int(length) <= most:
        return None
    return _api_key(scope, url_errors, frozenset())


async def _read(receive: Receive) -> tuple[bytes | None, list[Message]]:
    """The whole body, or None if the client left first; and the messages it came in."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return None, messages
        if not message.get("more_body", False):
            return b"".join(m.get("body", b"") for m in messages), messages


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` for the app, which must read the body the lane read first."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay


@dataclass(frozen=True)
class Lanes:
    """Serves what :func:`recall_arguments` and :func:`remember_body` take through the
    routes' own functions, ``search`` and ``remember``, after ``authenticated`` has been
    given the key (as the routes' dependency gives it); ``error`` makes the app's answer
    to an exception; bodies over ``most`` bytes are the app's to refuse."""

    search: Search
    remember: Callable[[Any], Awaitable[dict[str, Any]]]
    remember_model: type[pydantic.BaseModel]
    authenticated: Callable[[str], object]
    url_errors: URLErrors
    error: Callable[[Exception], Response]
    most: int

    async def __call__(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        """Serves the request, or has ``app`` serve it."""
        taken = recall_arguments(scope, self.url_errors)
        if taken is not None:
            key, params = taken
            space = (params["user_id"], params["agent_id"], params["run_id"])
            # The space is made inside the call, as by the route (a bad key is refused first).
            work = self.search(params["q"], lambda: Space(*space), int(params["limit"]))
            await self._answer(key, work, 200, scope, receive, send)
            return
        posted = remember_body(scope, self.url_errors, self.most)
        if posted is not None:
            body, messages = await _read(receive)
            model = None if body is None else self._remember_model(body)
            if model is not None:
                await self._answer(posted, self.remember(model), 201, scope, receive, send)
                return
            receive = _replaying(messages, receive)
        await app(scope, receive, send)

    def _remember_model(self, body: bytes) -> pydantic.BaseModel | None:
        """The route's body model of ``body``, or None if the route would refuse it, or
        might read it otherwise."""
        if body.count(b"[") + body.count(b"{") > _MOST_BRACKETS:
            return None
        try:
            return self.remember_model.model_validate(loads_unique(body, "the request body"))
        except (InvalidInputError, ValueError, RecursionError):  # pydantic's and json's errors are ValueErrors
            return None

    async def _answer(
        self, key: str, work: Awaitable[dict[str, Any]], status: int, scope: Scope, receive: Receive, send: Send
    ) -> None:
        self.authenticated(key)
        try:
            found = await work
        except DeleaturError as exc:
            response = self.error(exc)
        except Exception as exc:
            # As the app does: the error's JSON answer, then the exception for the server's log.
            await self.error(exc)(scope, receive, send)
            raise
        else:
            # What the route's JSONResponse sends, without making one (a fiftieth of a recall).
            body = pydantic_core.to_json(found)
            headers = [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await response(scope, receive, send)
