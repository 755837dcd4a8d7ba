"""A response leaves the server in one write to its socket (servers/combined_writes.py).

The server here is uvicorn on asyncio's own loop, whose socket transport is a Python
object: each test counts the writes made to it, the socket's, by the protocol the
server runs."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from deleatur.servers.combined_writes import MOST_HELD, CombinedWritesProtocol
from deleatur.servers.workers import server_config

from .serving import serving

BODY = b'{"hits": []}'
CHUNK = b"x" * 40_000
LARGE = b"y" * (MOST_HELD + 1)
#: Set by a client once it has ended its side of the connection (see /after-eof).
CLIENT_ENDED = threading.Event()


async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
    """An answer as the lanes send one: its head, then its whole body. A request for
    /streamed gets three chunks of CHUNK, sent without waiting between them."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/streamed":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(3):
            await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = LARGE if scope["path"] == "/large" else BODY
    if scope["path"] == "/after-eof":
        # Work done in the loop (as the store's calls are) while the client's end arrives.
        assert CLIENT_ENDED.wait(30)
    headers = [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _counted(protocol: type[HttpToolsProtocol], writes: list[bytes]) -> type[HttpToolsProtocol]:
    """``protocol``, its socket transport's writes appended to ``writes``."""

    class Counted(protocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:
            write = transport.write

            def counted(data: Any) -> None:
                writes.append(bytes(data))
                write(data)

            transport.write = counted  # type: ignore[method-assign]
            super().connection_made(transport)

    return Counted


@contextmanager
def _served(protocol: type[HttpToolsProtocol]) -> Iterator[tuple[str, list[bytes]]]:
    writes: list[bytes] = []
    with serving(_answer, loop="asyncio", http=_counted(protocol, writes)) as url:
        yield url, writes


def _exchange(url: str, request: bytes, *, ended: threading.Event | None = None) -> bytes:
    """Send ``request``, and read until the server closes the connection. With ``ended``,
    end this side of the connection first, and then set it."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        if ended is not None:
            sock.shutdown(socket.SHUT_WR)
            ended.set()
        received = b""
        while chunk := sock.recv(1 << 16):
            received += chunk
    return received


CLOSING = b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(("protocol", "writes_per_answer"), [(CombinedWritesProtocol, 1), (HttpToolsProtocol, 2)])
def test_an_answer_is_one_write(protocol: type[HttpToolsProtocol], writes_per_answer: int) -> None:
    """Its head and its body leave together (uvicorn's own protocol, the control, writes
    them apart), and the connection's close comes after what it held."""
    with _served(protocol) as (url, writes):
        received = _exchange(url, CLOSING)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"\r\n\r\n" + BODY)
    assert len(writes) == writes_per_answer
    assert b"".join(writes) == received


def test_answers_on_one_connection_are_one_write_each() -> None:
    """Keep-alive: each of three answers leaves in a write of its own."""
    keep_alive = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n"
    with _served(CombinedWritesProtocol) as (url, writes):
        received = _exchange(url, keep_alive * 2 + CLOSING)
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert [w.endswith(BODY) for w in writes] == [True] * 3
    assert b"".join(writes) == received


def test_a_streamed_body_is_written_past_the_high_water_mark() -> None:
    """A body sent faster than the loop turns is held only up to MOST_HELD, so the
    transport's flow control still sees it; nothing is lost or reordered."""
    with _served(CombinedWritesProtocol) as (url, writes):
        received = _exchange(url, CLOSING.replace(b"GET / ", b"GET /streamed "))
    head, _, chunked = received.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert chunked == (b"%x\r\n" % len(CHUNK) + CHUNK + b"\r\n") * 3 + b"0\r\n\r\n"
    assert len(writes) == 2
    assert len(writes[0]) >= MOST_HELD  # the head and two chunks, at once
    assert b"".join(writes) == received


def test_the_server_configuration_writes_each_answer_once() -> None:
    """The servers' own configuration (``serve http``, ``serve mcp``) runs the protocol."""
    config = server_config(_answer, log_level="warning")
    config.load()
    assert config.http_protocol_class is CombinedWritesProtocol
    assert config.ws_protocol_class is None


def test_a_large_body_is_written_as_it_is() -> None:
    """A body past MOST_HELD is not copied into one write with the head held before it:
    the head goes first, then the body, in order."""
    with _served(CombinedWritesProtocol) as (url, writes):
        received = _exchange(url, CLOSING.replace(b"GET / ", b"GET /large "))
    assert received.endswith(b"\r\n\r\n" + LARGE)
    assert len(writes) == 2 and writes[1] == LARGE
    assert b"".join(writes) == received


def test_a_client_that_ends_its_side_first_gets_its_answer() -> None:
    """On uvloop (the servers' loop), a transport closes once the client's end of the
    connection arrives: an answer still held then would be lost. Here the client ends
    its side while the answer is being made."""
    CLIENT_ENDED.clear()
    request = b"GET /after-eof HTTP/1.1\r\nHost: test\r\n\r\n"
    with serving(_answer) as url:  # the servers' own configuration: uvloop
        received = _exchange(url, request, ended=CLIENT_ENDED)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"\r\n\r\n" + BODY)
