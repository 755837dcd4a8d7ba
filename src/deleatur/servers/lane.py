"""Recall served without FastAPI's per-request machinery: ``GET /v1/memories/search``.

Recall is the call agents make most, and on it FastAPI's middleware, routing,
dependency solving and parameter validation cost the server about a third of its
requests per second (BENCHMARKS.md, "Recall's lane"). The lane, in front of the app,
takes a recall request only when it reads it exactly as the route would: one
``Authorization: Bearer <key>`` header (the first, as the route's), no body, and a
query the route takes as it is, which :func:`lane_arguments` checks. It then calls the
route's own function and answers with the route's JSON and error bodies. Every other
request, malformed or merely unusual (``limit=010``), goes to the app, so that every
refusal of the request itself (401, 422) is the route's own.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import pydantic_core
from fastapi.security.utils import get_authorization_scheme_param
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..errors import DeleaturError
from ..model import Space

PATH = "/v1/memories/search"
#: The route's query parameters, with the defaults it gives those left out.
DEFAULTS = {"limit": "10", "user_id": "default", "agent_id": "", "run_id": ""}
NAMES = frozenset({"q", *DEFAULTS})
# The limits the route's validation takes as pydantic reads them (1-1000, no sign,
# no leading zero, no space); any other spelling is left to the route to accept or refuse.
_LIMIT = re.compile(r"[1-9][0-9]{0,3}")
_MOST = 1000

Search = Callable[[str, Callable[[], Space], int], Awaitable[dict[str, Any]]]


URLErrors = Callable[[Scope, frozenset[str]], list[Any]]


def lane_arguments(scope: Scope, url_errors: URLErrors) -> tuple[str, dict[str, str]] | None:
    """The API key and query parameters of a recall request the lane may serve, or None
    if the app must see it. ``url_errors`` is the route's own check of the URL (a
    parameter not UTF-8, unknown or repeated): a URL it would refuse is the app's."""
    if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] != PATH or scope.get("root_path"):
        return None
    authorization = None
    for name, value in scope["headers"]:
        if name == b"authorization" and authorization is None:
            authorization = value.decode("latin-1")
        elif name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return None  # a body: the app's limit on bodies applies
    scheme, key = get_authorization_scheme_param(authorization)
    if scheme.lower() != "bearer" or not key or url_errors(scope, NAMES):
        return None
    params = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
    limit = params.get("limit")
    if "q" not in params or (limit is not None and not (_LIMIT.fullmatch(limit) and int(limit) <= _MOST)):
        return None
    return key, {**DEFAULTS, **params}


@dataclass(frozen=True)
class SearchLane:
    """Serves what :func:`lane_arguments` takes through ``search``, the route's own
    function, after ``authenticated`` has been given the key (as the route's dependency
    gives it); ``error`` makes the app's answer to an exception."""

    search: Search
    authenticated: Callable[[str], object]
    url_errors: URLErrors
    error: Callable[[Exception], Response]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Serves the request and says True, or says False having done nothing."""
        taken = lane_arguments(scope, self.url_errors)
        if taken is None:
            return False
        key, params = taken
        self.authenticated(key)
        space = (params["user_id"], params["agent_id"], params["run_id"])
        try:
            # The space is made inside the call, as by the route (a bad key is refused first).
            found = await self.search(params["q"], lambda: Space(*space), int(params["limit"]))
        except DeleaturError as exc:
            response = self.error(exc)
        except Exception as exc:
            # As the app does: the error's JSON answer, then the exception for the server's log.
            await self.error(exc)(scope, receive, send)
            raise
        else:
            response = Response(pydantic_core.to_json(found), media_type="application/json")
        await response(scope, receive, send)
        return True
