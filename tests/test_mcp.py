"""The MCP server through the SDK's own client: over stdio (spawning `deleatur serve
mcp`, the local operator) and over streamable HTTP (uvicorn on loopback)."""

from __future__ import annotations

import functools
import json
import select
import subprocess
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deleatur import Memory, NewMemory, Role, Space, from_bytes
from deleatur.erasure.requests import is_request_id
from deleatur.model import SpaceFilter
from deleatur.servers.auth import BearerGate
from deleatur.servers.calls import MAX_EXPORTS
from deleatur.servers.mcp import build_server, http_app
from deleatur.servers.pool import HandlePool

from .conftest import MASTER
from .serving import (
    api_key,
    assert_refused_unechoed,
    assert_the_librarys_report,
    certificate_texts,
    new_store,
    paged_by_bytes,
    reads_of_records,
    receipt_texts,
    serving,
)

Session = Callable[[ClientSession], Awaitable[None]]
SESSION_SECONDS = 120

READ_ONLY = {
    "recall",
    "get_memory",
    "list_memories",
    "history",
    "erasure_status",
    "erasure_certificate",
    "verify_certificate",
    "export_memory",
    "receipt",
    "verify_receipt",
    "verify_log",
    "verify_audit",
    "export_public_key",
    "explain_decision",
}
# forget and restrict take something away no call gives back: MCP's destructive_hint
# false promises only additive updates.
DESTRUCTIVE = {"delete", "delete_all", "purge_expired", "rectify", "forget", "restrict"}
ADDITIVE = {"remember", "record_decision"}


def _text(result: CallToolResult) -> str:
    assert isinstance(result.content[0], TextContent)
    return result.content[0].text


async def _call(session: ClientSession, tool: str, **arguments: Any) -> CallToolResult:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, _text(result)
    return result


async def _data(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    structured = (await _call(session, tool, **arguments)).structured_content
    assert isinstance(structured, dict)
    return structured


async def _tour(session: ClientSession) -> None:
    """Every tool, through the session, as an agent would use them."""
    await session.initialize()
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert set(tools) == READ_ONLY | DESTRUCTIVE | ADDITIVE
    hints = {name: tool.annotations for name, tool in tools.items() if tool.annotations is not None}
    assert {name for name, hint in hints.items() if hint.read_only_hint} == READ_ONLY
    assert {name for name, hint in hints.items() if hint.destructive_hint} == DESTRUCTIVE
    assert {name for name, hint in hints.items() if hint.destructive_hint is False} == ADDITIVE
    limit = tools["recall"].input_schema["properties"]["limit"]
    assert (limit["minimum"], limit["maximum"], limit["default"]) == (1, 1000, 10)  # as the library bounds it

    first = await _call(session, "remember", text="Refunds within 30 days", subject="refund_window", user_id="c1")
    record = first.structured_content
    assert record is not None
    assert _text(first) == f"Remembered {record['id']} for 'refund_window'."
    keyed = await _data(session, "remember", text="Phone +100", subject="Alice", key="alice::phone", user_id="c1")
    recalled = await _data(session, "recall", query="refunds", user_id="c1")
    assert [h["id"] for h in recalled["hits"]] == [record["id"]]
    got = await _data(session, "get_memory", record_id=record["id"], user_id="c1")
    assert got["records"][0]["text"] == "Refunds within 30 days"
    assert (await _data(session, "list_memories", user_id="c1"))["count"] == 2
    fixed = await _call(session, "rectify", key="alice::phone", text="Phone +101", reason="typo", user_id="c1")
    assert f"supersedes {keyed['id']}" in _text(fixed)
    assert (await _data(session, "history", key="alice::phone", user_id="c1"))["count"] == 2
    retired = await _call(session, "forget", key="alice::phone", user_id="c1")
    assert "stays in history" in _text(retired)

    receipt = await _data(session, "receipt", record_id=record["id"], user_id="c1")
    key = await _data(session, "export_public_key")
    assert (await _data(session, "verify_receipt", receipt=receipt, key=key["vkey"]))["verdict"] == "PASS"
    assert (await _data(session, "verify_log"))["verdict"] == "PASS"
    assert (await _data(session, "verify_audit"))["verdict"] == "PASS"
    exported = await _data(session, "export_memory", user_id="c1")
    assert exported["counts"]["records"] == 3
    both = await session.call_tool("export_memory", {"user_id": "c1", "subject": "Alice"})
    assert both.is_error and "exactly one of a subject or a user id" in _text(both)  # as over HTTP

    decided = await _call(session, "record_decision", summary="Refund order #91", used=[record["id"]], user_id="c1")
    decision_id = decided.structured_content["decision"]["id"] if decided.structured_content else ""
    assert _text(decided) == f"Recorded decision {decision_id} using 1 belief(s); explain it with explain_decision."
    explained = await _call(session, "explain_decision", decision_id=decision_id, user_id="c1")
    assert f"{record['id']}: Refunds within 30 days" in _text(explained)

    # A user's every space, as delete_all, the CLI and HTTP read a user id; another user's is kept.
    in_run = {"user_id": "c1", "agent_id": "support", "run_id": "r1"}
    await _call(session, "remember", text="Refunds by card too", subject="refund_window", **in_run)
    await _call(session, "remember", text="Refunds for c9", subject="refund_window", user_id="c9")
    plan = await _call(session, "delete", subject="refund_window", user_id="c1", dry_run=True)
    assert plan.structured_content is not None and plan.structured_content["plan"]["total"] == 2
    kept = " 1 record(s) of the subject outside this scope are kept, and its data key with them."
    assert _text(plan).startswith("Dry run: would erase 2 record(s) for 'refund_window' (0 through lineage)." + kept)
    erased = await _call(session, "delete", subject="refund_window", user_id="c1", request_id="DEL-1")
    assert _text(erased).startswith(
        "Erased 2 record(s) for 'refund_window'; redacted its values from 1 decision snapshot(s)." + kept + "\n"
        "  0 data key(s) destroyed;"
    )
    assert (await _data(session, "list_memories", **in_run))["count"] == 0
    explained = await _call(session, "explain_decision", decision_id=decision_id, user_id="c1")
    assert f"{record['id']}: [redacted: erased]" in _text(explained)
    none = await _call(session, "delete", subject="refund_window", user_id="c1", request_id="DEL-2")
    assert _text(none).startswith(
        "No records found for 'refund_window'." + kept + "\n  Nothing was held: no record matched this request"
        " within its scope, so none was erased; request DEL-2 is complete — get its signed certificate with"
        " erasure_certificate('DEL-2')"
    )
    # A refused erasure recorded as failed (an ambiguous subject) names its request: retried
    # under it, it is completed, and none is left open.
    for spelling in ("Rita Ruiz", "RITA RUIZ"):
        await _call(session, "remember", text="a note", subject=spelling, user_id="amb")
    ambiguous = await session.call_tool("delete", {"subject": "Rita Ruiz", "user_id": "amb"})
    assert ambiguous.is_error and isinstance(ambiguous.structured_content, dict)
    failed = ambiguous.structured_content["error"]["request_id"]
    assert _text(ambiguous).endswith(f" [request {failed} recorded as failed: retry under this request id]")
    assert (await _data(session, "erasure_status", request_id=failed))["status"] == "failed"
    retried = await _call(
        session, "delete", subject="Rita Ruiz", user_id="amb", request_id=failed, allow_ambiguous=True
    )
    assert f"request {failed} is complete" in _text(retried)
    nothing = await _data(session, "erasure_certificate", request_id="DEL-2")
    verdict = await _data(session, "verify_certificate", certificate=nothing, expected_pubkey=key["vkey"])
    assert verdict["verdict"] == "PASS" and verdict["checks"][4]["detail"].startswith("nothing was held")
    status = await _call(session, "erasure_status", request_id="DEL-1")
    assert _text(status) == "Request DEL-1 is complete: received done, records_erased done, keys_destroyed done."
    certificate = await _data(session, "erasure_certificate", request_id="DEL-1")
    verdict = await _data(session, "verify_certificate", certificate=certificate, expected_pubkey=key["vkey"])
    assert verdict["verdict"] == "PASS"

    assert "Restricted processing of 'Alice'" in _text(await _call(session, "restrict", subject="Alice", reason="x"))
    refused = await session.call_tool("remember", {"text": "more", "subject": "Alice", "user_id": "c1"})
    assert refused.is_error
    error = dict(refused.structured_content["error"])
    assert is_request_id(error.pop("request_id"))  # the call's, which its audit entry carries
    assert error == {"code": "subject_restricted", "message": error["message"]}
    assert _text(refused).startswith("Error (subject_restricted): ")
    missing = await session.call_tool("get_memory", {"record_id": "nope"})
    assert missing.is_error

    await _call(session, "remember", text="x", subject="S", user_id="acct", agent_id="a")
    unnamed = await session.call_tool("delete_all", {"request_id": "ACC-0"})  # never "default" by default
    assert unnamed.is_error and "user_id" in _text(unnamed)
    account = await _call(session, "delete_all", user_id="acct", request_id="ACC-1")
    assert _text(account).startswith("Erased all memory for 'acct' (1 record(s)).")
    nothing_due = await _call(session, "purge_expired", older_than_days=3650)
    assert _text(nothing_due) == (
        "Nothing to purge: no record is due, and no request was recorded (the audit log has the call)."
    )
    assert nothing_due.structured_content is not None and nothing_due.structured_content["nothing_due"]
    dry = await _call(session, "purge_expired", older_than_days=0, dry_run=True)
    assert dry.structured_content is not None
    kept = dry.structured_content["plan"]["kept_restricted"]
    assert kept > 0  # the subject restricted above: its records stay, and the dry run says so
    assert f" Would keep {kept} record(s) of restricted subjects (Art. 18).\n  confirmation token" in _text(dry)
    purged = await _call(session, "purge_expired", older_than_days=0, request_id="RET-7")
    assert _text(purged).startswith("Purged ")
    assert f"past their expiry or older than 0 days [request RET-7]. Kept {kept} record(s)" in _text(purged)
    again = await _data(session, "purge_expired", older_than_days=0, request_id="RET-7")
    assert again["request"]["id"] == "RET-7" and again["repeated"]


def _over_stdio(tmp_path: Path, env: dict[str, str], session_run: Session) -> None:
    deleatur = Path(sys.executable).with_name("deleatur")
    assert deleatur.exists(), f"the deleatur command is not installed next to {sys.executable}"
    params = StdioServerParameters(command=str(deleatur), args=["serve", "mcp"], env=env)

    async def run() -> None:
        # A hung server fails the test instead of hanging the suite.
        with anyio.fail_after(SESSION_SECONDS), (tmp_path / "stderr").open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session_run(session)

    anyio.run(run)


def test_stdio_as_local_operator_and_as_an_agent(tmp_path: Path) -> None:
    store = tmp_path / "mem.db"
    agent = api_key(new_store(store), Role.AGENT)
    env = {"DELEATUR_STORE": str(store), "DELEATUR_MASTER_KEY": MASTER.hex()}
    _over_stdio(tmp_path, env, _tour)
    _over_stdio(tmp_path, {**env, "DELEATUR_API_KEY": agent}, _agent)


def test_a_scoped_agent_follows_its_own_erasure(tmp_path: Path) -> None:
    store = tmp_path / "mem.db"
    agent = api_key(new_store(store), Role.AGENT, scopes=["c2"])
    env = {"DELEATUR_STORE": str(store), "DELEATUR_MASTER_KEY": MASTER.hex(), "DELEATUR_API_KEY": agent}
    _over_stdio(tmp_path, env, _scoped_agent)


def test_stdio_refuses_a_message_that_repeats_a_key(tmp_path: Path) -> None:
    """As over HTTP (_a_body_that_repeats_a_key_is_refused): the SDK's parser would keep
    user_id's last value and write into bob's space. The request is answered with the
    refusal under its own id, and the session goes on; a notification is dropped."""
    store = tmp_path / "mem.db"
    opener = new_store(store)
    env = {"DELEATUR_STORE": str(store), "DELEATUR_MASTER_KEY": MASTER.hex()}
    deleatur = str(Path(sys.executable).with_name("deleatur"))
    with subprocess.Popen(
        [deleatur, "serve", "mcp"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as server:
        stdin, stdout, stderr = server.stdin, server.stdout, server.stderr
        assert stdin is not None and stdout is not None and stderr is not None

        def send(line: str) -> None:
            stdin.write(line.encode() + b"\n")
            stdin.flush()

        def answer() -> dict[str, Any]:
            ready, _, _ = select.select([stdout], [], [], SESSION_SECONDS)
            assert ready, "no answer"
            found: dict[str, Any] = json.loads(stdout.readline())
            return found

        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}))
        assert answer()["id"] == 1
        send('{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        call = (
            '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "remember", "arguments":'
            ' {"text": "dup", "subject": "Dup Dan", "user_id": "alice", "user_id": "bob"}}}'
        )
        send(call)
        message = 'invalid_request: the message repeats a key in one object: "user_id"'
        refused = answer()
        assert (refused["id"], refused["error"]["message"]) == (2, message)
        assert refused["error"]["data"]["code"] == "invalid_request"
        send('{"jsonrpc": "2.0", "method": "notifications/x", "params": {"ann@example.com": 1, "ann@example.com": 2}}')
        send(call.replace('"id": 2', '"id": 3') + " and then no JSON")  # whose, it cannot tell
        unread = answer()
        assert (unread["id"], unread["error"]["message"]) == (None, message)
        for unclear in ('"id": true', '"id": 3, "id": 5'):  # JSON-RPC ids are strings or integers
            send(call.replace('"id": 2', unclear))
            assert answer()["id"] is None
        send(call.replace('"id": 2', '"id": "seven"').replace('"dup"', "1" + "0" * 5000))  # too long an integer
        long = answer()
        assert (long["id"], long["error"]["data"]["code"]) == ("seven", "invalid_request")
        assert "more than 4300 digits" in long["error"]["message"]
        lone_surrogate = call.replace('"id": 2', '"id": 8').replace('"dup"', '"\\ud800"')
        send(lone_surrogate.replace(', "user_id": "bob"', ""))  # the SDK's parser drops it: no answer came
        lone = answer()
        assert (lone["id"], lone["error"]["data"]["code"]) == (8, "invalid_request")
        assert "not valid UTF-8" in lone["error"]["message"]
        # What the SDK cannot read at all it left unanswered, its client waiting for good.
        send("")  # a blank line is nobody's message: skipped, unanswered
        send("garbage")
        garbage = answer()
        assert (garbage["id"], garbage["error"]["message"]) == (None, "invalid_request: the message is not JSON")
        send(call.replace('"id": 2', '"id": 9')[:-1])  # cut short: whose, it cannot tell
        assert answer()["id"] is None
        nested = '{"a": ' * 150 + "1" + "}" * 150
        deep = call.replace('"id": 2', '"id": 10').replace('"dup"', '"d", "metadata": ' + nested)
        send(deep.replace(', "user_id": "bob"', ""))
        too_deep = answer()
        assert (too_deep["id"], too_deep["error"]["message"]) == (
            10,
            "invalid_request: the message is nested more than 100 levels deep",
        )
        send(call.replace('"id": 2', '"id": 4').replace(', "user_id": "bob"', ""))
        done = answer()
        assert done["id"] == 4 and not done["result"]["isError"], done
        stdin.close()
        assert server.wait(timeout=SESSION_SECONDS) == 0
        logged = stderr.read().decode()
        assert "dropped a message that the SDK would misread" in logged and "ann@example.com" not in logged
    with opener() as memory:
        assert [r.text for r in memory.list(subject="Dup Dan", space=Space("alice"))] == ["dup"]
        assert list(memory.list(subject="Dup Dan", space=Space("bob"))) == []


async def _scoped_agent(session: ClientSession) -> None:
    """The erasure's reply points to its certificate: a key scoped to the erased user
    can fetch it, and no other user's erasure."""
    await session.initialize()
    await _call(session, "remember", text="Hank's ticket", subject="Hank", user_id="c2")
    plan = await _data(session, "delete", subject="Hank", user_id="c2", dry_run=True)
    await _call(session, "delete", subject="Hank", user_id="c2", confirmation=plan["token"], request_id="DEL-C2")
    status = await _data(session, "erasure_status", request_id="DEL-C2")
    assert status["status"] == "complete"
    certificate = await _data(session, "erasure_certificate", request_id="DEL-C2")
    verdict = await _data(session, "verify_certificate", certificate=certificate)
    assert verdict["verdict"] == "PASS"
    for scope in ({"user_id": "c3"}, {}):  # left out, the scope is every user's spaces: not this key's
        elsewhere = await session.call_tool("delete", {"subject": "Hank", "dry_run": True, **scope})
        assert elsewhere.is_error and elsewhere.structured_content is not None
        assert elsewhere.structured_content["error"]["missing"] == "scope"
    missing = await session.call_tool("erasure_status", {"request_id": "DEL-NONE"})
    assert missing.is_error and missing.structured_content is not None
    assert missing.structured_content["error"]["missing"] == "scope"  # as for another user's request


async def _agent(session: ClientSession) -> None:
    """An agent principal: writes, but erases only with its own dry run's token."""
    await session.initialize()
    await _call(session, "remember", text="Hank's ticket", subject="Hank", user_id="c2")
    refused = await session.call_tool("delete", {"subject": "Hank", "user_id": "c2"})
    assert refused.is_error
    assert _text(refused).startswith("Error (confirmation_required): ")
    assert "request" not in _text(refused).split(": ", 1)[1]  # none was recorded: no id to retry under
    plan = await _data(session, "delete", subject="Hank", user_id="c2", dry_run=True)
    done = await _call(session, "delete", subject="Hank", user_id="c2", confirmation=plan["token"])
    assert _text(done).startswith("Erased 1 record(s) for 'Hank'.")
    bad = await session.call_tool(
        "remember", {"text": "x", "subject": "Iris Quartz", "confidence": "Iris Quartz, HIV+"}
    )
    assert bad.is_error and _text(bad) == "Error (invalid_request): remember: invalid argument(s): confidence"
    # As over HTTP: an expiry in microseconds (it was no argument of the tool at all).
    kept = await _data(session, "remember", text="Iris's trial", subject="Iris", expires_at=253_402_300_799_999_999)
    assert kept["expires_at"] == "9999-12-31T23:59:59.999999Z"
    late = await session.call_tool("remember", {"text": "x", "subject": "Iris", "expires_at": 2**63})
    assert late.is_error and "from 1970 to the year 9999" in _text(late)
    past = await session.call_tool("remember", {"text": "x", "subject": "Iris", "expires_at": 1})
    assert _text(past) == "Error (invalid_input): expires_at 1970-01-01T00:00:00.000001Z is in the past"
    iso = await _data(session, "remember", text="Iris's next trial", subject="Iris", expires_at=kept["expires_at"])
    assert iso["expires_at"] == kept["expires_at"]
    assert bad.structured_content is not None and "Quartz" not in str(bad.structured_content)
    denied = await session.call_tool("verify_audit", {})
    assert denied.is_error  # verification is the auditors'
    assert denied.structured_content is not None
    assert denied.structured_content["error"]["code"] == "access_denied"
    assert denied.structured_content["error"]["missing"] == "verify"


def _over_http(url: str, key: str | None, session_run: Session) -> None:
    async def run() -> None:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        with anyio.fail_after(SESSION_SECONDS):
            await _session_over_http(url, headers, session_run)

    anyio.run(run)


async def _session_over_http(url: str, headers: dict[str, str], session_run: Session) -> None:
    async with (
        httpx2.AsyncClient(timeout=30, headers=headers) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session_run(session)


def _a_clients_refusal_says_why(url: str) -> None:
    """The gate's refusals are JSON-RPC errors, which the SDK's client shows its caller:
    before, any of them read "Server returned an error response", a bad key and a full
    server alike."""

    async def nothing(session: ClientSession) -> None:
        await session.initialize()
        raise AssertionError("a bad key opened a session")

    with pytest.raises(BaseExceptionGroup) as raised:  # the client's task groups wrap it
        _over_http(url, "dlt_wrong", nothing)
    refusal: BaseException = raised.value
    while isinstance(refusal, BaseExceptionGroup):
        (refusal,) = refusal.exceptions
    assert isinstance(refusal, MCPError)
    assert refusal.error.message == "unauthenticated: the API key is not valid"
    assert refusal.error.data["code"] == "unauthenticated"


def test_streamable_http(tmp_path: Path) -> None:
    opener = new_store(tmp_path / "mem.db")
    admin, agent = api_key(opener, Role.ADMIN), api_key(opener, Role.AGENT)
    pool = HandlePool(opener)
    with serving(http_app(build_server(pool), pool)) as url:
        _over_http(url, admin, _tour)
        _over_http(url, agent, _agent)
        for headers in ({}, {"Authorization": "Bearer dlt_wrong"}):
            refused = httpx2.post(f"{url}/mcp", json={}, headers=headers)
            assert _refused(refused) == (401, "unauthenticated")
        _a_clients_refusal_says_why(url)
        _a_body_that_repeats_a_key_is_refused(url, admin, opener)
        _sessions_belong_to_who_opened_them(url, admin, agent)
    pool.close()


ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
HELLO = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


def _open(url: str, key: str) -> httpx2.Response:
    """An initialize request without a session, as a client opens one."""
    return httpx2.post(f"{url}/mcp", json=HELLO, headers={**ACCEPT, "Authorization": f"Bearer {key}"})


def _in_session(key: str, session: str) -> dict[str, str]:
    return {**ACCEPT, "Authorization": f"Bearer {key}", "mcp-session-id": session, "mcp-protocol-version": "2025-06-18"}


def _end(url: str, key: str, session: str) -> httpx2.Response:
    return httpx2.delete(f"{url}/mcp", headers=_in_session(key, session))


def _sessions_belong_to_who_opened_them(url: str, owner: str, other: str) -> None:
    session = _open(url, owner).headers["mcp-session-id"]
    assert _end(url, owner, "0" * 32).status_code == 404  # unknown to the gate: nobody's
    for key, status in ((other, 404), (owner, 200)):
        ended = _end(url, key, session)
        assert ended.status_code == status, (key == owner, ended.text)


def _a_body_that_repeats_a_key_is_refused(url: str, key: str, opener: Callable[[], Memory]) -> None:
    """The SDK's parser keeps a repeated key's last value: a tool call naming user_id
    twice wrote into the second user's space (and a dry run's scope went from one user to
    all), where the HTTP API refuses the same body. Refused before the transport sees it."""
    session = _open(url, key).headers["mcp-session-id"]
    headers = _in_session(key, session)
    ready = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert httpx2.post(f"{url}/mcp", json=ready, headers=headers).status_code == 202
    call = (
        '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "remember", "arguments":'
        ' {"text": "dup", "subject": "Dup Dan", "user_id": "alice", "user_id": "bob"}}}'
    )
    refused = httpx2.post(f"{url}/mcp", content=call, headers=headers)
    assert _refused(refused) == (422, "invalid_request")
    assert (
        refused.json()["error"]["message"] == 'invalid_request: the request body repeats a key in one object: "user_id"'
    )
    once = call.replace(', "user_id": "bob"', "")
    assert httpx2.post(f"{url}/mcp", content=once, headers=headers).status_code == 200  # the same, without it
    with opener() as memory:
        assert [r.space.user_id for r in memory.list(subject="Dup Dan", space=Space("alice"))] == ["alice"]
        assert list(memory.list(subject="Dup Dan", space=Space("bob"))) == []
    assert _end(url, key, session).status_code == 200


def _refused(response: httpx2.Response) -> tuple[int, str]:
    assert "mcp-session-id" not in response.headers
    return response.status_code, response.json()["error"]["data"]["code"]


def test_sessions_are_capped_per_principal_until_they_end(tmp_path: Path) -> None:
    """One key (a viewer of one user) opened 10,000 sessions, the SDK's cap for the whole
    server, and no other principal could open one for the next 30 minutes. Now each
    principal holds a few at most, and a session it ends, or that goes idle, frees its slot."""
    opener = new_store(tmp_path / "mem.db")
    viewer, admin = api_key(opener, Role.VIEWER, scopes=["u9"]), api_key(opener, Role.ADMIN)
    pool = HandlePool(opener)
    now = [0.0]
    app = http_app(build_server(pool), pool, sessions_per_principal=2, idle_timeout=60, clock=lambda: now[0])

    with serving(app) as url:
        for _ in range(3):  # a request the transport refuses opens no session, and holds no slot
            listing = {**HELLO, "method": "tools/list", "params": {}}
            headers = {**ACCEPT, "Authorization": f"Bearer {viewer}"}
            assert httpx2.post(f"{url}/mcp", json=listing, headers=headers).status_code == 400
        opened = [_open(url, viewer).headers["mcp-session-id"] for _ in range(2)]
        assert _refused(_open(url, viewer)) == (429, "too_many_sessions")
        assert "DELETE" in _open(url, viewer).json()["error"]["message"]
        assert _open(url, admin).status_code == 200  # another principal is not held back

        assert _end(url, viewer, opened[0]).status_code == 200  # ended by its client: its slot is free
        opened[0] = _open(url, viewer).headers["mcp-session-id"]
        assert _refused(_open(url, viewer)) == (429, "too_many_sessions")

        # A session with a request in flight (a GET stream) is not idle, however long it lasts.
        with httpx2.stream("GET", f"{url}/mcp", headers=_in_session(viewer, opened[0])) as stream:
            assert stream.status_code == 200
            now[0] += 61  # the other went idle past the timeout: the SDK has ended it
            assert _refused(_end(url, viewer, opened[1])) == (404, "no_such_session")
            assert _open(url, viewer).status_code == 200
            assert _refused(_open(url, viewer)) == (429, "too_many_sessions")
    pool.close()


def test_sessions_opened_at_once_count_from_their_admission(tmp_path: Path) -> None:
    """Requests sent at once must not all pass the count before any session is open:
    the transport here answers only once every request was admitted or refused."""
    opener = new_store(tmp_path / "mem.db")
    viewer = api_key(opener, Role.VIEWER)
    pool = HandlePool(opener)
    seen, answer = threading.Semaphore(0), threading.Event()

    async def open_session(_: Request) -> Response:
        """Stands for the SDK's transport, which opens a session for a request without one."""
        seen.release()
        await anyio.to_thread.run_sync(answer.wait, SESSION_SECONDS)
        return Response(headers={"mcp-session-id": uuid.uuid4().hex})

    async def at_once(url: str, count: int) -> list[int]:
        statuses: list[int] = []

        async def one() -> None:
            statuses.append((await http.post(f"{url}/mcp", json=HELLO)).status_code)
            if statuses[-1] != 200:
                seen.release()

        async with (
            httpx2.AsyncClient(timeout=SESSION_SECONDS, headers={"Authorization": f"Bearer {viewer}"}) as http,
            anyio.create_task_group() as tasks,
        ):
            for _ in range(count):
                tasks.start_soon(one)
            for _ in range(count):
                assert await anyio.to_thread.run_sync(seen.acquire, True, SESSION_SECONDS)
            answer.set()
        return sorted(statuses)

    transport = Starlette(routes=[Route("/mcp", open_session, methods=["POST"])])
    with serving(BearerGate(transport, pool, idle_timeout=60, per_principal=2)) as url:
        assert anyio.run(at_once, url, 6) == [200, 200, 429, 429, 429, 429]
    pool.close()


def test_sessions_are_capped_for_the_whole_server(tmp_path: Path) -> None:
    """Past the server's cap the gate answers as the API does (the SDK's own 503 is a
    JSON-RPC error), and only while that many sessions are live."""
    opener = new_store(tmp_path / "mem.db")
    keys = [api_key(opener, Role.VIEWER) for _ in range(3)]
    pool = HandlePool(opener)
    with serving(http_app(build_server(pool), pool, max_sessions=2)) as url:
        first = _open(url, keys[0]).headers["mcp-session-id"]
        assert _open(url, keys[1]).status_code == 200
        assert _refused(_open(url, keys[2])) == (503, "busy")
        assert _end(url, keys[0], first).status_code == 200
        assert _open(url, keys[2]).status_code == 200
    pool.close()


async def _misspelt(session: ClientSession) -> None:
    """Every tool refuses an argument it does not take, and says which: ignored, a
    misspelt user_id wrote into the default space."""
    await session.initialize()
    tools = (await session.list_tools()).tools
    for tool in tools:
        assert tool.input_schema.get("additionalProperties") is False, tool.name
        refused = await session.call_tool(tool.name, {"user_Id": "alice"})
        assert refused.is_error, tool.name
        assert "unknown argument(s): user_Id" in _text(refused), (tool.name, _text(refused))
    typo = await session.call_tool("remember", {"text": "Alice's phone is +100", "subject": "Alice", "user_Id": "a"})
    said = "remember: unknown argument(s): user_Id"
    assert _text(typo) == f"Error (invalid_request): {said}"
    assert typo.structured_content == {"error": {"code": "invalid_request", "message": said}}
    both = await session.call_tool("recall", {"query": "phone", "limit": "many", "agent": "x"})
    assert _text(both) == "Error (invalid_request): recall: unknown argument(s): agent; invalid argument(s): limit"
    missing = await session.call_tool("delete_all", {})  # an account erasure names its account
    assert _text(missing) == "Error (invalid_request): delete_all: missing argument(s): user_id"
    for user in ("default", "a", "alice"):
        assert (await _data(session, "list_memories", user_id=user))["count"] == 0


def test_unknown_arguments_are_refused(tmp_path: Path) -> None:
    opener = new_store(tmp_path / "mem.db")
    admin = api_key(opener, Role.ADMIN)
    pool = HandlePool(opener)
    with serving(http_app(build_server(pool), pool)) as url:
        _over_http(url, admin, _misspelt)
    pool.close()


def _with_store(
    tmp_path: Path,
    fill: Callable[[Memory], None],
    session_run: Session,
    options: Mapping[str, Any] = MappingProxyType({}),
) -> None:
    """``session_run`` over streamable HTTP as an admin, on a store ``fill`` wrote first,
    by a server built with ``options`` as they are once ``fill`` has run."""
    opener = new_store(tmp_path / "mem.db")
    with opener() as memory:
        fill(memory)
    admin = api_key(opener, Role.ADMIN)
    pool = HandlePool(opener)
    with serving(http_app(build_server(pool, **options), pool)) as url:
        _over_http(url, admin, session_run)
    pool.close()


def _where(space: Space) -> dict[str, str]:
    return {"user_id": space.user_id, "agent_id": space.agent_id, "run_id": space.run_id}


def test_erasure_scopes_read_an_empty_id_as_the_space_without_one(tmp_path: Path) -> None:
    """delete and delete_all scope as the library, the CLI and HTTP do: an argument left
    out is any value, "" the spaces without an agent or run. MCP read "" as any, so the
    no-agent space alone could not be erased; and delete reached user "default" only."""
    kim = [Space("u9"), Space("u9", "bot"), Space("u9", "bot", "r1"), Space("u8")]
    evan = [Space("c1"), Space("c2", "bot"), Space("default", "", "r2")]
    # Each scope and the records of Kim it reaches, as the library's SpaceFilter reads it.
    scopes: list[tuple[dict[str, str], int]] = [
        ({"user_id": "u9", "agent_id": ""}, 1),
        ({"user_id": "u9", "agent_id": "bot", "run_id": ""}, 1),
        ({"user_id": "u9", "run_id": ""}, 2),
        ({"user_id": "u9"}, 3),  # every space of u9, as before
        ({"agent_id": ""}, 2),  # every user's spaces without an agent
        ({}, 4),  # every space of every user
    ]

    def fill(memory: Memory) -> None:
        for spaces, subject in ((kim, "Kim"), (evan, "Evan")):
            for space in spaces:
                memory.remember(f"{subject} in {space}", subject=subject, space=space)
        for scope, total in scopes:
            plan = memory.erase(
                "Kim", request_id="LIB", basis="b", requester="t", scope=SpaceFilter(**scope), dry_run=True
            ).plan
            assert plan is not None and plan.total == total, scope

    async def run(session: ClientSession) -> None:
        await session.initialize()
        for scope, total in scopes:
            plan = await _data(session, "delete", subject="Kim", dry_run=True, **scope)
            assert plan["plan"]["total"] == total, scope
        account = await _data(session, "delete_all", user_id="u9", agent_id="", dry_run=True)
        assert account["plan"]["total"] == 1
        assert (await _data(session, "delete_all", user_id="u9", dry_run=True))["plan"]["total"] == 3

        erased = await _call(session, "delete_all", user_id="u9", agent_id="", request_id="ACC-9")
        assert _text(erased).startswith("Erased all memory for 'u9' (1 record(s)).")
        assert (await _data(session, "list_memories", user_id="u9"))["count"] == 0
        assert (await _data(session, "list_memories", user_id="u9", agent_id="bot"))["count"] == 1
        assert (await _data(session, "list_memories", user_id="u9", agent_id="bot", run_id="r1"))["count"] == 1

        # "Every trace of a subject", as the server's instructions say: no user id is every user's.
        everywhere = await _call(session, "delete", subject="Evan", request_id="DEL-EVAN")
        assert _text(everywhere).startswith("Erased 3 record(s) for 'Evan'.\n")
        for space in evan:
            assert (await _data(session, "list_memories", subject="Evan", **_where(space)))["count"] == 0
        empty = await session.call_tool("delete", {"subject": "Kim", "user_id": ""})
        assert _text(empty) == "Error (invalid_input): user_id must not be empty"

    _with_store(tmp_path, fill, run)


def _invalid(result: CallToolResult) -> set[str]:
    """The arguments a refusal names as invalid."""
    said = _text(result)
    assert result.is_error and said.startswith("Error (invalid_request): "), said
    parts = [part.split(": ", 1) for part in said.split(": ", 2)[2].split("; ")]
    return {name for kind, names in parts if kind == "invalid argument(s)" for name in names.split(", ")}


def _wrong_value(schema: dict[str, Any]) -> object:
    """A JSON value of a type ``schema`` does not take, preferring one pydantic's lax mode
    would coerce ("1" for a number or a boolean)."""
    admitted = {part.get("type") for part in schema.get("anyOf", [schema])}
    if "number" in admitted:
        admitted.add("integer")  # 1.5 is a number
    kinds: list[tuple[str, object]] = [
        ("string", "1"),
        ("integer", 1.5),
        ("boolean", True),
        ("array", []),
        ("object", {}),
    ]
    for kind, value in kinds:
        if kind not in admitted:
            return value
    raise AssertionError(f"no wrong value for {schema}")


def test_arguments_are_taken_as_json_types_as_http_takes_them(tmp_path: Path) -> None:
    """A value of another JSON type is refused, naming the argument, as HTTP's strict
    bodies refuse it: the SDK's lax models took confidence=true as 1.0, "yes" as true,
    and decoded JSON held in a string (key="null" became no key)."""

    async def run(session: ClientSession) -> None:
        await session.initialize()
        base = {"text": "lax", "subject": "Lax", "user_id": "lax"}
        refused: list[tuple[str, dict[str, Any], str]] = [
            ("remember", {**base, "confidence": True}, "confidence"),
            ("remember", {**base, "confidence": "0.25"}, "confidence"),
            ("remember", {**base, "expires_at": 1.9e15}, "expires_at"),
            ("remember", {**base, "for_legal_claim": "yes"}, "for_legal_claim"),
            ("remember", {**base, "for_legal_claim": "true"}, "for_legal_claim"),
            ("remember", {**base, "metadata": '{"a": 1}'}, "metadata"),
            ("recall", {"query": "lax", "limit": True}, "limit"),
            ("recall", {"query": "lax", "limit": "5"}, "limit"),
            ("list_memories", {"limit": 10_001}, "limit"),
            ("purge_expired", {"older_than_days": "5", "dry_run": True}, "older_than_days"),
            ("record_decision", {"summary": "s", "used": '["x"]'}, "used"),
        ]
        for name, arguments, argument in refused:
            result = await session.call_tool(name, arguments)
            assert _text(result) == f"Error (invalid_request): {name}: invalid argument(s): {argument}", arguments
        assert (await _data(session, "list_memories", user_id="lax"))["count"] == 0  # nothing written

        # As HTTP: an integer for a number; for expires_at, microseconds or a string.
        whole = await _data(session, "remember", **base, confidence=1, expires_at="30d")
        assert whole["confidence"] == 1.0 and whole["expires_at"] is not None
        literal = await _data(session, "remember", **base, key="null")
        assert literal["key"] == "null"

        for tool in (await session.list_tools()).tools:
            for name, schema in tool.input_schema["properties"].items():
                result = await session.call_tool(tool.name, {name: _wrong_value(schema)})
                assert name in _invalid(result), (tool.name, name, _text(result))

    _with_store(tmp_path, lambda _: None, run)


def test_certificates_and_receipts_are_verified_as_their_text(tmp_path: Path) -> None:
    """verify_certificate gives a certificate's text, as erasure_certificate answers it or
    as a file keeps it, the library's report, as `deleatur verify` does: a key repeated in
    it, or a member nothing signs, fails check 1. Taken as an object only, it could not:
    the call's JSON kept the last of a repeated key's values before the tool saw it.
    verify_receipt reads a receipt's text as `deleatur verify-receipt` reads a file."""

    def fill(memory: Memory) -> None:
        memory.remember("Erin's badge is 7", subject="Erin Example", space=Space("as-text"))
        memory.erase("Erin Example", request_id="TEXT-1", basis="Art. 17(1)(a)", requester="dpo")
        memory.remember("a receipt as text", subject="Receipts", space=Space("as-text"))
        memory.remember("another record", subject="Receipts", space=Space("as-text"))

    async def run(session: ClientSession) -> None:
        await session.initialize()
        vkey = (await _data(session, "export_public_key"))["vkey"]
        issued = await _call(session, "erasure_certificate", request_id="TEXT-1")
        assert issued.structured_content is not None
        for text, failed in [(_text(issued), []), *certificate_texts(issued.structured_content)]:
            report = await _data(session, "verify_certificate", certificate=text, expected_pubkey=vkey)
            assert_the_librarys_report(report, text, vkey, failed)
        unreadable = await session.call_tool("verify_certificate", {"certificate": '{"certificate": '})
        assert _text(unreadable).startswith("Error (invalid_input): the certificate is not JSON: ")

        record, other = (await _data(session, "list_memories", user_id="as-text"))["records"]
        made = await _data(session, "receipt", record_id=record["id"], user_id="as-text")
        for text, problem in receipt_texts(made, other["id"]):
            checked = await session.call_tool("verify_receipt", {"receipt": text, "key": vkey})
            if problem is None:
                assert not checked.is_error and checked.structured_content is not None, _text(checked)
                assert checked.structured_content["verdict"] == "PASS"
            else:
                assert _text(checked).startswith("Error (invalid_signed_note): ")
                assert_refused_unechoed(_text(checked), problem, other["id"])

    _with_store(tmp_path, fill, run)


def test_a_restricted_subject_is_corrected_and_decided_on_for_a_legal_claim(tmp_path: Path) -> None:
    """The refusal tells the agent to pass for_legal_claim: rectify and record_decision
    take it, as over HTTP."""

    def fill(memory: Memory) -> None:
        memory.remember("Rita phone 1", subject="Rita", key="rita::phone")

    async def run(session: ClientSession) -> None:
        await session.initialize()
        used = (await _data(session, "list_memories"))["records"][0]["id"]
        await _call(session, "restrict", subject="Rita", reason="contested")
        fix = {"key": "rita::phone", "text": "Rita phone 2", "reason": "typo"}
        refused = await session.call_tool("rectify", fix)
        assert _text(refused).startswith("Error (subject_restricted): ") and "for_legal_claim" in _text(refused)
        fixed = await _data(session, "rectify", **fix, for_legal_claim=True)
        assert (fixed["text"], fixed["supersedes"]) == ("Rita phone 2", used)
        decision = {"summary": "Hold for the claim", "used": [fixed["id"]]}
        refused = await session.call_tool("record_decision", decision)
        assert _text(refused).startswith("Error (subject_restricted): ")
        decided = await _data(session, "record_decision", **decision, for_legal_claim=True)
        assert [b["record"] for b in decided["decision"]["beliefs"]] == [fixed["id"]]

    _with_store(tmp_path, fill, run)


def test_list_memories_pages_with_a_cursor(tmp_path: Path) -> None:
    """list_memories stopped at 100 records, saying nothing: now it answers a page and
    the cursor of the next (as HTTP's list), null once no record follows."""
    written: list[str] = []

    def fill(memory: Memory) -> None:
        records = memory.remember_many([NewMemory(f"note {i}", subject="Pg") for i in range(105)], space=Space("pg"))
        written.extend(sorted(r.id for r in records))

    async def run(session: ClientSession) -> None:
        await session.initialize()
        first = await _call(session, "list_memories", user_id="pg")
        page = first.structured_content
        assert page is not None
        assert [r["id"] for r in page["records"]] == written[:100] and page["next"] == written[99]
        assert _text(first).endswith(f"\nMore remain: pass after='{written[99]}' for the next page.")
        rest = await _call(session, "list_memories", user_id="pg", after=page["next"])
        assert rest.structured_content is not None
        assert [r["id"] for r in rest.structured_content["records"]] == written[100:]
        assert rest.structured_content["next"] is None and "More remain" not in _text(rest)
        # A full page that ends the listing says so: no empty page to fetch.
        last = await _data(session, "list_memories", user_id="pg", after=written[99], limit=5)
        assert (last["count"], last["next"]) == (5, None)
        short = await _data(session, "list_memories", user_id="pg", after=written[99], limit=4)
        assert short["next"] == written[103]
        bad = await session.call_tool("list_memories", {"user_id": "pg", "after": "nope"})
        assert bad.is_error and "not a record id" in _text(bad)

    _with_store(tmp_path, fill, run)


def test_list_pages_and_exports_are_capped_by_bytes(tmp_path: Path) -> None:
    """export_memory held a whole export several times over (93 MiB of records took the
    server to 1.6 GiB), and then the SDK's own client refused the answer, over 1 MiB; a
    page of list_memories could hold 10,000 records of 64 KiB. Now a page stops before
    passing the cap, and an export over it is refused, saying where to get it."""
    options: dict[str, Any] = {}
    pages: list[list[str]] = []

    def fill(memory: Memory) -> None:
        options["max_result_bytes"], found = paged_by_bytes(memory, Space("bytes"))
        pages.extend(found)

    async def run(session: ClientSession) -> None:
        await session.initialize()
        assert await _pages(session, "list_memories", user_id="bytes") == pages
        # A recall holds its best hits that fit, and names the rest (the SDK's client
        # refused an answer of 20 hits of 60 KiB each).
        recalled = await _call(session, "recall", query="x" * 1000, user_id="bytes")
        found = recalled.structured_content
        assert found is not None and found["count"] == 2 and len(found["left_out"]) == 5
        shown = {hit["id"] for hit in found["hits"]}
        assert shown.isdisjoint(found["left_out"]) and shown | set(found["left_out"]) == {
            i for page in pages for i in page if i not in pages[3]
        }
        assert _text(recalled).endswith(f"read them with get_memory: {', '.join(found['left_out'])}")
        refused = await session.call_tool("export_memory", {"user_id": "bytes"})
        assert refused.is_error and refused.structured_content is not None
        assert refused.structured_content["error"]["code"] == "result_too_large"
        assert "GET /v1/export" in _text(refused) and "deleatur export" in _text(refused)

    _with_store(tmp_path, fill, run, options)


async def _pages(session: ClientSession, tool: str, **arguments: Any) -> list[list[str]]:
    """The record ids of each page of ``tool``, following its cursor to the end."""
    got: list[list[str]] = []
    after: dict[str, str] = {}
    while True:
        page = await _data(session, tool, limit=100, **arguments, **after)
        got.append([r["id"] for r in page["records"]])
        if page["next"] is None:
            return got
        after = {"after": page["next"]}


def test_history_pages_as_list_memories_does(tmp_path: Path) -> None:
    """history answered every version of a key at once, however many (and the SDK's own
    client refuses an answer over 1 MiB): now it pages as list_memories does. Each page
    is a history call in the audit trail, and an unknown key a failed one (they were list
    calls, and an unknown key left no entry)."""
    options: dict[str, Any] = {}
    pages: list[list[str]] = []

    def fill(memory: Memory) -> None:
        options["max_result_bytes"], found = paged_by_bytes(memory, Space("bytes"), key="pages::k")
        pages.extend(found)

    async def run(session: ClientSession) -> None:
        await session.initialize()
        assert await _pages(session, "history", key="pages::k", user_id="bytes") == pages
        first = await _call(session, "history", key="pages::k", user_id="bytes", limit=2)
        assert f"pass after='{pages[0][1]}'" in _text(first)
        missing = await session.call_tool("history", {"key": "pages::none", "user_id": "bytes"})
        assert missing.is_error and missing.structured_content is not None
        assert missing.structured_content["error"]["code"] == "not_found"

    _with_store(tmp_path, fill, run, options)
    calls = reads_of_records(lambda: Memory.open(tmp_path / "mem.db", from_bytes(MASTER)))
    assert calls == [("history", "ok", None)] * 6 + [("history", "failed", "NotFoundError")]


def test_exports_beyond_the_limit_are_busy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MCP exports had no cap on how many run at once (HTTP's had, at 4): now they share it."""
    entered, finish = threading.Semaphore(0), threading.Event()
    export_json = Memory.export_json

    def held(memory: Memory, out: Any, **which: Any) -> dict[str, int]:
        entered.release()
        finish.wait(SESSION_SECONDS)
        return export_json(memory, out, **which)

    monkeypatch.setattr(Memory, "export_json", held)

    async def run(session: ClientSession) -> None:
        await session.initialize()
        try:
            async with anyio.create_task_group() as tasks:
                for _ in range(MAX_EXPORTS):
                    tasks.start_soon(functools.partial(_call, session, "export_memory", user_id="u1"))
                for _ in range(MAX_EXPORTS):
                    assert await anyio.to_thread.run_sync(entered.acquire, True, SESSION_SECONDS)
                busy = await session.call_tool("export_memory", {"user_id": "u1"})
                finish.set()
        finally:
            finish.set()
        assert busy.is_error and busy.structured_content is not None
        assert busy.structured_content["error"]["code"] == "busy"
        assert (await _data(session, "export_memory", user_id="u1"))["counts"]["records"] == 1  # the slots are free

    def fill(memory: Memory) -> None:
        memory.remember("a note", subject="Kim", space=Space("u1"))

    _with_store(tmp_path, fill, run)
