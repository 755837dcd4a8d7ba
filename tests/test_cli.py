"""The CLI as a user drives it: output, --json, exit codes, and bad input that
leaves the store exactly as it was."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from deleatur import Memory, NewMemory, StoreBusyError
from deleatur.ids import is_record_id
from deleatur.memory import keystore_path
from deleatur.model import check_who

from .conftest import Cli

DELEATUR = Path(sys.executable).with_name("deleatur")


def _snapshot(store: Path) -> tuple[object, ...]:
    """Everything a write could change, read through a separate connection."""
    conn = apsw.Connection(str(store), flags=apsw.SQLITE_OPEN_READONLY)
    keys = apsw.Connection(str(keystore_path(store)), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return (
            conn.execute("SELECT id, status, updated_at, ciphertext FROM records ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM lineage ORDER BY child").fetchall(),
            keys.execute("SELECT key_id, wrapped FROM data_keys ORDER BY key_id").fetchall(),
        )
    finally:
        conn.close()
        keys.close()


@pytest.fixture
def store(cli: Cli, tmp_path: Path) -> Path:
    code, out, _ = cli("init")
    assert code == 0, out
    assert cli("remember", "Alice phone is +100", "--subject", "Alice", "--key", "alice::phone")[0] == 0
    return tmp_path / "cli.db"


def test_init_prints_where_everything_is(cli: Cli, tmp_path: Path) -> None:
    code, out, _ = cli("init", "--json")
    assert code == 0
    info = json.loads(out)
    assert info["store"] == str(tmp_path / "cli.db")
    assert info["key_store"] == str(tmp_path / "cli.db.keys")
    assert info["master_key"] == str(tmp_path / "cli.db.master-key")
    code, _, err = cli("init")
    assert code == 2
    assert "already exists" in err


def test_every_operation_through_the_cli(cli: Cli, store: Path) -> None:
    code, out, _ = cli("remember", "Alice phone is +200", "-s", "Alice", "-k", "alice::phone", "--json")
    assert code == 0
    second = json.loads(out)
    assert second["supersedes"] is not None
    code, out, _ = cli(
        "remember",
        "Alice said hello",
        "-s",
        "Alice",
        "--source",
        "chat",
        "--metadata",
        '{"lang": "en"}',
        "--confidence",
        "0.9",
        "--derived-from",
        second["id"],
        "--expires-at",
        "30d",
    )
    assert code == 0
    derived_id = out.strip()

    code, out, _ = cli("get", derived_id, "--json")
    got = json.loads(out)
    assert (got["source"], got["metadata"], got["confidence"], got["derived_from"]) == (
        "chat",
        {"lang": "en"},
        0.9,
        [second["id"]],
    )
    assert got["expires_at"] is not None

    code, out, _ = cli("recall", "phone", "--json")
    assert [h["text"] for h in json.loads(out)] == ["Alice phone is +200"]
    code, out, _ = cli("recall", "phone")
    assert "Alice phone is +200" in out

    code, out, _ = cli("history", "--key", "alice::phone", "--json")
    assert [r["status"] for r in json.loads(out)] == ["SUPERSEDED", "ACTIVE"]

    code, out, _ = cli("rectify", "Alice phone is +201", "--key", "alice::phone", "--reason", "typo", "--json")
    assert code == 0
    rectified = json.loads(out)
    assert rectified["reason"] == "typo"
    assert rectified["actor"].startswith("cli:")

    code, out, _ = cli("forget", derived_id, "--json")
    assert json.loads(out)["status"] == "RETIRED"
    code, out, _ = cli("list", "--json")
    assert [r["text"] for r in json.loads(out)] == ["Alice phone is +201"]
    code, out, _ = cli("list", "--history", "--subject", "ALICE", "--json")
    assert len(json.loads(out)) == 4
    code, out, _ = cli("forget", "--key", "alice::phone")
    assert code == 0
    assert "retired" in out


def test_space_options_scope_every_command(cli: Cli, store: Path) -> None:
    code, out, _ = cli("remember", "user1 note", "-s", "x", "--user", "user1", "--agent", "a", "--run", "r")
    rid = out.strip()
    assert cli("get", rid, "--user", "user1", "--agent", "a", "--run", "r")[0] == 0
    code, _, err = cli("get", rid, "--user", "user10", "--agent", "a", "--run", "r")
    assert code == 2
    assert "no record" in err
    code, out, _ = cli("recall", "note", "--user", "user10", "--agent", "a", "--run", "r", "--json")
    assert json.loads(out) == []
    code, out, _ = cli("list", "-u", "user1", "-a", "a", "-r", "r", "--json")
    assert [r["text"] for r in json.loads(out)] == ["user1 note"]


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (("remember", "", "-s", "a"), None, "text must not be empty"),
        (("remember", "-", "-s", "a"), b"x" * (64 * 1024 + 1), "over the 65536-byte limit"),
        (("remember", "-", "-s", "a"), b"bad \xff utf8", "not valid UTF-8"),
        (("remember", "bad \udcff", "-s", "a"), None, "not valid UTF-8"),
        (("remember", "t", "-s", " "), None, "subject must not be empty"),
        (("remember", "t", "-s", "a", "--metadata", "{nope"), None, "metadata is not valid JSON"),
        (
            ("remember", "t", "-s", "a", "--metadata", '{"a": {"b": 1, "b": 2}}'),
            None,
            'metadata repeats a key in one object: "b"',
        ),
        (("remember", "t", "-s", "a", "--expires-at", "soon"), None, "expires_at: 'soon' is neither"),
        (("remember", "t", "-s", "a", "--expires-at", "99999999d"), None, "'99999999d' is after the year 9999"),
        (("remember", "t", "-s", "a", "--expires-at", "0001-01-01"), None, "'0001-01-01' is before 1970"),
        (("remember", "t", "-s", "a", "--confidence", "2"), None, "between 0 and 1"),
        (("remember", "t", "-s", "a", "--derived-from", "01a22a03-19d9-75ea-b6f8-0a895b612b14"), None, "unknown"),
        (("get", "01a22a03-19d9-75ea-b6f8-0a895b612b14"), None, "no record"),
        (("get", "xyz"), None, "not a record id"),
        (("forget", "--key", "nope"), None, "no active value for this key"),
        (("forget",), None, "exactly one"),
        (("history", "--key", "nope"), None, "no record with this key"),
        (("rectify", "t", "--key", "nope", "--reason", "r"), None, "no active value"),
        (("rectify", "t", "--key", "alice::phone", "--reason", " "), None, "needs a reason"),
        (("recall", "!!!"), None, "no searchable words"),
        (("recall", "bad \udcff"), None, "query is not valid UTF-8"),
        (("recall", "x", "--limit", "0"), None, "limit must be between"),
        (("--tenant", "", "recall", "x"), None, "tenant must not be empty"),
        (("--store", "", "list"), None, "--store must name the store's file"),
        # A name from the command line is quoted with its control characters as codes.
        (("verify", "\x1b[31mX\ny"), None, "cannot read \\x1b[31mX\\ny: No such file"),
        (("remember", "t", "-s", "a", "--metadata", '{"a": "\x01"}'), None, "Invalid control character at position 7"),
        (
            ("erase", "alice", "--request-id", "R", "--basis", "b", "--dry-run", "--confirm", "a-token"),
            None,
            "a dry run takes no confirmation token",
        ),
        (("remember", "t", "-s", "a", "--metadata", "[" * 5000 + "]" * 5000), None, "nested more than 32 levels"),
        (("remember", "t", "-s", "a", "--metadata", '{"n": ' + "7" * 5000 + "}"), None, "integer of more than"),
        (("list", "--limit", str(2**63)), None, "limit must be an integer from 1 to"),
        (("audit", "show", "--from", str(10**20)), None, "start must be an integer from 0 to"),
        (("audit", "verify", "--state", "/no-such-dir/x.state"), None, "no directory /no-such-dir"),
        # An output that cannot be written is refused before the write it would record.
        (("remember", "t", "-s", "a", "--receipt", "/no-such-dir/r.json"), None, "no directory /no-such-dir"),
        (("remember", "t", "-s", "a", "--receipt", "/"), None, "cannot write /: it is a directory"),
        (("export", "-s", "a", "--out", "/no-such-dir/a.json"), None, "no directory /no-such-dir"),
        (("export", "-u", "default", "--format", "csv", "--out", sys.executable), None, "needs a directory"),
        # Mistakes the command line's parser finds: one line too, not a usage box.
        (("erase-all", "--request-id", "X", "--basis", "b"), None, "Missing option '--user'"),
        (("principals", "create", "x", "--role", "superuser"), None, "'superuser' is not one of 'admin'"),
        (("recall", "x", "--limit", "many"), None, "Invalid value for '--limit'"),
        # A port out of range was an OverflowError from the socket: "internal error", exit 1.
        (
            ("serve", "http", "--port", "99999"),
            None,
            "Invalid value for '--port': 99999 is not a port: give one from 0 to 65535",
        ),
        (("serve", "http", "--port", "-1"), None, "Invalid value for '--port': -1 is not a port"),
        (("serve", "mcp", "--transport", "http", "--port", "70000"), None, "'--port': 70000 is not a port"),
        (("nonesuch",), None, "No such command 'nonesuch'"),
        # A negative number is a number, refused by the command's own check, not an unknown option.
        (("retention", "set", "run", "-1"), None, "a retention period must be a number of days from one second"),
        (("retention", "set", "run", "1e-12"), None, "a retention period must be a number of days from one second"),
        (("log", "prove", "-3"), None, "index must be an integer from 0"),
    ],
)
def test_bad_input_exits_2_and_changes_nothing(
    cli: Cli, store: Path, args: tuple[str, ...], stdin: bytes | None, message: str
) -> None:
    before = _snapshot(store)
    code, out, err = cli(*args, stdin=stdin)
    assert code == 2
    assert message in err
    assert err.startswith("error: ")
    assert err.count("\n") == 1  # one line
    assert out == ""
    assert _snapshot(store) == before


def test_missing_and_wrong_master_key(cli: Cli, store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _snapshot(store)
    key_file = store.with_name("cli.db.master-key")
    moved = key_file.rename(key_file.with_name("elsewhere.key"))
    code, _, err = cli("list")
    assert code == 2
    assert "master key file" in err
    assert "does not exist" in err
    monkeypatch.setenv("DELEATUR_MASTER_KEY", "11" * 32)
    code, _, err = cli("remember", "x", "-s", "a")
    assert code == 2
    assert "wrong master key" in err
    monkeypatch.delenv("DELEATUR_MASTER_KEY")
    code, out, _ = cli("list", "--json", "--master-key-file", str(moved))
    assert code == 2  # a global option goes before the command
    code, out, _ = cli("--master-key-file", str(moved), "list", "--json")
    assert code == 0
    assert len(json.loads(out)) == 1
    assert _snapshot(store) == before


def test_store_problems_exit_2(cli: Cli, tmp_path: Path) -> None:
    code, _, err = cli("list")
    assert code == 2
    assert "no store at" in err
    assert "deleatur init" in err
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 200)
    code, _, err = cli("--store", str(junk), "list")
    assert code == 2
    assert "is not a deleatur store" in err
    assert junk.read_bytes() == b"this is not a database at all" * 200
    other = tmp_path / "other.db"
    conn = apsw.Connection(str(other))
    conn.execute("CREATE TABLE t(x)")
    conn.close()
    theirs = other.read_bytes()
    code, _, err = cli("--store", str(other), "list")
    assert code == 2
    assert "is not a deleatur store" in err
    assert other.read_bytes() == theirs  # not even switched to WAL
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("other")) == ["other.db"]
    empty = tmp_path / "empty.db"
    empty.touch()
    code, _, err = cli("--store", str(empty), "list")
    assert code == 2
    assert "is empty, not an initialized store: remove it, then run `deleatur init`" in err
    assert empty.read_bytes() == b""


def test_unusable_paths_and_names_exit_2_in_one_line(cli: Cli, store: Path, tmp_path: Path) -> None:
    """A directory given as the store, a store's parent that is a file, a directory where
    nothing can be made, a witness name with a space: the user's mistakes, which were
    internal errors (exit 1, an OS or SQLite error's type)."""
    receipt, certificate = tmp_path / "r.json", tmp_path / "c.json"
    assert cli("remember", "Bob's note", "-s", "Bob", "--receipt", str(receipt))[0] == 0
    assert cli("erase", "Bob", "--request-id", "R1", "--basis", "b")[0] == 0
    assert cli("certificate", "--request-id", "R1", "--out", str(certificate))[0] == 0
    vkey = cli("keys", "export-public")[1].strip()
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    cases = [
        (("verify", str(certificate), "--store", str(tmp_path)), f"{tmp_path} is a directory, not a store file"),
        (("verify-receipt", str(receipt), "--key", vkey, "--store", str(tmp_path)), "is a directory, not a store"),
        (("--store", str(tmp_path), "init"), f"{tmp_path} is a directory, not a store file"),
        (("--store", str(a_file / "x.db"), "init"), f"{a_file} is not a directory"),
        (("--store", str(a_file / "sub" / "x.db"), "init"), f"cannot create directory {a_file / 'sub'}: Not a dir"),
        (("witness", "init", "--state", str(tmp_path / "w.db"), "--name", "a b"), "witness name: key name 'a b'"),
        (("witness", "init", "--state", str(tmp_path / "w.db"), "--name", "w\x1b[31m"), "or control characters"),
    ]
    if Path("/proc/self").is_dir():  # Linux: no file can be made there, not even by root
        cases.append((("--store", "/proc/x.db", "init"), "cannot create files in directory /proc: No such file"))
    before = sorted(tmp_path.iterdir())
    for args, message in cases:
        code, out, err = cli(*args)
        assert (code, out) == (2, ""), (args, err)
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (args, err)
    assert sorted(tmp_path.iterdir()) == before


def test_no_output_is_written_over_the_stores_own_files(cli: Cli, store: Path, tmp_path: Path) -> None:
    """An export, receipt or checkpoint written over the master key, the key store or the
    database destroyed the store (an export over the master key made every record
    unreadable). Each of them, a file named after the store beside it that does not exist
    yet, and a hard link to the master key elsewhere, is refused before anything is
    written, and the store is as it was."""
    master = store.with_name(store.name + ".master-key")
    os.link(master, tmp_path / "innocent.txt")
    keys = [master, store.with_name(store.name + ".signing-key")]
    before = {p: p.read_bytes() for p in keys}
    named = [store, master, store.with_name(store.name + ".keys"), store.with_name(store.name + ".signing-key")]
    for path in [*named, store.with_name(store.name + "-wal"), tmp_path / "innocent.txt"]:
        for args in (
            ("export", "--subject", "Alice", "--out", str(path)),
            ("remember", "more", "--subject", "Bo", "--receipt", str(path)),
            ("log", "checkpoint", "--out", str(path)),
        ):
            code, out, err = cli(*args)
            assert (code, out) == (2, ""), (args, err)
            assert (
                err == f"error: cannot write {path}: it is one of the store's own files (or named after the store"
                " beside it), which it would destroy; name another file\n"
            )
    assert cli("list", "--subject", "Bo", "--json")[1] == "[]\n"
    assert {p: p.read_bytes() for p in keys} == before
    assert cli("get", json.loads(cli("list", "--json")[1])[0]["id"])[0] == 0  # its keys read it still
    assert cli("log", "verify")[0] == 0


def test_an_output_file_is_written_as_named_and_a_failed_one_leaves_nothing(
    cli: Cli, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint, certificate, proof or receipt goes into the file as named, through a
    link too (`--out /dev/stdout` works); one under a file is refused naming it, and one
    that the disk cannot hold leaves no empty or cut file behind."""
    target = tmp_path / "published" / "cp.txt"
    target.parent.mkdir()
    (tmp_path / "link.txt").symlink_to(target)
    assert cli("log", "checkpoint", "--out", str(tmp_path / "link.txt"))[0] == 0
    assert target.read_text() and (tmp_path / "link.txt").is_symlink()
    (tmp_path / "afile").write_text("")
    code, _, err = cli("log", "checkpoint", "--out", str(tmp_path / "afile" / "x"))
    assert (code, err) == (2, f"error: cannot write {tmp_path / 'afile' / 'x'}: Not a directory\n")
    written = Path.write_text

    def full(self: Path, *args: object, **kwargs: object) -> int:
        written(self, "cut")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    out = tmp_path / "new-cp.txt"
    code, _, err = cli("log", "checkpoint", "--out", str(out))
    assert (code, err) == (2, f"error: cannot write {out}: No space left on device\n")
    assert not out.exists()


def test_no_output_is_written_over_the_files_of_a_store_reached_through_a_link(cli: Cli, tmp_path: Path) -> None:
    """A store named by a link keeps its keys beside the link, named after it, and its
    database where the link leads: an output named after either is refused, a CSV
    bundle's directory too (a directory named like the store's journal made it unusable)."""
    assert cli("--store", str(tmp_path / "real" / "data.db"), "init")[0] == 0
    live = tmp_path / "live"
    live.mkdir()
    (live / "mem.db").symlink_to(tmp_path / "real" / "data.db")
    for suffix in (".keys", ".master-key", ".signing-key"):
        (tmp_path / "real" / f"data.db{suffix}").rename(live / f"mem.db{suffix}")
    store = ("--store", str(live / "mem.db"))
    assert cli(*store, "remember", "Alice's note", "-s", "Alice")[0] == 0
    master = (live / "mem.db.master-key").read_bytes()
    for out, fmt in (
        (live / "mem.db.master-key", "json"),
        (live / "mem.db-journal", "csv"),
        (tmp_path / "real" / "data.db-journal", "csv"),
        (tmp_path / "real" / "data.db.export", "json"),
    ):
        code, _, err = cli(*store, "export", "--subject", "Alice", "--format", fmt, "--out", str(out))
        assert code == 2 and "it is one of the store's own files" in err, (out, err)
        assert not out.exists() or out == live / "mem.db.master-key"
    assert (live / "mem.db.master-key").read_bytes() == master
    assert cli(*store, "list", "--json")[0] == 0


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full, a file no write fits in")
def test_a_receipt_that_cannot_be_written_after_its_record_says_the_record_was(cli: Cli, store: Path) -> None:
    """Only the write itself finds that the disk is full, after the record committed: the
    id is printed, and the error says the record was written and how to get its receipt,
    so that no one writes it again."""
    code, out, err = cli("remember", "Ann's note", "-s", "Ann", "--receipt", "/dev/full")
    record_id = out.strip()
    assert code == 1 and is_record_id(record_id)
    assert err == (
        f"error: the record {record_id} was written, but not its receipt: cannot write /dev/full: No space left"
        f" on device; get it with `deleatur receipt {record_id} --out FILE`\n"
    )
    assert [r["id"] for r in json.loads(cli("list", "--subject", "Ann", "--json")[1])] == [record_id]


def test_a_receipt_refused_after_its_record_committed_says_the_record_was(
    cli: Cli, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receipt logs and signs in a transaction of its own, after the record's: a lock
    held elsewhere past the busy timeout refuses it with 'nothing was changed', which must
    not be what the caller is told of the record."""

    def refused(self: Memory, record_id: str, **_: object) -> object:
        raise StoreBusyError("another process held the write lock; nothing was changed: try again")

    monkeypatch.setattr(Memory, "receipt", refused)
    code, out, err = cli("remember", "Ann's note", "-s", "Ann", "--receipt", str(tmp_path / "r.json"))
    record_id = out.strip()
    assert code == 1 and is_record_id(record_id)
    assert err.startswith(f"error: the record {record_id} was written, but not its receipt: another process held")
    assert not (tmp_path / "r.json").exists()


def test_newer_schema_is_refused(cli: Cli, store: Path) -> None:
    conn = apsw.Connection(str(store))
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    code, _, err = cli("list")
    assert code == 2
    assert "schema version 99" in err
    assert "upgrade deleatur" in err


def test_tampered_store_is_an_internal_failure_exit_1(cli: Cli, store: Path) -> None:
    conn = apsw.Connection(str(store))
    [(ciphertext,)] = conn.execute("SELECT ciphertext FROM records").fetchall()
    assert isinstance(ciphertext, bytes)
    blob = bytearray(ciphertext)
    blob[-1] ^= 1
    conn.execute("UPDATE records SET ciphertext = ?", (bytes(blob),))
    conn.close()
    code, _, err = cli("list")
    assert code == 1
    assert "failed authentication" in err
    assert "+100" not in err


def test_real_process_exit_codes_and_stdin(tmp_path: Path) -> None:
    env = {"DELEATUR_STORE": str(tmp_path / "p.db"), "PATH": "/usr/bin:/bin"}
    assert subprocess.run([DELEATUR, "init"], env=env, capture_output=True, check=False).returncode == 0
    ok = subprocess.run(
        [DELEATUR, "remember", "-", "--subject", "Zoë"],
        env=env,
        input="é from stdin".encode(),
        capture_output=True,
        check=False,
    )
    assert ok.returncode == 0
    bad = subprocess.run(
        [DELEATUR, "remember", b"bad \xff arg", "--subject", "z"], env=env, capture_output=True, check=False
    )
    assert bad.returncode == 2
    assert b"not valid UTF-8" in bad.stderr
    listed = subprocess.run([DELEATUR, "list", "--json"], env=env, capture_output=True, check=True)
    assert [r["text"] for r in json.loads(listed.stdout)] == ["é from stdin"]
    if Path("/dev/full").exists():  # Linux: a file no write fits in, as a full disk
        with open("/dev/full", "wb") as full:
            command = [str(DELEATUR), "list", "--json"]
            unwritten = subprocess.run(command, env=env, stdout=full, stderr=subprocess.PIPE, check=False)
        assert unwritten.returncode == 1
        assert unwritten.stderr == b"error: cannot write the output: No space left on device\n"


def test_a_long_output_its_reader_or_disk_refuses_is_told_as_such(tmp_path: Path) -> None:
    """A listing longer than standard output's buffer meets a full disk while the command
    runs: that was "internal error (OSError)". A reader gone (`| head`) ends the command
    quietly with 1, as a short output's does."""
    store = tmp_path / "long.db"
    memory, _ = Memory.init(store)
    memory.remember_many(NewMemory(f"note number {i} " + "x" * 200, subject="Long") for i in range(2000))
    memory.close()
    env = {"DELEATUR_STORE": str(store), "PATH": "/usr/bin:/bin"}
    command = [str(DELEATUR), "list", "--json"]
    if Path("/dev/full").exists():  # Linux: a file no write fits in, as a full disk
        with open("/dev/full", "wb") as full:
            unwritten = subprocess.run(command, env=env, stdout=full, stderr=subprocess.PIPE, check=False)
        assert (unwritten.returncode, unwritten.stderr) == (
            1,
            b"error: cannot write the output: No space left on device\n",
        )
    reader = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.read(100)  # the command has begun writing; its reader goes
    reader.stdout.close()
    assert reader.wait(timeout=60) == 1
    assert reader.stderr.read() == b""


def test_the_command_line_loads_no_server_until_one_is_served() -> None:
    """Agents shell out for every call: FastAPI, MCP and uvicorn took half a second of
    each command's start, ``deleatur version`` included, though only ``serve`` uses them."""
    probe = (
        "import sys, deleatur.cli.app; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'mcp', 'uvicorn', 'starlette'}))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_an_expiry_in_microseconds_is_taken(cli: Cli, store: Path) -> None:
    """The README lists microseconds among the forms of an expiry, as HTTP and the library take them."""
    code, out, err = cli("remember", "x", "--subject", "X", "--expires-at", "4102444800000000", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["expires_at"] == "2100-01-01T00:00:00Z"


def test_tables_and_lines_show_text_with_brackets_literally(cli: Cli, tmp_path: Path) -> None:
    """Stored text, keys, names and paths may hold "[...]", which rich takes for markup
    and swallows, in a table cell and in a one-line confirmation alike."""
    store = tmp_path / "[bold]" / "m.db"
    code, out, _ = cli("--store", str(store), "init")
    assert (code, out.splitlines()[0]) == (0, f"store:      {store}")
    in_store = ("--store", str(store))
    code, out, _ = cli(*in_store, "remember", "[red]note[/red] about [b]x", "-s", "Alice", "--key", "k[bold]")
    assert code == 0
    code, listed, _ = cli(*in_store, "list")
    assert code == 0
    assert "[red]note[/red] about [b]x" in listed
    assert cli(*in_store, "forget", "--key", "k[bold]") == (0, f"retired {out.strip()} [key=k[bold]]\n", "")
    code, out, _ = cli(*in_store, "principals", "create", "[red]bot", "--role", "viewer")
    assert code == 0 and out.startswith("created viewer '[red]bot' (")
    code, out, _ = cli(*in_store, "export", "--subject", "Alice", "--out", str(tmp_path / "[red]x.json"))
    assert (code, out) == (0, f"exported 1 record(s), 2 log entries -> {tmp_path / '[red]x.json'}\n")


def test_serve_on_a_port_in_use_is_refused_with_exit_2(cli: Cli) -> None:
    assert cli("init")[0] == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        for command in (["http", "--workers", "1"], ["http", "--workers", "2"], ["mcp", "--transport", "http"]):
            code, _, err = cli("serve", *command, "--port", port)
            assert code == 2, command
            assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in err


def test_help_shows_every_default(cli: Cli) -> None:
    """Rich reads "[default: ...]" as markup and drops it: help left "Store file ."."""
    code, out, _ = cli("--help")
    assert code == 0
    assert "Store file (default: $XDG_DATA_HOME/deleatur/memory.db)." in " ".join(out.split())
    code, out, _ = cli("erase", "--help")
    assert "Who asked (default: cli:$USER)." in " ".join(out.split())


def test_text_is_refused_with_control_characters_and_old_ones_are_shown_not_run(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory is text: an escape sequence stored in one would run in the terminal of
    whoever lists it later (clear the screen, retitle the window)."""
    assert cli("init")[0] == 0
    for bad in ("wipe\x1b[2J", "ring\x07", "nul\x00"):
        code, _, err = cli("remember", bad, "-s", "a")
        assert code == 2 and "control characters" in err
    assert cli("remember", "tab\tand\nline", "-s", "a")[0] == 0
    # A record from before the rule, written past it.
    from deleatur import memory as memory_module

    real = memory_module.validate_text  # type: ignore[attr-defined]
    monkeypatch.setattr(memory_module, "validate_text", lambda text, limit: text)
    assert cli("remember", "old\x1b]0;owned\x07 text", "-s", "b")[0] == 0
    monkeypatch.setattr(memory_module, "validate_text", real)
    code, out, _ = cli("list", "--subject", "b")
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert "old\\x1b]0;owned\\x07 text" in out
    code, out, _ = cli("list", "--subject", "b", "--json")
    assert json.loads(out)[0]["text"] == "old\x1b]0;owned\x07 text"  # JSON carries it escaped, intact


def test_bidirectional_formatting_is_shown_as_codes(cli: Cli) -> None:
    """A right-to-left override in a subject or text would show it in another order
    than it is stored, so one subject could pass for another in a listing."""
    assert cli("init")[0] == 0
    assert cli("remember", "pay \u202eevil\u202c now", "-s", "Ann\u202eeve")[0] == 0
    code, out, _ = cli("list")
    assert code == 0 and "\u202e" not in out and "\u202c" not in out
    assert "Ann\\u202eeve" in out and "pay \\u202eevil\\u202c now" in out
    code, out, _ = cli("list", "--json")
    assert json.loads(out)[0]["text"] == "pay \u202eevil\u202c now"  # stored as given
    # So in a decision's summary, and a principal's name as whoami shows it.
    code, out, _ = cli("decision", "record", "refund \u202edenied\u202c", "--used", json.loads(out)[0]["id"], "--json")
    code, out, _ = cli("decision", "explain", json.loads(out)["decision"]["id"])
    assert code == 0 and "\u202e" not in out and "refund \\u202edenied\\u202c" in out
    code, out, _ = cli("principals", "create", "bot\u202eevil", "--role", "viewer", "--json")
    code, out, _ = cli("--api-key", json.loads(out)["api_key"], "whoami")
    assert code == 0 and "\u202e" not in out and out.startswith("bot\\u202eevil (")


def test_invisible_format_characters_are_shown_as_codes(cli: Cli) -> None:
    """Subjects that differ only by a zero-width space or joiner, or a soft hyphen, all
    showed as "Finn Wolf": one could pass for another in a listing or a dry run."""
    assert cli("init")[0] == 0
    for n, subject in enumerate(["Finn Wolf", "Finn\u200bWolf", "Finn Wolf\u200d", "Fi\u00adnn Wolf"]):
        assert cli("remember", f"note {n}", "-s", subject, "-u", "u\u2060x")[0] == 0
    code, out, _ = cli("list", "-u", "u\u2060x")
    assert code == 0 and not {"\u200b", "\u200d", "\u00ad"} & set(out)
    assert "Finn\\u200bWolf" in out and "Finn Wolf\\u200d" in out and "Fi\\xadnn Wolf" in out
    (finn,) = [r for r in json.loads(cli("list", "-u", "u\u2060x", "--json")[1]) if r["subject"] == "finn\u200bwolf"]
    assert cli("remember", "derived", "-s", "Ann\ufeff", "-u", "u\u2060x", "--derived-from", finn["id"])[0] == 0
    code, out, _ = cli("erase", "Finn\u200bWolf", "--request-id", "R", "--basis", "b", "--dry-run")
    assert code == 0 and not {"\u200b", "\ufeff", "\u2060"} & set(out)
    assert "Finn\\u200bWolf" in out  # the record's subject in the table
    assert "other subjects whose derived records go too: ann\\ufeff" in out  # canonical
    assert "  u\\u2060x//: 2" in out


def test_audit_show_keeps_an_older_multi_line_actor_on_its_entrys_line(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older release took an actor with a line break; shown raw, its second line would
    pass for an entry, or a field, of its own."""
    from deleatur.rights import restriction

    assert cli("init")[0] == 0
    assert cli("remember", "a note", "-s", "Ann")[0] == 0
    monkeypatch.setattr(restriction, "check_who", lambda value, what, missing: value)
    assert cli("restrict", "Ann", "--reason", "contested", "--actor", "clerk\nactor=operator")[0] == 0
    monkeypatch.setattr(restriction, "check_who", check_who)
    code, out, _ = cli("audit", "show")
    assert code == 0 and "actor=clerk\\nactor=operator" in out
    assert not any(line.startswith("actor=") for line in out.splitlines())


def test_a_global_option_after_the_command_is_told_where_it_goes(cli: Cli, store: Path) -> None:
    code, _, err = cli("list", "--store", str(store))
    assert code == 2
    assert err.startswith("error: No such option: --store")
    assert err.endswith("; --store is a global option: give it before the command (deleatur --store ... COMMAND)\n")
    code, _, err = cli("whoami", "--api-key", "x")
    assert (code, err.count("\n")) == (2, 1) and "--api-key is a global option" in err
    code, _, err = cli("list", "--bogus")
    assert (code, err) == (2, "error: No such option: --bogus (Possible options: --user)\n")


def test_ids_in_tables_are_whole_on_a_narrow_terminal(cli: Cli, store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An id is copied from a table into the next command: stored text wraps instead."""
    code, out, _ = cli("remember", "a long text that has to wrap somewhere in a narrow table " * 3, "-s", "Bob")
    record_id = out.strip()
    code, out, _ = cli("principals", "create", "a bot", "--role", "viewer", "--json")
    principal_id = json.loads(out)["id"]
    assert cli("erase", "Alice", "--request-id", "DSAR-2026-000123", "--basis", "Art. 17(1)(a)")[0] == 0
    monkeypatch.setenv("COLUMNS", "60")
    tables = ((("list",), record_id), (("principals", "list"), principal_id), (("requests",), "DSAR-2026-000123"))
    for command, whole in tables:
        code, out, _ = cli(*command)
        assert code == 0 and max(map(len, out.splitlines())) <= 60
        assert any(f"│ {whole} │" in line for line in out.splitlines()), out


def test_recall_scores_are_shown_to_three_significant_digits(cli: Cli, store: Path) -> None:
    """In a store this small "phone" is in most records, whose scores BM25 makes tiny:
    they still rank, and the table says so rather than 0.000 for each."""
    cli("remember", "Bob's phone is +1 555 0100", "-s", "Bob")
    cli("remember", "a note on something else", "-s", "Bob")
    code, out, _ = cli("recall", "phone", "--json")
    scores = [hit["score"] for hit in json.loads(out)]
    assert code == 0 and len(scores) == 2 and all(0 < s < 1e-5 for s in scores)
    code, out, _ = cli("recall", "phone")
    assert code == 0 and "0.000" not in out
    assert all(f"{s:.3g}" in out for s in scores)
