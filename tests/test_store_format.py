"""The store file: ownership marks, schema versions and migrations, init."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from deleatur import (
    AccessDeniedError,
    KeyStoreError,
    MasterKeyError,
    Memory,
    NotADeleaturStoreError,
    NotFoundError,
    Principal,
    Role,
    SchemaVersionError,
    Space,
    SpaceFilter,
    StoreError,
    from_bytes,
    from_file,
)
from deleatur.access.calls import SYSTEM
from deleatur.erasure import engine
from deleatur.erasure.engine import ConfirmationRequiredError
from deleatur.erasure.verify import verify_certificate
from deleatur.log.entries import EventType
from deleatur.log.tlog import TransparencyLog
from deleatur.newfiles import Made
from deleatur.sqlitefile import sidecar_files
from deleatur.store import schema
from deleatur.store.evidence import StoreEvidence

from .conftest import MASTER, SRC, Cli, FakeClock, resume, run_together, start_paused, store_files


def _version(path: Path) -> int:
    conn = apsw.Connection(str(path))
    try:
        value = conn.execute("PRAGMA user_version").fetchall()[0][0]
        assert isinstance(value, int)
        return value
    finally:
        conn.close()


def _undo_v16(conn: apsw.Connection) -> None:
    """The log as v15 left it: its entries carry no MAC."""
    conn.execute("ALTER TABLE log_entries DROP COLUMN mac")


def _undo_v15(conn: apsw.Connection) -> None:
    """The confirmation tokens as v14 left them: no terms."""
    _undo_v16(conn)
    conn.execute("ALTER TABLE erasure_confirmations DROP COLUMN terms")


def _undo_v14(conn: apsw.Connection) -> None:
    """The erasure requests as v13 left them: no scope keys."""
    _undo_v15(conn)
    conn.execute("ALTER TABLE erasure_requests DROP COLUMN scope_key")


def _undo_v13(conn: apsw.Connection) -> None:
    """The erasure requests as v12 left them: not numbered, indexed by time of receipt."""
    _undo_v14(conn)
    conn.execute("DROP TRIGGER erasure_requests_numbered")
    conn.execute("DROP INDEX erasure_requests_seq")
    conn.execute("ALTER TABLE erasure_requests DROP COLUMN seq")
    conn.execute("CREATE INDEX erasure_requests_received ON erasure_requests(tenant, received_at, id)")


def test_new_store_is_marked_and_versioned(store_path: Path) -> None:
    Memory.open(store_path, from_bytes(MASTER), create=True).close()
    conn = apsw.Connection(str(store_path))
    assert conn.execute("PRAGMA application_id").fetchall()[0][0] == schema.APPLICATION_ID
    conn.close()
    assert _version(store_path) == max(schema.MIGRATIONS)


def test_migrations_run_in_order_once(store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        kept = memory.remember("survives the migration", subject="a")
    applied: list[int] = []
    nxt = max(schema.MIGRATIONS) + 1

    def upgrade(conn: apsw.Connection) -> None:
        applied.append(nxt)
        conn.execute("ALTER TABLE records ADD COLUMN note TEXT")

    monkeypatch.setitem(schema.MIGRATIONS, nxt, upgrade)
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert memory.get(kept.id).text == "survives the migration"
    with Memory.open(store_path, from_bytes(MASTER)):
        pass
    assert applied == [nxt]
    assert _version(store_path) == nxt


def test_a_version_1_store_gains_the_log(store_path: Path) -> None:
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        kept = memory.remember("written before the log existed", subject="a")
    # Turn it into the store schema 1 wrote: the same records, none of the later tables.
    fresh = apsw.Connection(":memory:")
    schema.MIGRATIONS[1](fresh)
    v1 = {name for (name,) in fresh.execute("SELECT name FROM sqlite_schema")}
    fresh.close()
    conn = apsw.Connection(str(store_path))
    later = [(kind, n) for kind, n in conn.execute("SELECT type, name FROM sqlite_schema") if n not in v1]
    assert ("table", "log_entries") in later
    for kind, name in later:
        if kind in ("table", "index"):
            conn.execute(f"DROP {kind.upper()} IF EXISTS {name}")
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert _version(store_path) == max(schema.MIGRATIONS)
        assert memory.backend.log_size() == 0
        assert memory.get(kept.id).text == "written before the log existed"
        memory.new_signing_key()
        memory.remember("written after", subject="a")
        assert memory.verify_log().ok


def test_failed_migration_leaves_the_old_version(store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Memory.open(store_path, from_bytes(MASTER), create=True).close()

    def broken(conn: apsw.Connection) -> None:
        conn.execute("CREATE TABLE half_done(x)")
        raise RuntimeError("disk on fire")

    current = max(schema.MIGRATIONS)
    monkeypatch.setitem(schema.MIGRATIONS, current + 1, broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        Memory.open(store_path, from_bytes(MASTER))
    assert _version(store_path) == current
    conn = apsw.Connection(str(store_path))
    assert conn.execute("SELECT count(*) FROM sqlite_schema WHERE name = 'half_done'").fetchall() == [(0,)]
    conn.close()


def test_newer_schema_is_refused_without_change(store_path: Path) -> None:
    Memory.open(store_path, from_bytes(MASTER), create=True).close()
    newer = max(schema.MIGRATIONS) + 1
    conn = apsw.Connection(str(store_path))
    conn.execute(f"PRAGMA user_version = {newer}")
    conn.close()
    with pytest.raises(SchemaVersionError, match=f"schema version {newer}"):
        Memory.open(store_path, from_bytes(MASTER))
    assert _version(store_path) == newer


def test_foreign_files_are_refused_untouched(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_bytes(b"hello " * 1000)
    with pytest.raises(NotADeleaturStoreError, match="not an SQLite database"):
        Memory.open(text, from_bytes(MASTER))
    with pytest.raises(NotADeleaturStoreError, match="not an SQLite database"):
        Memory.init(text, from_bytes(MASTER))  # it raised apsw's NotADBError
    assert text.read_bytes() == b"hello " * 1000
    foreign = tmp_path / "app.db"
    conn = apsw.Connection(str(foreign))
    conn.execute("CREATE TABLE users(name)")
    conn.close()
    with pytest.raises(NotADeleaturStoreError, match="not a deleatur store"):
        Memory.open(foreign, from_bytes(MASTER), create=True)
    with pytest.raises(StoreError, match="is a directory"):
        Memory.open(tmp_path, from_bytes(MASTER))


@pytest.mark.parametrize("name", ["mem.db", "mem.db.keys"])
def test_a_store_file_this_user_cannot_write_is_named(tmp_path: Path, name: str) -> None:
    """SQLite opens such a file read-only, and the first write (a read's audit entry)
    failed with apsw's ReadOnlyError, naming no file: the CLI said "internal error"."""
    store = tmp_path / "mem.db"
    with Memory.open(store, from_bytes(MASTER), create=True) as memory:
        memory.remember("x", subject="s")
    read_only = tmp_path / name
    # Root writes through any mode: for root the file is made immutable (binding root too).
    as_root = os.geteuid() == 0
    if as_root:
        subprocess.run(["chattr", "+i", str(read_only)], check=True)
    else:
        read_only.chmod(0o400)
    try:
        with pytest.raises(StoreError, match=f"{re.escape(str(read_only))} is read-only to this user"):
            Memory.open(store, from_bytes(MASTER))
    finally:
        if as_root:
            subprocess.run(["chattr", "-i", str(read_only)], check=True)
        else:
            read_only.chmod(0o600)
    with Memory.open(store, from_bytes(MASTER)) as memory:
        assert [r.text for r in memory.list()] == ["x"]


def test_key_store_of_another_store_is_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    Memory.open(a, from_bytes(MASTER), create=True).close()
    Memory.open(b, from_bytes(MASTER), create=True).close()
    (tmp_path / "b.db.keys").write_bytes((tmp_path / "a.db.keys").read_bytes())
    with pytest.raises(MasterKeyError, match="belongs to another store"):
        Memory.open(b, from_bytes(MASTER))


def _files_open_under(directory: Path) -> list[str]:
    """What this process holds open in ``directory`` (Linux: /proc/self/fd)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed meanwhile
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(f"{directory}{os.sep}"):
                found.append(target)
    return sorted(found)


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a database " * 300)


def _foreign(path: Path) -> None:
    path.unlink()
    conn = apsw.Connection(str(path))
    conn.execute("CREATE TABLE users(name)")
    conn.close()


def _newer(path: Path) -> None:
    conn = apsw.Connection(str(path))
    conn.execute(f"PRAGMA user_version = {max(schema.MIGRATIONS) + 1}")
    conn.close()


def _other_stores_keys(path: Path) -> None:
    other = path.with_name("other.db")
    Memory.open(other, from_bytes(MASTER), create=True).close()
    path.write_bytes(other.with_name("other.db.keys").read_bytes())
    for part in store_files(other):
        part.unlink()


def _other_stores_signing_key(path: Path) -> None:
    other = path.with_name("other.db")
    with Memory.open(other, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
    path.write_bytes(other.with_name("other.db.signing-key").read_bytes())
    for part in store_files(other):
        part.unlink()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
@pytest.mark.parametrize(
    ("part", "damage", "error"),
    [
        ("", _garbage, NotADeleaturStoreError),
        ("", _foreign, NotADeleaturStoreError),
        ("", _newer, SchemaVersionError),
        (".keys", Path.unlink, MasterKeyError),  # the store opens, its key store is missing
        (".keys", _garbage, NotADeleaturStoreError),
        (".keys", _foreign, NotADeleaturStoreError),
        (".keys", _other_stores_keys, MasterKeyError),
        (".keys", lambda path: (path.unlink(), path.mkdir()), StoreError),
        (".signing-key", _other_stores_signing_key, KeyStoreError),  # both open; the handle fails
        ("master", None, MasterKeyError),  # the wrong master key
    ],
)
def test_a_failed_open_leaves_no_file_open(
    tmp_path: Path, part: str, damage: Callable[[Path], object] | None, error: type[Exception]
) -> None:
    """Whichever file fails to open, or the handle that would use them both, every file
    opened before is closed: still while the error is held (a server logging it), not
    when the garbage collector gets to it."""
    store = tmp_path / "m.db"
    with Memory.open(store, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        memory.remember("a note", subject="Ann")
    if damage is not None:
        damage(store.with_name(store.name + part))
    master = from_bytes(bytes(32)) if part == "master" else from_bytes(MASTER)
    assert _files_open_under(tmp_path) == []
    with pytest.raises(error) as raised:
        Memory.open(store, master)
    assert _files_open_under(tmp_path) == [], raised.value


def test_init_refuses_to_overwrite_and_cleans_up_after_failure(tmp_path: Path) -> None:
    store = tmp_path / "m.db"
    Memory.init(store)[0].close()
    before = {p.name: p.read_bytes() for p in store_files(store)}
    with pytest.raises(StoreError, match="already exists"):
        Memory.init(store)
    assert {p.name: p.read_bytes() for p in store_files(store)} == before

    def failing_random(n: int) -> bytes:
        raise RuntimeError("injected failure")

    fresh = tmp_path / "fresh.db"
    # The first random bytes are asked for while the key store is being made, after
    # the database file exists: init must remove what it made.
    with pytest.raises(RuntimeError, match="injected failure"):
        Memory.init(fresh, from_bytes(MASTER), random=failing_random)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("fresh.db")] == []
    if Path("/proc/self/fd").is_dir():
        assert _files_open_under(tmp_path) == []  # removed, and closed: not held open unlinked


@pytest.mark.parametrize(
    "dies_in",
    [
        "deleatur.crypto.keystore:KeyStore.open",  # the store exists, its key store does not
        "deleatur.memory:Memory.new_signing_key",  # no signing key yet
        "deleatur.memory:Memory._announce_first_key",  # its key file written, not announced
    ],
)
def test_an_init_killed_part_way_is_finished_by_running_init_again(tmp_path: Path, dies_in: str) -> None:
    """Killed, an init cleans nothing up: what it made must neither block a new init nor
    give a store that writes with a signing key its log never announced."""
    module, attr = dies_in.split(":")
    owner, name = attr.split(".")
    script = f"""
import os, sys, importlib
sys.path.insert(0, {str(Path(__file__).parent.parent / "src")!r})
from deleatur import Memory
setattr(getattr(importlib.import_module({module!r}), {owner!r}), {name!r}, lambda *a, **k: os._exit(9))
Memory.init({str(tmp_path / "m.db")!r})
"""
    assert subprocess.run([sys.executable, "-c", script], check=False).returncode == 9
    memory, info = Memory.init(tmp_path / "m.db")
    with memory:
        assert info.master_key.endswith("m.db.master-key")
        memory.remember("after the crash", subject="a")
        report = memory.verify_log()
        assert report.ok, report
    with pytest.raises(StoreError, match="already exists"):
        Memory.init(tmp_path / "m.db")  # a store in use is never taken over


def test_an_init_killed_in_the_middle_of_a_transaction_on_the_new_store_is_finished_by_init(tmp_path: Path) -> None:
    """Killed inside SQLite's first transaction on the new file (as it turns on WAL),
    init leaves a hot rollback journal beside it. Finishing the init must roll it back:
    reading the file read-only, it met SQLite's refusal (ReadOnlyError, an internal error
    at every retry)."""
    store = tmp_path / "m.db"
    script = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).parent.parent / "src")!r})
import apsw
from deleatur import Memory
from deleatur.store import sqlite

def killed_mid_transaction(path, *args, **kwargs):
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA cache_size = 1")  # pages spill into the file before the commit
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("CREATE TABLE t(x)")
    conn.executemany("INSERT INTO t VALUES (randomblob(3000))", [()] * 50)
    os._exit(9)

sqlite.SQLiteBackend.open = killed_mid_transaction
Memory.init({str(store)!r})
"""
    assert subprocess.run([sys.executable, "-c", script], check=False).returncode == 9
    journal = store.with_name("m.db-journal")
    assert journal.stat().st_size > 0 and store.stat().st_size > 4096  # a hot journal, a changed file
    memory, _ = Memory.init(store)
    with memory:
        memory.remember("after the crash", subject="a")
        assert memory.verify_log().ok
    assert not journal.exists()


@pytest.mark.parametrize(
    "paused_in",
    [
        "deleatur.store.sqlite:SQLiteBackend.open",  # its master key written, the store not set up
        "deleatur.crypto.keystore:KeyStore.open",  # the store set up, its key store not
        "deleatur.memory:Memory.new_signing_key",  # no signing key yet
        "deleatur.memory:Memory._announce_first_key",  # its key file written, not announced
    ],
)
def test_an_init_under_way_refuses_another_and_its_store_stays_whole(tmp_path: Path, paused_in: str) -> None:
    """A second init while one runs took the first one's files, half made, for a killed
    init's: it finished them as its own (two signing keys, one unannounced), or removed
    them as it failed, leaving no store, or one without its master key."""
    first = start_paused(paused_in, f"from deleatur import Memory; Memory.init({str(tmp_path / 'm.db')!r})[0].close()")
    try:
        made = {p.name: p.read_bytes() for p in store_files(tmp_path / "m.db")}
        with pytest.raises(StoreError, match="another init is creating"):
            Memory.init(tmp_path / "m.db")
        with pytest.raises(StoreError, match="another init is creating"):
            Memory.init(tmp_path / "m.db", from_bytes(MASTER))
        assert {p.name: p.read_bytes() for p in store_files(tmp_path / "m.db")} == made
    finally:
        assert resume(first)[0] == 0
    with Memory.open(tmp_path / "m.db", from_file(tmp_path / "m.db.master-key")) as memory:
        assert len(memory.signing_keys()) == 1
        memory.remember("a note", subject="Ann")
        report = memory.verify_log()
        assert report.ok, report
    with pytest.raises(StoreError, match="already exists"):
        Memory.init(tmp_path / "m.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.db", "m.db.keys", "m.db.master-key", "m.db.signing-key"]


def test_an_init_refused_while_another_runs_exits_2_from_the_cli(tmp_path: Path) -> None:
    store = tmp_path / "m.db"
    init = f"from deleatur import Memory; Memory.init({str(store)!r})[0].close()"
    first = start_paused("deleatur.memory:Memory.new_signing_key", init)
    try:
        cli = f"import sys; sys.path.insert(0, {SRC!r}); from deleatur.cli.app import main; main()"
        second = subprocess.run(
            [sys.executable, "-c", cli, "--store", str(store), "init"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (second.returncode, second.stdout) == (2, "")
        assert second.stderr == f"error: another init is creating {store}; nothing was changed\n"
    finally:
        assert resume(first)[0] == 0


def _init(store: Path) -> str:
    try:
        Memory.init(store)[0].close()
    except StoreError as exc:
        return f"refused: {exc.message}"
    return "ok"


def test_inits_started_together_make_one_store_and_refuse_the_rest(tmp_path: Path) -> None:
    """Processes let go at once (not deterministic: the test above pins each interleaving)."""
    for round in range(4):
        store = tmp_path / f"m{round}.db"
        outcomes = run_together([functools.partial(_init, store)] * 6)
        assert outcomes[0] == "ok" and all(o.startswith("refused") for o in outcomes[1:]), outcomes
        assert all("another init is creating" in o or "already exists" in o for o in outcomes[1:]), outcomes
        with Memory.open(store, from_file(store.with_name(store.name + ".master-key"))) as memory:
            memory.remember("a note", subject="Ann")
            assert memory.verify_log().ok


def test_a_failed_init_removes_only_the_files_it_made(tmp_path: Path) -> None:
    """A signing key file without its store is not init's to take or to remove."""
    store = tmp_path / "m.db"
    Memory.init(store)[0].close()
    for part in ("", ".keys"):
        store.with_name(store.name + part).unlink()
    kept = {p.name: p.read_bytes() for p in store_files(store)}
    assert sorted(kept) == ["m.db.master-key", "m.db.signing-key"]
    with pytest.raises(StoreError, match=r"m\.db\.signing-key exists but its store"):
        Memory.init(store)
    assert {p.name: p.read_bytes() for p in store_files(store)} == kept


def _random_failing_after(calls: int, meanwhile: Callable[[], object] = lambda: None) -> Callable[[int], bytes]:
    """Random bytes for the first ``calls`` asks, then, once ``meanwhile`` ran, a failure.
    An init asks first for its master key, then while it makes the key store."""
    asked = 0

    def random(n: int) -> bytes:
        nonlocal asked
        asked += 1
        if asked > calls:
            meanwhile()
            raise RuntimeError("injected failure")
        return os.urandom(n)

    return random


def test_a_failed_init_leaves_alone_the_files_beside_those_it_made(tmp_path: Path) -> None:
    """It removed the -wal, -shm and -journal beside every file it made, the master key
    file's too (no database has them), and a file another process had put in the place
    of one it made (by its path alone)."""
    key_file = tmp_path / "m.key"
    others = {key_file.with_name(key_file.name + part): f"another's {part}" for part in ("-wal", "-shm", "-journal")}
    for path, text in others.items():
        path.write_text(text)
    with pytest.raises(RuntimeError, match="injected failure"):
        Memory.init(tmp_path / "m.db", key_file=key_file, random=_random_failing_after(1))
    assert {p: p.read_text() for p in tmp_path.iterdir()} == others

    def put_another_key_file() -> None:
        key_file.unlink()
        key_file.write_text("another's key\n")

    with pytest.raises(RuntimeError, match="injected failure"):
        Memory.init(tmp_path / "m.db", key_file=key_file, random=_random_failing_after(1, put_another_key_file))
    assert {p: p.read_text() for p in tmp_path.iterdir()} == {**others, key_file: "another's key\n"}


def test_a_failed_run_removes_the_rest_of_a_databases_files_when_one_cannot_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database's files were removed in one loop under one suppress(OSError): the
    first that could not be removed kept those after it from going."""
    database = tmp_path / "m.db"
    for part in sidecar_files(database):
        part.write_text("made by the run")
    unlink = Path.unlink

    def unlink_refusing_the_wal(path: Path, missing_ok: bool = False) -> None:
        if path.name.endswith("-wal"):
            raise PermissionError(f"cannot remove {path}")
        unlink(path, missing_ok=missing_ok)

    def run() -> None:
        with Made() as made:
            made.add(database, database.stat(), database=True)
            raise RuntimeError("the run failed")

    monkeypatch.setattr(Path, "unlink", unlink_refusing_the_wal)
    with pytest.raises(RuntimeError, match="the run failed"):
        run()
    assert [p.name for p in tmp_path.iterdir()] == ["m.db-wal"]


def test_init_refuses_the_files_a_removed_store_left_to_a_process_that_has_it_open(tmp_path: Path) -> None:
    """A store removed while a process has it open leaves its -wal and -shm: SQLite took
    them up for the new store (pages of another database, a shared-memory index another
    process uses), and a failed init removed them."""
    store = tmp_path / "m.db"
    script = f"""
import sqlite3, sys
conn = sqlite3.connect({str(store)!r}, isolation_level=None)
conn.execute("PRAGMA journal_mode = WAL")
conn.execute("CREATE TABLE t(x)")
conn.execute("INSERT INTO t VALUES (1)")
print("open", flush=True)
sys.stdin.readline()
conn.execute("INSERT INTO t VALUES (2)")
print(conn.execute("SELECT count(*) FROM t").fetchone()[0])
"""
    other = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "open\n"
        store.unlink()
        left = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
        assert sorted(left) == ["m.db-shm", "m.db-wal"]
        with pytest.raises(StoreError) as raised:
            Memory.init(store)
        assert raised.value.message.startswith(f"{store}-wal exists but its store {store} does not: ")
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == left
    finally:
        out, _ = other.communicate("\n", timeout=120)
    assert (other.returncode, out) == (0, "2\n")


def test_init_where_no_file_can_be_made_names_the_directory_and_leaves_nothing(
    tmp_path: Path, make_unwritable: Callable[[Path], str], cli: Cli
) -> None:
    """It named a file the user never did (the lock, or the master key's temporary
    file), or, finding a killed init's lock file in a directory made read-only since,
    failed with an OS error (exit 1) as it could not remove it."""
    locked, free = tmp_path / "locked", tmp_path / "free"
    locked.mkdir()
    free.mkdir()
    (locked / "m.db.init-lock").touch()  # a killed init's
    problem = f"cannot create files in directory {locked}: {make_unwritable(locked)}"
    for store, master, key_file in [
        (locked / "m.db", None, None),
        (locked / "n.db", from_bytes(MASTER), None),
        (free / "m.db", None, locked / "m.key"),
    ]:
        with pytest.raises(StoreError) as raised:
            Memory.init(store, master, key_file=key_file)
        assert raised.value.message == problem, store
    assert cli("--store", str(locked / "n.db"), "init") == (2, "", f"error: {problem}\n")
    assert [p.name for p in locked.iterdir()] == ["m.db.init-lock"]
    assert list(free.iterdir()) == []


def test_init_with_a_missing_directory_names_it_and_leaves_nothing(tmp_path: Path, cli: Cli) -> None:
    """The directory of a master key file was not checked: the error named its temporary file."""
    missing, a_file = tmp_path / "missing", tmp_path / "a-file"
    a_file.write_text("x")
    for store, key_file, error in [
        (missing / "m.db", None, NotFoundError(f"directory {missing} does not exist")),
        (tmp_path / "m.db", missing / "m.key", NotFoundError(f"directory {missing} does not exist")),
        (tmp_path / "m.db", a_file / "m.key", StoreError(f"{a_file} is not a directory")),
    ]:
        with pytest.raises(type(error)) as raised:
            Memory.init(store, key_file=key_file)
        assert raised.value.message == error.message
    code_out_err = cli("--store", str(tmp_path / "m.db"), "--master-key-file", str(missing / "m.key"), "init")
    assert code_out_err == (2, "", f"error: directory {missing} does not exist\n")
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_without_fcntl_deleatur_imports_and_init_locks_with_a_file_made_exclusively(tmp_path: Path) -> None:
    """Windows has no fcntl, and `import deleatur` failed there for want of it."""
    store, other = tmp_path / "m.db", tmp_path / "n.db"
    lock = other.with_name(other.name + ".init-lock")
    script = f"""
import sys
sys.modules["fcntl"] = None  # importing it raises ImportError, as on Windows
sys.path.insert(0, {SRC!r})
import deleatur.cli.app
from deleatur import Memory, StoreError
Memory.init({str(store)!r})[0].close()
open({str(lock)!r}, "x").close()  # a killed init's
try:
    Memory.init({str(other)!r})
except StoreError as exc:
    print(exc.message)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == (
        f"another init is creating {other}, or one was killed: if none is running, remove {lock}; nothing was changed\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "m.db",
        "m.db.keys",
        "m.db.master-key",
        "m.db.signing-key",
        "n.db.init-lock",
    ]
    with Memory.open(store, from_file(tmp_path / "m.db.master-key")) as memory:
        memory.remember("a note", subject="Ann")
        assert memory.verify_log().ok


def test_init_never_makes_a_new_key_store_for_a_store_in_use(tmp_path: Path) -> None:
    """Its key store moved or unmounted, a used store must not get a new, empty one: every
    record would then read as crypto-shredded."""
    memory, _ = Memory.init(tmp_path / "m.db")
    with memory:
        memory.remember("kept", subject="a")
    keys = tmp_path / "m.db.keys"
    keys.rename(tmp_path / "elsewhere.keys")
    with pytest.raises(MasterKeyError, match="is missing"):
        Memory.init(tmp_path / "m.db")
    assert not keys.exists()
    (tmp_path / "elsewhere.keys").rename(keys)
    with Memory.open(tmp_path / "m.db", from_file(tmp_path / "m.db.master-key")) as memory:
        assert [r.text for r in memory.list()] == ["kept"]


def test_a_v11_store_forgets_what_older_releases_kept_of_erased_accounts(store_path: Path) -> None:
    """v12: API keys scoped to an account erased before it kept the user id in clear, and
    spent or pending confirmation tokens kept plain hashes of their plans. Opening the
    store keeps those scopes by reference (with the same reach) and drops the tokens."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        scoped, _ = memory.create_principal("app", Role.MEMBER, scopes=["cust_qzold", "u2"])
        memory.remember("a note", subject="Ann", space=Space("cust_qzold"))
        memory.erase_all(user_id="cust_qzold", request_id="ACC-OLD", basis="Art. 17(1)(a)", requester="dpo")
        memory.erase_all(user_id="u2", agent_id="a", request_id="ACC-PART", basis="Art. 17(1)(a)", requester="dpo")
        memory.remember("Bo's note", subject="Bo")
        token = memory.erase("Bo", request_id="D", basis="b", requester="r", dry_run=True, issue_token=True).token
    _as_v11_left_it(store_path, {scoped.id: ["cust_qzold", "u2"]})
    assert b"cust_qzold" in b"".join(p.read_bytes() for p in store_files(store_path))
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        (scopes,) = [p.scopes for p in memory.principals() if p.id == scoped.id]
        assert scopes is not None and "u2" in scopes and len(scopes) == 2  # a partial erasure ends no account
        view = memory.as_principal(next(p for p in memory.principals() if p.id == scoped.id))
        assert view.erasure_request("ACC-OLD").status.value == "complete"
        with pytest.raises(ConfirmationRequiredError, match="unknown confirmation token"):
            memory.erase("Bo", request_id="E", basis="b", requester="r", require_confirmation=True, confirmation=token)
    assert _version(store_path) == max(schema.MIGRATIONS)
    assert b"cust_qzold" not in b"".join(p.read_bytes() for p in store_files(store_path))


def test_a_v12_store_keeps_listing_its_requests_in_the_order_it_did(store_path: Path) -> None:
    """v13 lists erasure requests in the order they were recorded, by a number each one
    takes under the write lock; v12 listed them by (received_at, id). A v12 store's
    requests are numbered in v12's order, each tenant's apart, so a cursor taken before
    the upgrade goes on where it was, and a request recorded after comes after them all."""
    clock = FakeClock()
    with Memory.open(store_path, from_bytes(MASTER), clock=clock, create=True) as memory:
        memory.new_signing_key()
        acme_admin, _ = memory.create_principal("acme", Role.ADMIN, tenant="acme")
        acme = memory.as_principal(acme_admin)
        for request_id in ("V12-B", "V12-A"):  # received at the same time: v12 ordered them by id
            memory.erase("Nobody", request_id=request_id, basis="Art. 17(1)(a)", requester="dpo")
        acme.erase("Nobody", request_id="ACME-1", basis="Art. 17(1)(a)", requester="dpo")
        clock.advance(60)
        memory.erase("Nobody", request_id="V12-C", basis="Art. 17(1)(a)", requester="dpo")
        clock.advance(-3600)  # a clock set back: received before the others, recorded after
        memory.erase("Nobody", request_id="V12-0", basis="Art. 17(1)(a)", requester="dpo")
    conn = apsw.Connection(str(store_path))
    _undo_v13(conn)
    conn.execute("PRAGMA user_version = 12")
    conn.close()
    with Memory.open(store_path, from_bytes(MASTER), clock=clock) as memory:
        assert _version(store_path) == max(schema.MIGRATIONS)
        assert [r.id for r in memory.erasure_requests()] == ["V12-0", "V12-A", "V12-B", "V12-C"]
        assert [r.id for r in memory.erasure_requests(after="V12-A", limit=1)] == ["V12-B"]
        clock.advance(-3600)
        memory.erase("Nobody", request_id="V13-1", basis="Art. 17(1)(a)", requester="dpo")
        assert [r.id for r in memory.erasure_requests(after="V12-B")] == ["V12-C", "V13-1"]
        acme = memory.as_principal(acme_admin)
        acme.erase("Nobody", request_id="ACME-2", basis="Art. 17(1)(a)", requester="dpo")
        assert [r.id for r in acme.erasure_requests()] == ["ACME-1", "ACME-2"]
    conn = apsw.Connection(str(store_path))
    assert conn.execute("SELECT name FROM sqlite_schema WHERE name = 'erasure_requests_received'").fetchall() == []
    conn.close()


def test_requests_an_older_release_writes_beside_the_upgrade_stay_listed(store_path: Path) -> None:
    """A v12 process still running after another one upgraded the store writes requests
    without a number, and its INSERT OR REPLACE drops the number of the row it replaces:
    numbered at the end of the list, every request stays reachable page by page."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        for request_id in ("R-1", "R-2", "R-3"):
            memory.erase("Nobody", request_id=request_id, basis="Art. 17(1)(a)", requester="dpo")
    conn = apsw.Connection(str(store_path))
    v12_columns = [c for (c,) in conn.execute("SELECT name FROM pragma_table_info('erasure_requests')") if c != "seq"]
    listed = ", ".join(v12_columns)
    for source, new_id in (("R-1", "OLD-NEW"), ("R-2", "R-2")):  # a new request, and a settle's rewrite
        conn.execute(
            f"INSERT OR REPLACE INTO erasure_requests({listed})"
            f" SELECT {listed.replace('id, ', '? AS id, ', 1)} FROM erasure_requests WHERE id = ?",
            (new_id, source),
        )
    assert conn.execute("SELECT count(*) FROM erasure_requests WHERE seq IS NULL").fetchall() == [(0,)]
    conn.close()
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert [r.id for r in memory.erasure_requests()] == ["R-1", "R-3", "OLD-NEW", "R-2"]
        paged, after = [], None
        while page := memory.erasure_requests(limit=1, after=after):
            paged.append(page[0].id)
            after = page[0].id
        assert paged == ["R-1", "R-3", "OLD-NEW", "R-2"]


def test_a_limited_erasure_from_before_v14_still_verifies_against_its_store(store_path: Path) -> None:
    """v14 keeps the key of a limited erasure's scope, for the certificate's absence check;
    a request recorded before has none. Its certificate verifies against the store (read,
    not upgraded, or upgraded), checking the erased ids, and says what it could not check."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        memory.remember("n1", subject="N", space=Space("u1"))
        memory.remember("n3", subject="N", space=Space("u2"))
        memory.erase("N", request_id="OLD-S", basis="Art. 17(1)(a)", requester="t", scope=SpaceFilter("u1"))
        cert = memory.certificate("OLD-S")
    conn = apsw.Connection(str(store_path))
    _undo_v14(conn)
    conn.execute("PRAGMA user_version = 13")
    conn.close()
    for upgraded in (False, True):
        if upgraded:
            Memory.open(store_path, from_bytes(MASTER)).close()
        assert _version(store_path) == (max(schema.MIGRATIONS) if upgraded else 13)
        with StoreEvidence(store_path) as evidence:
            report = verify_certificate(cert, store=evidence)
        assert report.ok, report.lines()
        assert "could not be placed in or out of the erasure's scope" in report.checks[-1].detail
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert memory.erasure_request("OLD-S").scope_key is None
        memory.remember("n4", subject="M", space=Space("u1"))
        memory.erase("M", request_id="NEW-S", basis="Art. 17(1)(a)", requester="t", scope=SpaceFilter("u1"))
        assert memory.erasure_request("NEW-S").scope_key is not None


def test_tokens_issued_before_v15_confirm_nothing(store_path: Path) -> None:
    """v15 binds a token to its dry run's basis and requester. A token issued before has
    neither: the upgrade drops it (unknown), and one an older release still running
    writes after the upgrade, with no terms, confirms no erasure. A dry run issues another."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        bo = memory.remember("Bo's note", subject="Bo")
        before, beside = (
            memory.erase("Bo", request_id="D", basis="b", requester="r", dry_run=True, issue_token=True).token
            for _ in range(2)
        )
        assert before is not None and beside is not None
    conn = apsw.Connection(str(store_path))
    (row,) = conn.execute(
        "SELECT token_hash, tenant, plan_digest, expires_at FROM erasure_confirmations WHERE token_hash = ?",
        (engine._token_hash(beside),),
    ).fetchall()
    _undo_v15(conn)
    conn.execute("PRAGMA user_version = 14")
    conn.close()
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert _version(store_path) == max(schema.MIGRATIONS)
        erase = functools.partial(memory.erase, "Bo", basis="b", requester="r", require_confirmation=True)
        with pytest.raises(ConfirmationRequiredError, match="unknown confirmation token"):
            erase(request_id="E", confirmation=before)
        # As a v14 process writes a token: without the column it does not know.
        old_insert = (
            "INSERT INTO erasure_confirmations(token_hash, tenant, plan_digest, expires_at) VALUES (?, ?, ?, ?)"
        )
        memory.backend._conn.execute(old_insert, row)  # type: ignore[attr-defined]
        with pytest.raises(ConfirmationRequiredError, match="another legal basis or requester"):
            erase(request_id="E", confirmation=beside)
        token = memory.erase("Bo", request_id="D", basis="b", requester="r", dry_run=True, issue_token=True).token
        assert erase(request_id="E", confirmation=token).request.record_ids == (bo.id,)  # type: ignore[union-attr]


def _as_v11_left_it(store_path: Path, scopes: dict[str, list[str]]) -> None:
    """Make the store what a release before v12 left: the API keys scoped to accounts it
    erased still name them (``scopes``: principal id to its scopes)."""
    conn = apsw.Connection(str(store_path))
    conn.executemany("UPDATE principals SET scopes = ? WHERE id = ?", [(json.dumps(s), i) for i, s in scopes.items()])
    _undo_v13(conn)
    conn.execute("PRAGMA user_version = 11")
    conn.close()


def _erased_accounts_in_two_tenants(store_path: Path) -> tuple[Principal, Principal, Principal, list[str]]:
    """A v11 store whose keys are scoped to an account erased in each of two tenants: the
    default tenant's key, acme's admin and its key, and the tokens of the two users."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        app, _ = memory.create_principal("app", Role.MEMBER, scopes=["cust_qzold", "u2"])
        acme_admin, _ = memory.create_principal("acme", Role.ADMIN, tenant="acme")
        acme = memory.as_principal(acme_admin)
        bot, _ = acme.create_principal("bot", Role.AGENT, scopes=["cust_acmeold"])
        memory.remember("a note", subject="Ann", space=Space("cust_qzold"))
        memory.erase_all(user_id="cust_qzold", request_id="ACC-1", basis="Art. 17(1)(a)", requester="dpo")
        acme.erase_all(user_id="cust_acmeold", request_id="ACC-2", basis="Art. 17(1)(a)", requester="dpo")
        tokens = [memory._user_token("cust_qzold"), acme._user_token("cust_acmeold")]
    _as_v11_left_it(store_path, {app.id: ["cust_qzold", "u2"], bot.id: ["cust_acmeold"]})
    return app, acme_admin, bot, tokens


def test_the_v12_rescope_is_logged_as_the_systems_change(store_path: Path) -> None:
    """Every change to a principal's scopes is in the log; the upgrade's rewrite of the
    scopes of erased accounts too: a call entry per tenant whose actor is the system (no
    person made it), naming the principals changed and the users by token only, covered
    by a checkpoint, after which no byte of the store names the users."""
    app, acme_admin, bot, (qzold, acmeold) = _erased_accounts_in_two_tenants(store_path)
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        size, checkpoint = memory.backend.log_size(), memory.backend.checkpoint()
        assert checkpoint is not None and checkpoint[0] == size  # signed with the rewrite
        acme = memory.as_principal(acme_admin)
        [ours] = memory.audit_entries(actor=SYSTEM)
        [theirs] = acme.audit_entries(actor=SYSTEM)
        for shown, tenant, principal, user in ((ours, "default", app, qzold), (theirs, "acme", bot, acmeold)):
            entry = shown.entry
            assert shown.index < size and entry.type is EventType.CALL
            assert {k: v for k, v in entry.fields.items() if k != "request"} == {
                "action": "principal.rescope",
                "actor": "system",
                "role": "system",
                "tenant": tenant,
                "outcome": "ok",
                "users": [user],
                "principals": [principal.id],
                "upgrade": 12,
            }
        assert memory.verify_log().ok
        assert memory.verify_audit().ok
    with Memory.open(store_path, from_bytes(MASTER)) as memory:  # once: the store is unmarked
        assert len(list(memory.audit_entries(actor=SYSTEM))) == 1
    files = b"".join(p.read_bytes() for p in store_files(store_path))
    assert b"cust_qzold" not in files and b"cust_acmeold" not in files


def test_the_v12_rescope_and_its_entry_commit_together(store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewrite whose entry cannot be appended is not made: the next open makes both."""
    app, *_ = _erased_accounts_in_two_tenants(store_path)

    def failing(log: TransparencyLog, events: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(TransparencyLog, "append", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        Memory.open(store_path, from_bytes(MASTER))
    monkeypatch.undo()
    conn = apsw.Connection(str(store_path))
    assert conn.execute("SELECT scopes FROM principals WHERE id = ?", (app.id,)).fetchall() == [
        ('["cust_qzold", "u2"]',)
    ]
    conn.close()
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert [a.entry.fields["principals"] for a in memory.audit_entries(actor=SYSTEM)] == [[app.id]]
        assert memory.verify_log().ok


def test_the_v12_rescope_does_not_wait_for_a_missing_signing_key(store_path: Path) -> None:
    """Like a read's audit entry: the store opens (its key may be on its way back), the
    scopes stop naming the erased user at once, and the entry is covered once it is back."""
    app, *_ = _erased_accounts_in_two_tenants(store_path)
    key = store_path.with_name(store_path.name + ".signing-key")
    key.rename(key.with_name("away"))
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert [a.entry.fields["principals"] for a in memory.audit_entries(actor=SYSTEM)] == [[app.id]]
        assert not memory.verify_log().ok  # uncovered until the key returns
    assert b"cust_qzold" not in b"".join(p.read_bytes() for p in store_files(store_path))
    key.with_name("away").rename(key)
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        memory.remember("a later write", subject="a")
        assert memory.verify_log().ok


def test_requests_from_before_v9_stay_the_whole_tenants(store_path: Path) -> None:
    """v9 records which users an erasure reached; an older request says nothing, so a
    key scoped to a user may not read it (as before), while an admin still may."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        memory.remember("x", subject="a", space=Space("u1"))
        memory.erase("a", request_id="OLD-1", basis="Art. 17(1)(a)", requester="t", scope=SpaceFilter("u1"))
        principal, _ = memory.create_principal("scoped", Role.VIEWER, scopes=["u1"])
    conn = apsw.Connection(str(store_path))
    _undo_v13(conn)
    conn.execute("ALTER TABLE erasure_requests DROP COLUMN users")
    conn.execute("DROP TABLE lineage_stubs")  # v11's
    conn.execute("PRAGMA user_version = 8")
    conn.close()
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert _version(store_path) == max(schema.MIGRATIONS)
        assert memory.erasure_request("OLD-1").users is None
        with pytest.raises(AccessDeniedError) as denied:
            memory.as_principal(principal).erasure_request("OLD-1")
        assert denied.value.missing == "scope"
        memory.remember("y", subject="b", space=Space("u1"))
        memory.erase("b", request_id="NEW-1", basis="Art. 17(1)(a)", requester="t", scope=SpaceFilter("u1"))
        assert memory.as_principal(principal).erasure_request("NEW-1").status.value == "complete"


def test_a_v9_index_of_words_is_rebuilt_of_keyed_hashes_on_open(store_path: Path) -> None:
    """Before v10 the full-text index held the words (with their space's token). Opening
    such a store with its master key rebuilds the index, every tenant's, of hashes; the
    words are then in no byte of the store's files and recall finds the same records."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        alice = memory.remember("Alice drinks quokkaberry tea", subject="Alice", space=Space("u1"))
        memory.remember("retired quokkaberry note", subject="a")
        memory.forget(record_id=memory.remember("gone quokkaberry", subject="b").id)
        acme, _ = memory.create_principal("acme", Role.ADMIN, tenant="acme")
        other = memory.as_principal(acme).remember("Acme's quokkaberry jam", subject="Jam")
        old_index = []  # as v9 indexed a record: each word prefixed with its space's token
        for rowid, row in memory.backend.indexed_rows():
            view = memory._in_tenant(row.tenant)
            words = re.findall(r"[^\W_]+", view._decrypt(row).text)
            old_index.append((rowid, " ".join(view._scope_token(row.space) + word for word in words)))
    conn = apsw.Connection(str(store_path))
    conn.execute("PRAGMA secure_delete = ON")
    conn.execute("INSERT INTO ft(ft) VALUES ('delete-all')")
    conn.executemany("INSERT INTO ft(rowid, body) VALUES (?, ?)", old_index)
    _undo_v13(conn)
    conn.execute("DROP TABLE lineage_stubs")  # v11's
    conn.execute("PRAGMA user_version = 9")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert b"quokkaberry" in b"".join(p.read_bytes() for p in store_files(store_path))  # the old index
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        assert _version(store_path) == max(schema.MIGRATIONS)
        assert not memory.backend.index_holds_words()
        assert [h.record.id for h in memory.recall("QUOKKABERRY", space=Space("u1"))] == [alice.id]
        assert [h.record.id for h in memory.recall("quokkaberry")] != []
        assert [h.record.id for h in memory.as_principal(acme).recall("quokkaberry")] == [other.id]
    assert b"quokkaberry" not in b"".join(p.read_bytes() for p in store_files(store_path)).lower()
