"""Recall's lane (deleatur.servers.lane): it serves exactly what the route would, and
leaves every request it cannot read as the route does to the route."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Scope

from deleatur import NewMemory, Role, Space
from deleatur.servers.http import API, _query_names, _url_errors, create_app
from deleatur.servers.lane import DEFAULTS, NAMES, PATH, SearchLane, lane_arguments

from .serving import api_key, new_store, serving


@pytest.fixture(scope="module")
def lane_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[API, str, str, str]]:
    """An app over a store with records to find, served; its URL, a member's key and a
    key of a principal scoped to another user."""
    opener = new_store(tmp_path_factory.mktemp("lane") / "mem.db")
    with opener() as memory:
        memory.remember_many(
            [NewMemory(f"lane note {i} {'tea' if i % 2 else 'coffee'}", subject=f"person {i}") for i in range(12)]
        )
        memory.remember("lane note in another space", subject="Zed", space=Space("u2", agent_id="a", run_id="r"))
    member = api_key(opener, Role.MEMBER)
    scoped = api_key(opener, Role.MEMBER, scopes=["user:someone-else"])
    app = create_app(opener)
    with serving(app) as url:
        yield app, url, member, scoped


def _scope(query: bytes = b"q=tea", headers: list[tuple[bytes, bytes]] | None = None, **extra: Any) -> Scope:
    given = [(b"host", b"x"), (b"authorization", b"Bearer k-1")] if headers is None else headers
    return {
        "type": "http",
        "method": "GET",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": query,
        "root_path": "",
        "headers": given,
        **extra,
    }


def test_the_lane_takes_the_routes_parameters_with_its_defaults() -> None:
    app = create_app(lambda: pytest.fail("no handle is opened"))
    [route] = [r for r in app.routes if isinstance(r, APIRoute) and r.path == PATH and "GET" in (r.methods or ())]
    assert frozenset(_query_names(route.dependant)) == NAMES
    given = {field.alias: field.field_info.is_required() for field in route.dependant.query_params}
    assert [name for name, required in given.items() if required] == ["q"]
    defaults = {field.alias: str(field.default) for field in route.dependant.query_params if field.alias != "q"}
    assert defaults == DEFAULTS


def test_a_plain_recall_is_taken_with_the_routes_defaults() -> None:
    assert lane_arguments(_scope(), _url_errors) == ("k-1", {"q": "tea", **DEFAULTS})
    taken = lane_arguments(
        _scope(b"q=t%C3%A9&limit=1000&user_id=&run_id=r+1", [(b"authorization", b"bearer   k-2  ")]), _url_errors
    )
    assert taken == ("k-2", {"q": "t\u00e9", "limit": "1000", "user_id": "", "agent_id": "", "run_id": "r 1"})
    # The first Authorization header, as Starlette's headers.get gives the route.
    two = [(b"authorization", b"Bearer first"), (b"authorization", b"Bearer second")]
    assert lane_arguments(_scope(headers=two), _url_errors) == ("first", {"q": "tea", **DEFAULTS})
    assert lane_arguments(_scope(headers=[(b"authorization", b"Bearer k"), (b"content-length", b"0")]), _url_errors)


@pytest.mark.parametrize(
    ("scope", "why"),
    [
        (_scope(headers=[]), "no key"),
        (_scope(headers=[(b"authorization", b"Basic k-1")]), "another scheme"),
        (_scope(headers=[(b"authorization", b"Bearer   ")]), "an empty key"),
        (_scope(b"limit=3"), "no query"),
        (_scope(b"q=tea&limit=010"), "a limit pydantic reads, spelt otherwise"),
        (_scope(b"q=tea&limit=0"), "a limit under the least"),
        (_scope(b"q=tea&limit=1001"), "a limit over the most"),
        (_scope(b"q=tea&limit=%2B5"), "a signed limit"),
        (_scope(b"q=tea&limit="), "an empty limit"),
        (_scope(b"q=tea&limt=3"), "an unknown parameter"),
        (_scope(b"q=tea&q=coffee"), "a repeated parameter"),
        (_scope(b"q=%FF"), "a value not UTF-8"),
        (_scope(headers=[(b"authorization", b"Bearer k"), (b"content-length", b"4")]), "a body"),
        (_scope(headers=[(b"authorization", b"Bearer k"), (b"transfer-encoding", b"chunked")]), "a chunked body"),
        (_scope(method="HEAD"), "another method"),
        (_scope(method="POST"), "the POST route"),
        (_scope(path=PATH + "/"), "another path"),
        (_scope(root_path="/api"), "an app mounted under a root path"),
        (_scope(type="websocket"), "not HTTP"),
    ],
)
def test_the_lane_leaves_to_the_route_what_it_cannot_read_as_the_route(scope: Scope, why: str) -> None:
    assert lane_arguments(scope, _url_errors) is None, why


def _both(app: API, url: str, params: dict[str, str], headers: dict[str, str]) -> tuple[httpx.Response, ...]:
    """The answer through the lane, then the route's own to the same request."""
    lane = app.lane
    with httpx.Client(base_url=url) as http:
        through_lane = http.get(PATH, params=params, headers=headers)
        app.lane = None
        try:
            by_route = http.get(PATH, params=params, headers=headers)
        finally:
            app.lane = lane
    return through_lane, by_route


@pytest.mark.parametrize(
    ("params", "who", "status"),
    [
        ({"q": "tea"}, "member", 200),
        ({"q": "coffee note", "limit": "3"}, "member", 200),
        ({"q": "another", "user_id": "u2", "agent_id": "a", "run_id": "r"}, "member", 200),
        ({"q": "nothing-matches-this"}, "member", 200),
        ({"q": "tea", "user_id": "u2"}, "member", 200),  # no record in that space
        ({"q": ""}, "member", 422),  # the library's refusal: no searchable words
        ({"q": "tea", "user_id": "bad\x01user"}, "member", 422),  # the library's refusal of the space
        ({"q": "tea"}, "wrong key", 401),
        ({"q": "tea"}, "scoped", 403),
    ],
)
def test_the_lane_answers_as_the_route(
    lane_server: tuple[API, str, str, str], params: dict[str, str], who: str, status: int
) -> None:
    app, url, member, scoped = lane_server
    key = {"member": member, "scoped": scoped, "wrong key": "dlt_wrong_key"}[who]
    through_lane, by_route = _both(app, url, params, {"Authorization": f"Bearer {key}"})
    assert through_lane.status_code == by_route.status_code == status
    if status == 200:
        assert through_lane.content == by_route.content
    else:  # but for the call's own request id
        lane_error, route_error = through_lane.json()["error"], by_route.json()["error"]
        assert ("request_id" in lane_error) == ("request_id" in route_error)
        assert lane_error.pop("request_id", 1) != route_error.pop("request_id", 2)
        assert lane_error == route_error
    for header in ("content-type", "content-length", "www-authenticate"):
        assert through_lane.headers.get(header) == by_route.headers.get(header), header
    if status == 200:
        assert all(h["user_id"] == params.get("user_id", "default") for h in through_lane.json()["hits"])
    if params == {"q": "tea"} and who == "member":
        assert len(through_lane.json()["hits"]) == 6


def test_the_lane_serves_the_routes_requests(tmp_path: Path) -> None:
    """Shown on an app itself: the lane answers, and says it did."""
    opener = new_store(tmp_path / "mem.db")
    with opener() as memory:
        memory.remember_many([NewMemory(f"coffee {i}", subject="Ann") for i in range(3)])
    member = api_key(opener, Role.MEMBER)
    app = create_app(opener)
    assert app.lane is not None
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = _scope(b"q=coffee&limit=2", [(b"authorization", f"Bearer {member}".encode())])
    try:
        assert asyncio.run(app.lane(scope, receive, send)) is True
        assert sent[0]["status"] == 200
        assert len(httpx.Response(200, content=sent[1]["body"]).json()["hits"]) == 2
        sent.clear()
        assert asyncio.run(app.lane(_scope(b"q=coffee&limit=02"), receive, send)) is False
        assert sent == []
    finally:
        app.state.pool.close()


def test_an_unexpected_failure_is_answered_then_raised() -> None:
    """As the app does (its handler's JSON, then the exception for the server's log)."""
    failure = RuntimeError("the search broke")

    async def search(*_: Any) -> dict[str, Any]:
        raise failure

    def error(exc: Exception) -> Response:
        return JSONResponse({"error": type(exc).__name__}, status_code=500)

    lane = SearchLane(search, authenticated=lambda _: None, url_errors=_url_errors, error=error)
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    with pytest.raises(RuntimeError) as raised:
        asyncio.run(lane(_scope(), receive, send))
    assert raised.value is failure
    assert sent[0]["status"] == 500
    assert sent[1]["body"] == b'{"error":"RuntimeError"}'
