"""The lanes of recall and remember (deleatur.servers.lane): they serve exactly what the
routes would, and leave every request they cannot read as the route does to the route."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Scope

from deleatur import NewMemory, Role, Space
from deleatur.model import MAX_RECALL
from deleatur.servers.http import API, BodyLimit, _query_names, _url_errors, create_app
from deleatur.servers.lane import DEFAULTS, MEMORIES, NAMES, SEARCH, Lanes, recall_arguments, remember_body

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
        "path": SEARCH,
        "raw_path": SEARCH.encode(),
        "query_string": query,
        "root_path": "",
        "headers": given,
        **extra,
    }


def test_the_lane_takes_the_routes_parameters_with_its_defaults() -> None:
    app = create_app(lambda: pytest.fail("no handle is opened"))
    [route] = [r for r in app.routes if isinstance(r, APIRoute) and r.path == SEARCH and "GET" in (r.methods or ())]
    assert frozenset(_query_names(route.dependant)) == NAMES
    given = {field.alias: field.field_info.is_required() for field in route.dependant.query_params}
    assert [name for name, required in given.items() if required] == ["q"]
    defaults = {field.alias: str(field.default) for field in route.dependant.query_params if field.alias != "q"}
    assert defaults == DEFAULTS
    [limit] = [field for field in route.dependant.query_params if field.alias == "limit"]
    assert [m.le for m in limit.field_info.metadata if hasattr(m, "le")] == [MAX_RECALL]


def test_the_lanes_pass_by_no_middleware_but_the_body_limit() -> None:
    """The lanes stand in front of the app's middleware: one added later would not see
    recall and remember (the body limit the remember lane keeps itself)."""
    app = create_app(lambda: pytest.fail("no handle is opened"))
    classes: list[object] = [middleware.cls for middleware in app.user_middleware]
    assert classes == [BodyLimit]


def test_a_plain_recall_is_taken_with_the_routes_defaults() -> None:
    assert recall_arguments(_scope(), _url_errors) == ("k-1", {"q": "tea", **DEFAULTS})
    taken = recall_arguments(
        _scope(b"q=t%C3%A9&limit=1000&user_id=&run_id=r+1", [(b"authorization", b"bearer   k-2  ")]), _url_errors
    )
    assert taken == ("k-2", {"q": "t\u00e9", "limit": "1000", "user_id": "", "agent_id": "", "run_id": "r 1"})
    # The first Authorization header, as Starlette's headers.get gives the route.
    two = [(b"authorization", b"Bearer first"), (b"authorization", b"Bearer second")]
    assert recall_arguments(_scope(headers=two), _url_errors) == ("first", {"q": "tea", **DEFAULTS})
    assert recall_arguments(_scope(headers=[(b"authorization", b"Bearer k"), (b"content-length", b"0")]), _url_errors)


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
        (_scope(path=SEARCH + "/"), "another path"),
        (_scope(root_path="/api"), "an app mounted under a root path"),
        (_scope(type="websocket"), "not HTTP"),
    ],
)
def test_the_lane_leaves_to_the_route_what_it_cannot_read_as_the_route(scope: Scope, why: str) -> None:
    assert recall_arguments(scope, _url_errors) is None, why


def _both(app: API, url: str, method: str, path: str, **request: Any) -> tuple[httpx.Response, httpx.Response]:
    """The answer through the lanes, then the route's own to the same request."""
    lanes = app.lanes
    with httpx.Client(base_url=url) as http:
        through_lane = http.request(method, path, **request)
        app.lanes = None
        try:
            by_route = http.request(method, path, **request)
        finally:
            app.lanes = lanes
    return through_lane, by_route


def _same_refusal(through_lane: httpx.Response, by_route: httpx.Response) -> None:
    """The same error, but for each call's own request id."""
    lane_error, route_error = through_lane.json()["error"], by_route.json()["error"]
    assert ("request_id" in lane_error) == ("request_id" in route_error)
    assert lane_error.pop("request_id", 1) != route_error.pop("request_id", 2)
    assert lane_error == route_error


def _same_headers(through_lane: httpx.Response, by_route: httpx.Response) -> None:
    for header in ("content-type", "www-authenticate", "content-length"):
        assert through_lane.headers.get(header) == by_route.headers.get(header), header


def _bearer(lane_server: tuple[API, str, str, str], who: str) -> dict[str, str]:
    _, _, member, scoped = lane_server
    return {"Authorization": "Bearer " + {"member": member, "scoped": scoped, "wrong key": "dlt_wrong_key"}[who]}


def _same_recall(through_lane: httpx.Response, by_route: httpx.Response) -> None:
    assert through_lane.status_code == by_route.status_code
    if through_lane.status_code == 200:
        assert through_lane.content == by_route.content
    else:
        _same_refusal(through_lane, by_route)
    _same_headers(through_lane, by_route)


#: What differs between two records written from one body.
_OWN = ("id", "created_at", "updated_at", "supersedes", "expires_at")


def _same_remember(through_lane: httpx.Response, by_route: httpx.Response) -> None:
    """The same answer to a remember: for two writes, the same record but for ``_OWN``."""
    assert through_lane.status_code == by_route.status_code
    if through_lane.status_code == 201:
        made, again = through_lane.json(), by_route.json()
        assert made["id"] != again["id"]
        assert {k: v for k, v in made.items() if k not in _OWN} == {k: v for k, v in again.items() if k not in _OWN}
        assert through_lane.headers["content-type"] == by_route.headers["content-type"] == "application/json"
    else:
        _same_refusal(through_lane, by_route)
        _same_headers(through_lane, by_route)


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
def test_the_recall_lane_answers_as_the_route(
    lane_server: tuple[API, str, str, str], params: dict[str, str], who: str, status: int
) -> None:
    app, url, _, _ = lane_server
    through_lane, by_route = _both(app, url, "GET", SEARCH, params=params, headers=_bearer(lane_server, who))
    assert through_lane.status_code == status
    _same_recall(through_lane, by_route)
    if status == 200:
        assert all(h["user_id"] == params.get("user_id", "default") for h in through_lane.json()["hits"])
    if params == {"q": "tea"} and who == "member":
        assert len(through_lane.json()["hits"]) == 6


@pytest.mark.parametrize(
    ("body", "who", "status"),
    [
        ({"text": "lane memo", "subject": "Ann"}, "member", 201),
        (
            {
                "text": "Ann's phone is +1",
                "subject": " ANN ",
                "key": "ann::phone",
                "metadata": {"channel": "crm"},
                "source": "call",
                "confidence": 0.5,
                "expires_at": "2030-01-01T00:00:00Z",
                "user_id": "u3",
                "agent_id": "a",
            },
            "member",
            201,
        ),
        ({"text": "", "subject": "Ann"}, "member", 422),  # the library's refusals
        ({"text": "x", "subject": "  "}, "member", 422),
        ({"text": "x", "subject": "Ann", "expires_at": "soon"}, "member", 422),
        ({"text": "x", "subject": "Ann", "derived_from": ["0190a0a0-0000-7000-8000-000000000000"]}, "member", 404),
        ({"text": "x", "subject": "Ann"}, "wrong key", 401),
        ({"text": "x", "subject": "Ann"}, "scoped", 403),
    ],
)
def test_the_remember_lane_answers_as_the_route(
    lane_server: tuple[API, str, str, str], body: dict[str, Any], who: str, status: int
) -> None:
    app, url, _, _ = lane_server
    through_lane, by_route = _both(app, url, "POST", MEMORIES, json=body, headers=_bearer(lane_server, who))
    assert through_lane.status_code == status
    _same_remember(through_lane, by_route)
    if status == 201:
        # A keyed write through the route supersedes the lane's: the lane's was written.
        assert by_route.json()["supersedes"] == (through_lane.json()["id"] if "key" in body else None)
        assert through_lane.json()["supersedes"] is None
        assert through_lane.json()["expires_at"] == by_route.json()["expires_at"]


_LIMITS = st.sampled_from(["1", "10", "1000", "1001", "0", "010", " 5", "5.0", "+5", "-1", "", "1e3", "\u0661"])
_WORDS = st.one_of(st.text(max_size=12), st.sampled_from(["tea", "coffee note", "another", ""]))
# Mostly queries the lane takes (each parameter once), some with a parameter repeated,
# unknown or misspelt: the route's alone to answer.
_QUERIES = st.tuples(
    st.fixed_dictionaries(
        {"q": _WORDS},
        optional={"limit": _LIMITS | st.integers(1, 1000).map(str), "user_id": _WORDS, "agent_id": _WORDS},
    ),
    st.lists(st.tuples(st.sampled_from(["q", "limit", "run_id", "lmit"]), _WORDS | _LIMITS), max_size=2),
).map(lambda given: [*given[0].items(), *given[1]])


@settings(max_examples=100, deadline=None)
@given(params=_QUERIES)
def test_any_recall_query_is_answered_as_the_route_answers_it(
    lane_server: tuple[API, str, str, str], params: list[tuple[str, str]]
) -> None:
    app, url, _, _ = lane_server
    _same_recall(*_both(app, url, "GET", SEARCH, params=params, headers=_bearer(lane_server, "member")))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_TEXTS = st.none() | st.text(max_size=8)
# Mostly bodies of the route's model, some with a member of another type or one it does
# not take: the route's alone to refuse.
_BODIES = st.tuples(
    st.fixed_dictionaries(
        {"text": st.text(max_size=20), "subject": st.text(max_size=10) | st.sampled_from(["Ann", "Bob"])},
        optional={
            "key": _TEXTS,
            "metadata": st.none() | st.dictionaries(st.text(max_size=5), _JSON, max_size=3),
            "source": _TEXTS,
            "confidence": st.none() | st.integers() | st.floats(allow_nan=False, allow_infinity=False),
            "derived_from": st.lists(st.text(max_size=5), max_size=2),
            "expires_at": st.none() | st.integers() | st.sampled_from(["30d", "2030-01-01T00:00:00Z", "soon", ""]),
            "user_id": st.text(max_size=6),
            "for_legal_claim": st.booleans(),
        },
    ),
    st.dictionaries(st.sampled_from(["text", "key", "confidence", "colour"]), _JSON, max_size=1),
).map(lambda given: {**given[0], **given[1]})


@settings(max_examples=100, deadline=None)
@given(body=_BODIES)
def test_any_remember_body_is_answered_as_the_route_answers_it(
    lane_server: tuple[API, str, str, str], body: dict[str, Any]
) -> None:
    app, url, _, _ = lane_server
    _same_remember(*_both(app, url, "POST", MEMORIES, json=body, headers=_bearer(lane_server, "member")))


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"text": "x", "subject": "Ann", "subject": "Bob"}', "a repeated member"),
        (b'{"text": "x", "subject": "Ann"', "not JSON"),
        (b'{"text": "x", "subject": "Ann", "colour": "red"}', "a member the route does not take"),
        (b'{"text": 5, "subject": "Ann"}', "a member of another type"),
        (b'{"text": "x"}', "a member missing"),
        (b'["x"]', "not an object"),
        (b"\xff", "not UTF-8"),
        (b"[" * 100_000, "nested too deeply"),
        # Near the depth json.loads reaches on the route's stack: the route's to read.
        (b'{"text": "x", "subject": "Ann", "metadata": {"a": ' + b"[" * 970 + b"1" + b"]" * 970 + b"}}", "deep"),
    ],
)
def test_a_body_the_remember_route_refuses_is_the_routes_to_refuse(
    lane_server: tuple[API, str, str, str], content: bytes, why: str
) -> None:
    """The lane read it first, and gives it to the app to read again."""
    app, url, _, _ = lane_server
    headers = {**_bearer(lane_server, "member"), "Content-Type": "application/json"}
    through_lane, by_route = _both(app, url, "POST", MEMORIES, content=content, headers=headers)
    assert through_lane.status_code == by_route.status_code == 422, why
    _same_refusal(through_lane, by_route)


def _post(content_type: bytes = b"application/json", length: bytes = b"30", **extra: Any) -> Scope:
    headers = [(b"authorization", b"Bearer k-1"), (b"content-type", content_type), (b"content-length", length)]
    return _scope(b"", headers, **{"method": "POST", "path": MEMORIES, "raw_path": MEMORIES.encode(), **extra})


def test_a_plain_remember_is_read_by_the_lane() -> None:
    assert remember_body(_post(), _url_errors, 64) == "k-1"
    assert remember_body(_post(length=b"64"), _url_errors, 64) == "k-1"


@pytest.mark.parametrize(
    ("scope", "why"),
    [
        (_post(b"application/json; charset=utf-8"), "a content type spelt otherwise"),
        (_post(b"text/plain"), "another content type"),
        (_post(length=b"65"), "a body over the limit"),
        (_post(length=b"0"), "no body"),
        (_post(length=b"-1"), "a length that is no length"),
        (
            _scope(
                b"",
                [(b"authorization", b"Bearer k"), (b"content-type", b"application/json")],
                method="POST",
                path=MEMORIES,
            ),
            "no length",
        ),
        (_post(headers_extra=True), "a chunked body"),
        (_post(query_string=b"user_id=u"), "a query the route does not take"),
        (_post(path=SEARCH), "the search route"),
        (_post(method="PUT"), "another method"),
    ],
)
def test_the_remember_lane_leaves_to_the_route_what_it_cannot_read_as_the_route(scope: Scope, why: str) -> None:
    if scope.pop("headers_extra", False):
        scope["headers"] = [*scope["headers"], (b"transfer-encoding", b"chunked")]
    assert remember_body(scope, _url_errors, 64) is None, why


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def test_the_lanes_serve_their_routes_requests(tmp_path: Path) -> None:
    """Shown on an app itself: the lanes answer, and the app sees nothing of it; what
    they leave goes to the app, a body they read given to it again."""
    opener = new_store(tmp_path / "mem.db")
    with opener() as memory:
        memory.remember_many([NewMemory(f"coffee {i}", subject="Ann") for i in range(3)])
    bearer = (b"authorization", f"Bearer {api_key(opener, Role.MEMBER)}".encode())
    app = create_app(opener)
    lanes = app.lanes
    assert lanes is not None
    sent: list[Message] = []
    to_app: list[tuple[Scope, Message]] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def the_app(scope: Scope, receive: Any, _: Any) -> None:
        to_app.append((scope, await receive()))

    def body(content: bytes) -> Any:
        async def receive() -> Message:
            return {"type": "http.request", "body": content, "more_body": False}

        return receive

    remembered = b'{"text": "coffee 4", "subject": "Ann"}'
    refused = b'{"text": "coffee 5", "subject": "Ann", "subject": "Bob"}'
    try:
        asyncio.run(lanes(_scope(b"q=coffee&limit=2", [bearer]), _no_body, send, the_app))
        assert sent[0]["status"] == 200 and to_app == []
        assert len(httpx.Response(200, content=sent[1]["body"]).json()["hits"]) == 2
        sent.clear()
        posted = _post(length=str(len(remembered)).encode())
        posted["headers"][0] = bearer
        asyncio.run(lanes(posted, body(remembered), send, the_app))
        assert sent[0]["status"] == 201 and to_app == []
        assert httpx.Response(201, content=sent[1]["body"]).json()["text"] == "coffee 4"
        sent.clear()
        asyncio.run(lanes(_scope(b"q=coffee&limit=02"), _no_body, send, the_app))
        posted = _post(length=str(len(refused)).encode())
        asyncio.run(lanes(posted, body(refused), send, the_app))
        assert sent == []
        assert [(scope["path"], message.get("body")) for scope, message in to_app] == [
            (SEARCH, b""),
            (MEMORIES, refused),
        ]
    finally:
        app.state.pool.close()


def test_an_unexpected_failure_is_answered_then_raised() -> None:
    """As the app does (its handler's JSON, then the exception for the server's log)."""
    failure = RuntimeError("the search broke")

    async def search(*_: Any) -> dict[str, Any]:
        raise failure

    def error(exc: Exception) -> Response:
        return JSONResponse({"error": type(exc).__name__}, status_code=500)

    lanes = Lanes(search, search, BaseModel, authenticated=lambda _: None, url_errors=_url_errors, error=error, most=64)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def no_app(*_: Any) -> None:
        pytest.fail("the lane took the request")

    with pytest.raises(RuntimeError) as raised:
        asyncio.run(lanes(_scope(), _no_body, send, no_app))
    assert raised.value is failure
    assert sent[0]["status"] == 500
    assert sent[1]["body"] == b'{"error":"RuntimeError"}'
