"""Restriction commands (Art. 18)."""

from __future__ import annotations

import getpass
from typing import Annotated

import typer
from rich.table import Table

from .common import JsonOpt, app, emit, open_memory, out

ActorOpt = Annotated[str | None, typer.Option("--actor", help="Who decides [default: cli:$USER].")]


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
        out.print(f"restricted {restriction.subject}", markup=False)


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
    table = Table()
    for column in ("subject", "since", "actor", "reason"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["subject"], r["since"], r["actor"], r["reason"] or "(key destroyed)")
    out.print(table)
