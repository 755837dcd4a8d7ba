"""The minimal witness: cosigns only checkpoints consistent with what it saw."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from deleatur import InvalidInputError, Memory, NewMemory, NotFoundError
from deleatur.log.checkpoint import Checkpoint
from deleatur.log.cosignature import CosignatureVerifier
from deleatur.log.note import Note, Signature, Signer
from deleatur.log.witness import (
    ConflictError,
    InconsistentError,
    UnknownLogError,
    UntrustedCheckpointError,
    Witness,
    WitnessError,
    format_request,
)

from .conftest import Cli, FakeClock, resume, run_together, start_paused


@pytest.fixture
def witness(tmp_path: Path, clock: FakeClock) -> Witness:
    return Witness.create(tmp_path / "witness.db", "witness.example/w1", clock=clock)


def _first(memory: Memory) -> str:
    return format_request(0, [], memory.checkpoint())


def test_cosigns_a_consistent_history(memory: Memory, witness: Witness, clock: FakeClock) -> None:
    witness.add_log(memory.announced_keys()[0].vkey)
    memory.remember("one", subject="a")
    first = memory.checkpoint()
    [sig] = witness.add_checkpoint(format_request(0, [], first))
    verifier = CosignatureVerifier.from_vkey(witness.vkey)
    assert verifier.verify(first.text, sig) == clock.now // 1_000_000
    memory.remember_many([NewMemory(f"n{i}", subject="a") for i in range(7)])
    [sig2] = witness.add_checkpoint(memory.consistency_request(first))
    assert verifier.verify(memory.checkpoint().text, sig2) > 0
    assert witness.logs()[0][2] == memory.backend.log_size()


def test_refuses_a_split_view(memory: Memory, witness: Witness) -> None:
    witness.add_log(memory.announced_keys()[0].vkey)
    memory.remember("one", subject="a")
    seen = memory.checkpoint()
    witness.add_checkpoint(format_request(0, [], seen))
    # The log key signs a different tree of the same size: a split view.
    cp = Checkpoint.parse(seen.text)
    other = Checkpoint(cp.origin, cp.size, bytes(32)).body()
    signer = memory.log.signer
    assert signer is not None
    fork = Note(other, (signer.sign(other),))
    with pytest.raises(ConflictError, match="split view") as caught:
        witness.add_checkpoint(format_request(cp.size, [], fork))
    assert caught.value.status == 409


def test_refuses_an_inconsistent_extension(memory: Memory, witness: Witness) -> None:
    witness.add_log(memory.announced_keys()[0].vkey)
    memory.remember("one", subject="a")
    first = memory.checkpoint()
    witness.add_checkpoint(format_request(0, [], first))
    memory.remember("two", subject="a")
    size = Checkpoint.parse(first.text).size
    bogus = [bytes(32)] * len(memory.log.consistency_proof(size, memory.backend.log_size()))
    with pytest.raises(InconsistentError) as caught:
        witness.add_checkpoint(format_request(size, bogus, memory.checkpoint()))
    assert caught.value.status == 422


def test_refuses_a_stale_old_size_and_reports_its_own(memory: Memory, witness: Witness) -> None:
    witness.add_log(memory.announced_keys()[0].vkey)
    memory.remember("one", subject="a")
    first = memory.checkpoint()
    witness.add_checkpoint(format_request(0, [], first))
    memory.remember("two", subject="a")
    with pytest.raises(ConflictError) as caught:
        witness.add_checkpoint(_first(memory))
    assert caught.value.latest_size == Checkpoint.parse(first.text).size > 0


def test_refuses_unknown_logs_and_untrusted_signatures(memory: Memory, witness: Witness) -> None:
    memory.remember("one", subject="a")
    with pytest.raises(UnknownLogError) as unknown:
        witness.add_checkpoint(_first(memory))
    assert unknown.value.status == 404
    impostor = Signer.generate(memory.log.origin)
    witness.add_log(memory.announced_keys()[0].vkey)
    text = memory.checkpoint().text
    with pytest.raises(UntrustedCheckpointError) as untrusted:
        witness.add_checkpoint(format_request(0, [], Note(text, (impostor.sign(text),))))
    assert untrusted.value.status == 403


def test_malformed_requests(witness: Witness) -> None:
    with pytest.raises(WitnessError, match="first line must be 'old"):
        witness.add_checkpoint("new 1\n\nx\n")
    with pytest.raises(WitnessError, match="no empty line"):
        witness.add_checkpoint("old 0\n")


def test_witness_state_survives_reopening(memory: Memory, tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    Witness.create(path, "w").close()
    w = Witness.open(path)
    w.add_log(memory.announced_keys()[0].vkey)
    memory.remember("one", subject="a")
    w.add_checkpoint(_first(memory))
    w.close()
    again = Witness.open(path)
    assert again.logs()[0][2] == memory.backend.log_size()
    with pytest.raises(ConflictError):
        again.add_checkpoint(_first(memory))  # it remembers it already saw this log
    again.close()
    assert (tmp_path / "w.db.key").stat().st_mode & 0o777 == 0o600


def test_cosignatures_are_checked_and_attached(memory: Memory, witness: Witness) -> None:
    witness.add_log(memory.announced_keys()[0].vkey)
    memory.remember("one", subject="a")
    [sig] = witness.add_checkpoint(_first(memory))
    verifier = CosignatureVerifier.from_vkey(witness.vkey)
    size = memory.backend.log_size()
    cosigned = memory.add_cosignatures(sig.line(), verifier)
    assert len(cosigned.signatures) == 2
    assert memory.checkpoint(size=size) == cosigned  # receipts' verifiers can fetch it by size
    with pytest.raises(NotFoundError, match="no stored checkpoint of size 999"):
        memory.checkpoint(size=999)
    with pytest.raises(InvalidInputError, match="size must be"):
        memory.checkpoint(size=-1)
    # The change is an admin's write, so it is audited: its entry follows that checkpoint.
    audited = next(memory.audit_entries(start=size))
    assert (audited.entry.fields["action"], audited.entry.fields["outcome"]) == ("log.cosign", "ok")
    assert memory.verify_log().ok
    other = Witness.create(witness.path.with_name("other.db"), "witness.example/other")
    with pytest.raises(InvalidInputError, match="no signature line from witness"):
        memory.add_cosignatures(sig.line(), CosignatureVerifier.from_vkey(other.vkey))
    flipped = bytearray(sig.signature)
    flipped[-1] ^= 1
    forged = Signature(sig.name, sig.key_id, bytes(flipped))
    with pytest.raises(InvalidInputError, match="does not verify"):
        memory.add_cosignatures(forged.line(), verifier)


def test_a_witness_init_beaten_to_its_path_is_refused_and_the_winners_witness_stays_whole(
    tmp_path: Path, cli: Cli
) -> None:
    """Two inits that both found the path free each wrote the key, the later one over the
    other's: the witness that had been made (and whose key was handed out) lost its key,
    and the later init failed on the state the other had made (exit 1)."""
    state = tmp_path / "w.db"
    init = ("witness", "init", "--state", str(state), "--name")
    first = start_paused(
        "deleatur.log.witness:write_text_secret", "from deleatur.cli.app import main; main()", *init, "example/a"
    )
    code, out, _ = cli(*init, "example/b")
    assert code == 0
    vkey = out.splitlines()[1].removeprefix("cosigner key: ")
    assert resume(first) == (2, "", f"error: {state}.key already exists; refusing to overwrite a witness\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.db", "w.db.key"]
    witness = Witness.open(state)
    assert (witness.vkey, witness.logs()) == (vkey, [])
    witness.close()


def _create_witness(path: Path, name: str) -> str:
    try:
        witness = Witness.create(path, name)
    except WitnessError as exc:
        return f"refused: {exc.message}"
    witness.close()
    return witness.vkey


def test_witness_inits_started_together_make_one_witness_and_refuse_the_rest(tmp_path: Path) -> None:
    for round in range(4):
        state = tmp_path / f"w{round}.db"
        outcomes = run_together([functools.partial(_create_witness, state, f"example/{i}") for i in range(6)])
        made = [o for o in outcomes if not o.startswith("refused: ")]
        assert len(made) == 1 and all(o.endswith("refusing to overwrite a witness") for o in outcomes if o not in made)
        witness = Witness.open(state)
        assert witness.vkey == made[0]
        witness.close()
    assert len(list(tmp_path.iterdir())) == 8  # each state and its key, nothing else
