"""Concurrent clients on loopback, bounded in count and time, ending with an exact
count: every acknowledged write is there once, nothing lost, nothing duplicated,
while recalls and erasures of other subjects run alongside."""

from __future__ import annotations

import ast
import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from deleatur import Role
from deleatur.errors import InvalidInputError
from deleatur.servers.http import create_app
from deleatur.servers.workers import YOUNG_OBJECTS_COLLECTED_AT, how_it_ended, listen

from .conftest import MASTER
from .serving import api_key, new_store, serving

# The worker tests read /proc and wait on pidfds.
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and waits on pidfds (Linux)")

CLIENTS = 24
WRITES = 25
DEADLINE_S = 90


async def _load(url: str, key: str) -> tuple[list[str], list[str]]:
    limits = httpx.Limits(max_connections=CLIENTS + 2)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits, headers=headers) as http:

        async def writer(n: int) -> list[str]:
            ids = []
            for i in range(WRITES):
                body = {"text": f"load note w{n} i{i} tag{n}x{i}", "subject": f"customer {n % 5}", "user_id": "load"}
                response = await http.post("/v1/memories", json=body)
                assert response.status_code == 201, response.text
                ids.append(response.json()["id"])
                if i % 5 == 0:
                    recalled = await http.get("/v1/memories/search", params={"q": f"tag{n}x{i}", "user_id": "load"})
                    assert [h["id"] for h in recalled.json()["hits"]] == [ids[-1]]
            return ids

        async def eraser() -> list[str]:
            done = []
            for i in range(10):
                body = {"text": f"short-lived {i}", "subject": f"leaver {i}", "user_id": "load"}
                assert (await http.post("/v1/memories", json=body)).status_code == 201
                erased = await http.delete(f"/v1/subjects/leaver {i}", headers={"Idempotency-Key": f"LOAD-{i}"})
                assert erased.status_code == 202, erased.text
                assert erased.json()["counts"]["records"] == 1
                done.append(erased.json()["request_id"])
            return done

        results = await asyncio.gather(*(writer(n) for n in range(CLIENTS)), eraser())
        written = [record_id for ids in results[:-1] for record_id in ids]
        listed = await http.get("/v1/memories", params={"user_id": "load", "limit": 10_000})
        return written, [r["id"] for r in listed.json()["records"]]


@pytest.mark.parametrize("handles", [1, 4])
def test_concurrent_clients_lose_and_duplicate_nothing(tmp_path: Path, handles: int) -> None:
    opener = new_store(tmp_path / "mem.db")
    key = api_key(opener, Role.MEMBER)
    app = create_app(opener, handles=handles)
    started = time.monotonic()
    with serving(app) as url:
        written, listed = asyncio.run(asyncio.wait_for(_load(url, key), DEADLINE_S))
    assert len(written) == CLIENTS * WRITES
    assert len(set(written)) == len(written)
    assert Counter(listed) == Counter(written)  # exactly the acknowledged writes, each once
    assert 1 <= app.state.pool.size <= handles
    assert time.monotonic() - started < DEADLINE_S


@contextmanager
def _command(path: Path, workers: int) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``deleatur serve http --workers N`` as its own process: its first stderr line comes
    once it listens with every worker started, and connections wait in the backlog
    until a worker takes them."""
    command = [
        str(Path(sys.executable).with_name("deleatur")),
        "serve",
        "http",
        "--port",
        "0",
        "--workers",
        str(workers),
    ]
    env = {**os.environ, "DELEATUR_STORE": str(path), "DELEATUR_MASTER_KEY": MASTER.hex()}
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as server:
        assert server.stderr is not None
        line = server.stderr.readline()
        try:
            assert line.startswith("deleatur HTTP API on http://127.0.0.1:"), line
            assert line.endswith(f", {workers} worker processes\n" if workers > 1 else "/openapi.json)\n"), line
            yield line.split()[4], server
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)


@linux_only
def test_worker_processes_share_one_store_and_lose_nothing(tmp_path: Path) -> None:
    opener = new_store(tmp_path / "mem.db")
    key = api_key(opener, Role.MEMBER)
    with _command(tmp_path / "mem.db", 2) as (url, server):
        workers = _children(server.pid)
        assert len(workers) == 2
        written, listed = asyncio.run(asyncio.wait_for(_load(url, key), DEADLINE_S))
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    assert len(written) == CLIENTS * WRITES
    assert Counter(listed) == Counter(written)
    assert not any(_alive(pid) for pid in workers)
    with opener() as memory:
        assert memory.verify_audit().ok  # both processes' entries form one consistent log


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_stops_the_server_cleanly(tmp_path: Path, workers: int, stop: signal.Signals) -> None:
    """Ctrl-C or a service manager's SIGTERM: exit 0 with no traceback, however many workers."""
    new_store(tmp_path / "mem.db")
    with _command(tmp_path / "mem.db", workers) as (url, server):
        assert httpx.get(f"{url}/openapi.json", timeout=30).status_code == 200  # serving
        server.send_signal(stop)
        assert server.wait(timeout=30) == 0
        assert server.stderr is not None
        assert "Traceback" not in server.stderr.read()


@linux_only
def test_a_worker_that_dies_stops_the_server(tmp_path: Path) -> None:
    new_store(tmp_path / "mem.db")
    with _command(tmp_path / "mem.db", 2) as (_, server):
        first, second = _children(server.pid)
        os.kill(first, signal.SIGKILL)
        assert server.wait(timeout=30) == 1  # not a server quietly running at half capacity
        assert server.stderr is not None
        said = server.stderr.read()
    assert not _alive(second)
    # An operator learns why, not only that it ended.
    assert said == f"error: worker 1 of 2 (pid {first}) was killed by signal 9 (SIGKILL); stopping the others\n"


def test_how_a_process_ended_in_words() -> None:
    assert how_it_ended(0) == "exited with status 0"
    assert how_it_ended(3 << 8) == "exited with status 3"
    assert how_it_ended(signal.SIGSEGV) == "was killed by signal 11 (SIGSEGV)"


@linux_only
def test_workers_end_with_a_killed_parent(tmp_path: Path) -> None:
    new_store(tmp_path / "mem.db")
    with _command(tmp_path / "mem.db", 2) as (_, server):
        exits = [os.pidfd_open(pid) for pid in _children(server.pid)]
        server.kill()  # SIGKILL: the parent cannot forward anything
    try:
        # A pidfd turns readable when its process ends: no orphan keeps the port.
        for fd in exits:
            assert select.select([fd], [], [], 30)[0], "a worker outlived its parent by 30 s"
    finally:
        for fd in exits:
            os.close(fd)


def test_a_worker_whose_app_fails_stays_in_its_own_process() -> None:
    # The forked workers must end in _child, never run on through the caller's code.
    program = """
import sys
from deleatur.servers.workers import listen, run_workers
def build():
    raise RuntimeError("no app")
try:
    status = run_workers(build, listen("127.0.0.1", 0), workers=2)
except BaseException as exc:
    print("escaped", type(exc).__name__, flush=True)
    sys.exit(3)
print("status", status, flush=True)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, "status 1\n"), done.stderr
    # The first failure stops the other worker, which may not have got as far.
    assert "RuntimeError: no app" in done.stderr


def test_a_serving_process_collects_its_youngest_objects_less_often_and_every_second() -> None:
    """While it serves, a process has the start's objects frozen and collects its youngest
    generation past YOUNG_OBJECTS_COLLECTED_AT only, and every second: an idle server
    collects the garbage it made. After, the collector is as before."""
    program = """
import asyncio, gc, os, signal, weakref
from deleatur.servers.workers import listen, run_workers
class Cycle:
    pass
async def app(scope, receive, send):
    assert scope["type"] == "lifespan"
    await receive()
    print("serving", gc.get_threshold(), gc.get_freeze_count() > 0, flush=True)
    collected = asyncio.Event()
    garbage = Cycle()
    garbage.itself = garbage
    alive = weakref.ref(garbage, lambda _: collected.set())
    del garbage
    async def stop_once_collected():
        try:
            await asyncio.wait_for(collected.wait(), 30)
        finally:
            print("collected", alive() is None, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
    task = asyncio.ensure_future(stop_once_collected())
    await send({"type": "lifespan.startup.complete"})
    await receive()
    await send({"type": "lifespan.shutdown.complete"})
print("before", gc.get_threshold(), flush=True)
status = run_workers(lambda: app, listen("127.0.0.1", 0), workers=1)
print("after", status, gc.get_threshold(), gc.get_freeze_count(), flush=True)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    before, serving, collected, after = done.stdout.splitlines()
    young, older, oldest = ast.literal_eval(before.removeprefix("before "))
    assert serving == f"serving ({YOUNG_OBJECTS_COLLECTED_AT}, {older}, {oldest}) True"
    assert collected == "collected True"
    assert after == f"after 0 ({young}, {older}, {oldest}) 0"


_PIDS_SERVER = """
import os, sys, time
from deleatur.servers.workers import listen, run_workers

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/block":
        print("blocking", flush=True)
        time.sleep(1)  # the worker's loop is held: it accepts nothing meanwhile
    body = str(os.getpid()).encode()
    length = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": length})
    await send({"type": "http.response.body", "body": body})

sock = listen("127.0.0.1", 0, workers=2)
port = sock.getsockname()[1]
sys.exit(run_workers(lambda: app, sock, workers=2, started=lambda: print(port, flush=True)))
"""


def _ask(connection: socket.socket, path: str) -> None:
    connection.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())


def _served_by(connection: socket.socket) -> int:
    with connection:
        answer = b""
        while chunk := connection.recv(4096):
            answer += chunk
    return int(answer.split(b"\r\n\r\n", 1)[1])


@linux_only
def test_workers_share_a_burst_of_connections_while_one_is_busy() -> None:
    """Clients connecting at once, as a load generator's do, reach both workers even
    while one is busy with a long call: on one shared listening socket, the other
    accepted them all, and kept them (keep-alive) after the busy one was free again.
    None is refused just after the server says it listens."""
    with subprocess.Popen([sys.executable, "-c", _PIDS_SERVER], stdout=subprocess.PIPE, text=True) as server:
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            first = socket.create_connection(("127.0.0.1", port), timeout=30)
            _ask(first, "/block")
            assert server.stdout.readline() == "blocking\n"
            burst = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(31)]
            for connection in burst:
                _ask(connection, "/")
            busy = _served_by(first)
            served_by = [_served_by(connection) for connection in burst]
            workers = set(_children(server.pid))
            assert busy in workers and set(served_by) == workers and len(workers) == 2
            # Another server on the port is refused, not given a share of its connections.
            with pytest.raises(InvalidInputError, match=f"cannot listen on 127.0.0.1:{port}"):
                listen("127.0.0.1", port, workers=2)
        finally:
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 0


@linux_only
def test_no_start_line_when_a_worker_cannot_listen() -> None:
    program = """
import sys
from deleatur.servers import workers
def cannot(sock):
    raise OSError("no room on the port")
workers._listening = cannot
status = workers.run_workers(lambda: None, workers.listen("127.0.0.1", 0, workers=2), workers=2,
                             started=lambda: print("started", flush=True))
print("status", status, flush=True)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, "status 1\n"), done.stderr
    assert "OSError: no room on the port" in done.stderr


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
