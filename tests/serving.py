"""Servers on a loopback port for tests: uvicorn in a thread, on a socket bound and
listening before the thread starts, so the first request waits in the kernel's
backlog until the server takes it: readiness needs neither sleeps nor retries."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from deleatur import Memory, NewMemory, Role, Space, from_bytes
from deleatur.servers.calls import record_bytes

from .conftest import MASTER


def new_store(path: Path) -> Callable[[], Memory]:
    """A signed store at ``path``; returns how servers open it."""
    memory, _ = Memory.init(path, from_bytes(MASTER))
    memory.close()
    return lambda: Memory.open(path, from_bytes(MASTER))


def api_key(open_memory: Callable[[], Memory], role: Role, *, scopes: list[str] | None = None) -> str:
    """A new principal's API key, made by the local operator."""
    with open_memory() as memory:
        return memory.create_principal(f"test {role.value}", role, scopes=scopes)[1]


def paged_by_bytes(memory: Memory, space: Space, key: str | None = None) -> tuple[int, list[list[str]]]:
    """Eight records in ``space`` (with ``key``: its eight versions), and a byte cap under
    which a listing's pages are, by record id: two short records each, but a short one
    alone before a record larger than the cap, which comes alone too."""
    texts = ["x" * 1000] * 5 + ["y" * 9000] + ["x" * 1000] * 2
    records = memory.remember_many([NewMemory(text, subject="Pages", key=key) for text in texts], space=space)
    ids = [r.id for r in records]
    short = {record_bytes(r) for r in records if r.text.startswith("x")}
    assert ids == sorted(ids) and len(short) == 1
    cap = 2 * short.pop()
    assert record_bytes(records[5]) > cap
    return cap, [ids[0:2], ids[2:4], ids[4:5], ids[5:6], ids[6:8]]


@contextmanager
def serving(app: ASGIApp) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 for the ``with`` block; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    # Idle connections kept past any test's length: a client that takes one the server
    # is closing as idle (uvicorn's default is 5 s, which a loaded machine can leave a
    # pooled connection unused for) fails its request with a ReadError, HTTP's own race.
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_keep_alive=300)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"
