"""Erasure commands (Art. 17): erase, erase-all, requests, certificate, verify, residue."""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from ..clock import system_clock
from ..erasure.engine import DRY_RUN_FIRST, ErasureResult
from ..erasure.plan import RESIDUE_HINT, ErasurePlan
from ..erasure.requests import NOTHING_DUE, NOTHING_HELD
from ..erasure.verify import pinned_key_for, verify_certificate
from ..errors import InvalidInputError
from ..log.note import Note, NoteError
from ..model import SpaceFilter, loads_readable
from ..store.evidence import StoreEvidence
from ..store.protocol import WAL_NOT_TRUNCATED
from .common import (
    JsonOpt,
    add_row,
    app,
    emit,
    err,
    new_table,
    open_memory,
    out,
    print_report,
    read_input,
    visible,
    write_output,
)
from .logs import PubkeyOpt

RequestIdOpt = Annotated[str, typer.Option("--request-id", help="The DSAR's id; repeating it is idempotent.")]
BasisOpt = Annotated[str, typer.Option("--basis", help="Legal basis, e.g. 'Art. 17(1)(a)'.")]
RequesterOpt = Annotated[str | None, typer.Option("--requester", help="Who asked (default: cli:$USER).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show the blast radius; change nothing.")]
TokenOpt = Annotated[bool, typer.Option("--issue-token", help="With --dry-run: a single-use confirmation token.")]
ConfirmOpt = Annotated[str | None, typer.Option("--confirm", help="The token a dry run issued.")]


WAL_HELD = (
    "write-ahead log NOT truncated: another connection's read kept it, so it may still hold page images"
    " of what was erased; the next open of the store, removal, status read or certificate truncates it"
    " once that read ends, and the request then no longer says so"
)


def _print_kept_restricted(records: int) -> None:
    if records:
        out.print(f"kept: {records} record(s) of restricted subjects (Art. 18)")


def _print_plan(plan: ErasurePlan, token: str | None) -> None:
    if plan.subject is not None:
        direct = "naming the subject"
    else:  # an account erasure, or a retention purge
        direct = "in the account's spaces" if plan.scope.user_id is not None else "expired or past retention"
    out.print(
        f"would erase {plan.total} record(s): {len(plan.direct)} {direct}, {len(plan.lineage)} reached through lineage",
    )
    table = new_table("via", "id", "space", "status", "subject", free=("space", "subject"))
    for r in (*plan.direct, *plan.lineage):
        add_row(table, r.via, r.id, f"{r.user_id}/{r.agent_id}/{r.run_id}", r.status.value, r.subject)
    if plan.total:
        out.print(table)
    if plan.other_subjects:
        others = ", ".join(visible(s) for s in plan.other_subjects)
        out.print(f"other subjects whose derived records go too: {others}")
    if plan.ambiguous:
        out.print(
            "AMBIGUOUS: the subject matches several spellings: "
            + ", ".join(repr(s) for s in plan.spellings)
            + " (erasing needs --allow-ambiguous)",
        )
    for space, n in plan.per_space().items():
        out.print(f"  {visible(space)}: {n}")
    out.print(f"data keys to destroy: {plan.keys_destroyed}")
    if plan.kept_elsewhere:
        out.print(f"kept: {plan.kept_elsewhere} record(s) of the subject outside this scope (its key stays)")
    if plan.outside_lineage:
        out.print(f"kept: {plan.outside_lineage} derived record(s) outside this scope")
    _print_kept_restricted(plan.kept_restricted)
    if plan.erases_restricted:
        out.print(
            f"WARNING: {plan.erases_restricted} of these record(s) are of restricted subjects (Art. 18), whom a"
            " restriction may keep them for (a legal claim): an erasure takes them all the same",
        )
    if plan.subject is not None:
        out.print(f"note: {RESIDUE_HINT}")
    if token:
        out.print(f"confirmation token (single use, 15 min): {token}")


def report_erasure(result: ErasureResult, as_json: bool, *, extra: dict[str, int] | None = None) -> None:
    if as_json:
        emit({**result.to_json(system_clock()), **(extra or {})})
        return
    for name, value in (extra or {}).items():
        out.print(f"{name.replace('_', ' ')}: {value}")
    if result.request is None:
        assert result.plan is not None
        if result.nothing_due:
            out.print(NOTHING_DUE)
            _print_kept_restricted(result.plan.kept_restricted)
        else:
            _print_plan(result.plan, result.token)
        return
    request = result.request
    counts = request.counts
    prefix = "already done: " if result.repeated else ""
    out.print(
        f"{prefix}erased {counts.get('records', 0)} record(s), {len(request.tombstones)} tombstone(s), "
        f"{counts.get('keys_destroyed', 0)} data key(s) destroyed [request {request.id}, {request.status.value}]",
    )
    _print_kept_restricted(counts.get("kept_restricted", 0))
    if WAL_NOT_TRUNCATED in counts:
        out.print(WAL_HELD)
    if not counts.get("records", 0):
        out.print(f"{NOTHING_HELD}; the request is recorded, and its certificate says so")
    out.print(f"certificate: deleatur certificate --request-id {request.id} --out {request.id}.cert.json")


@contextmanager
def _as_options() -> Iterator[None]:
    """A refusal that names a library parameter, told as the option that sets it."""
    try:
        yield
    except InvalidInputError as exc:
        if exc.message == DRY_RUN_FIRST:
            exc.message = "--issue-token needs --dry-run: a confirmation token comes from a dry run"
        raise


@app.command()
def erase(
    subject: Annotated[str, typer.Argument(help="Who the records are about.")],
    request_id: RequestIdOpt,
    basis: BasisOpt,
    requester: RequesterOpt = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's spaces.")] = None,
    agent: Annotated[str | None, typer.Option("--agent", "-a", help="Only this agent's spaces.")] = None,
    run: Annotated[str | None, typer.Option("--run", "-r", help="Only this run's spaces.")] = None,
    dry_run: DryRunOpt = False,
    allow_ambiguous: Annotated[
        bool,
        typer.Option(
            "--allow-ambiguous",
            help="Erase although the subject's records spell its name in several ways (check the dry run first).",
        ),
    ] = False,
    issue_token: TokenOpt = False,
    confirm: ConfirmOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Art. 17: erase a subject everywhere (or in the spaces given), with signed tombstones."""
    with open_memory() as memory, _as_options():
        result = memory.erase(
            subject,
            request_id=request_id,
            basis=basis,
            requester=requester or f"cli:{getpass.getuser()}",
            scope=SpaceFilter(user, agent, run),
            dry_run=dry_run,
            allow_ambiguous=allow_ambiguous,
            issue_token=issue_token,
            confirmation=confirm,
        )
    report_erasure(result, as_json)


@app.command("erase-all")
def erase_all(
    user: Annotated[str, typer.Option("--user", "-u", help="The account whose memory goes.")],
    request_id: RequestIdOpt,
    basis: BasisOpt,
    requester: RequesterOpt = None,
    agent: Annotated[str | None, typer.Option("--agent", "-a", help="Only this agent's space.")] = None,
    run: Annotated[str | None, typer.Option("--run", "-r", help="Only this run's space.")] = None,
    dry_run: DryRunOpt = False,
    issue_token: TokenOpt = False,
    confirm: ConfirmOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Account deletion: every space of one user (never another user's), with tombstones."""
    with open_memory() as memory, _as_options():
        result = memory.erase_all(
            user_id=user,
            agent_id=agent,
            run_id=run,
            request_id=request_id,
            basis=basis,
            requester=requester or f"cli:{getpass.getuser()}",
            dry_run=dry_run,
            issue_token=issue_token,
            confirmation=confirm,
        )
    report_erasure(result, as_json)


@app.command()
def requests(as_json: JsonOpt = False) -> None:
    """Erasure requests, with their Art. 12(3) deadline and whether it was met."""
    now = system_clock()
    with open_memory() as memory:
        rows = [r.to_json(now) for r in memory.erasure_requests()]
    if as_json:
        emit(rows)
        return
    table = new_table(
        "id",
        "kind",
        "subject",
        "status",
        "records",
        "received",
        "deadline",
        "met",
        free=("subject", "received", "deadline"),
    )
    for r in rows:
        met = {True: "yes", False: "NO", None: "open"}[r["deadline_met"]]
        add_row(
            table,
            r["id"],
            r["kind"],
            r["subject"] or "",
            r["status"],
            str(r["counts"].get("records", "")),
            r["received_at"],
            r["deadline"],
            met,
        )
    out.print(table)


@app.command()
def certificate(
    request_id: Annotated[str, typer.Option("--request-id", help="The erasure request's id.")],
    out_file: Annotated[Path | None, typer.Option("--out", "-o", help="Write the certificate here.")] = None,
) -> None:
    """A portable erasure certificate, verifiable offline with the public key alone."""
    with open_memory() as memory:
        document = memory.certificate(request_id)
    write_output(out_file, json.dumps(document, indent=2, sort_keys=True) + "\n")
    if not document["certificate"]["erasure"]["wal_truncated"]:
        # On stderr: the certificate itself may be going to standard output.
        err.print(f"note: {WAL_HELD}; the certificate says so: issue it again then")
    if out_file is not None:
        attested = document["certificate"]["erasure"]["records"]
        what = f"{attested} erasure(s) attested" if attested else "nothing was held: it attests no erasure"
        out.print(f"wrote erasure certificate -> {visible(str(out_file))} ({what})")


@app.command()
def verify(
    certificate_file: Annotated[str, typer.Argument(metavar="CERT", help="A certificate file ('-': stdin).")],
    store: Annotated[Path | None, typer.Option("--store", help="Check absence in this store (read-only).")] = None,
    expected_pubkey: PubkeyOpt = None,
    expected_checkpoint: Annotated[
        str | None, typer.Option("--expected-checkpoint", help="A checkpoint you pinned earlier.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Verify an erasure certificate: one line per numbered check, NOTEs, VERDICT (exit 0 or 1)."""
    text = read_input(certificate_file)
    # Text that is not JSON at all is unreadable input, like a truncated file; JSON whose
    # readers disagree (a repeated key) is verify_certificate's to fail at check 1, saying
    # why, as it reads the text itself, strictly.
    parsed = loads_readable(text, certificate_file)
    pinned = None
    if expected_checkpoint is not None:
        try:
            pinned = Note.parse(read_input(expected_checkpoint))
        except NoteError as exc:
            raise InvalidInputError(f"--expected-checkpoint: {exc.message}") from None
    key = None
    if expected_pubkey is not None:
        try:
            key = pinned_key_for(parsed, expected_pubkey)
        except NoteError as exc:
            raise InvalidInputError(f"--expected-pubkey: {exc.message}") from None
    evidence = None if store is None else StoreEvidence(store)
    try:
        report = verify_certificate(text, expected_key=key, expected_checkpoint=pinned, store=evidence)
    finally:
        if evidence is not None:
            evidence.close()
    print_report(report, as_json)


@app.command()
def residue(
    subject: str,
    identifier: Annotated[list[str], typer.Option("--identifier", "-i", help="A name, number or address.")],
    as_json: JsonOpt = False,
) -> None:
    """Find live records about SUBJECT that are tagged with another subject (for review)."""
    with open_memory() as memory:
        hits = memory.residue(subject, identifier)
    if as_json:
        emit([h.to_json() for h in hits])
        return
    if not hits:
        out.print("no residue: no other record mentions these identifiers")
        return
    table = new_table("id", "space", "tagged subject", "mentions", free=("space", "tagged subject", "mentions"))
    for h in hits:
        add_row(table, h.record_id, f"{h.user_id}/{h.agent_id}/{h.run_id}", h.subject, ", ".join(h.identifiers))
    out.print(table)
