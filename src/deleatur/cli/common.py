"""What every ``deleatur`` command shares: the root app, global options, output."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..crypto.master import from_environment
from ..errors import InvalidInputError
from ..log.note import NoteError, Verifier, parse_verifier
from ..log.report import Report
from ..memory import Memory
from ..model import check_path, utf8_text
from ..newfiles import store_file

app = typer.Typer(
    name="deleatur",
    help="Agent memory with every GDPR data-subject right built in.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# Plain text: what is printed quotes stored text, ids and paths, in which rich would
# take "[...]" for markup and swallow it, and colour numbers at random.
out = Console(soft_wrap=True, markup=False, highlight=False)
err = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)


def _default_store() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "deleatur" / "memory.db"


class Options:
    store: Path = _default_store()
    tenant: str | None = None  # None: not given (the default tenant, or the API key's)
    key_file: Path | None = None
    api_key: str | None = None


@app.callback()
def _global(
    store: Annotated[
        Path | None,
        typer.Option(
            "--store", envvar="DELEATUR_STORE", help="Store file (default: $XDG_DATA_HOME/deleatur/memory.db)."
        ),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", envvar="DELEATUR_TENANT", help="Tenant (default: 'default', or the API key's)."),
    ] = None,
    master_key_file: Annotated[
        Path | None,
        typer.Option(
            "--master-key-file",
            envvar="DELEATUR_MASTER_KEY_FILE",
            help="Master key file (default: STORE.master-key);"
            " DELEATUR_MASTER_KEY or DELEATUR_PASSPHRASE take precedence.",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="DELEATUR_API_KEY",
            help="Act as the principal of this API key. Without one, a command acts as the"
            " local operator: the tenant's admin, on the store's own machine.",
        ),
    ] = None,
) -> None:
    if store is not None and not store.name:  # "" (which reads as "."), ".", "/"
        raise InvalidInputError("--store must name the store's file, e.g. memory.db (it was empty, or a directory)")
    Options.store = store or _default_store()
    Options.api_key = api_key
    Options.tenant = tenant
    Options.key_file = master_key_file


def store_tenant() -> str:
    """The tenant a handle opens on: --tenant, else the default one."""
    return "default" if Options.tenant is None else Options.tenant


@contextmanager
def open_memory() -> Iterator[Memory]:
    master = from_environment(Options.store, Options.key_file)
    with Memory.open(Options.store, master, tenant=store_tenant()) as memory:
        if Options.api_key is None:
            yield memory
            return
        principal = memory.authenticate(Options.api_key)
        if Options.tenant not in (None, principal.tenant):
            raise InvalidInputError(f"this API key belongs to tenant {principal.tenant!r}, not {Options.tenant!r}")
        yield memory.as_principal(principal)


UserOpt = Annotated[str, typer.Option("--user", "-u", help="user_id of the memory space.")]
AgentOpt = Annotated[str, typer.Option("--agent", "-a", help="agent_id of the memory space.")]
RunOpt = Annotated[str, typer.Option("--run", "-r", help="run_id of the memory space.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
#: The ``context_settings`` of a command whose argument is a number: click reads
#: "-1" as an unknown option ("No such option: -1"); this lets it through to the
#: command, whose own check refuses it by what is wrong with it. (An unknown option
#: there is refused as not a number.)
NUMBER_ARGUMENT: dict[str, Any] = {"ignore_unknown_options": True}
LegalClaimOpt = Annotated[
    bool, typer.Option("--for-legal-claim", help="Allowed for a restricted subject (Art. 18(2)).")
]


# Characters shown as their codes: control characters (Unicode category Cc), and format
# characters (Cf): the bidirectional ones make a terminal show text in another order than
# it is stored ("Trojan Source"), and the invisible ones (zero-width space and joiners, a
# soft hyphen) leave "Finn\u200bWolf" looking like "Finn Wolf": a subject could pass for
# another. Only a character outside printable ASCII needs its category looked up.
_SHOWN_AS_CODES = frozenset({"Cc", "Cf"})
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")


def visible(text: str, *, lines: bool = False) -> str:
    """Stored text as the terminal should show it: control and format characters as their
    codes (a record from before text refused them may hold an escape sequence, and an
    actor from before actors were one line a line break), never run; tabs and line breaks
    kept only where the output has room for them (``lines``)."""

    def shown(match: re.Match[str]) -> str:
        char = match.group()
        if unicodedata.category(char) not in _SHOWN_AS_CODES or (lines and char in "\t\n"):
            return char
        return repr(char)[1:-1]

    return _NOT_PRINTABLE_ASCII.sub(shown, text)


def new_table(*columns: str, free: tuple[str, ...] = (), show_header: bool = True) -> Table:
    """A table whose columns of ids, times and counts are never wrapped or cut short (an
    id is copied from it into the next command); only the ``free`` ones, of stored text,
    wrap to fit the terminal."""
    table = Table(show_header=show_header)
    for column in columns:
        if column in free:
            table.add_column(column, overflow="fold")
        else:
            table.add_column(column, no_wrap=True)
    return table


def add_row(table: Table, *values: str) -> None:
    """A table row of plain text: stored text may contain "[...]", which rich would
    otherwise take for markup and swallow."""
    table.add_row(*(Text(visible(v, lines=True)) for v in values))


def print_error(message: str) -> None:
    """An error as every command reports one: a line on stderr. What it quotes of the
    caller's input (a file name, say) is shown as stored text is, its control characters
    as their codes: an escape sequence in it would run in the terminal, a line break
    split the line."""
    err.print(f"error: {visible(message)}")


def emit(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")


def read_text(text: str) -> str:
    """``-`` reads the text from standard input, which must be UTF-8."""
    if text != "-":
        return text
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"text on standard input is not valid UTF-8 (byte {exc.start})") from None


def read_input(path: str) -> str:
    """A text file argument; ``-`` is standard input."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise InvalidInputError(f"cannot read {path}: {exc.strerror}") from None
    return utf8_text(data, path)


def check_output_path(path: Path) -> None:
    """Refuse an output file that could not be written, before the work that produces
    it changes anything: a write whose receipt then fails would be retried, twice."""
    refuse_store_file(path)
    if path.is_dir():
        raise InvalidInputError(f"cannot write {path}: it is a directory")
    if not path.parent.is_dir():
        raise InvalidInputError(f"cannot write {path}: no directory {path.parent}")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise InvalidInputError(f"cannot write {path}: permission denied")


def refuse_store_file(path: Path) -> None:
    """An output file (or directory) may be none of the store's own (see newfiles.store_file)."""
    check_path(path, str(path), written=True)
    others = [] if Options.key_file is None else [Options.key_file]
    if store_file(Options.store, path, others):
        raise InvalidInputError(
            f"cannot write {path}: it is one of the store's own files (or named after the store beside it),"
            " which it would destroy; name another file"
        )


def write_output(path: Path | None, text: str) -> None:
    """Write to ``path``, or to standard output when no path is given."""
    if path is None:
        sys.stdout.write(text)
        return
    refuse_store_file(path)
    existed = path.exists()
    try:
        # Into the file as named (a link, a pipe, /dev/stdout): what is written here is no
        # one's personal data, unlike an export (private_output).
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        if not existed:
            with contextlib.suppress(OSError):  # none was made (its directory is a file, say)
                path.unlink()  # an empty or cut file would pass for the output
        raise InvalidInputError(f"cannot write {path}: {exc.strerror}") from None


def pin_key(value: str, name: str, given_as: str = "--expected-pubkey") -> Verifier:
    """The verifier key ``value``; a bad one is refused naming the option or argument
    it was ``given_as``."""
    try:
        return parse_verifier(value, name)
    except NoteError as exc:
        raise InvalidInputError(f"{given_as}: {exc.message}") from None


def print_report(report: Report, as_json: bool) -> None:
    if as_json:
        emit(report.to_json())
    else:
        for line in report.lines():
            out.print(line)
    if not report.ok:
        raise typer.Exit(1)
