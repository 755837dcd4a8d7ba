"""The erasure commands as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apsw
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
    code, _, err = cli("erase", "alice smith", "--request-id", "DSAR-17", "--basis", "Art. 17(1)(d)")
    assert code == 2
    assert "request id DSAR-17 was made under another legal basis" in err
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
    # One line, which says the request is recorded and how to finish it.
    request_id = ERASE[ERASE.index("--request-id") + 1]
    assert err.endswith(f" (request {request_id} recorded as failed: retry under this request id)\n")
    assert err.count("\n") == 1
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
    # The option to add, not the library parameter ("add dry_run").
    assert err == "error: --issue-token needs --dry-run: a confirmation token comes from a dry run\n"
    code, out, _ = cli("list", "--subject", "Bob", "--json")
    assert [r["text"] for r in json.loads(out)] == ["Bob met Alice Smith"]
    code, out, _ = cli("requests", "--json")
    assert json.loads(out) == []


def test_erase_all_user1_spares_user10(cli: Cli, store: Path) -> None:
    code, out, _ = cli("erase-all", "--user", "user1", "--request-id", "ACC-1", "--basis", "b", "--dry-run")
    assert "would erase 1 record(s): 1 in the account's spaces, 0 reached through lineage" in out
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


def test_a_damaged_certificate_is_a_fail_verdict_not_an_internal_error(cli: Cli, store: Path, tmp_path: Path) -> None:
    assert cli("erase", "alice smith", *ERASE)[0] == 0
    cert = tmp_path / "cert.json"
    assert cli("certificate", "--request-id", "DSAR-17", "--out", str(cert))[0] == 0
    _, vkey, _ = cli("keys", "export-public")
    good = json.loads(cert.read_text())
    damaged = tmp_path / "damaged.json"

    def verify(change: Any, *args: str) -> tuple[int, list[str], str]:
        data = json.loads(json.dumps(good))
        change(data["certificate"])
        damaged.write_text(json.dumps(data))
        code, out, err = cli("verify", str(damaged), *args)
        return code, out.strip().split("\n"), err

    code, lines, err = verify(lambda b: b["tombstones"][0].update(index="x"), "--store", str(store))
    assert (code, err) == (1, ""), err
    assert (
        "FAIL  4 tombstones: the tombstones are malformed: certificate.tombstones[0].index is not an integer" in lines
    )
    assert (
        "FAIL  9 store_log: the tombstones cannot be looked up: certificate.tombstones[0].index is not an integer"
        in lines
    )
    assert lines[-1] == "VERDICT: FAIL (check 2 signature, check 4 tombstones, check 9 store_log)"

    code, lines, err = verify(lambda b: b.update(request="x"))
    assert (code, err) == (1, "")
    assert lines == [
        "FAIL  1 format: malformed certificate: certificate.request is not an object",
        "VERDICT: FAIL (check 1 format)",
    ]

    # The pinned key's name is read from the certificate before it is verified: that must not crash either.
    code, lines, err = verify(lambda b: b.update(store=[]), "--expected-pubkey", vkey.strip())
    assert (code, err) == (1, "")
    assert lines[-1] == "VERDICT: FAIL (check 1 format)"

    # JSON that Python cannot load (an integer of 5000 digits) is unreadable input, like a truncated file.
    damaged.write_text('{"certificate": ' + "1" * 5000 + "}")
    code, out, err = cli("verify", str(damaged))
    assert (code, out) == (2, "")
    assert len(err.strip().split("\n")) == 1 and "internal error" not in err


def test_an_erasure_limited_to_a_user_verifies_against_the_store(cli: Cli, tmp_path: Path) -> None:
    """The person is known to another user too: the erasure of one user's records about
    them is certified, and checked against the store, within that user's spaces."""
    assert cli("init")[0] == 0
    store = tmp_path / "cli.db"
    cli("remember", "n1", "--subject", "N", "--user", "u1")
    cli("remember", "n3", "--subject", "N", "--user", "u2")
    assert cli("erase", "N", "--request-id", "S1", "--basis", "b", "--user", "u1")[0] == 0
    cert = tmp_path / "s1.json"
    assert cli("certificate", "--request-id", "S1", "--out", str(cert))[0] == 0
    code, out, _ = cli("verify", str(cert), "--store", str(store))
    assert code == 0, out
    assert "nor any record of the subject within its scope (1 outside it" in out
    assert out.strip().endswith("VERDICT: PASS")
    cli("remember", "n1 again", "--subject", "N", "--user", "u1")  # re-inserted within the scope
    code, out, _ = cli("verify", str(cert), "--store", str(store))
    assert code == 1
    assert "FAIL 10 store_absent: a live record of the subject lies within the erasure's scope" in out


def test_a_request_about_someone_never_held_is_answered_and_certified(cli: Cli, store: Path, tmp_path: Path) -> None:
    code, out, _ = cli("erase", "Nobody", "--request-id", "DSAR-0", "--basis", "b")
    assert code == 0
    assert "nothing was held: no record matched this request within its scope" in out
    assert "certificate: deleatur certificate --request-id DSAR-0" in out
    code, out, _ = cli("requests", "--json")
    assert [(r["id"], r["status"]) for r in json.loads(out)] == [("DSAR-0", "complete")]
    cert = tmp_path / "nobody.json"
    code, out, _ = cli("certificate", "--request-id", "DSAR-0", "--out", str(cert))
    assert "nothing was held: it attests no erasure" in out
    code, out, _ = cli("verify", str(cert), "--store", str(store))
    assert code == 0, out
    assert "OK    5 attests_erasure: nothing was held" in out


def test_a_purge_with_nothing_due_records_no_request(cli: Cli, store: Path) -> None:
    code, out, _ = cli("purge", "--dry-run")
    assert code == 0
    assert "would erase 0 record(s)" in out and "note:" not in out
    for args in ((), ("--older-than", "3650", "--include-audit")):
        code, out, _ = cli("purge", *args)
        assert code == 0
        assert "nothing to purge: no record is due, and no request was recorded" in out
    assert "audit entries pruned: 0" in out
    code, out, _ = cli("purge", "--json")
    assert json.loads(out)["nothing_due"] is True
    assert json.loads(cli("requests", "--json")[1]) == []


def test_verify_reads_the_certificate_file_as_its_readers_would(cli: Cli, store: Path, tmp_path: Path) -> None:
    """A key repeated in one object (json keeps the last, a first-wins reader or a person
    the first) and a member the signature does not cover fail check 1, and the report
    names the problem, not what the document says."""
    assert cli("erase", "alice smith", *ERASE)[0] == 0
    cert = tmp_path / "cert.json"
    assert cli("certificate", "--request-id", "DSAR-17", "--out", str(cert))[0] == 0
    vkey = cli("keys", "export-public")[1].strip()
    real = '"basis": "Art. 17(1)(a)"'
    text = cert.read_text()
    assert text.count(real) == 1
    dup = tmp_path / "dup.json"
    dup.write_text(text.replace(real, f'"basis": "Art. 17(3)(b) - retained for Alice Smith", {real}'))
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({**json.loads(text), "extra": 1}))
    for forged, problem in ((dup, "repeats a key"), (extra, "besides certificate and signature")):
        code, out, err = cli("verify", str(forged), "--expected-pubkey", vkey)
        assert code == 1, err
        assert "FAIL  1 format" in out and problem in out
        assert out.strip().endswith("VERDICT: FAIL (check 1 format)")
        assert "retained" not in out and "Alice" not in out
    code, out, _ = cli("verify", str(cert), "--expected-pubkey", vkey)
    assert code == 0, out


def test_erase_and_certificate_say_when_a_reader_kept_the_wal_from_being_truncated(
    cli: Cli, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deleatur import sqlitefile

    monkeypatch.setattr(sqlitefile, "BUSY_TIMEOUT_MS", 100)
    reader = apsw.Connection(str(store), flags=apsw.SQLITE_OPEN_READONLY)
    reader.execute("BEGIN").fetchall()
    reader.execute("SELECT count(*) FROM records").fetchall()  # an open read snapshot
    code, out, _ = cli("erase", "alice smith", *ERASE)
    assert code == 0 and "write-ahead log NOT truncated" in out
    code, out, err = cli("certificate", "--request-id", "DSAR-17")
    held = json.loads(out)["certificate"]
    assert held["erasure"]["wal_truncated"] is False and held["request"]["counts"]["wal_not_truncated"] == 1
    assert "write-ahead log NOT truncated" in err
    reader.execute("COMMIT").fetchall()
    reader.close()
    code, out, _ = cli("requests", "--json")  # opening the store truncated the -wal
    assert "wal_not_truncated" not in json.loads(out)[0]["counts"]
    code, out, err = cli("certificate", "--request-id", "DSAR-17")
    issued = json.loads(out)["certificate"]
    assert issued["erasure"]["wal_truncated"] is True and "wal_not_truncated" not in issued["request"]["counts"]
    assert err == ""
    code, out, _ = cli("erase", "alice smith", *ERASE)
    assert code == 0 and "NOT truncated" not in out


def test_verify_with_the_store_refuses_a_key_its_log_never_announced(cli: Cli, store: Path, tmp_path: Path) -> None:
    """`verify --store` without a pinned key: a certificate re-signed, checkpoint and body,
    by a key of the forger's own named like the store's fails check 8, naming the key."""
    import base64

    from deleatur.erasure.certificate import signed_message
    from deleatur.log.note import Note, Signer

    assert cli("erase", "alice smith", *ERASE)[0] == 0
    cert = tmp_path / "cert.json"
    assert cli("certificate", "--request-id", "DSAR-17", "--out", str(cert))[0] == 0
    body = json.loads(cert.read_text())["certificate"]
    forger = Signer.generate(body["store"]["origin"])
    text = Note.parse(body["checkpoint"]).text
    body["checkpoint"] = Note(text, (forger.sign(text),)).format()
    body["public_key"] = forger.verifier.vkey
    body["issued_at"] = "2099-01-01T00:00:00Z"  # no log entry states when it was issued
    forged = tmp_path / "forged.json"
    signature = base64.b64encode(forger.sign_bytes(signed_message(body))).decode()
    forged.write_text(json.dumps({"certificate": body, "signature": signature}))
    code, out, _ = cli("verify", str(forged), "--store", str(store))
    assert code == 1, out
    named = f"{forger.verifier.name} (key {forger.verifier.key_id.hex()})"
    assert f"FAIL  8 store_identity: the certificate's key {named} is not one the store's log announced" in out
    assert out.strip().endswith("VERDICT: FAIL (check 8 store_identity)")


def test_certificate_refuses_a_request_row_edited_against_the_log(cli: Cli, store: Path, tmp_path: Path) -> None:
    """Someone who can write the store's files (and holds no key) edits the request's basis
    and times; `deleatur certificate` would sign the edit. It refuses, writing nothing."""
    assert cli("erase", "alice smith", *ERASE)[0] == 0
    conn = apsw.Connection(str(store))
    conn.execute(
        "UPDATE erasure_requests SET basis = 'Art. 17(1)(d) [EDITED]', received_at = 1799000000000000,"
        " completed_at = 1799000000500000 WHERE id = 'DSAR-17'"
    )
    conn.close()
    cert = tmp_path / "cert.json"
    code, _, err = cli("certificate", "--request-id", "DSAR-17", "--out", str(cert))
    assert code == 1
    assert "erasure request DSAR-17 contradicts its log entries (the request's receipt time is not" in err
    assert "EDITED" not in err and not cert.exists()


def test_verify_with_the_store_re_derives_the_certified_tree_from_its_entries(
    cli: Cli, store: Path, tmp_path: Path
) -> None:
    """An entry of the certified tree edited in the store's files, its stored hashes left
    alone: check 9 fails, and `log verify` too."""
    assert cli("erase", "alice smith", *ERASE)[0] == 0
    cert = tmp_path / "cert.json"
    assert cli("certificate", "--request-id", "DSAR-17", "--out", str(cert))[0] == 0
    conn = apsw.Connection(str(store))
    [(index, raw)] = conn.execute('SELECT idx, entry FROM log_entries WHERE instr(entry, \'"type":"write"\') LIMIT 1')
    conn.execute(
        "UPDATE log_entries SET entry = ? WHERE idx = ?", (bytes(raw).replace(b'"time":1', b'"time":2'), index)
    )
    conn.close()
    code, out, _ = cli("verify", str(cert), "--store", str(store))
    assert code == 1
    assert "FAIL  9 store_log: the store's log entries no longer produce the certificate's tree" in out
    assert out.strip().endswith("VERDICT: FAIL (check 9 store_log)")
