"""Principals, the audit trail and decisions: ``deleatur principals ...``,
``deleatur audit ...``, ``deleatur whoami``, ``deleatur decision ...``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..access.principals import Role
from ..model import Space
from .common import (
    AgentOpt,
    JsonOpt,
    LegalClaimOpt,
    RunOpt,
    UserOpt,
    add_row,
    app,
    emit,
    new_table,
    open_memory,
    out,
    pin_key,
    print_report,
    visible,
)

principals_app = typer.Typer(help="Principals, their roles, scopes and API keys.", no_args_is_help=True)
audit_app = typer.Typer(help="The audit trail: every call, verifiable.", no_args_is_help=True)
app.add_typer(principals_app, name="principals")
app.add_typer(audit_app, name="audit")


@app.command()
def whoami(as_json: JsonOpt = False) -> None:
    """Who this command acts as: the principal of --api-key, or the local operator."""
    with open_memory() as memory:
        described = memory.principal.describe()
    if as_json:
        emit(described)
        return
    scopes = described["scopes"]
    out.print(
        visible(
            f"{described['name']} ({described['id']}): {described['role']} of tenant {described['tenant']!r},"
            f" capabilities {', '.join(described['capabilities'])},"  # type: ignore[arg-type]
            f" {'all users' if scopes is None else 'users ' + ', '.join(scopes)}"  # type: ignore[arg-type]
        )
    )


@principals_app.command("create")
def create(
    name: str,
    role: Annotated[Role, typer.Option("--role", help="admin, member, agent, viewer or auditor.")],
    scope: Annotated[
        list[str] | None, typer.Option("--scope", help="A user_id the key may touch (repeat); default: all.")
    ] = None,
    tenant: Annotated[
        str | None, typer.Option("--in-tenant", help="Create in this tenant (the operator only).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a principal and print its API key: shown once, never stored."""
    with open_memory() as memory:
        principal, api_key = memory.create_principal(name, role, scopes=scope, tenant=tenant)
    if as_json:
        emit({**principal.describe(), "api_key": api_key})
        return
    out.print(f"created {principal.role.value} {principal.name!r} ({principal.id}) in tenant {principal.tenant!r}")
    out.print(f"API key (shown once, keep it secret): {api_key}")


@principals_app.command("list")
def list_(as_json: JsonOpt = False) -> None:
    """The tenant's principals (never their keys)."""
    with open_memory() as memory:
        rows = [p.describe() for p in memory.principals()]
    if as_json:
        emit(rows)
        return
    table = new_table("id", "name", "role", "scopes", "revoked", free=("name", "scopes"))
    for r in rows:
        scopes = r["scopes"]
        add_row(
            table,
            str(r["id"]),
            str(r["name"]),
            str(r["role"]),
            "all" if scopes is None else ", ".join(scopes),  # type: ignore[arg-type]
            "yes" if r["revoked_at"] is not None else "",
        )
    out.print(table)


@principals_app.command("revoke")
def revoke(principal_id: str) -> None:
    """Revoke a principal's API key at once."""
    with open_memory() as memory:
        memory.revoke_principal(principal_id)
    out.print(f"revoked {principal_id}")


@audit_app.command("show")
def show(
    start: Annotated[int, typer.Option("--from", help="First log index.")] = 0,
    limit: Annotated[int | None, typer.Option("--limit", help="At most this many entries.")] = None,
    calls: Annotated[bool, typer.Option("--calls", help="Only the per-call entries.")] = False,
    actor: Annotated[str | None, typer.Option("--actor", help="Only this principal's calls.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The tenant's audit trail, naming erased-or-not subjects where this caller may."""
    with open_memory() as memory:
        for item in memory.audit_entries(start=start, limit=limit, calls_only=calls, actor=actor):
            data = item.to_json()
            if as_json:
                emit(data)
                continue
            rest = " ".join(f"{k}={v}" for k, v in data.items() if k not in ("index", "type", "time"))
            line = f"{data['index']:>8} {data['time']} {data['type']:<10} {rest}"
            out.print(visible(line))


@audit_app.command("verify")
def verify(
    expected_pubkey: Annotated[
        str | None, typer.Option("--expected-pubkey", help="The log's first public key, obtained out of band.")
    ] = None,
    state: Annotated[
        Path | None,
        typer.Option(
            "--state",
            help="The auditor's file of the last verified checkpoint (created if missing; its directory must exist).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Verify the whole trail: any edit, deletion, truncation or reordering fails."""
    with open_memory() as memory:
        pinned = None if expected_pubkey is None else [pin_key(expected_pubkey, memory.log.origin)]
        report = memory.verify_audit(pinned_keys=pinned, state=state)
    print_report(report, as_json)


decision_app = typer.Typer(help="Signed snapshots of the beliefs a decision used.", no_args_is_help=True)
app.add_typer(decision_app, name="decision")


@decision_app.command("record")
def record_decision(
    summary: str,
    used: Annotated[list[str], typer.Option("--used", help="A record id the decision used (repeat).")],
    user: UserOpt = "default",
    agent: AgentOpt = "",
    run: RunOpt = "",
    for_legal_claim: LegalClaimOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Record a decision and sign a snapshot of exactly the records it used."""
    with open_memory() as memory:
        decision = memory.record_decision(summary, used, space=Space(user, agent, run), for_legal_claim=for_legal_claim)
    if as_json:
        emit(decision.to_json())
    else:
        out.print(f"recorded decision {decision.id} (sha256 {decision.hash})")


@decision_app.command("explain")
def explain_decision(
    decision_id: Annotated[str, typer.Argument(metavar="ID")],
    user: UserOpt = "default",
    agent: AgentOpt = "",
    run: RunOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Show a decision's snapshot after verifying its signature; erased beliefs show redacted."""
    with open_memory() as memory:
        decision = memory.explain_decision(decision_id, space=Space(user, agent, run))
    if as_json:
        emit(decision.to_json())
        return
    body = decision.body
    out.print(f"decision {decision.id}: {visible(body['summary'])}")
    out.print(f"signature verified ({decision.signed_by}); sha256 {decision.hash}")
    table = new_table("record", "key", "value", "confidence", "log index", free=("key", "value"))
    for b in body["beliefs"]:
        value = "[redacted: erased]" if b["redacted"] else b["value"]
        add_row(table, b["record"], b["key"] or "", value, str(b["confidence"] or ""), str(b["log_index"]))
    out.print(table)
    for r in body["redactions"]:
        out.print(f"redacted by {r['by']} {visible(r['request'])}: {len(r['records'])} belief(s)")
