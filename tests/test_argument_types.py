"""Every public call answers an argument of the wrong type with InvalidInputError, in one
line naming the argument: never a bare TypeError, AttributeError or ValueError from deep
inside, and never by quietly coercing it (``dry_run=None`` must not erase, ``True`` must
not be one day). The sweep passes each kind of value to each argument of each call."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from deleatur import (
    Cosigner,
    InvalidInputError,
    Memory,
    NewMemory,
    Space,
    SpaceFilter,
    StoreError,
    canonical_subject,
    from_bytes,
    from_environment,
    from_file,
    from_hex,
    from_passphrase,
)
from deleatur.log.checkpoint import Checkpoint
from deleatur.log.merkle import ProofError, verify_inclusion
from deleatur.log.note import Note, NoteError, Signer, Verifier
from deleatur.log.receipt import Receipt, ReceiptError
from deleatur.log.tlogproof import TlogProof

from .conftest import MASTER, FakeClock

#: One value of each kind a caller might pass where another kind is expected.
KINDS: dict[str, object] = {
    "None": None,
    "int": 5,
    "bool": True,
    "float": 1.5,
    "str": "x",
    "list": ["x"],
    "dict": {"a": 1},
}


@dataclass
class Ctx:
    """What valid arguments refer to: made afresh in each test's store."""

    memory: Memory
    tmp: Path
    record: str
    decision: str
    request: str
    principal: str
    witness: Any
    cosignature: str
    note: Any
    me: Any


@dataclass(frozen=True)
class Call:
    """A public call, with valid arguments, the kinds of value each argument takes (its own
    type: not tested), and which arguments are passed positionally."""

    method: str
    args: Callable[[Ctx], dict[str, Any]]
    own: Mapping[str, str] = field(default_factory=dict)
    positional: tuple[str, ...] = ()
    only: tuple[str, ...] | None = None  # the arguments this baseline is for; all if None
    #: How a refusal names the argument, when not by its own name.
    named: Mapping[str, str] = field(default_factory=dict)


SPACE = Space()
ERASE = {"request_id": "E-1", "basis": "b", "requester": "r"}

CALLS = [
    Call(
        "remember",
        lambda c: {
            "text": "t",
            "subject": "Alice",
            "space": SPACE,
            "key": None,
            "metadata": None,
            "source": None,
            "confidence": None,
            "derived_from": (),
            "expires_at": None,
            "for_legal_claim": False,
        },
        own={
            "text": "str",
            "subject": "str",
            "key": "None str",
            "metadata": "None dict",
            "source": "None str",
            "confidence": "None float",
            "expires_at": "None",
            "for_legal_claim": "bool",
        },
        positional=("text",),
    ),
    Call(
        "remember_many",
        lambda c: {"items": [NewMemory("t", subject="Alice")], "space": SPACE, "for_legal_claim": False},
        own={"for_legal_claim": "bool"},
        positional=("items",),
    ),
    Call(
        "recall",
        lambda c: {"query": "phone", "space": SPACE, "limit": 10},
        own={"query": "str", "limit": "int"},
        positional=("query",),
    ),
    Call(
        "list",
        lambda c: {
            "space": SPACE,
            "subject": None,
            "key": None,
            "include_history": False,
            "limit": None,
            "after": None,
        },
        own={"subject": "None str", "key": "None str", "include_history": "bool", "limit": "None int", "after": "None"},
    ),
    Call("history", lambda c: {"key": "alice::phone", "space": SPACE}, own={"key": "str"}, positional=("key",)),
    Call(
        "versions",
        lambda c: {"key": "alice::phone", "space": SPACE, "limit": None, "after": None},
        own={"key": "str", "limit": "None int", "after": "None"},
        positional=("key",),
    ),
    Call("get", lambda c: {"record_id": c.record, "space": SPACE}, positional=("record_id",)),
    Call("receipt", lambda c: {"record_id": c.record, "space": SPACE}, positional=("record_id",)),
    Call(
        "forget",
        lambda c: {"space": SPACE, "record_id": c.record},
        own={"record_id": "None"},
        only=("space", "record_id"),
    ),
    Call("forget", lambda c: {"key": "alice::phone"}, own={"key": "None str"}, only=("key",)),
    Call(
        "rectify",
        lambda c: {
            "key": "alice::phone",
            "text": "t2",
            "reason": "r",
            "actor": "a",
            "space": SPACE,
            "erase_previous": False,
            "for_legal_claim": False,
        },
        own={
            "key": "str",
            "text": "str",
            "reason": "str",
            "actor": "str",
            "erase_previous": "bool",
            "for_legal_claim": "bool",
        },
        positional=("key", "text"),
    ),
    Call(
        "record_decision",
        lambda c: {"summary": "s", "used": [c.record], "space": SPACE, "for_legal_claim": False},
        own={"summary": "str", "for_legal_claim": "bool"},
        positional=("summary", "used"),
    ),
    Call(
        "explain_decision",
        lambda c: {"decision_id": c.decision, "space": SPACE},
        own={"decision_id": "str"},
        positional=("decision_id",),
    ),
    Call(
        "erase",
        lambda c: {
            "subject": "Nobody",
            **ERASE,
            "scope": SpaceFilter(),
            "dry_run": True,
            "allow_ambiguous": False,
            "issue_token": False,
        },
        own={
            "subject": "str",
            "request_id": "str",
            "basis": "str",
            "requester": "str",
            "dry_run": "bool",
            "allow_ambiguous": "bool",
            "issue_token": "bool",
        },
        positional=("subject",),
        named={"request_id": "request id", "basis": "legal basis"},
    ),
    # Only a real erasure reads these: a dry run ignores a confirmation.
    Call(
        "erase",
        lambda c: {"subject": "Nobody", **ERASE, "dry_run": False, "confirmation": None, "require_confirmation": False},
        own={"confirmation": "None str", "require_confirmation": "bool"},
        only=("confirmation", "require_confirmation"),
    ),
    Call(
        "erase_all",
        lambda c: {
            "user_id": "nobody",
            **ERASE,
            "agent_id": None,
            "run_id": None,
            "dry_run": True,
            "issue_token": False,
        },
        own={
            "user_id": "str",
            "request_id": "str",
            "basis": "str",
            "requester": "str",
            "agent_id": "None str",
            "run_id": "None str",
            "dry_run": "bool",
            "issue_token": "bool",
        },
        named={"request_id": "request id", "basis": "legal basis"},
    ),
    Call(
        "erase_all",
        lambda c: {"user_id": "nobody", **ERASE, "dry_run": False, "confirmation": None, "require_confirmation": False},
        own={"confirmation": "None str", "require_confirmation": "bool"},
        only=("confirmation", "require_confirmation"),
    ),
    Call(
        "certificate",
        lambda c: {"request_id": c.request},
        own={"request_id": "str"},
        positional=("request_id",),
        named={"request_id": "request id"},
    ),
    Call(
        "erasure_request",
        lambda c: {"request_id": c.request},
        own={"request_id": "str"},
        positional=("request_id",),
        named={"request_id": "request id"},
    ),
    Call(
        "residue",
        lambda c: {"subject": "Alice", "identifiers": ["+100"]},
        own={"subject": "str", "identifiers": "list"},
        positional=("subject", "identifiers"),
    ),
    Call(
        "export_json",
        lambda c: {"out": io.StringIO(), "subject": "Alice", "user_id": None},
        own={"subject": "None str", "user_id": "None str"},
        positional=("out",),
    ),
    Call(
        "export_csv",
        lambda c: {"directory": c.tmp / "csv", "subject": "Alice", "user_id": None},
        own={"directory": "str", "subject": "None str", "user_id": "None str"},
        positional=("directory",),
    ),
    Call(
        "set_retention",
        lambda c: {"kind": "run", "days": 30},
        own={"kind": "str", "days": "None int float"},
        positional=("kind", "days"),
    ),
    Call(
        "purge",
        lambda c: {"older_than_days": 100_000, "request_id": None, "dry_run": True, "issue_token": False},
        own={"older_than_days": "None int float", "request_id": "None str", "dry_run": "bool", "issue_token": "bool"},
        named={"request_id": "request id"},
    ),
    Call(
        "purge",
        lambda c: {"older_than_days": 100_000, "dry_run": False, "confirmation": None},
        own={"confirmation": "None str"},
        only=("confirmation",),
    ),
    Call("prune_audit", lambda c: {"older_than_days": 100_000}, own={"older_than_days": "int float"}),
    Call(
        "restrict",
        lambda c: {"subject": "Alice", "reason": "r", "actor": "a"},
        own={"subject": "str", "reason": "str", "actor": "str"},
        positional=("subject",),
    ),
    Call(
        "unrestrict",
        lambda c: {"subject": "Restricted", "actor": "a"},
        own={"subject": "str", "actor": "str"},
        positional=("subject",),
    ),
    Call(
        "create_principal",
        lambda c: {"name": "bot", "role": "agent", "scopes": None, "tenant": None},
        own={"name": "str", "role": "str", "scopes": "None list", "tenant": "None str"},
        positional=("name", "role"),
        named={"name": "name"},
    ),
    Call(
        "revoke_principal",
        lambda c: {"principal_id": c.principal},
        own={"principal_id": "str"},
        positional=("principal_id",),
    ),
    Call("as_principal", lambda c: {"principal": c.me}, positional=("principal",)),
    Call("checkpoint", lambda c: {"size": None}, own={"size": "None int"}),
    Call("prove", lambda c: {"index": 0}, own={"index": "int"}, positional=("index",)),
    Call(
        "consistency_request",
        lambda c: {"old": c.note, "new_witness": False},
        own={"new_witness": "bool"},
        positional=("old",),
    ),
    Call(
        "add_cosignatures",
        lambda c: {"lines": c.cosignature, "witness": c.witness, "size": None},
        own={"lines": "str", "size": "None int"},
        positional=("lines", "witness"),
    ),
    Call(
        "verify_log",
        lambda c: {"pinned_keys": None, "pinned_checkpoint": None},
        own={"pinned_keys": "None", "pinned_checkpoint": "None"},
    ),
    Call(
        "verify_audit", lambda c: {"pinned_keys": None, "state": None}, own={"pinned_keys": "None", "state": "None str"}
    ),
    Call(
        "audit_entries",
        lambda c: {"start": 0, "limit": None, "calls_only": False, "actor": None, "scan": None},
        own={"start": "int", "limit": "None int", "calls_only": "bool", "actor": "None str", "scan": "None int"},
    ),
]


def _cases() -> list[Any]:
    # The arguments of a baseline, read without a store: every field of the Ctx is a stand-in.
    stand_in = Ctx(*(None for _ in Ctx.__dataclass_fields__))  # type: ignore[arg-type]
    stand_in.tmp = Path()
    return [
        pytest.param(call, name, id=f"{call.method}-{name}")
        for call in CALLS
        for name in call.only or tuple(call.args(stand_in))
    ]


@pytest.fixture
def ctx(memory: Memory, tmp_path: Path) -> Ctx:
    record = memory.remember("Alice's phone is +100", subject="Alice", key="alice::phone")
    decision = memory.record_decision("called Alice", [record.id])
    memory.remember("kept", subject="Gone")
    request = memory.erase("Gone", request_id="DONE-1", basis="b", requester="r").request
    assert request is not None
    memory.remember("held", subject="Restricted")
    memory.restrict("Restricted", reason="contested", actor="dpo")
    principal, _ = memory.create_principal("someone", "member")
    cosigner = Cosigner("witness.example/w", Ed25519PrivateKey.generate())
    note = memory.checkpoint()
    line = cosigner.cosign(note.text, 1_790_000_000).line()
    return Ctx(
        memory,
        tmp_path,
        record.id,
        decision.id,
        request.id,
        principal.id,
        cosigner.verifier,
        line,
        note,
        memory.principal,
    )


def _call(call: Call, ctx: Ctx, name: str, value: object) -> object:
    kwargs = call.args(ctx)
    kwargs[name] = value
    args = [kwargs.pop(p) for p in call.positional]
    return getattr(ctx.memory, call.method)(*args, **kwargs)


def _sweep(own: str, word: str, attempt: Callable[[object], object]) -> list[str]:
    """What went wrong passing each kind of value but the argument's own ones."""
    problems = []
    for kind, value in KINDS.items():
        if kind in own.split():
            continue
        try:
            attempt(value)
        except InvalidInputError as exc:
            if word not in exc.message or "\n" in exc.message:
                problems.append(f"{kind}: InvalidInputError not naming {word!r} in one line: {exc.message!r}")
        except Exception as exc:
            problems.append(f"{kind}: {type(exc).__name__}: {exc}")
        else:
            problems.append(f"{kind}: accepted {value!r}")
    return problems


@pytest.mark.parametrize(("call", "name"), _cases())
def test_wrong_argument_types_are_invalid_input(ctx: Ctx, call: Call, name: str) -> None:
    problems = _sweep(call.own.get(name, ""), call.named.get(name, name), lambda v: _call(call, ctx, name, v))
    assert not problems, f"{call.method}({name}=...):\n" + "\n".join(problems)


_opened = iter(range(1_000_000))


def _open(tmp: Path, **given: Any) -> None:
    args: dict[str, Any] = {"path": tmp / "open.db", "master": from_bytes(MASTER), "create": True, **given}
    Memory.open(args.pop("path"), args.pop("master"), **args).close()


def _init(tmp: Path, **given: Any) -> None:
    args: dict[str, Any] = {"path": tmp / f"init{next(_opened)}.db", "master": None, **given}
    Memory.init(args.pop("path"), args.pop("master"), **args)[0].close()


#: (the call, the argument, its own kinds): the constructors and re-exported functions.
FUNCTIONS: list[tuple[str, str, str, Callable[[Path, object], object]]] = [
    ("Memory.open", "path", "str", lambda t, v: _open(t, path=t / "sub" / "none.db" if v == "x" else v)),
    ("Memory.open", "master", "", lambda t, v: _open(t, master=v)),
    ("Memory.open", "tenant", "str", lambda t, v: _open(t, tenant=v)),
    ("Memory.open", "max_text_bytes", "int", lambda t, v: _open(t, max_text_bytes=v)),
    ("Memory.open", "full_sync", "bool", lambda t, v: _open(t, full_sync=v)),
    ("Memory.open", "create", "bool", lambda t, v: _open(t, create=v)),
    ("Memory.open", "checkpoint_interval_us", "int", lambda t, v: _open(t, checkpoint_interval_us=v)),
    ("Memory.init", "path", "str", lambda t, v: _init(t, path=v)),
    ("Memory.init", "master", "None", lambda t, v: _init(t, master=v)),
    ("Memory.init", "key_file", "None str", lambda t, v: _init(t, key_file=v)),
    ("Memory.init", "max_text_bytes", "int", lambda t, v: _init(t, max_text_bytes=v)),
    ("canonical_subject", "subject", "str", lambda t, v: canonical_subject(v)),  # type: ignore[arg-type]
    ("from_bytes", "key", "", lambda t, v: from_bytes(v)),  # type: ignore[arg-type]
    ("from_hex", "value", "str", lambda t, v: from_hex(v)),  # type: ignore[arg-type]
    ("from_passphrase", "passphrase", "str", lambda t, v: from_passphrase(v)),  # type: ignore[arg-type]
    ("from_file", "path", "str", lambda t, v: from_file(v)),  # type: ignore[arg-type]
    ("from_environment", "store_path", "str", lambda t, v: from_environment(v)),  # type: ignore[arg-type]
    ("from_environment", "key_file", "None str", from_environment),  # type: ignore[list-item]
    *(
        (cls.__name__, part, own, lambda t, v, cls=cls, part=part: cls(**{part: v}))
        for cls, own in ((Space, "str"), (SpaceFilter, "None str"))
        for part in ("user_id", "agent_id", "run_id")
    ),
    *(
        ("NewMemory", part, own, lambda t, v, part=part: NewMemory(**{"text": "t", "subject": "s", part: v}))
        for part, own in (
            ("text", "str"),
            ("subject", "str"),
            ("key", "None str"),
            ("metadata", "None dict"),
            ("source", "None str"),
            ("confidence", "None float"),
            ("derived_from", "list"),
            ("expires_at", "None int"),
        )
    ),
]


@pytest.mark.parametrize("case", [pytest.param(f, id=f"{f[0]}-{f[1]}") for f in FUNCTIONS])
def test_public_functions_refuse_wrong_types(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[str, str, str, Callable[[Path, object], object]]
) -> None:
    function, name, own, attempt = case
    for var in ("DELEATUR_MASTER_KEY", "DELEATUR_PASSPHRASE", "DELEATUR_MASTER_KEY_FILE"):
        monkeypatch.delenv(var, raising=False)
    problems = _sweep(own, name, lambda v: attempt(tmp_path, v))
    assert not problems, f"{function}({name}=...):\n" + "\n".join(problems)


def test_an_empty_request_id_is_refused_by_purge_as_by_erase(memory: Memory, clock: FakeClock) -> None:
    """None asks purge for a generated id; an explicit empty one is bad input, as erase says."""
    with pytest.raises(InvalidInputError, match="request id must be") as erased:
        memory.erase("Alice", request_id="", basis="b", requester="r")
    with pytest.raises(InvalidInputError, match="request id must be") as purged:
        memory.purge(request_id="")
    assert purged.value.message == erased.value.message
    memory.remember("expiring", subject="a", expires_at=clock.now + 1)
    clock.advance(1)
    result = memory.purge(request_id=None)
    assert result.request is not None and result.request.id.startswith("RET-")


def test_purge_refuses_a_bool_and_a_string_for_days(memory: Memory) -> None:
    """True is not one day, nor "5" five: both are refused, naming the argument."""
    for days in (True, "5"):
        with pytest.raises(InvalidInputError, match=r"^older_than_days must be a finite number$"):
            memory.purge(older_than_days=days, dry_run=True)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match=r"^days must be a finite number$"):
            memory.set_retention("run", days)  # type: ignore[arg-type]


def test_a_dry_run_flag_that_is_not_a_bool_erases_nothing(memory: Memory) -> None:
    """dry_run=None is falsy: taken as given, it would have erased for real."""
    record = memory.remember("kept", subject="Alice")
    with pytest.raises(InvalidInputError, match=r"^dry_run must be True or False$"):
        memory.erase("Alice", request_id="E-1", basis="b", requester="r", dry_run=None)  # type: ignore[arg-type]
    assert memory.get(record.id).text == "kept"


@pytest.mark.parametrize("path", ["m\x00.db", "m\ud800.db"])
def test_a_path_no_file_system_can_hold_is_invalid_input(tmp_path: Path, path: str) -> None:
    """It was the OS call's ValueError (a NUL byte) or UnicodeEncodeError (a lone
    surrogate), not a DeleaturError naming the argument."""
    with pytest.raises(InvalidInputError, match=r"^path (contains a NUL byte|is not valid UTF-8)$"):
        Memory.init(str(tmp_path / path))
    with pytest.raises(InvalidInputError, match=r"^path (contains a NUL byte|is not valid UTF-8)$"):
        Memory.open(str(tmp_path / path), from_bytes(bytes(32)), create=True)
    assert list(tmp_path.iterdir()) == []


def test_a_store_name_too_long_for_the_file_system_is_a_store_error(tmp_path: Path) -> None:
    """It was the OS call's OSError (ENAMETOOLONG) from Memory.open, where init said StoreError."""
    with pytest.raises(StoreError, match=r"cannot open .*: File name too long"):
        Memory.open(tmp_path / ("x" * 300 + ".db"), from_bytes(bytes(32)), create=True)


def test_a_file_to_write_whose_name_is_too_long_is_invalid_input(memory: Memory, tmp_path: Path) -> None:
    """pathlib's exists() raises ENAMETOOLONG's OSError rather than answer False: it was
    that raw error, where a name the file system cannot hold is the caller's mistake."""
    long = tmp_path / ("a" * 300)
    for call, name in (
        (lambda: memory.export_csv(long, user_id="u1"), "directory"),
        (lambda: memory.verify_audit(state=long), "state"),
        (lambda: Memory.init(tmp_path / "new.db", key_file=long), "key_file"),
    ):
        with pytest.raises(InvalidInputError, match=f"^{name} is too long a path: a file name is at most 255 bytes$"):
            call()
    assert not (tmp_path / "new.db").exists()


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.explain_decision("\ud800"),
        lambda m: m.revoke_principal("\ud800"),
        lambda m: m.erase("Bob", request_id="E1", basis="b", requester="r", confirmation="\ud800"),
        lambda m: m.purge(older_than_days=0, confirmation="\ud800"),
    ],
    ids=["decision_id", "principal_id", "erase-confirmation", "purge-confirmation"],
)
def test_an_id_that_is_not_utf8_is_invalid_input(memory: Memory, call: Callable[[Memory], object]) -> None:
    """A lone surrogate (what a bad decode leaves) raised UnicodeEncodeError from the
    hash or statement it reached: over HTTP, a 500 for a client's mistake."""
    with pytest.raises(InvalidInputError, match=r"is not valid UTF-8$"):
        call(memory)


def test_numbers_past_a_floats_range_are_invalid_input(memory: Memory) -> None:
    """They raised OverflowError (math.isfinite of an int, int() of an infinite product)."""
    with pytest.raises(InvalidInputError, match="confidence must be between 0 and 1"):
        memory.remember("t", subject="s", confidence=10**400)
    with pytest.raises(InvalidInputError, match=r"older_than_days .* from 0 to 1,000,000"):
        memory.prune_audit(older_than_days=1e308)
    assert list(memory.list()) == []


@pytest.mark.parametrize("value", [None, 5, {"a": 1}, b"\xff\xfe"], ids=["None", "int", "dict", "bytes"])
def test_the_format_parsers_refuse_what_is_not_text(value: Any) -> None:
    """They raised AttributeError or TypeError from the first string method they called."""
    for parse in (
        Note.parse,
        Checkpoint.parse,
        TlogProof.parse,
        Verifier.from_vkey,
        Signer.from_skey,
        Cosigner.from_skey,
    ):
        with pytest.raises(NoteError, match="must be text"):
            parse(value)
    if not isinstance(value, bytes):  # bytes are JSON text to json.loads, refused as such
        with pytest.raises(ReceiptError, match="must be JSON text"):
            Receipt.loads(value)
    with pytest.raises(ProofError, match=r"hashes must be bytes|the proof must be a list"):
        verify_inclusion(0, 1, value, value, value)


def test_a_signed_note_splits_its_lines_at_newlines_only() -> None:
    """splitlines() also split at a carriage return or U+2028, taking signature lines that
    C2SP (and Go's parser) refuse."""
    signer = Signer.generate("example.com/log")
    note = Note("a checkpoint\n", (signer.sign("a checkpoint\n"),)).format()
    assert Note.parse(note).signatures
    for odd in ("\r\n", "\u2028", "\x85"):
        with pytest.raises(NoteError):
            Note.parse(note[:-1] + odd + note.splitlines(keepends=True)[-1])
