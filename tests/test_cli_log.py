"""The log, key, receipt and witness commands as a user runs them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deleatur import DeleaturError, Memory, from_bytes

from .conftest import MASTER, Cli


@pytest.fixture
def store(cli: Cli, tmp_path: Path) -> Path:
    assert cli("init")[0] == 0
    return tmp_path / "cli.db"


def _vkey(cli: Cli) -> str:
    code, out, _ = cli("keys", "export-public")
    assert code == 0
    return out.strip()


def test_keys_commands(cli: Cli, store: Path) -> None:
    vkey = _vkey(cli)
    name, key_id, _ = vkey.split("+", 2)
    assert name.startswith("deleatur/")
    code, out, _ = cli("keys", "export-public", "--hex")
    assert len(out.strip()) == 64
    code, _, err = cli("keys", "new")
    assert code == 2
    assert "already has a signing key" in err
    code, out, _ = cli("keys", "rotate", "--json")
    new = json.loads(out)["vkey"]
    code, out, _ = cli("keys", "show", "--json")
    shown = json.loads(out)
    assert [k["vkey"] for k in shown] == [vkey, new]
    assert [k["current"] for k in shown] == [False, True]
    assert key_id == shown[0]["key_id"]


def test_receipt_round_trip(cli: Cli, store: Path, tmp_path: Path) -> None:
    receipt = tmp_path / "r.json"
    code, out, _ = cli("remember", "Alice likes tea", "-s", "Alice", "--receipt", str(receipt))
    assert code == 0
    assert "Alice" not in receipt.read_text()
    vkey = _vkey(cli)
    code, out, _ = cli("verify-receipt", str(receipt), "--key", vkey)
    assert code == 0, out
    assert out.strip().endswith("VERDICT: PASS")
    code, out, _ = cli("verify-receipt", str(receipt))
    assert code == 0
    assert "KEY NOT PINNED" in out
    data = json.loads(receipt.read_text())
    index = re.search(r"^index (\d+)$", data["tlog_proof"], re.M)
    assert index is not None and index.group(1) != "0"
    data["tlog_proof"] = data["tlog_proof"].replace(index.group(0), "index 0")
    receipt.write_text(json.dumps(data))
    code, out, _ = cli("verify-receipt", str(receipt), "--key", vkey, "--json")
    assert code == 1
    assert json.loads(out)["verdict"] == "FAIL"
    code, out, _ = cli("receipt", "01a22a03-19d9-75ea-b6f8-0a895b612b14")
    assert code == 2


def test_checkpoint_prove_consistency_verify(cli: Cli, store: Path, tmp_path: Path) -> None:
    cli("remember", "one", "-s", "a")
    old = tmp_path / "old.txt"
    assert cli("log", "checkpoint", "--out", str(old))[0] == 0
    cli("remember", "two", "-s", "a")
    cli("remember", "three", "-s", "b")
    code, out, _ = cli("log", "prove", "2")
    assert out.startswith("c2sp.org/tlog-proof@v1\nextra ")
    assert cli("log", "prove", "99")[0] == 2
    code, out, _ = cli("log", "consistency", str(old))
    assert out.startswith(f"old {old.read_text().splitlines()[1]}\n")
    assert cli("log", "checkpoint", "--size", old.read_text().splitlines()[1])[1] == old.read_text()
    code, _, err = cli("log", "checkpoint", "--size", "999")
    assert code == 2 and "no stored checkpoint of size 999" in err
    code, out, _ = cli("log", "verify", "--expected-pubkey", _vkey(cli), "--expected-checkpoint", str(old))
    assert code == 0, out
    assert "VERDICT: PASS" in out
    code, out, _ = cli("log", "verify")
    assert "NOTE NOT ANCHORED" in out
    code, out, _ = cli("log", "entries", "--limit", "2")
    assert [line.split(" ", 1)[0] for line in out.strip().split("\n")] == ["0", "1"]
    assert cli("log", "verify", "--expected-pubkey", "zz")[0] == 2


def test_witness_commands(cli: Cli, store: Path, tmp_path: Path) -> None:
    state = tmp_path / "w.db"
    assert cli("witness", "init", "--state", str(state), "--name", "witness.example/w")[0] == 0
    code, _, err = cli("witness", "add-log", "--state", str(state), "garbage")
    assert code == 2 and err.startswith("error: VKEY: "), err  # the argument given, not an option it lacks
    assert cli("witness", "add-log", "--state", str(state), _vkey(cli))[0] == 0
    cp = tmp_path / "cp.txt"
    cli("log", "checkpoint", "--out", str(cp))
    first = tmp_path / "first.txt"
    # A witness new to the log first cosigns cp.txt itself (a request from size 0).
    assert cli("log", "consistency", str(cp), "--new-witness", "--out", str(first))[0] == 0
    assert first.read_text() == "old 0\n\n" + cp.read_text()
    code, out, _ = cli("witness", "cosign", "--state", str(state), str(first))
    assert code == 0
    assert out.startswith("\u2014 witness.example/w ")
    cli("remember", "more", "-s", "a")
    request = tmp_path / "req.txt"
    assert cli("log", "consistency", str(cp), "--out", str(request))[0] == 0
    assert cli("witness", "cosign", "--state", str(state), str(request))[0] == 0
    code, _, err = cli("witness", "cosign", "--state", str(state), str(first))
    assert code == 2
    latest_size = cli("log", "checkpoint")[1].splitlines()[1]
    # The refusal says how to make the request it takes; done, the witness cosigns.
    assert f"latest size for {_vkey(cli).split('+')[0]} is {latest_size}: send a proof from the log's" in err
    assert err.endswith("then `deleatur log consistency last.txt`)\n")
    last = tmp_path / "last.txt"
    assert f"`deleatur log checkpoint --size {latest_size} --out last.txt`" in err
    cli("remember", "more still", "-s", "a")
    assert cli("log", "checkpoint", "--size", latest_size, "--out", str(last))[0] == 0
    assert cli("log", "consistency", str(last), "--out", str(request))[0] == 0
    assert cli("witness", "cosign", "--state", str(state), str(request))[0] == 0
    latest_size = cli("log", "checkpoint")[1].splitlines()[1]
    code, out, _ = cli("witness", "show", "--state", str(state))
    assert f"size {latest_size} " in out  # the checkpoint the consistency request carried
    code, out, _ = cli("witness", "show", "--state", str(state), "--json")
    shown = json.loads(out)
    assert shown["cosigner_key"].startswith("witness.example/w+")
    assert [(log["vkey"], log["size"]) for log in shown["logs"]] == [(_vkey(cli), int(latest_size))]


def test_a_cosignature_is_attached_to_the_checkpoint_it_is_for(cli: Cli, store: Path, tmp_path: Path) -> None:
    """The log grows between the request to the witness and the cosignature's return:
    without --size, the cosignature goes to the checkpoint it verifies for, not the
    latest, for which it "does not verify"."""
    state, request = tmp_path / "w.db", tmp_path / "req.txt"
    code, out, _ = cli("witness", "init", "--state", str(state), "--name", "witness.example/w")
    vkey = out.split("cosigner key: ")[1].strip()
    assert cli("witness", "add-log", "--state", str(state), _vkey(cli))[0] == 0
    cp = tmp_path / "cp.txt"
    cli("log", "checkpoint", "--out", str(cp))
    assert cli("log", "consistency", str(cp), "--new-witness", "--out", str(request))[0] == 0
    code, signatures, _ = cli("witness", "cosign", "--state", str(state), str(request))
    cli("remember", "written meanwhile", "-s", "a")
    code, out, err = cli("log", "add-cosignature", "-", "--witness", vkey, stdin=signatures.encode())
    assert (code, err) == (0, "")
    cosigned_size = cp.read_text().splitlines()[1]
    assert out.startswith(cp.read_text())  # the checkpoint of cp.txt's size, now with two signatures
    assert [line.split()[1] for line in out.splitlines() if line.startswith("\u2014 ")][1] == "witness.example/w"
    # The cosigned checkpoint itself, signature lines and all, names its own size.
    code, out, err = cli("log", "add-cosignature", "-", "--witness", vkey, stdin=(cp.read_text() + signatures).encode())
    assert (code, err) == (0, "")
    code, _, err = cli(
        "log", "add-cosignature", "-", "--witness", vkey, "--size", "1", stdin=(cp.read_text() + signatures).encode()
    )
    assert code == 2
    assert f"the cosigned checkpoint is of size {cosigned_size}, not 1" in err


def test_a_receipt_that_repeats_a_key_or_carries_another_member_is_refused(
    cli: Cli, store: Path, tmp_path: Path
) -> None:
    receipt = tmp_path / "r.json"
    assert cli("remember", "Alice likes tea", "-s", "Alice", "--receipt", str(receipt))[0] == 0
    vkey = _vkey(cli)
    text = receipt.read_text()
    data = json.loads(text)
    other = tmp_path / "other.json"
    assert cli("remember", "Bob likes tea", "-s", "Bob", "--receipt", str(other))[0] == 0
    other_id = json.loads(other.read_text())["record_id"]
    # json keeps the last record_id: the receipt would be reported as another record's.
    first = f'"record_id": "{data["record_id"]}"'
    dup = tmp_path / "dup.json"
    dup.write_text(text.replace(first, f'"record_id": "{other_id}", {first}'))
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({**data, "note": "Alice Example"}))
    for forged, problem in ((dup, "repeats a key"), (extra, "a member besides")):
        code, out, err = cli("verify-receipt", str(forged), "--key", vkey)
        assert code == 2, out
        assert problem in err and "Alice" not in err and other_id not in err
    assert cli("verify-receipt", str(receipt), "--key", vkey)[0] == 0


def test_a_missing_signing_key_file_gets_the_same_advice_from_every_command(
    cli: Cli, store: Path, tmp_path: Path
) -> None:
    """An operator's problem (exit 2), and each command names the same remedy: restore
    the file. `keys new` cannot replace a key the log announced, nor `keys rotate` a key
    it no longer has."""
    _, used, _ = cli("remember", "Bo likes tea", "-s", "Bo")
    assert cli("erase", "Al", "--request-id", "B1", "--basis", "x")[0] == 0
    key = store.with_name(store.name + ".signing-key")
    key.rename(tmp_path / "elsewhere")
    for args in (
        ("remember", "Bo likes coffee", "-s", "Bo"),
        ("certificate", "--request-id", "B1"),
        ("keys", "new"),
        ("keys", "rotate"),
        ("keys", "export-public"),
        ("decision", "record", "tea for Bo", "--used", used.strip()),
    ):
        code, _, err = cli(*args)
        assert code == 2, (args, err)
        assert f"the signing key {key} is missing" in err and "restore it from a backup" in err, (args, err)
        assert not any(word in err for word in ("new_signing_key", "rotate_signing_key", "run `deleatur keys new`"))
    (tmp_path / "elsewhere").rename(key)
    assert cli("remember", "Bo likes coffee", "-s", "Bo")[0] == 0


def test_a_store_that_never_had_a_signing_key_is_told_to_make_one(tmp_path: Path) -> None:
    with Memory.open(tmp_path / "m.db", from_bytes(MASTER), create=True) as memory:
        for call in (memory.rotate_signing_key, memory.public_key):
            with pytest.raises(DeleaturError, match="no signing key; run `deleatur keys new`"):
                call()
