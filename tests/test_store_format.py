"""The store file: ownership marks, schema versions and migrations, init."""

from __future__ import annotations

import contextlib
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
    Role,
    SchemaVersionError,
    Space,
    SpaceFilter,
    StoreError,
    from_bytes,
    from_file,
)
from deleatur.erasure.engine import ConfirmationRequiredError
from deleatur.store import schema

from .conftest import MASTER, store_files


def _version(path: Path) -> int:
    conn = apsw.Connection(str(path))
    try:
        value = conn.execute("PRAGMA user_version").fetchall()[0][0]
        assert isinstance(value, int)
        return value
    finally:
        conn.close()


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
    assert text.read_bytes() == b"hello " * 1000
    foreign = tmp_path / "app.db"
    conn = apsw.Connection(str(foreign))
    conn.execute("CREATE TABLE users(name)")
    conn.close()
    with pytest.raises(NotADeleaturStoreError, match="not a deleatur store"):
        Memory.open(foreign, from_bytes(MASTER), create=True)
    with pytest.raises(StoreError, match="is a directory"):
        Memory.open(tmp_path, from_bytes(MASTER))


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
    conn = apsw.Connection(str(store_path))  # as the older release left it
    conn.execute("UPDATE principals SET scopes = ? WHERE id = ?", ('["cust_qzold", "u2"]', scoped.id))
    conn.execute("PRAGMA user_version = 11")
    conn.close()
    assert b"cust_qzold" in b"".join(p.read_bytes() for p in store_files(store_path))
    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        (scopes,) = [p.scopes for p in memory.principals() if p.id == scoped.id]
        assert scopes is not None and "u2" in scopes and len(scopes) == 2  # a partial erasure ends no account
        view = memory.as_principal(next(p for p in memory.principals() if p.id == scoped.id))
        assert view.erasure_request("ACC-OLD").status.value == "complete"
        with pytest.raises(ConfirmationRequiredError, match="unknown confirmation token"):
            memory.erase("Bo", request_id="E", basis="b", requester="r", require_confirmation=True, confirmation=token)
    assert _version(store_path) == 12
    assert b"cust_qzold" not in b"".join(p.read_bytes() for p in store_files(store_path))


def test_requests_from_before_v9_stay_the_whole_tenants(store_path: Path) -> None:
    """v9 records which users an erasure reached; an older request says nothing, so a
    key scoped to a user may not read it (as before), while an admin still may."""
    with Memory.open(store_path, from_bytes(MASTER), create=True) as memory:
        memory.new_signing_key()
        memory.remember("x", subject="a", space=Space("u1"))
        memory.erase("a", request_id="OLD-1", basis="Art. 17(1)(a)", requester="t", scope=SpaceFilter("u1"))
        principal, _ = memory.create_principal("scoped", Role.VIEWER, scopes=["u1"])
    conn = apsw.Connection(str(store_path))
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
