"""Key rotation: verifiers pinned to the current key and witnesses follow it, only
through the chain of endorsements the log proves (deleatur.log.keychain)."""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deleatur import Memory, NewMemory, SigningKeyMissingError, from_file
from deleatur.crypto.signing import pending_path, read_signer
from deleatur.erasure.certificate import signed_message
from deleatur.erasure.verify import verify_certificate
from deleatur.log.checkpoint import Checkpoint
from deleatur.log.entries import Entry, EventType
from deleatur.log.keychain import KeyChain
from deleatur.log.note import Note, NoteError, Signer
from deleatur.log.receipt import Receipt, verify_receipt
from deleatur.log.tlog import rotation_message
from deleatur.log.witness import ConflictError, UntrustedCheckpointError, Witness, WitnessError, parse_rotation_proof
from deleatur.store.evidence import StoreEvidence

from .conftest import Cli, FakeClock, resume, start_paused

BASIS = "Art. 17(1)(a)"


@pytest.fixture
def rotated(memory: Memory) -> tuple[Memory, dict[str, Any], Receipt, Signer]:
    """A certificate and a receipt issued under the first key, then two rotations (so the
    chain has a key between the one that signed them and the current one)."""
    memory.remember_many([NewMemory(f"bystander {i}", subject=f"p{i % 5}") for i in range(12)])
    record = memory.remember("Alice's phone is +100", subject="Alice")
    receipt = memory.receipt(record.id)
    memory.erase("Alice", request_id="DSAR-17", basis=BASIS, requester="dpo")
    cert = memory.certificate("DSAR-17")
    old = memory.log.signer
    assert old is not None
    memory.rotate_signing_key()
    memory.remember("between the rotations", subject="Bo")
    memory.rotate_signing_key()
    memory.remember("after the rotations", subject="Bo")
    return memory, cert, receipt, old


@pytest.fixture
def evidence(store_path: Path, memory: Memory) -> Iterator[StoreEvidence]:
    ev = StoreEvidence(store_path)
    yield ev
    ev.close()


def _failed(report: Any) -> dict[str, str]:
    return {c.name: c.detail for c in report.failed}


def test_a_certificate_signed_before_a_rotation_verifies_against_the_current_key_with_the_store(
    rotated: tuple[Memory, dict[str, Any], Receipt, Signer], evidence: StoreEvidence
) -> None:
    memory, cert, _, old = rotated
    current = memory.public_key()
    report = verify_certificate(cert, expected_key=current, store=evidence)
    assert report.ok, report.lines()
    assert "an earlier key endorsed through the log's key chain" in report.checks[1].detail
    # Offline the chain cannot be proven: the failure names the key that signed, and what to do.
    alone = _failed(verify_certificate(cert, expected_key=current))
    assert list(alone) == ["signature", "checkpoint"]
    assert old.key_id.hex() in alone["signature"]
    assert "--store" in alone["signature"] and "keys show" in alone["signature"]
    assert alone["checkpoint"] == "the checkpoint is not signed by the pinned key"


def test_a_key_outside_the_chain_is_refused_even_with_a_forged_announcement(
    rotated: tuple[Memory, dict[str, Any], Receipt, Signer], evidence: StoreEvidence
) -> None:
    """An intruder's key that itself 'endorses' the current key proves nothing: only a
    tree the pinned key signed can vouch for an earlier key."""
    memory, cert, _, _ = rotated
    current = memory.public_key()
    intruder = Signer.generate(memory.log.origin)
    forged = copy.deepcopy(cert)
    body = forged["certificate"]
    note = Note.parse(body["checkpoint"])
    body["checkpoint"] = Note(note.text, (intruder.sign(note.text),)).format()
    body["public_key"] = intruder.verifier.vkey
    forged["signature"] = base64.b64encode(intruder.sign_bytes(signed_message(body))).decode()
    assert "signature" in _failed(verify_certificate(forged, expected_key=current, store=evidence))
    # Now the store's log names the intruder's key first, and the next key as endorsed by it.
    conn = memory.backend._conn  # type: ignore[attr-defined]
    (first, raw), (second, raw2), *_ = evidence.key_entries(evidence.log_size())
    entry, entry2 = Entry.decode(raw), Entry.decode(raw2)
    fields = {**entry2.fields, "previous": intruder.verifier.vkey}
    vkey = str(entry2.fields["vkey"])
    fields["endorsement"] = base64.b64encode(intruder.sign_bytes(rotation_message(vkey))).decode()
    for index, fake in (
        (first, Entry(EventType.KEY, entry.time, {"vkey": intruder.verifier.vkey})),
        (second, Entry(EventType.KEY, entry2.time, fields)),
    ):
        conn.execute("UPDATE log_entries SET entry = ? WHERE idx = ?", (fake.encode(), index))
    failed = _failed(verify_certificate(forged, expected_key=current, store=evidence))
    assert "is not in the tree of size" in failed["signature"]


def test_a_retired_key_cannot_vouch_for_a_tree_of_its_own(
    rotated: tuple[Memory, dict[str, Any], Receipt, Signer], evidence: StoreEvidence
) -> None:
    memory, cert, _, old = rotated
    chain = KeyChain.from_log(memory.public_key(), evidence)
    assert [k for _, k in chain.keys] == memory.announced_keys()
    genuine = Note.parse(cert["certificate"]["checkpoint"])
    assert chain.signer_of(genuine) == old.verifier
    cp = Checkpoint.parse(genuine.text)
    # Another tree of a size at which the old key was current: not a prefix of the pinned key's.
    other = Checkpoint(cp.origin, cp.size, bytes(32)).body()
    with pytest.raises(NoteError, match="not a prefix"):
        chain.signer_of(Note(other, (old.sign(other),)))
    # A later tree, signed after the old key was retired.
    later = Checkpoint(cp.origin, memory.backend.log_size(), memory.log.root(memory.backend.log_size())).body()
    with pytest.raises(NoteError, match="not the key the log's chain"):
        chain.signer_of(Note(later, (old.sign(later),)))


def test_a_receipt_taken_before_a_rotation_verifies_against_the_current_key_with_the_store(
    rotated: tuple[Memory, dict[str, Any], Receipt, Signer], evidence: StoreEvidence
) -> None:
    memory, _, receipt, old = rotated
    current = [memory.public_key()]
    report = verify_receipt(receipt, current, pinned=True, store=evidence)
    assert report.ok, report.lines()
    assert "earlier key" in report.checks[0].detail
    alone = _failed(verify_receipt(receipt, current, pinned=True))
    assert old.key_id.hex() in alone["checkpoint_signature"] and "--store" in alone["checkpoint_signature"]
    # A key that is in no chain of this log's: refused with or without the store.
    stranger = [Signer.generate(memory.log.origin).verifier]
    failed = _failed(verify_receipt(receipt, stranger, pinned=True, store=evidence))
    assert "never announced the pinned key" in failed["checkpoint_signature"]


def test_a_witness_follows_a_rotation_endorsed_by_the_key_it_trusts(
    memory: Memory, tmp_path: Path, clock: FakeClock
) -> None:
    witness = Witness.create(tmp_path / "w.db", "witness.example/w1", clock=clock)
    witness.add_log(memory.public_key().vkey)
    memory.remember("one", subject="a")
    seen = memory.checkpoint()
    witness.add_checkpoint(memory.consistency_request(seen, new_witness=True))
    memory.rotate_signing_key()
    memory.remember("two", subject="a")
    new = memory.public_key()
    with pytest.raises(UntrustedCheckpointError, match="witness update-log"):
        witness.add_checkpoint(memory.consistency_request(seen))
    proof = memory.rotation_proof(seen)
    # A key the trusted one never endorsed: an intruder re-signs the proof's checkpoint.
    intruder = Signer.generate(memory.log.origin)
    data = json.loads(proof)
    request, _ = parse_rotation_proof(proof)
    head, _, note_text = request.partition("\n\n")
    note = Note.parse(note_text)
    data["request"] = head + "\n\n" + Note(note.text, (intruder.sign(note.text),)).format()
    with pytest.raises(UntrustedCheckpointError, match="is not endorsed"):
        witness.update_log(intruder.verifier.vkey, json.dumps(data))
    # ... nor with an announcement of its own key appended to the proof's entries.
    fake = Entry(EventType.KEY, clock.now, {"vkey": intruder.verifier.vkey, "previous": new.vkey, "endorsement": ""})
    data["key_entries"].append({"index": 0, "entry": base64.b64encode(fake.encode()).decode(), "proof": []})
    with pytest.raises(UntrustedCheckpointError, match="key chain"):
        witness.update_log(intruder.verifier.vkey, json.dumps(data))
    assert witness.logs()[0][1] != new.vkey
    assert witness.update_log(new.vkey, proof) == memory.log.origin
    assert witness.logs()[0][1] == new.vkey
    [signature] = witness.add_checkpoint(memory.consistency_request(seen))
    assert witness.cosigner.verifier.verify(memory.checkpoint().text, signature) > 0
    # A rotation proof from a checkpoint the witness has moved past says how to make one.
    memory.rotate_signing_key()
    latest = witness.logs()[0][2]
    with pytest.raises(ConflictError, match=rf"latest size .* is {latest}: .*`deleatur log rotation-proof last.txt`"):
        witness.update_log(memory.public_key().vkey, memory.rotation_proof(seen))
    witness.close()


def test_rotation_across_the_cli(cli: Cli, tmp_path: Path) -> None:
    """The review's commands: after `keys rotate`, an older certificate and receipt verify
    against the current key with --store, the log verifies against a checkpoint signed by
    the earlier key, and a witness follows the rotation."""
    assert cli("init")[0] == 0
    store = str(tmp_path / "cli.db")
    receipt, cert, cp = tmp_path / "r.json", tmp_path / "ag.json", tmp_path / "cp.txt"
    assert cli("remember", "Alice likes tea", "-s", "Alice", "--receipt", str(receipt))[0] == 0
    assert cli("erase", "Alice", "--request-id", "DSAR-1", "--basis", BASIS)[0] == 0
    assert cli("certificate", "--request-id", "DSAR-1", "--out", str(cert))[0] == 0
    assert cli("log", "checkpoint", "--out", str(cp))[0] == 0
    state = tmp_path / "w.db"
    old_key = cli("keys", "export-public")[1].strip()
    assert cli("witness", "init", "--state", str(state), "--name", "witness.example/w")[0] == 0
    assert cli("witness", "add-log", "--state", str(state), old_key)[0] == 0
    first = cli("log", "consistency", str(cp), "--new-witness")[1]
    assert cli("witness", "cosign", "--state", str(state), "-", stdin=first.encode())[0] == 0

    assert cli("keys", "rotate")[0] == 0
    cli("remember", "after", "-s", "Bo")
    new_key = cli("keys", "export-public")[1].strip()
    old_id = old_key.split("+")[1]

    code, out, _ = cli("verify", str(cert), "--store", store, "--expected-pubkey", new_key)
    assert code == 0, out
    code, out, _ = cli("verify", str(cert), "--expected-pubkey", new_key)
    assert code == 1 and old_id in out and "--store" in out
    code, out, _ = cli("verify-receipt", str(receipt), "--key", new_key, "--store", store)
    assert code == 0, out
    code, out, _ = cli("verify-receipt", str(receipt), "--key", new_key)
    assert code == 1 and old_id in out and "--store" in out
    code, out, _ = cli("log", "verify", "--expected-pubkey", new_key, "--expected-checkpoint", str(cp))
    assert code == 0, out
    assert old_id in out  # the pinned check names the earlier key that signed the checkpoint

    code, _, err = cli("witness", "add-log", "--state", str(state), new_key)
    assert code == 2 and "update-log" in err
    request = cli("log", "consistency", str(cp))[1]
    code, _, err = cli("witness", "cosign", "--state", str(state), "-", stdin=request.encode())
    assert code == 2 and "update-log" in err and old_id in err
    proof = cli("log", "rotation-proof", str(cp))[1]
    code, out, _ = cli("witness", "update-log", "--state", str(state), new_key, "-", stdin=proof.encode())
    assert code == 0, out
    code, out, _ = cli("witness", "cosign", "--state", str(state), "-", stdin=request.encode())
    assert code == 0 and out.startswith("\u2014 witness.example/w ")


def test_log_verify_names_the_key_of_a_pinned_checkpoint_it_cannot_follow(memory: Memory) -> None:
    memory.remember("one", subject="a")
    cp = memory.checkpoint()
    stranger = Signer.generate(memory.log.origin)
    foreign = Note(cp.text, (stranger.sign(cp.text),))
    memory.rotate_signing_key()
    pinned = [memory.public_key()]
    assert memory.verify_log(pinned_keys=pinned, pinned_checkpoint=cp).ok
    report = memory.verify_log(pinned_keys=pinned, pinned_checkpoint=foreign)
    detail = _failed(report)["pinned"]
    assert stranger.key_id.hex() in detail and "nor any key of this log's key chain" in detail


def test_a_rotation_proof_that_repeats_a_key_or_carries_another_member_is_refused(memory: Memory) -> None:
    """Read as strictly as a certificate: json would keep the last of two requests, where
    a first-wins reader takes the other."""
    memory.remember("one", subject="a")
    seen = memory.checkpoint()
    memory.rotate_signing_key()
    proof = memory.rotation_proof(seen)
    parse_rotation_proof(proof)
    data = json.loads(proof)
    doubled = proof.replace('"request": ', '"request": "old 0\\n\\nforged\\n", "request": ', 1)
    entry = data["key_entries"][0]
    for forged, problem in (
        (doubled, "repeats a key"),
        (json.dumps({**data, "extra": 1}), "a member besides"),
        (json.dumps({**data, "key_entries": [{**entry, "extra": 1}]}), "a member besides"),
    ):
        with pytest.raises(WitnessError, match=problem):
            parse_rotation_proof(forged)


_ROTATE = "from deleatur.cli.app import main; main()"


def _rotate(store: Path) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-c", _ROTATE, "--store", str(store), "keys", "rotate"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def _announced_and_placed(store: Path) -> tuple[list[str], str]:
    """The vkeys the log announced, once it verifies, and the one of the key file."""
    with Memory.open(store, from_file(store.with_name(store.name + ".master-key"))) as memory:
        report = memory.verify_log()
        assert report.ok, report
        announced = [key["vkey"] for key in memory.signing_keys()]
        placed = read_signer(memory.signing_key_path)
        assert placed is not None
        assert sorted(p.name for p in store.parent.iterdir() if ".signing-key" in p.name) == [
            f"{store.name}.signing-key"
        ]
        return announced, placed.verifier.vkey


@pytest.mark.parametrize(
    ("paused_at", "refused", "message"),
    [
        # The first holds the rotation's lock: the second is refused at once.
        ("deleatur.memory:write_signer", "second", "another rotation of the signing key"),
        # The first read the key before the second replaced it: it is refused as it goes on.
        ("deleatur.log.note:Signer.generate", "first", "another rotation replaced the signing key"),
    ],
    ids=["at once", "one after the other, begun together"],
)
def test_of_two_rotations_at_once_one_wins_and_the_other_changes_nothing(
    tmp_path: Path, paused_at: str, refused: str, message: str
) -> None:
    """Both wrote one pending key file, each over the other's: the first to commit moved
    the other's key into place (a key file the log never announced), and the other
    announced its key as the successor of one no longer current, breaking the key chain;
    both said they had rotated the key."""
    store = tmp_path / "m.db"
    Memory.init(store)[0].close()
    ((vkey,), _) = _announced_and_placed(store)
    paused = start_paused(paused_at, _ROTATE, "--store", str(store), "keys", "rotate")
    second = _rotate(store)
    outcomes = {"first": resume(paused), "second": second}
    lost = outcomes.pop(refused)
    assert lost[:2] == (2, "") and lost[2].startswith(f"error: {message}"), lost
    assert lost[2].endswith("; nothing was changed\n"), lost
    ((code, out, err),) = outcomes.values()
    assert (code, err) == (0, "")
    winner = out.removeprefix("new verifier key: ").strip()
    assert _announced_and_placed(store) == ([vkey, winner], winner)


# A rotation that writes its pending key and announces it, then fails before it commits
# (a full disk), as the rotation's own cleanup sees it.
_ROTATE_FAILING = f"""
from deleatur.log.tlog import TransparencyLog
announce = TransparencyLog.announce_key
def announce_then_fail(*args, **kwargs):
    announce(*args, **kwargs)
    raise OSError(28, "No space left on device")
TransparencyLog.announce_key = announce_then_fail
{_ROTATE}
"""


def test_finishing_a_killed_rotation_moves_the_key_it_announced_not_a_later_rotations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handle finishing a rotation killed after it committed read the pending key
    file, found its key announced, then moved whatever file was at that path by then,
    taking no lock: a rotation begun meanwhile had written its own key there, not yet
    announced, which was moved over the announced key; that rotation failed, and the
    store's key was lost (the store refused to open: "is not this store's current
    key"). A rotation holds the lock from before it writes the pending file, so the
    handle now finds it held, signs with the key it read, and leaves the file alone."""
    import deleatur.memory

    store = tmp_path / "m.db"
    Memory.init(store)[0].close()
    ((first,), _) = _announced_and_placed(store)
    server = Memory.open(store, from_file(store.with_name(store.name + ".master-key")))
    killed = start_paused("os:replace", _ROTATE, "--store", str(store), "keys", "rotate")
    killed.kill()  # committed, before its key file was moved into place
    killed.communicate()
    pending = pending_path(server.signing_key_path)
    announced = read_signer(pending)
    assert announced is not None
    failing: list[subprocess.Popen[str]] = []

    def read_then_let_a_rotation_begin(path: Path) -> Signer | None:
        signer = read_signer(path)
        if path == pending and not failing:  # the server read the announced key
            paused = start_paused(
                "deleatur.log.tlog:TransparencyLog.announce_key",
                _ROTATE_FAILING,
                "--store",
                str(store),
                "keys",
                "rotate",
            )
            failing.append(paused)  # it wrote its key to the pending file, not yet announced
        return signer

    monkeypatch.setattr(deleatur.memory, "read_signer", read_then_let_a_rotation_begin)
    try:
        assert server.public_key().vkey == announced.verifier.vkey
    finally:
        monkeypatch.undo()
        outcome = resume(failing[0])
    assert outcome == (1, "", "error: internal error (OSError); set DELEATUR_DEBUG=1 for details\n")
    server.remember("signed with the announced key", subject="Alice")
    server.close()
    assert _announced_and_placed(store) == ([first, announced.verifier.vkey], announced.verifier.vkey)


def test_a_rotation_whose_key_file_was_removed_says_so(memory: Memory) -> None:
    """The key file removed under a live handle: the rotation is refused as any call
    that must sign is, naming the missing file (it named the handle's own key as
    "another rotation's")."""
    memory.signing_key_path.unlink()
    with pytest.raises(SigningKeyMissingError, match="is missing"):
        memory.rotate_signing_key()
