"""The HTTP API's ASGI app driven in process: no network, no load generator, no
uvicorn, so the figure is what the app itself (FastAPI, the server's handling, the
library) costs per request on one core. Not a test. From the repository root::

    .venv/bin/python bench/bench_app.py remember          # 3 rounds of 2,000 requests
    .venv/bin/python bench/bench_app.py recall --concurrency 1

The store is ``bench_http.py``'s (10,000 records, a member's API key). ``--concurrency``
tasks send requests one after another, as keep-alive clients would, so that requests
served at once are group-committed as under load. ``--every-write-signed`` makes the app
as ``serve http --workers N`` does. To compare two revisions, run it from a clean export
of each, alternating (``PYTHONPATH=<export>/src``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message

from bench_http import MASTER, WORDS, prepare
from deleatur import Memory, from_bytes
from deleatur.servers.http import create_app


def request(operation: str, i: int, key: str) -> tuple[dict[str, Any], bytes]:
    """The scope and body of the ``i``-th request: those of ``bench_http.py``."""
    headers = [(b"host", b"bench"), (b"authorization", f"Bearer {key}".encode())]
    if operation == "recall":
        query = f"q={WORDS[(i * 31) % len(WORDS)]}&limit=10".encode()
        method, path, body = "GET", "/v1/memories/search", b""
    else:
        query, method, path = b"", "POST", "/v1/memories"
        body = json.dumps({"text": f"bench note {i} {WORDS[i % len(WORDS)]}", "subject": f"person {i % 500}"}).encode()
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    return scope, body


async def one(app: ASGIApp, operation: str, i: int, key: str) -> None:
    scope, body = request(operation, i, key)
    sent = False
    status = 0

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays until the response is sent
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    if status not in (200, 201):
        raise SystemExit(f"{operation} request {i} answered {status}")


async def rounds(app: ASGIApp, args: argparse.Namespace, key: str) -> list[float]:
    """Microseconds per request, one figure per round."""
    startup: asyncio.Queue[Message] = asyncio.Queue()
    events: asyncio.Queue[Message] = asyncio.Queue()
    await startup.put({"type": "lifespan.startup"})

    async def lifespan() -> None:
        await app({"type": "lifespan", "asgi": {"version": "3.0"}}, startup.get, events.put)

    running = asyncio.create_task(lifespan())
    await events.get()
    sent = iter(range(1 << 62))
    await asyncio.gather(*(one(app, args.operation, next(sent), key) for _ in range(64)))  # warm-up
    figures = []
    for _ in range(args.rounds):
        left = iter(range(args.requests))
        start = time.perf_counter()
        await asyncio.gather(*(client(app, args.operation, left, sent, key) for _ in range(args.concurrency)))
        figures.append((time.perf_counter() - start) / args.requests * 1e6)
    await startup.put({"type": "lifespan.shutdown"})
    await events.get()
    await running
    return figures


async def client(app: ASGIApp, operation: str, left: Iterator[int], sent: Iterator[int], key: str) -> None:
    """One keep-alive client: its next request once the last is answered, while any are left."""
    for _ in left:
        await one(app, operation, next(sent), key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("operation", choices=("remember", "recall"))
    parser.add_argument("--requests", type=int, default=2000, help="per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--every-write-signed", action="store_true", help="as `serve http --workers N`")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        key = prepare(path, 10_000)
        app = create_app(lambda: Memory.open(path, from_bytes(MASTER)), sign_every_write=args.every_write_signed)
        figures = asyncio.run(rounds(app, args, key))
    per_request = statistics.median(figures)
    print(
        f"{args.operation}: {per_request:,.0f} µs per request (median of {args.rounds} rounds:"
        f" {', '.join(f'{f:,.0f}' for f in figures)}), {1e6 / per_request:,.0f} requests/s on one core"
    )


if __name__ == "__main__":
    main()
