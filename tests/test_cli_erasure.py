"""The erasure commands as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import Cli

ERASE = ("--request-id", "DSAR-17", "--basis", "Art. 17(1)(a)")


@pytest.fixture
def store(cli: Cli, tmp_path: Path) -> Path:
    assert cli("init")[0] == 0
    _, out, _ = cli("remember", "Alice phone +100", "-s", "Alice Smith", "-k", "alice::phone")
    cli("remember", "Derived from Alice", "-s", "Team", "--derived-from", out.strip())
    cli("remember", "Bob met Alice Smith", "-s", "Bob")
    cli("remember", "user1 data", "-s", "x", "--user", "user1")
    cli("remember", "user10 data", "-s", "y", "--user", "user10")
    return tmp_path / "cli.db"


def test_dry_run_erase_certificate_verify(cli: Cli, store: Path, tmp_path: Path) -> None:
    code, out, _ = cli("erase", "alice smith", *ERASE, "--dry-run")
    assert code == 0
    assert "would erase 2 record(s): 1 naming the subject, 1 reached through lineage" in out
    assert "residue" in out
    code, out, _ = cli("erase", "alice smith", *ERASE, "--dry-run", "--json")
    assert json.loads(out)["plan"]["total"] == 2
    code, out, _ = cli("erase", "alice smith", *ERASE)
    assert code == 0
    assert "erased 2 record(s), 2 tombstone(s)" in out
    code, out, _ = cli("erase", "alice smith", *ERASE)
    assert out.startswith("already done: ")
    code, out, _ = cli("requests", "--json")
    [request] = json.loads(out)
    assert request["status"] == "complete"
    assert request["deadline_met"] is True
    cert = tmp_path / "cert.json"
    code, out, _ = cli("certificate", "--request-id", "DSAR-17", "--out", str(cert))
    assert "2 erasure(s) attested" in out
    code, vkey, _ = cli("keys", "export-public")
    code, out, _ = cli("verify", str(cert), "--store", str(store), "--expected-pubkey", vkey.strip())
    assert code == 0, out
    lines = out.strip().split("\n")
    assert lines[-1] == "VERDICT: PASS"
    assert [line.split()[1] for line in lines if line[:4] in ("OK  ", "FAIL", "n/a ")] == [str(i) for i in range(1, 11)]
    assert any(line.startswith("NOTE NOT ANCHORED") for line in lines)

    data = json.loads(cert.read_text())
    data["certificate"]["issued_at"] = "2020-01-01T00:00:00Z"
    cert.write_text(json.dumps(data))
    code, out, _ = cli("verify", str(cert), "--store", str(store), "--expected-pubkey", vkey.strip())
    assert code == 1
    assert "FAIL  2 signature" in out
    assert out.strip().endswith("VERDICT: FAIL (check 2 signature)")


def test_ambiguous_and_confirmation(cli: Cli, store: Path) -> None:
    cli("remember", "again", "-s", "ALICE SMITH")
    code, _, err = cli("erase", "alice smith", *ERASE)
    assert code == 2
    assert "--allow-ambiguous" in err
    code, out, _ = cli(
        "erase", "alice smith", "--request-id", "D2", "--basis", "b", "--dry-run", "--issue-token", "--json"
    )
    token = json.loads(out)["token"]
    code, out, _ = cli(
        "erase", "alice smith", "--request-id", "D2", "--basis", "b", "--allow-ambiguous", "--confirm", token
    )
    assert code == 0
    code, _, err = cli("erase", "bob", "--request-id", "D3", "--basis", "b", "--confirm", token)
    assert code == 2
    assert "already used" in err


def test_a_token_request_never_erases(cli: Cli, store: Path) -> None:
    """--issue-token belongs to a dry run: asked without one, nothing is erased."""
    code, _, err = cli("erase", "bob", "--request-id", "D4", "--basis", "b", "--issue-token")
    assert code == 2
    assert "a confirmation token comes from a dry run" in err
    code, out, _ = cli("list", "--subject", "Bob", "--json")
    assert [r["text"] for r in json.loads(out)] == ["Bob met Alice Smith"]
    code, out, _ = cli("requests", "--json")
    assert json.loads(out) == []


def test_erase_all_user1_spares_user10(cli: Cli, store: Path) -> None:
    code, out, _ = cli("erase-all", "--user", "user1", "--request-id", "ACC-1", "--basis", "Art. 17(1)(a)")
    assert code == 0
    assert "erased 1 record(s)" in out
    code, out, _ = cli("list", "--user", "user10", "--json")
    assert [r["text"] for r in json.loads(out)] == ["user10 data"]


def test_residue_and_bad_input(cli: Cli, store: Path, tmp_path: Path) -> None:
    code, out, _ = cli("residue", "Alice Smith", "-i", "+100", "--json")
    assert [h["subject"] for h in json.loads(out)] == ["Bob"]
    assert cli("erase", "x", "--request-id", "bad id", "--basis", "b")[0] == 2
    assert cli("certificate", "--request-id", "NOPE")[0] == 2
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    code, _, err = cli("verify", str(junk))
    assert code == 2
    assert "not JSON" in err
    junk.write_text("{}")
    assert cli("verify", str(junk))[0] == 1
