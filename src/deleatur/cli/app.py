"""The ``deleatur`` command line. Every command parses its options, calls one
library function, and prints the result (``--json`` for scripts); no rule of
the product lives here."""

from __future__ import annotations

import errno
import getpass
import json
import os
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TextIO

import typer
from rich.table import Table

# Typer's own copy of click raises these; it has no public name for them.
from typer._click.exceptions import ClickException, NoArgsIsHelpError, NoSuchOption

from .. import __version__
from ..crypto.master import default_key_file, from_environment
from ..errors import DeleaturError, StoreError
from ..memory import Memory
from ..model import Hit, Record, Space, parse_metadata
from . import access as _access_commands  # noqa: F401  (registers principals, audit, whoami)
from . import erasure as _erasure_commands  # noqa: F401  (registers the erasure commands)
from . import rights as _rights_commands  # noqa: F401  (registers the restriction commands)
from . import serve as _serve_commands  # noqa: F401  (registers deleatur serve)
from .common import (
    AgentOpt,
    JsonOpt,
    LegalClaimOpt,
    Options,
    RunOpt,
    UserOpt,
    add_row,
    app,
    check_output_path,
    emit,
    new_table,
    open_memory,
    out,
    print_error,
    read_text,
    store_tenant,
    visible,
    write_output,
)
from .logs import keys_app, log_app, witness_app

app.add_typer(keys_app, name="keys")
app.add_typer(log_app, name="log")
app.add_typer(witness_app, name="witness")


def _records_table(
    records: Iterable[Record], *, scores: dict[str, float] | None = None, provenance: bool = False
) -> Table:
    columns = ["id", "subject", "key", "status", "text"]
    columns += ["score"] if scores is not None else []
    columns += ["reason", "actor"] if provenance else []
    table = new_table(*columns, free=("subject", "key", "text", "reason", "actor"))
    for r in records:
        row = [r.id, r.subject_original, r.key or "", r.status.value, r.text]
        # Significant digits: a word in most records of a small store scores ~1e-6.
        row += [f"{scores[r.id]:.3g}"] if scores is not None else []
        row += [r.reason or "", r.actor or ""] if provenance else []
        add_row(table, *row)
    return table


@app.command()
def init(as_json: JsonOpt = False) -> None:
    """Create the store, its key store and a master key file (mode 0600)."""
    try:
        Options.store.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        raise StoreError(f"{Options.store.parent} is not a directory") from None
    except OSError as exc:
        raise StoreError(f"cannot create directory {Options.store.parent}: {exc.strerror}") from None
    env_master = os.environ.get("DELEATUR_MASTER_KEY") or os.environ.get("DELEATUR_PASSPHRASE")
    master = from_environment(Options.store, Options.key_file) if env_master else None
    key_file = Options.key_file or default_key_file(Options.store)
    memory, info = Memory.init(Options.store, master, key_file=key_file, tenant=store_tenant())
    memory.close()
    if as_json:
        emit(
            {
                "store": str(info.store),
                "key_store": str(info.key_store),
                "master_key": info.master_key,
                "store_id": info.store_id,
            }
        )
        return
    out.print(f"store:      {visible(str(info.store))}")
    out.print(f"key store:  {visible(str(info.key_store))}  (keep it out of database backups)")
    out.print(f"master key: {visible(str(info.master_key))}")
    out.print(f"store id:   {info.store_id}")


@app.command()
def remember(
    text: Annotated[str, typer.Argument(help="The memory text ('-' reads standard input).")],
    subject: Annotated[str, typer.Option("--subject", "-s", help="Who the memory is about.")],
    key: Annotated[str | None, typer.Option("--key", "-k", help="Fact slot, e.g. alice::phone.")] = None,
    source: Annotated[str | None, typer.Option("--source", help="Where the memory came from.")] = None,
    derived_from: Annotated[
        list[str] | None, typer.Option("--derived-from", help="Id of a record this derives from.")
    ] = None,
    metadata: Annotated[str | None, typer.Option("--metadata", help="A JSON object.")] = None,
    confidence: Annotated[float | None, typer.Option("--confidence", help="Between 0 and 1.")] = None,
    expires_at: Annotated[
        str | None,
        typer.Option(
            "--expires-at", help="A future time: microseconds since the epoch, ISO 8601, or a delay like 30d."
        ),
    ] = None,
    receipt_file: Annotated[
        Path | None, typer.Option("--receipt", help="Also write a signed write receipt to this file.")
    ] = None,
    for_legal_claim: LegalClaimOpt = False,
    user: UserOpt = "default",
    agent: AgentOpt = "",
    run: RunOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Write a memory; prints its id."""
    meta = parse_metadata(metadata) if metadata is not None else None
    if receipt_file is not None:
        check_output_path(receipt_file)
    with open_memory() as memory:
        record = memory.remember(
            read_text(text),
            subject=subject,
            space=Space(user, agent, run),
            key=key,
            metadata=meta,
            source=source,
            confidence=confidence,
            derived_from=derived_from or (),
            expires_at=expires_at,
            for_legal_claim=for_legal_claim,
        )
        if as_json:
            emit(record.to_json())
        else:
            out.print(record.id)
        if receipt_file is not None:
            try:
                receipt = memory.receipt(record.id, space=record.space)
                write_output(receipt_file, json.dumps(receipt.to_json(), indent=2) + "\n")
            except DeleaturError as exc:
                # The record is written (its id is printed above): not to be written again by a
                # retry, whatever kept its receipt (a lock held elsewhere, a full disk); the
                # receipt can be had again.
                raise DeleaturError(
                    f"the record {record.id} was written, but not its receipt: {exc.message}; get it with"
                    f" `deleatur receipt {record.id} --out FILE`"
                ) from None


@app.command()
def recall(
    query: str,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Most results to return.")] = 10,
    user: UserOpt = "default",
    agent: AgentOpt = "",
    run: RunOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Full-text search (BM25) over the active memories of one space."""
    with open_memory() as memory:
        hits: list[Hit] = memory.recall(query, space=Space(user, agent, run), limit=limit)
    if as_json:
        emit([h.to_json() for h in hits])
    elif not hits:
        out.print("no matching memories")
    else:
        out.print(_records_table((h.record for h in hits), scores={h.record.id: h.score for h in hits}))


@app.command()
def get(
    record_id: Annotated[str, typer.Argument(metavar="ID")],
    user: UserOpt = "default",
    agent: AgentOpt = "",
    run: RunOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Show one memory."""
    with open_memory() as memory:
        record = memory.get(record_id, space=Space(user, agent, run))
    if as_json:
        emit(record.to_json())
        return
    table = new_table("field", "value", free=("value",), show_header=False)
    for name, value in record.to_json().items():
        add_row(
            table,
            name,
            "" if value is None else json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value,
        )
    out.print(table)


@app.command("list")
def list_(
    subject: Annotated[str | None, typer.Option("--subject", "-s")] = None,
    key: Annotated[str | None, typer.Option("--key", "-k")] = None,
    history: Annotated[bool, typer.Option("--history", help="Include retired and superseded records.")] = False,
    limit: Annotated[int | None, typer.Option("--limit", "-n", min=1)] = None,
    user: UserOpt = "default",
    agent: AgentOpt = "",
    run: RunOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """List the memories of one space, oldest first."""
    with open_memory() as memory:
        records = memory.list(
            space=Space(user, agent, run), subject=subject, key=key, include_history=history, limit=limit
        )
        if as_json:
            # Stream one JSON array without holding every record in memory.
            sys.stdout.write("[")
            for n, record in enumerate(records):
                sys.stdout.write(("," if n else "") + json.dumps(record.to_json(), ensure_ascii=False))
            sys.stdout.write("]\n")
        else:
            out.print(_records_table(records))


@app.command()
def forget(
    record_id: Annotated[str | None, typer.Argument(metavar="[ID]")] = None,
    key: Annotated[str | None, typer.Option("--key", "-k", help="Retire the current value of this key.")] = None,
    user: UserOpt = "default",
    agent: AgentOpt = "",
    run: RunOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Retire a memory: no longer recalled, kept in history (use erasure to remove it)."""
    with open_memory() as memory:
        record = memory.forget(space=Space(user, agent, run), record_id=record_id, key=key)
    if as_json:
        emit(record.to_json())
    else:
        out.print(f"retired {record.id}" + (f" [key={visible(record.key)}]" if record.key else ""))


@app.command()
def history(
    key: Annotated[str, typer.Option("--key", "-k")],
    user: UserOpt = "default",
    agent: AgentOpt = "",
    run: RunOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Every version of a key, oldest first."""
    with open_memory() as memory:
        records = memory.history(key, space=Space(user, agent, run))
    if as_json:
        emit([r.to_json() for r in records])
        return
    out.print(_records_table(records, provenance=True))


@app.command()
def rectify(
    text: Annotated[str, typer.Argument(help="The corrected text ('-' reads standard input).")],
    key: Annotated[str, typer.Option("--key", "-k")],
    reason: Annotated[str, typer.Option("--reason", help="Why the value is corrected (recorded).")],
    actor: Annotated[str | None, typer.Option("--actor", help="Who corrects it (default: cli:$USER).")] = None,
    erase_previous: Annotated[
        bool, typer.Option("--erase-previous", help="Hard-delete the inaccurate earlier values.")
    ] = False,
    for_legal_claim: LegalClaimOpt = False,
    user: UserOpt = "default",
    agent: AgentOpt = "",
    run: RunOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Art. 16: supersede the value of a key with a corrected one."""
    with open_memory() as memory:
        record = memory.rectify(
            key,
            read_text(text),
            reason=reason,
            actor=actor or f"cli:{getpass.getuser()}",
            space=Space(user, agent, run),
            erase_previous=erase_previous,
            for_legal_claim=for_legal_claim,
        )
    if as_json:
        emit(record.to_json())
    else:
        out.print(
            f"{record.id} supersedes {record.supersedes}" + (" (earlier values erased)" if erase_previous else "")
        )


@app.command()
def version() -> None:
    """Print the version."""
    out.print(__version__)


def _fail(message: str, code: int) -> NoReturn:
    print_error(message)
    raise SystemExit(code)


class _OutputError(OSError):
    """Standard output could not be written (a full disk, a reader gone): told apart from
    an OSError the work itself met, which is an internal error."""


class _Stdout:
    """Standard output as the commands write it, its failures raised as its own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise _OutputError(exc.errno, exc.strerror) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise _OutputError(exc.errno, exc.strerror) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _output_failed(exc: OSError) -> NoReturn:
    # Nothing of it is to be flushed again as the process exits.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if exc.errno == errno.EPIPE:
        # Its reader has gone (`| head`): exit 1 quietly, as click does when it meets this
        # while the command runs; the reader took what it wanted.
        raise SystemExit(1)
    _fail(f"cannot write the output: {exc.strerror}", 1)


def _where_global_options_go(exc: ClickException) -> str:
    """A global option given after the command is unknown there: say where it goes."""
    if not isinstance(exc, NoSuchOption):
        return ""
    name = exc.option_name
    # Read from the command only now: building it costs the startup of every command.
    global_options = {option for param in typer.main.get_command(app).params for option in getattr(param, "opts", ())}
    if name == "--help" or name not in global_options:
        return ""
    return f"; {name} is a global option: give it before the command (deleatur {name} ... COMMAND)"


def _terminated(signum: int, _frame: object) -> None:
    # Python's default for SIGTERM (a service stopping, a timeout) ends the process at
    # once, leaving a partial export (personal data in clear) beside its output. As an
    # exception, every cleanup on the way out runs first.
    raise SystemExit(128 + signum)


def main() -> None:
    if sys.stdout is sys.__stdout__ and sys.stdout is not None:
        sys.stdout = _Stdout(sys.stdout)
    signal.signal(signal.SIGTERM, _terminated)
    try:
        # Not click's standalone mode, whose usage errors are a box of several lines:
        # an agent that reads stderr gets one line, as from every other error.
        status = app(standalone_mode=False)
    except NoArgsIsHelpError:
        raise SystemExit(2) from None  # the help is already printed
    except ClickException as exc:
        _fail(" ".join(exc.format_message().split()) + _where_global_options_go(exc), exc.exit_code)
    except typer.Abort:
        _fail("aborted", 1)
    except DeleaturError as exc:
        _fail(exc.message if exc.retry_note is None else f"{exc.message} ({exc.retry_note})", exc.exit_code)
    except _OutputError as exc:
        _output_failed(exc)
    except Exception as exc:
        if os.environ.get("DELEATUR_DEBUG"):
            raise
        # The message of an unexpected error may quote data; the type name never does.
        _fail(f"internal error ({type(exc).__name__}); set DELEATUR_DEBUG=1 for details", 1)
    try:
        # What standard output still buffers (all of a short listing) is written here, so
        # that a full disk or a reader gone is told as such (a longer output meets it
        # while the command runs: _OutputError, above).
        sys.stdout.flush()
    except OSError as exc:
        _output_failed(exc)
    # Out of standalone mode, typer.Exit(code) (a failed verification, Ctrl-C's 130)
    # comes back as the return value instead of ending the process.
    if isinstance(status, int) and status:
        raise SystemExit(status)


__all__ = ["app", "main"]
