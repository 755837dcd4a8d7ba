"""Servers on a loopback port for tests: uvicorn in a thread, on a socket bound and
listening before the thread starts, so the first request waits in the kernel's
backlog until the server takes it: readiness needs neither sleeps nor retries."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from deleatur import Memory, NewMemory, Role, Space, from_bytes
from deleatur.erasure.verify import verify_certificate
from deleatur.log.note import Verifier
from deleatur.servers.calls import record_bytes
from deleatur.servers.workers import server_config

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


def reads_of_records(open_memory: Callable[[], Memory]) -> list[tuple[str, str, str | None]]:
    """The action, outcome and error of each list and history call in the audit trail."""
    with open_memory() as memory:
        entries = [e.entry.fields for e in memory.audit_entries(calls_only=True)]
    return [(f["action"], f["outcome"], f.get("error")) for f in entries if f["action"] in ("list", "history")]


@contextmanager
def serving(app: ASGIApp, **options: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 for the ``with`` block, configured as the servers are
    but for ``options`` (uvicorn's); yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    # Idle connections kept past any test's length: a client that takes one the server
    # is closing as idle (uvicorn's default is 5 s, which a loaded machine can leave a
    # pooled connection unused for) fails its request with a ReadError, HTTP's own race.
    defaults: dict[str, Any] = {"log_level": "warning", "timeout_keep_alive": 300}
    config = server_config(app, **(defaults | options))
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


#: What a forged certificate slips in beside what was signed, which no report may echo.
SLIPPED = "Art. 17(3)(b) - retained for a legal claim of Erin Example"


def certificate_texts(certificate: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """A certificate's text as issued, and two forgeries of it, each with the checks it
    fails: one that repeats its basis, another value first (json.loads keeps the last,
    the signed one; a reader that keeps the first, or a person, reads the other), and
    one with a member beside certificate and signature, which nothing signs."""
    text = json.dumps(certificate, indent=2)
    real = f'"basis": {json.dumps(certificate["certificate"]["request"]["basis"])}'
    assert text.count(real) == 1
    repeated = text.replace(real, f'"basis": {json.dumps(SLIPPED)}, {real}')
    unsigned = json.dumps({**certificate, "note": SLIPPED}, indent=2)
    return [(text, []), (repeated, ["format"]), (unsigned, ["format"])]


def assert_the_librarys_report(report: Mapping[str, Any], text: str, vkey: str, failed: list[str]) -> None:
    """``report``, an entry point's for the certificate ``text`` under the key ``vkey``, is
    the library's for that text, fails the checks ``failed``, and echoes none of it."""
    assert report == verify_certificate(text, expected_key=Verifier.from_vkey(vkey)).to_json()
    assert [c["name"] for c in report["checks"] if c["passed"] is False] == failed
    assert "retained" not in json.dumps(report)


def receipt_texts(receipt: Mapping[str, Any], other_id: str) -> list[tuple[str, str | None]]:
    """A receipt's text as issued, and two forgeries of it, each with what its refusal
    says: one that repeats its record id, another record's first (json.loads keeps the
    last, the one proven), and one with a member besides its four."""
    text = json.dumps(receipt, indent=2)
    first = f'"record_id": {json.dumps(receipt["record_id"])}'
    assert text.count(first) == 1
    repeated = text.replace(first, f'"record_id": {json.dumps(other_id)}, {first}')
    unsigned = json.dumps({**receipt, "note": SLIPPED}, indent=2)
    return [(text, None), (repeated, "repeats a key"), (unsigned, "a member besides")]


def assert_refused_unechoed(message: str, problem: str, other_id: str) -> None:
    """A forged receipt's refusal says what is wrong, and nothing the forger wrote."""
    assert problem in message and other_id not in message and "retained" not in message, message
