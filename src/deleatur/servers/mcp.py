"""The MCP server (official SDK): ``deleatur serve mcp`` over stdio or streamable HTTP.

Each tool calls one library method and answers with a short, exact message for
the model and the same facts as structured content. Tools take the memory-space
arguments ``user_id="default"``, ``agent_id=""``, ``run_id=""`` where they apply:
where a tool reads or writes one space. The erasure tools (``delete``,
``delete_all``) name no space but a scope, as the library's ``SpaceFilter``, the CLI
and HTTP do: an argument left out matches every value (``delete`` reaches every
space of the tenant, ``delete_all`` every space of ``user_id``) and ``""`` only the
spaces without an agent or a run.
"""

# No ``from __future__ import annotations``: the SDK reads each tool's signature
# with typing.get_type_hints, which cannot resolve string annotations of functions
# defined inside build_server.

import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.types import CallToolResult, InputRequiredResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from .. import __version__
from ..clock import system_clock
from ..erasure.engine import ErasureResult
from ..erasure.requests import NOTHING_DUE, NOTHING_HELD
from ..errors import DeleaturError
from ..log.report import Report
from ..memory import Memory
from ..model import MAX_RECALL, Record, Space, SpaceFilter
from .auth import BearerGate, as_caller, bearer_token
from .calls import (
    MAX_EXPORTS,
    MAX_PAGE,
    Exports,
    check_certificate,
    check_receipt,
    fitting,
    history_page,
    list_page,
    new_request_id,
    public_key,
)
from .defaults import DEFAULT_BASIS, DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_IDLE_TIMEOUT, DEFAULT_SESSIONS_PER_PRINCIPAL
from .errors import ErrorInfo, ResultTooLargeError, error_info
from .pool import HandlePool

Ctx = Context[Any, Any]
F = TypeVar("F", bound=Callable[..., CallToolResult])
#: The most a page of list_memories, a recall (by calls.record_bytes) or an export_memory
#: answer holds. An answer is built whole, and carries its records twice (as text and as
#: structured content); the SDK's own client refuses one over 1 MiB.
MAX_RESULT_BYTES = 256 * 1024

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
ADDITIVE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)

INSTRUCTIONS = """\
deleatur is a memory store in which every GDPR data-subject right is built in.
`remember` facts about a subject, `recall` them; `forget` retires a fact that stopped
being true and keeps it in history; `delete` erases every trace of a subject, in every
space unless user_id, agent_id or run_id narrow it, and issues a signed erasure
certificate (`erasure_certificate`, `verify_certificate`)."""


#: Why a signed document is best passed to a verify tool as its text.
_PARSED = (
    " An object is taken too, but the call's JSON was parsed before the verifier saw it: of a key"
    " the document repeats, the last value alone is left, and the verifier cannot tell."
)
_CertificateText = Annotated[
    str | dict[str, Any],
    Field(
        description="The certificate's JSON text, exactly as issued (erasure_certificate's text) or kept: a key"
        " repeated in it, or a member beside certificate and signature, fails check 1." + _PARSED
    ),
]
_ReceiptText = Annotated[
    str | dict[str, Any],
    Field(
        description="The receipt's JSON text, exactly as issued (receipt's text) or kept: one that repeats a key,"
        " or has a member besides its four, is refused." + _PARSED
    ),
]


def _ok(text: str, data: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def _line(record: Record) -> str:
    key = f" [{record.key}]" if record.key else ""
    return f"{record.id}{key} {record.subject_original}: {record.text}"


def _lines(records: list[Record], empty: str) -> str:
    return "\n".join(_line(r) for r in records) if records else empty


def _listing(records: list[Record]) -> dict[str, Any]:
    return {"count": len(records), "records": [r.to_json() for r in records]}


def _records(records: list[Record], empty: str) -> CallToolResult:
    return _ok(_lines(records, empty), _listing(records))


def _page(records: list[Record], cursor: str | None) -> CallToolResult:
    """A page of a listing and where the next one starts (``next``, None after the last),
    said in the text too, as a model may read only that."""
    text = _lines(records, "No memories.")
    if cursor is not None:
        text += f"\nMore remain: pass after='{cursor}' for the next page."
    return _ok(text, {**_listing(records), "next": cursor})


def _report(report: Report) -> CallToolResult:
    return _ok("\n".join(report.lines()), report.to_json())


def _kept(records: int | None) -> str:
    """The subject's records outside the erasure's scope, where the caller may know of them."""
    if not records:
        return ""
    return f" {records} record(s) of the subject outside this scope are kept, and its data key with them."


def _dry_run(result: ErasureResult, what: str, kept: str = "") -> str:
    """A dry run's message; ``kept`` says what it would keep, before its token."""
    plan = result.plan
    assert plan is not None
    text = f"Dry run: would erase {plan.total} record(s) for {what} ({len(plan.lineage)} through lineage)."
    text += _kept(plan.kept_elsewhere) + kept
    if plan.ambiguous:
        text += f" The subject matches {len(plan.spellings)} spellings: pass allow_ambiguous to erase them all."
    if plan.erases_restricted:
        text += (
            f" Warning: {plan.erases_restricted} of them are of restricted subjects (Art. 18), and would go"
            " all the same."
        )
    if result.token:
        text += f"\n  confirmation token (single use, 15 min): {result.token}"
    return text


def _restricted(records: int, keeps: str = "kept") -> str:
    """A purge's records past their retention kept for their restricted subjects."""
    return f" {keeps.capitalize()} {records} record(s) of restricted subjects (Art. 18)." if records else ""


def _erasure(result: ErasureResult, what: str, *, account: bool = False) -> CallToolResult:
    """The seeds' messages: ``Erased 2 record(s) for 'x'; ...`` or ``No records found for 'x'.``"""
    if result.request is None:
        return _ok(_dry_run(result, what), result.to_json(system_clock()))
    request = result.request
    records = request.counts.get("records", 0)
    again = "Already done: " if result.repeated else ""
    redacted = request.counts.get("decisions_redacted", 0)
    if not records:
        text = f"{again}No records found for {what}."
    elif account:
        also = f"; values redacted from {redacted} decision snapshot(s)" if redacted else ""
        text = f"{again}Erased all memory for {what} ({records} record(s)){also}."
    else:
        also = f"; redacted its values from {redacted} decision snapshot(s)" if redacted else ""
        text = f"{again}Erased {records} record(s) for {what}{also}."
    text += _kept(request.counts.get("kept_in_other_spaces"))
    # A request that found nothing is recorded and certified all the same: the answer to it.
    done = f"{request.counts.get('keys_destroyed', 0)} data key(s) destroyed" if records else NOTHING_HELD.capitalize()
    text += (
        f"\n  {done}; request {request.id} is {request.status.value} — get its signed certificate with"
        f" erasure_certificate('{request.id}') and check it with verify_certificate (or offline with the key"
        " from export_public_key)."
    )
    return _ok(text, result.to_json(system_clock()))


class _Capped:
    """An export's text, refused past ``limit`` bytes: written on until then, so a large
    export stops there, and is never held whole."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.size += len(text.encode())
        if self.size > self.limit:
            raise ResultTooLargeError(
                f"the export is over the {self.limit} bytes an MCP answer holds: get it from the HTTP API"
                " (GET /v1/export streams it) or the CLI (deleatur export --user or --subject)"
            )
        self.parts.append(text)
        return len(text)


class _AsHttpTakesThem(BaseModel):
    # As HTTP's bodies: JSON types as sent (an integer still stands for a number, as
    # JSON has no other), and no other members.
    model_config = ConfigDict(extra="forbid", strict=True)


class _AsSent(FuncMetadata):
    """Arguments validated as the client sent them. The SDK first decodes any string
    that holds JSON, for every argument not typed plain ``str``: ``key="null"`` became
    no key, and ``used='["r1"]'`` a list, which HTTP refuses."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        return data


def _strict(tool: Tool) -> Tool:
    """``tool`` refusing arguments it does not take, and values of another JSON type.
    The SDK's argument models ignore unknown arguments, so a misspelt ``user_Id`` would
    leave ``user_id`` at its default and write into another user's space; refused, the
    schema also says so (additionalProperties false). They also coerce in pydantic's lax
    mode: ``confidence=true`` became 1.0 and ``for_legal_claim="yes"`` true, where
    HTTP refuses them."""
    loose = tool.fn_metadata.arg_model
    strict = create_model(loose.__name__, __base__=(loose, _AsHttpTakesThem))
    return tool.model_copy(
        update={
            "fn_metadata": _AsSent(**{**dict(tool.fn_metadata), "arg_model": strict}),
            "parameters": strict.model_json_schema(by_alias=True),
        }
    )


class _Server(MCPServer[Any]):
    """The SDK's server, but arguments that fail validation are reported by field name
    with a stable code: the SDK's message quotes the rejected values, which are the
    caller's data (a subject's name, say) and would end up in the agent's transcript."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Ctx | None = None
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            problems: dict[str, set[str]] = {"missing": set(), "unknown": set(), "invalid": set()}
            kinds = {"missing": "missing", "extra_forbidden": "unknown"}
            for error in exc.__cause__.errors():
                kind = kinds.get(error["type"], "invalid")
                # The argument alone: past it the location names union members
                # (expires_at.int, expires_at.str) or list positions, not arguments.
                problems[kind].add(str(error["loc"][0]) if error["loc"] else "arguments")
            said = "; ".join(
                f"{kind} argument(s): {', '.join(sorted(names))}" for kind, names in problems.items() if names
            )
            info = ErrorInfo(422, "invalid_request", f"{name}: {said}")
            return CallToolResult(
                content=[TextContent(type="text", text=f"Error ({info.code}): {info.message}")],
                structured_content=info.to_json(),
                is_error=True,
            )


def build_server(
    pool: HandlePool, *, local_api_key: str | None = None, max_result_bytes: int = MAX_RESULT_BYTES
) -> MCPServer[Any]:
    """The MCP server over ``pool``'s store. Over stdio it acts as the local operator,
    or as the principal of ``local_api_key`` (an agent's own, narrower key). A page of
    ``list_memories`` and an ``export_memory`` answer hold at most ``max_result_bytes``."""
    exports = Exports(MAX_EXPORTS)
    # Built here rather than by server.tool(), which keeps the Tool it builds: each gets
    # its strict argument model before the server is given the list.
    tools: list[Tool] = []

    def tool(annotations: ToolAnnotations) -> Callable[[F], F]:
        def register(fn: F) -> F:
            tools.append(_strict(Tool.from_function(fn, annotations=annotations)))
            return fn

        return register

    def call(ctx: Ctx, run: Callable[[Memory], CallToolResult], *, erasure: bool = False) -> CallToolResult:
        """One library call on a leased handle, as the caller: over HTTP the principal of
        the bearer key, over stdio (no headers) the local operator. A refusal is a tool
        error with a stable code; an ``erasure``'s names its request, which a refused
        erasure may have recorded as failed (an ambiguous subject, say): retried under that
        id, it is completed, not left open beside a new one."""
        try:
            with pool.lease() as memory:
                headers = ctx.headers
                if headers is not None:
                    return run(as_caller(memory, bearer_token(headers.get("authorization"))))
                return run(memory if local_api_key is None else as_caller(memory, local_api_key))
        except Exception as exc:
            info = error_info(exc)
            text = f"Error ({info.code}): {info.message}"
            if erasure and isinstance(exc, DeleaturError) and exc.retry_note is not None:
                text += f" [{exc.retry_note}]"
            return CallToolResult(
                content=[TextContent(type="text", text=text)],
                structured_content=info.to_json(),
                is_error=True,
            )

    @tool(ADDITIVE)
    def remember(
        ctx: Ctx,
        text: str,
        subject: str,
        key: str | None = None,
        source: str | None = None,
        metadata: dict[str, Any] | None = None,
        confidence: float | None = None,
        derived_from: list[str] | None = None,
        expires_at: int | str | None = None,
        for_legal_claim: bool = False,
        user_id: str = "default",
        agent_id: str = "",
        run_id: str = "",
    ) -> CallToolResult:
        """Remember a fact about a subject; a new value for a key supersedes the old one.
        ``expires_at``: microseconds since the epoch, an ISO 8601 time (UTC if no offset)
        or a delay like 30d; ``for_legal_claim``: a write for a
        legal claim, allowed while the subject's processing is restricted."""

        def run(memory: Memory) -> CallToolResult:
            record = memory.remember(
                text,
                subject=subject,
                space=Space(user_id, agent_id, run_id),
                key=key,
                metadata=metadata,
                source=source,
                confidence=confidence,
                derived_from=derived_from or (),
                expires_at=expires_at,
                for_legal_claim=for_legal_claim,
            )
            superseded = f" (supersedes {record.supersedes})" if record.supersedes else ""
            return _ok(f"Remembered {record.id} for '{record.subject_original}'{superseded}.", record.to_json())

        return call(ctx, run)

    @tool(READ_ONLY)
    def recall(
        ctx: Ctx,
        query: str,
        limit: Annotated[int, Field(ge=1, le=MAX_RECALL)] = 10,
        user_id: str = "default",
        agent_id: str = "",
        run_id: str = "",
    ) -> CallToolResult:
        """Search the active memories of one space (BM25), best first."""

        def run(memory: Memory) -> CallToolResult:
            hits = memory.recall(query, space=Space(user_id, agent_id, run_id), limit=limit)
            # The best hits that fit one answer (the first always does), and the ids of the rest.
            shown = fitting([h.record for h in hits], max_result_bytes)
            left_out = [h.record.id for h in hits[shown:]]
            text = "\n".join(f"{_line(h.record)} ({h.score:.3g})" for h in hits[:shown]) or "No matching memories."
            if left_out:
                text += (
                    f"\n{len(left_out)} more hit(s) left out, past the {max_result_bytes} bytes an answer holds;"
                    f" read them with get_memory: {', '.join(left_out)}"
                )
            data = {"count": shown, "hits": [h.to_json() for h in hits[:shown]], "left_out": left_out}
            return _ok(text, data)

        return call(ctx, run)

    @tool(READ_ONLY)
    def get_memory(
        ctx: Ctx, record_id: str, user_id: str = "default", agent_id: str = "", run_id: str = ""
    ) -> CallToolResult:
        """One memory by id."""
        return call(ctx, lambda m: _records([m.get(record_id, space=Space(user_id, agent_id, run_id))], ""))

    @tool(READ_ONLY)
    def list_memories(
        ctx: Ctx,
        subject: str | None = None,
        key: str | None = None,
        include_history: bool = False,
        limit: Annotated[int, Field(ge=1, le=MAX_PAGE)] = 100,
        after: str | None = None,
        user_id: str = "default",
        agent_id: str = "",
        run_id: str = "",
    ) -> CallToolResult:
        """The memories of one space, oldest first (active ones unless include_history), a
        page of at most limit at a time (fewer if they are long): while more remain the
        answer's next is a record id, to pass as after for the following page; next is null
        after the last page."""

        def run(memory: Memory) -> CallToolResult:
            records, cursor = list_page(
                memory,
                space=Space(user_id, agent_id, run_id),
                subject=subject,
                key=key,
                include_history=include_history,
                limit=limit,
                after=after,
                max_bytes=max_result_bytes,
            )
            return _page(records, cursor)

        return call(ctx, run)

    # Destructive: no call brings a retired record back (MCP's false means only additive updates).
    @tool(DESTRUCTIVE)
    def forget(
        ctx: Ctx,
        record_id: str | None = None,
        key: str | None = None,
        user_id: str = "default",
        agent_id: str = "",
        run_id: str = "",
    ) -> CallToolResult:
        """Retire a fact that stopped being true: no longer recalled, kept in history (delete erases)."""

        def run(memory: Memory) -> CallToolResult:
            record = memory.forget(space=Space(user_id, agent_id, run_id), record_id=record_id, key=key)
            return _ok(f"Retired {record.id}; it stays in history (use delete to erase it).", record.to_json())

        return call(ctx, run)

    @tool(READ_ONLY)
    def history(
        ctx: Ctx,
        key: str,
        limit: Annotated[int, Field(ge=1, le=MAX_PAGE)] = 100,
        after: str | None = None,
        user_id: str = "default",
        agent_id: str = "",
        run_id: str = "",
    ) -> CallToolResult:
        """Every version of a key, oldest first, a page at a time as list_memories pages:
        while more remain the answer's next is a record id, to pass as after."""

        def run(memory: Memory) -> CallToolResult:
            where = Space(user_id, agent_id, run_id)
            records, cursor = history_page(
                memory, key=key, space=where, limit=limit, after=after, max_bytes=max_result_bytes
            )
            return _page(records, cursor)

        return call(ctx, run)

    @tool(DESTRUCTIVE)
    def rectify(
        ctx: Ctx,
        key: str,
        text: str,
        reason: str,
        erase_previous: bool = False,
        for_legal_claim: bool = False,
        user_id: str = "default",
        agent_id: str = "",
        run_id: str = "",
    ) -> CallToolResult:
        """Art. 16: correct the value of a key; with erase_previous the wrong values are
        hard-deleted. for_legal_claim: a correction for a legal claim, allowed while the
        subject's processing is restricted."""

        def run(memory: Memory) -> CallToolResult:
            record = memory.rectify(
                key,
                text,
                reason=reason,
                actor=memory.principal.who,
                space=Space(user_id, agent_id, run_id),
                erase_previous=erase_previous,
                for_legal_claim=for_legal_claim,
            )
            erased = " (earlier values erased)" if erase_previous else ""
            return _ok(f"Rectified {record.key}: {record.id} supersedes {record.supersedes}{erased}.", record.to_json())

        return call(ctx, run)

    @tool(DESTRUCTIVE)
    def delete(
        ctx: Ctx,
        subject: str,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        request_id: str | None = None,
        basis: str = DEFAULT_BASIS,
        dry_run: bool = False,
        confirmation: str | None = None,
        allow_ambiguous: bool = False,
    ) -> CallToolResult:
        """Art. 17: permanently erase every record of a subject, history and derived records
        included, and destroy its key: in every space of every user unless narrowed. user_id,
        agent_id and run_id each narrow it to the spaces with that value; "" for agent_id or
        run_id is the spaces with no agent or run. Records of the subject outside the scope are
        kept, and its key with them. A dry run shows what would go and issues the confirmation
        token agents must present."""

        def run(memory: Memory) -> CallToolResult:
            result = memory.erase(
                subject,
                request_id=new_request_id(request_id, "MCP"),
                basis=basis,
                requester=memory.principal.who,
                # Filters, as the library, the CLI (erase --agent "") and HTTP read them: left
                # out, any value; "" the spaces without one. No space, so no "default" user.
                scope=SpaceFilter(user_id, agent_id, run_id),
                dry_run=dry_run,
                issue_token=dry_run,
                confirmation=confirmation,
                allow_ambiguous=allow_ambiguous,
            )
            return _erasure(result, f"'{subject}'")

        return call(ctx, run, erasure=True)

    @tool(DESTRUCTIVE)
    def delete_all(
        ctx: Ctx,
        user_id: str,  # no default: an account erasure names its account, as over HTTP and the CLI
        agent_id: str | None = None,
        run_id: str | None = None,
        request_id: str | None = None,
        basis: str = DEFAULT_BASIS,
        dry_run: bool = False,
        confirmation: str | None = None,
    ) -> CallToolResult:
        """Account deletion: every space of user_id and no other user's. agent_id and run_id,
        if given, narrow it to the spaces with that value; "" is the spaces with no agent or run."""

        def run(memory: Memory) -> CallToolResult:
            result = memory.erase_all(
                user_id=user_id,
                agent_id=agent_id,
                run_id=run_id,
                request_id=new_request_id(request_id, "MCP"),
                basis=basis,
                requester=memory.principal.who,
                dry_run=dry_run,
                issue_token=dry_run,
                confirmation=confirmation,
            )
            return _erasure(result, f"'{user_id}'", account=True)

        return call(ctx, run, erasure=True)

    @tool(READ_ONLY)
    def erasure_status(ctx: Ctx, request_id: str) -> CallToolResult:
        """An erasure request's status and phases, with timestamps."""

        def run(memory: Memory) -> CallToolResult:
            found = memory.erasure_request(request_id).to_json(system_clock())
            phases = ", ".join(f"{p['name']} {p['status']}" for p in found["phases"])
            return _ok(f"Request {request_id} is {found['status']}: {phases}.", found)

        return call(ctx, run)

    @tool(READ_ONLY)
    def erasure_certificate(ctx: Ctx, request_id: str) -> CallToolResult:
        """The signed erasure certificate of a request, verifiable offline with the public key."""

        def run(memory: Memory) -> CallToolResult:
            document = memory.certificate(request_id)
            return _ok(json.dumps(document, indent=2, sort_keys=True), document)

        return call(ctx, run)

    @tool(READ_ONLY)
    def verify_certificate(
        ctx: Ctx, certificate: _CertificateText, expected_pubkey: str | None = None
    ) -> CallToolResult:
        """Verify an erasure certificate offline; pin expected_pubkey (from export_public_key) for trust."""

        return call(ctx, lambda _: _report(check_certificate(certificate, expected_pubkey)))

    @tool(READ_ONLY)
    def export_memory(ctx: Ctx, user_id: str | None = None, subject: str | None = None) -> CallToolResult:
        """Art. 15/20: everything held about a user (all its spaces) or a subject, as JSON: give
        exactly one of user_id and subject. A large export is refused (result_too_large):
        get it from the HTTP API or the CLI, which stream it."""

        def run(memory: Memory) -> CallToolResult:
            exports.begin()
            try:
                out = _Capped(max_result_bytes)
                counts = memory.export_json(out, subject=subject, user_id=user_id)
            finally:
                exports.end()
            text = "".join(out.parts)
            what = f"'{subject}'" if subject else f"'{user_id}'"
            return _ok(f"Exported {counts['records']} record(s) for {what}.\n{text}", json.loads(text))

        return call(ctx, run)

    @tool(DESTRUCTIVE)
    def purge_expired(
        ctx: Ctx,
        older_than_days: float | None = None,
        request_id: str | None = None,
        dry_run: bool = False,
        confirmation: str | None = None,
    ) -> CallToolResult:
        """Art. 5(1)(e): hard-delete expired records, and with older_than_days those written earlier.
        A dry run shows what would go and issues the confirmation token agents must present; a
        repeat under the same request_id returns the first purge's result."""

        def run(memory: Memory) -> CallToolResult:
            result = memory.purge(
                older_than_days=older_than_days,
                request_id=request_id,
                dry_run=dry_run,
                issue_token=dry_run,
                confirmation=confirmation,
            )
            # Expired records always go; with older_than_days, those written earlier too.
            due = " past their expiry" + (
                f" or older than {older_than_days:g} days" if older_than_days is not None else ""
            )
            if result.request is not None:
                restricted = result.request.counts.get("kept_restricted", 0)
                records = result.request.counts.get("records", 0)
                text = f"Purged {records} record(s){due} [request {result.request.id}]." + _restricted(restricted)
            else:
                assert result.plan is not None
                restricted = result.plan.kept_restricted
                if result.nothing_due:
                    text = NOTHING_DUE.capitalize() + "." + _restricted(restricted)
                else:
                    text = _dry_run(result, "the retention policy", _restricted(restricted, "would keep"))
            return _ok(text, result.to_json(system_clock()))

        return call(ctx, run, erasure=True)

    # Destructive: it turns away later writes and recalls of the subject's records.
    @tool(DESTRUCTIVE)
    def restrict(ctx: Ctx, subject: str, reason: str) -> CallToolResult:
        """Art. 18: keep a subject's records but stop recalling them and refuse new writes."""

        def run(memory: Memory) -> CallToolResult:
            restriction = memory.restrict(subject, reason=reason, actor=memory.principal.who)
            return _ok(f"Restricted processing of '{subject}'.", restriction.to_json())

        return call(ctx, run)

    @tool(ADDITIVE)
    def record_decision(
        ctx: Ctx,
        summary: str,
        used: list[str],
        for_legal_claim: bool = False,
        user_id: str = "default",
        agent_id: str = "",
        run_id: str = "",
    ) -> CallToolResult:
        """Sign and keep a snapshot of exactly the memories (by id) a decision used.
        for_legal_claim: a decision for a legal claim, allowed to use the memories of a
        subject whose processing is restricted."""

        def run(memory: Memory) -> CallToolResult:
            decision = memory.record_decision(
                summary, used, space=Space(user_id, agent_id, run_id), for_legal_claim=for_legal_claim
            )
            beliefs = len(decision.body["beliefs"])
            text = f"Recorded decision {decision.id} using {beliefs} belief(s); explain it with explain_decision."
            return _ok(text, decision.to_json())

        return call(ctx, run)

    @tool(READ_ONLY)
    def explain_decision(
        ctx: Ctx, decision_id: str, user_id: str = "default", agent_id: str = "", run_id: str = ""
    ) -> CallToolResult:
        """A decision's snapshot, its hash and signature checked; erased beliefs appear redacted."""

        def run(memory: Memory) -> CallToolResult:
            decision = memory.explain_decision(decision_id, space=Space(user_id, agent_id, run_id))
            lines = [f"Decision {decision.id}: {decision.body['summary']} (signature verified, {decision.signed_by})"]
            for belief in decision.body["beliefs"]:
                value = "[redacted: erased]" if belief["redacted"] else belief["value"]
                lines.append(f"  {belief['record']}: {value}")
            return _ok("\n".join(lines), decision.to_json())

        return call(ctx, run)

    @tool(READ_ONLY)
    def receipt(
        ctx: Ctx, record_id: str, user_id: str = "default", agent_id: str = "", run_id: str = ""
    ) -> CallToolResult:
        """A signed write receipt for a record, to check later with verify_receipt."""

        def run(memory: Memory) -> CallToolResult:
            made = memory.receipt(record_id, space=Space(user_id, agent_id, run_id)).to_json()
            return _ok(json.dumps(made, indent=2), made)

        return call(ctx, run)

    @tool(READ_ONLY)
    def verify_receipt(ctx: Ctx, receipt: _ReceiptText, key: str | None = None) -> CallToolResult:
        """Check a write receipt; pin key (from export_public_key) or it is checked against the store's keys."""

        return call(ctx, lambda m: _report(check_receipt(m, receipt, key)))

    @tool(READ_ONLY)
    def verify_log(ctx: Ctx) -> CallToolResult:
        """Re-derive the whole transparency log and check every signed checkpoint."""
        return call(ctx, lambda m: _report(m.verify_log()))

    @tool(READ_ONLY)
    def verify_audit(ctx: Ctx) -> CallToolResult:
        """Verify the whole audit trail: every call, write, erasure and export, in the signed log."""
        return call(ctx, lambda m: _report(m.verify_audit()))

    @tool(READ_ONLY)
    def export_public_key(ctx: Ctx) -> CallToolResult:
        """The log's verifier key, to verify receipts and certificates independently."""

        def run(memory: Memory) -> CallToolResult:
            key = public_key(memory)
            return _ok(key["vkey"], key)

        return call(ctx, run)

    return _Server(
        "deleatur",
        version=__version__,
        instructions=INSTRUCTIONS,
        # Session ids and transport chatter at INFO would fill an MCP client's log pane.
        log_level="WARNING",
        tools=tools,
    )


def http_app(
    server: MCPServer[Any],
    pool: HandlePool,
    *,
    host: str = "127.0.0.1",
    sessions_per_principal: int = DEFAULT_SESSIONS_PER_PRINCIPAL,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout: float = DEFAULT_SESSION_IDLE_TIMEOUT,
    clock: Callable[[], float] | None = None,
) -> BearerGate:
    """``server`` over streamable HTTP at ``/mcp``, behind the bearer-key gate, which
    caps the sessions of each principal and of everyone (see ``BearerGate``). The
    transport gets the same caps and idle timeout, so that the gate's count and the
    SDK's agree; ``clock`` replaces the gate's (tests)."""
    app = server.streamable_http_app(host=host, max_sessions=max_sessions, session_idle_timeout=idle_timeout)
    return BearerGate(
        app,
        pool,
        idle_timeout=idle_timeout,
        per_principal=sessions_per_principal,
        max_sessions=max_sessions,
        clock=clock,
    )


__all__ = ["build_server", "http_app"]
