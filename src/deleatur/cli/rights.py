"""Rights commands: restriction (Art. 18), export (Art. 15/20)."""

from __future__ import annotations

import getpass
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..erasure.requests import check_request_id
from ..errors import InvalidInputError
from ..rights.export import private_output
from .common import (
    NUMBER_ARGUMENT,
    JsonOpt,
    add_row,
    app,
    check_output_path,
    emit,
    new_table,
    open_memory,
    out,
    refuse_store_file,
    visible,
)
from .erasure import ConfirmOpt, TokenOpt, report_erasure

ActorOpt = Annotated[str | None, typer.Option("--actor", help="Who decides (default: cli:$USER).")]


@app.command()
def restrict(
    subject: str,
    reason: Annotated[str, typer.Option("--reason", help="Why processing is restricted (kept encrypted).")],
    actor: ActorOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Art. 18: keep the subject's records but stop recalling them and refuse new writes."""
    with open_memory() as memory:
        restriction = memory.restrict(subject, reason=reason, actor=actor or f"cli:{getpass.getuser()}")
    if as_json:
        emit(restriction.to_json())
    else:
        out.print(f"restricted {visible(restriction.subject)}")


@app.command()
def unrestrict(subject: str, actor: ActorOpt = None) -> None:
    """Lift a restriction of processing."""
    with open_memory() as memory:
        memory.unrestrict(subject, actor=actor or f"cli:{getpass.getuser()}")
    out.print("restriction lifted")


@app.command()
def restrictions(as_json: JsonOpt = False) -> None:
    """Restricted subjects (by pseudonym), with reason, actor and date."""
    with open_memory() as memory:
        rows = [r.to_json() for r in memory.restrictions()]
    if as_json:
        emit(rows)
        return
    table = new_table("subject", "since", "actor", "reason", free=("actor", "reason"))
    for r in rows:
        add_row(table, r["subject"], r["since"], r["actor"], r["reason"] or "(key destroyed)")
    out.print(table)


@app.command()
def export(
    subject: Annotated[str | None, typer.Option("--subject", "-s", help="Everything about this subject.")] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Everything in this user's spaces.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="json, or csv (a directory bundle).")] = "json",
    out_path: Annotated[Path | None, typer.Option("--out", "-o", help="File (json) or empty directory (csv).")] = None,
) -> None:
    """Art. 15/20: stream everything held about a subject or a user, untruncated."""
    if fmt not in ("json", "csv"):
        raise InvalidInputError("--format must be json or csv")
    if fmt == "csv" and out_path is None:
        raise InvalidInputError("a csv export needs --out DIRECTORY")
    if fmt == "json" and out_path is not None:
        check_output_path(out_path)
    if fmt == "csv" and out_path is not None:
        refuse_store_file(out_path)  # the directory the bundle is made in
    with open_memory() as memory:
        if fmt == "csv":
            assert out_path is not None
            counts = memory.export_csv(out_path, subject=subject, user_id=user)
        elif out_path is None:
            counts = memory.export_json(sys.stdout, subject=subject, user_id=user)
        else:
            with private_output(out_path) as handle:
                counts = memory.export_json(handle, subject=subject, user_id=user)
    if out_path is not None:
        shown = visible(str(out_path))
        out.print(f"exported {counts['records']} record(s), {counts['log_entries']} log entries -> {shown}")


retention_app = typer.Typer(help="The retention policy (Art. 5(1)(e)).", no_args_is_help=True)
app.add_typer(retention_app, name="retention")


@retention_app.command("set", context_settings=NUMBER_ARGUMENT)
def retention_set(
    kind: Annotated[str, typer.Argument(help="user, agent or run spaces.")],
    days: Annotated[float | None, typer.Argument(help="Days to keep; omit to keep indefinitely.")] = None,
) -> None:
    """Records written to spaces of KIND expire after DAYS."""
    with open_memory() as memory:
        memory.set_retention(kind, days)
    out.print(f"{kind} spaces: " + (f"{days:g} days" if days is not None else "kept until erased"))


@retention_app.command("show")
def retention_show(as_json: JsonOpt = False) -> None:
    """The retention period of each kind of space."""
    with open_memory() as memory:
        current = memory.retention_policy()
    if as_json:
        emit(current)
        return
    for kind, days in current.items():
        out.print(f"{kind} spaces: " + (f"{days:g} days" if days is not None else "kept until erased"))


@app.command()
def purge(
    older_than: Annotated[
        float | None, typer.Option("--older-than", help="Also purge records older than DAYS.")
    ] = None,
    request_id: Annotated[str | None, typer.Option("--request-id", help="Request id (default: RET-<new id>).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would go; change nothing.")] = False,
    include_audit: Annotated[
        bool,
        typer.Option(
            "--include-audit",
            help="Also prune audit (call) entries older than --older-than, with a retention anchor (operator only).",
        ),
    ] = False,
    issue_token: TokenOpt = False,
    confirm: ConfirmOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Hard-delete expired records (and, with --older-than, old ones), with tombstones."""
    if include_audit and (older_than is None or dry_run):
        raise InvalidInputError("--include-audit needs --older-than DAYS, and has no dry run")
    # Everything the purge could refuse as bad input is checked before the audit is pruned.
    if request_id is not None:
        check_request_id(request_id)
    if issue_token and not dry_run:
        raise InvalidInputError("--issue-token comes with --dry-run: a token confirms a dry run")
    if include_audit and confirm is not None:
        raise InvalidInputError("--include-audit is the operator's, who confirms nothing: drop --confirm")
    with open_memory() as memory:
        # The operator-only part first: a refusal leaves everything as it was.
        pruned = memory.prune_audit(older_than_days=older_than) if include_audit and older_than is not None else None
        result = memory.purge(
            older_than_days=older_than,
            request_id=request_id,
            dry_run=dry_run,
            issue_token=issue_token,
            confirmation=confirm,
        )
    report_erasure(result, as_json, extra=None if pruned is None else {"audit_entries_pruned": pruned})
