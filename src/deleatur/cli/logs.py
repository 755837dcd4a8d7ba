"""Commands for the verifiable log: keys, checkpoints, proofs, receipts, witnesses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..errors import InvalidInputError
from ..log.cosignature import CosignatureVerifier
from ..log.note import Note, NoteError
from ..log.receipt import Receipt, verify_receipt
from ..log.retention import pruned_leaf
from ..log.witness import Witness
from ..model import Space
from ..store.evidence import StoreEvidence
from .common import (
    NUMBER_ARGUMENT,
    AgentOpt,
    JsonOpt,
    RunOpt,
    UserOpt,
    app,
    emit,
    open_memory,
    out,
    pin_key,
    print_report,
    read_input,
    visible,
    write_output,
)

keys_app = typer.Typer(help="The store's Ed25519 signing key.", no_args_is_help=True)
log_app = typer.Typer(help="The store's transparency log.", no_args_is_help=True)
witness_app = typer.Typer(help="A minimal C2SP witness that cosigns consistent checkpoints.", no_args_is_help=True)

OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Write to this file instead of standard output.")]
PubkeyOpt = Annotated[
    str | None,
    typer.Option("--expected-pubkey", help="Pin the log key: a verifier key (name+id+key) or 64 hex digits."),
]


def _note(text: str, what: str) -> Note:
    try:
        return Note.parse(text)
    except NoteError as exc:
        raise InvalidInputError(f"{what}: {exc.message}") from None


@keys_app.command("new")
def keys_new(as_json: JsonOpt = False) -> None:
    """Give a store its first signing key (stores made by `deleatur init` already have one)."""
    with open_memory() as memory:
        signer = memory.new_signing_key()
        path = memory.signing_key_path
    if as_json:
        emit({"key_file": str(path), "vkey": signer.verifier.vkey})
    else:
        out.print(f"signing key written to {visible(str(path))} (0600)\nverifier key: {signer.verifier.vkey}")


@keys_app.command("rotate")
def keys_rotate(as_json: JsonOpt = False) -> None:
    """Replace the signing key; the log records the new key, endorsed by the old one."""
    with open_memory() as memory:
        signer = memory.rotate_signing_key()
    if as_json:
        emit({"vkey": signer.verifier.vkey})
    else:
        out.print(f"new verifier key: {signer.verifier.vkey}")


@keys_app.command("show")
def keys_show(as_json: JsonOpt = False) -> None:
    """Every signing key the log has announced, oldest first; the last one signs now."""
    with open_memory() as memory:
        rows = memory.signing_keys()
    if as_json:
        emit(rows)
        return
    for row in rows:
        out.print(
            f"{row['key_id']}  {row['vkey']}  (log entry {row['log_index']}){'  current' if row['current'] else ''}"
        )


@keys_app.command("export-public")
def keys_export_public(
    raw_hex: Annotated[bool, typer.Option("--hex", help="Raw Ed25519 public key, 64 hex digits.")] = False,
) -> None:
    """The current verifier key (C2SP signed-note form), to give to verifiers out of band."""
    with open_memory() as memory:
        verifier = memory.public_key()
    out.print(verifier.public_key.hex() if raw_hex else verifier.vkey)


@log_app.command("checkpoint")
def log_checkpoint(
    out_file: OutOpt = None,
    size: Annotated[
        int | None, typer.Option("--size", min=0, help="The stored checkpoint of this size, with cosignatures.")
    ] = None,
) -> None:
    """The latest signed checkpoint (C2SP tlog-checkpoint as a signed note)."""
    with open_memory() as memory:
        note = memory.checkpoint(size=size)
    write_output(out_file, note.format())


@log_app.command("prove", context_settings=NUMBER_ARGUMENT)
def log_prove(index: int, out_file: OutOpt = None) -> None:
    """A C2SP tlog-proof that entry INDEX is in the log (the entry is in its `extra` line)."""
    with open_memory() as memory:
        proof = memory.prove(index)
    write_output(out_file, proof.format())


@log_app.command("consistency")
def log_consistency(
    old_checkpoint: Annotated[str, typer.Argument(help="A checkpoint file this log signed earlier ('-': stdin).")],
    new_witness: Annotated[
        bool, typer.Option("--new-witness", help="Ask a witness new to this log to cosign OLD_CHECKPOINT itself.")
    ] = False,
    out_file: OutOpt = None,
) -> None:
    """Prove the log extends OLD_CHECKPOINT: a tlog-witness add-checkpoint request body."""
    old = _note(read_input(old_checkpoint), "old checkpoint")
    with open_memory() as memory:
        body = memory.consistency_request(old, new_witness=new_witness)
    write_output(out_file, body)


@log_app.command("rotation-proof")
def log_rotation_proof(
    old_checkpoint: Annotated[str, typer.Argument(help="The checkpoint the witness last cosigned ('-': stdin).")],
    out_file: OutOpt = None,
) -> None:
    """What a witness needs to follow a key rotation (`witness update-log`): the log extends
    OLD_CHECKPOINT, and its key announcements, each endorsed by the key before it."""
    old = _note(read_input(old_checkpoint), "old checkpoint")
    with open_memory() as memory:
        proof = memory.rotation_proof(old)
    write_output(out_file, proof)


@log_app.command("add-cosignature")
def log_add_cosignature(
    signatures: Annotated[
        str,
        typer.Argument(help="The witness's signature lines, or the cosigned checkpoint with them ('-': stdin)."),
    ],
    witness: Annotated[str, typer.Option("--witness", help="The witness's cosigner key (type 0x04 vkey).")],
    size: Annotated[
        int | None,
        typer.Option(
            "--size",
            help="The cosigned checkpoint's tree size (default: the one the signatures verify for,"
            " the latest or one of the 999 before it).",
        ),
    ] = None,
) -> None:
    """Check a witness's cosignature and attach it to the stored checkpoint it is for."""
    try:
        verifier = CosignatureVerifier.from_vkey(witness)
    except NoteError as exc:
        raise InvalidInputError(f"--witness: {exc.message}") from None
    with open_memory() as memory:
        note = memory.add_cosignatures(read_input(signatures), verifier, size=size)
    write_output(None, note.format())


@log_app.command("verify")
def log_verify(
    expected_pubkey: PubkeyOpt = None,
    expected_checkpoint: Annotated[
        str | None, typer.Option("--expected-checkpoint", help="A checkpoint you kept earlier: the log must extend it.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-derive the whole tree from the entries and check every checkpoint."""
    pinned_checkpoint = None if expected_checkpoint is None else _note(read_input(expected_checkpoint), "checkpoint")
    with open_memory() as memory:
        pinned = None if expected_pubkey is None else [pin_key(expected_pubkey, memory.log.origin)]
        report = memory.verify_log(pinned_keys=pinned, pinned_checkpoint=pinned_checkpoint)
    print_report(report, as_json)


@log_app.command("entries")
def log_entries(
    start: Annotated[int, typer.Option("--start", min=0)] = 0,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 50,
) -> None:
    """Print log entries (content-free JSON), one per line with its index."""
    with open_memory() as memory:
        for index, raw in memory.backend.log_entries(start, start + limit):
            leaf = pruned_leaf(raw)
            text = raw.decode("ascii") if leaf is None else f"(pruned by audit retention; leaf hash {leaf.hex()})"
            out.print(f"{index} {text}")


@app.command()
def receipt(
    record_id: Annotated[str, typer.Argument(metavar="ID")],
    out_file: OutOpt = None,
    user: UserOpt = "default",
    agent: AgentOpt = "",
    run: RunOpt = "",
) -> None:
    """A signed write receipt for a record, verifiable later with the public key alone."""
    with open_memory() as memory:
        made = memory.receipt(record_id, space=Space(user, agent, run))
    write_output(out_file, json.dumps(made.to_json(), indent=2) + "\n")


@app.command("verify-receipt")
def verify_receipt_command(
    receipt_file: Annotated[str, typer.Argument(metavar="FILE")],
    key: Annotated[
        str | None, typer.Option("--key", help="The log's verifier key, obtained out of band (recommended).")
    ] = None,
    store: Annotated[
        Path | None,
        typer.Option(
            "--store",
            help="With --key: a receipt signed before a key rotation is checked through this store's key chain"
            " (read-only).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a write receipt; with --key no store is needed (but for one signed by an earlier key)."""
    try:
        parsed = Receipt.loads(read_input(receipt_file))
        origin = parsed.origin
    except NoteError as exc:
        raise InvalidInputError(f"{receipt_file}: {exc.message}") from None
    if key is not None:
        pinned = [pin_key(key, origin, "--key")]
        evidence = None if store is None else StoreEvidence(store)
        try:
            report = verify_receipt(parsed, pinned, pinned=True, store=evidence)
        finally:
            if evidence is not None:
                evidence.close()
    elif store is not None:
        raise InvalidInputError("--store goes with --key: it follows the pinned key's chain back to earlier keys")
    else:
        with open_memory() as memory:
            report = verify_receipt(parsed, memory.announced_keys(), pinned=False)
    print_report(report, as_json)


WitnessOpt = Annotated[Path, typer.Option("--state", envvar="DELEATUR_WITNESS", help="The witness state file.")]


@witness_app.command("init")
def witness_init(state: WitnessOpt, name: Annotated[str, typer.Option("--name", help="The witness key name.")]) -> None:
    """Create a witness: a state file and a cosigning key (0600) beside it."""
    witness = Witness.create(state, name)
    out.print(f"witness {visible(name)}\ncosigner key: {witness.vkey}")
    witness.close()


@witness_app.command("add-log")
def witness_add_log(state: WitnessOpt, vkey: str) -> None:
    """Trust a log's verifier key (its origin is the key's name)."""
    witness = Witness.open(state)
    try:
        origin = witness.add_log(pin_key(vkey, "", "VKEY").vkey)
    finally:
        witness.close()
    out.print(f"now witnessing {origin}")


@witness_app.command("update-log")
def witness_update_log(
    state: WitnessOpt,
    vkey: Annotated[str, typer.Argument(help="The log's new verifier key, obtained out of band.")],
    proof: Annotated[str, typer.Argument(help="A proof from `deleatur log rotation-proof` ('-': stdin).")],
) -> None:
    """Follow a log's key rotation: trust VKEY once PROOF shows the key trusted now endorsed it
    in the log this witness cosigned."""
    witness = Witness.open(state)
    try:
        origin = witness.update_log(pin_key(vkey, "", "VKEY").vkey, read_input(proof))
    finally:
        witness.close()
    out.print(f"now witnessing {origin} under its key {vkey.strip()}")


@witness_app.command("cosign")
def witness_cosign(
    state: WitnessOpt,
    request: Annotated[
        str, typer.Argument(help="An add-checkpoint request ('-': stdin), e.g. from `log consistency`.")
    ],
) -> None:
    """Cosign a checkpoint if it is consistent with the last one seen; prints the signature lines."""
    witness = Witness.open(state)
    try:
        signatures = witness.add_checkpoint(read_input(request))
    finally:
        witness.close()
    write_output(None, "".join(s.line() for s in signatures))


@witness_app.command("show")
def witness_show(state: WitnessOpt, as_json: JsonOpt = False) -> None:
    """The witness's key and the latest size it cosigned for each log."""
    witness = Witness.open(state)
    try:
        vkey, logs = witness.vkey, witness.logs()
    finally:
        witness.close()
    if as_json:
        emit({"cosigner_key": vkey, "logs": [{"origin": o, "vkey": v, "size": n} for o, v, n in logs]})
        return
    out.print(f"cosigner key: {vkey}")
    for origin, log_vkey, size in logs:
        out.print(f"{origin}  size {size}  {log_vkey}")
