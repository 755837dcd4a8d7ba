"""The master key, per-subject data keys and crypto-shredding."""

from __future__ import annotations

import errno
import functools
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deleatur import (
    DataKeyDestroyedError,
    ExposedKeyFileError,
    IntegrityError,
    MasterKeyError,
    Memory,
    StoreError,
    Witness,
    from_bytes,
    from_file,
    from_hex,
    from_passphrase,
)
from deleatur.crypto.master import default_key_file
from deleatur.crypto.signing import signing_key_path, write_text_secret
from deleatur.memory import keystore_path

from .conftest import MASTER, resume, run_together, start_paused, store_files


def test_init_writes_a_0600_key_file_outside_the_database(tmp_path: Path) -> None:
    store = tmp_path / "m.db"
    memory, info = Memory.init(store)
    memory.remember("hello", subject="a")
    memory.close()
    key_file = tmp_path / "m.db.master-key"
    assert info.master_key == str(key_file)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = bytes.fromhex(key_file.read_text())
    for path in store_files(store):
        if path != key_file:
            assert key not in path.read_bytes(), path
    with Memory.open(store, from_file(key_file)) as again:
        assert [r.text for r in again.list()] == ["hello"]


def _fsync_refusing_directories(fd: int, fsync: Callable[[int], None] = os.fsync) -> None:
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    fsync(fd)


def _open_refusing_directories(path: Any, flags: int, *args: Any, open: Any = os.open, **kwargs: Any) -> int:
    if kwargs.get("dir_fd") is None and os.path.isdir(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    return int(open(path, flags, *args, **kwargs))


@pytest.mark.parametrize("system", ["fsync of a directory refused", "no directory opened, as on Windows"])
def test_init_goes_on_where_the_directory_cannot_be_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, system: str
) -> None:
    """A secret's directory was synced once the secret was placed, outside any cleanup:
    where the system refused it (EINVAL from a file system; EACCES opening a directory
    on Windows), init failed with a bare OSError naming no file, left the master key
    file its cleanup never learned of, and a second init refused, finding it there. The
    sync is for the new name's durability alone, where the system allows it: the file,
    synced already, stays placed and init goes on."""
    if system.startswith("fsync"):
        monkeypatch.setattr(os, "fsync", _fsync_refusing_directories)
    else:
        monkeypatch.delattr(os, "O_DIRECTORY")
        monkeypatch.delattr(os, "O_TMPFILE", raising=False)
        monkeypatch.setattr(os, "open", _open_refusing_directories)
    store = tmp_path / "m.db"
    memory, info = Memory.init(store)
    memory.remember("hello", subject="a")
    memory.close()
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.db", "m.db.keys", "m.db.master-key", "m.db.signing-key"]
    with Memory.open(store, from_file(info.master_key)) as again:
        assert [r.text for r in again.list()] == ["hello"]
        assert again.verify_log().ok


def test_of_two_secrets_written_to_one_path_the_first_placed_stays_whole(tmp_path: Path) -> None:
    """They shared one temporary file: the second writer removed the first one's and made
    its own under the same name, which the first then linked into place (the second's
    secret, where the first believed its own was), and the second failed on a temporary
    file gone (FileNotFoundError), not on the secret in place."""
    secret = tmp_path / "secret"
    write = f"""
from pathlib import Path
from deleatur.crypto.signing import write_text_secret
try:
    write_text_secret(Path({str(secret)!r}), sys.argv[1])
    print("placed")
except FileExistsError as exc:
    print("refused:", exc.filename)
"""
    first = start_paused("os:link", write, "the first secret")
    second = start_paused("os:link", write, "the second secret")
    assert resume(first) == (0, "placed\n", "")
    assert resume(second) == (0, f"refused: {secret}\n", "")
    assert secret.read_text() == "the first secret\n"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert list(tmp_path.iterdir()) == [secret]


def _write_secret(path: Path, text: str) -> str:
    try:
        write_text_secret(path, text)
    except FileExistsError:
        return "refused"
    return text


def test_secrets_written_to_one_path_together_place_one_whole_and_refuse_the_rest(tmp_path: Path) -> None:
    for round in range(4):
        secret = tmp_path / f"secret{round}"
        texts = [f"{i:x}" * 100_000 for i in range(6)]
        outcomes = run_together([functools.partial(_write_secret, secret, text) for text in texts])
        assert outcomes.count("refused") == 5, [o[:20] for o in outcomes]
        assert secret.read_text() == next(o for o in outcomes if o != "refused") + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"secret{round}" for round in range(4)]


# A writer killed once its secret is written, before it is placed: every call that
# would place it ends the process there, as a kill would.
_KILLED_BEFORE_PLACING = """
import errno, os, sys
from pathlib import Path
from deleatur.crypto.signing import write_text_secret
{without_unnamed_files}
os.link = lambda *args, **kwargs: os._exit(9)
write_text_secret(Path(sys.argv[1]), sys.argv[2])
"""

# Where the system has no unnamed files: Python without O_TMPFILE, or a file system
# that refuses them.
_WITHOUT_UNNAMED_FILES = {
    "no O_TMPFILE": "del os.O_TMPFILE",
    "refused by the file system": """
real_open = os.open
def open_refusing_unnamed(path, flags, *args, **kwargs):
    if flags & os.O_TMPFILE == os.O_TMPFILE:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP), path)
    return real_open(path, flags, *args, **kwargs)
os.open = open_refusing_unnamed
""",
}


def _write_secret_killed(path: Path, text: str, *, without_unnamed_files: str = "") -> None:
    script = _KILLED_BEFORE_PLACING.format(without_unnamed_files=without_unnamed_files)
    killed = subprocess.run([sys.executable, "-c", script, str(path), text], capture_output=True, check=False)
    assert (killed.returncode, killed.stderr) == (9, b"")


def _files_holding(directory: Path, secret: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if secret.encode() in p.read_bytes())


def _has_unnamed_files(directory: Path) -> bool:
    try:
        os.close(os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o600))
    except (AttributeError, OSError):
        return False
    return os.path.isdir("/proc/self/fd")


def test_a_writer_killed_before_placing_its_secret_leaves_no_copy_of_it(tmp_path: Path) -> None:
    """It wrote the secret to a temporary file of its own name (`NAME.<random>.tmp`),
    which a writer killed before removing it left, a copy of a master or signing key
    that nothing ever removed; the secret is now written to an unnamed file, gone with
    the process."""
    if not _has_unnamed_files(tmp_path):
        pytest.skip("no unnamed files (O_TMPFILE) here: the test below covers the named ones")
    secret = "c0ffee" * 10
    _write_secret_killed(tmp_path / "m.db.master-key", secret)
    assert _files_holding(tmp_path, secret) == []
    assert list(tmp_path.iterdir()) == []
    assert write_text_secret(tmp_path / "m.db.master-key", "placed").st_size == len("placed\n")


@pytest.mark.parametrize("without_unnamed_files", _WITHOUT_UNNAMED_FILES.values(), ids=_WITHOUT_UNNAMED_FILES)
def test_a_secret_a_killed_writer_left_named_goes_at_the_next_write_of_that_secret(
    tmp_path: Path, without_unnamed_files: str
) -> None:
    """Where the secret must have a name before it is placed (no unnamed files), a
    killed writer's copy stays until the next process writes the same secret: that
    write removes it, and only copies of that secret."""
    path, other = tmp_path / "m.db.signing-key.new", tmp_path / "other.key"
    _write_secret_killed(path, "the lost secret", without_unnamed_files=without_unnamed_files)
    _write_secret_killed(other, "another secret", without_unnamed_files=without_unnamed_files)
    left = _files_holding(tmp_path, "the lost secret")
    assert len(left) == 1 and left[0].startswith(f"{path.name}.") and left[0].endswith(".tmp"), left
    assert stat.S_IMODE((tmp_path / left[0]).stat().st_mode) == 0o600
    write = """
import sys
from pathlib import Path
from deleatur.crypto.signing import write_text_secret
write_text_secret(Path(sys.argv[1]), "the new secret")
"""
    subprocess.run([sys.executable, "-c", write, str(path)], check=True)
    assert _files_holding(tmp_path, "the lost secret") == []
    assert path.read_text() == "the new secret\n"
    assert len(_files_holding(tmp_path, "another secret")) == 1  # another secret's, for its own next write


def test_master_key_file_as_a_path_or_a_string(store_path: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "master.key"
    write_text_secret(key_file, MASTER.hex())
    Memory.open(store_path, from_file(key_file), create=True).close()
    Memory.open(store_path, from_file(str(key_file))).close()  # as the README writes it
    key_file.write_bytes(b"\xff" * 64)
    with pytest.raises(MasterKeyError, match=f"master key in {key_file} is not hex"):
        Memory.open(store_path, from_file(key_file))


def _secret_files(store: Path, witness_state: Path) -> list[Path]:
    Memory.init(store)[0].close()
    with Memory.open(store, from_file(default_key_file(store))) as memory:
        memory.remember("signed", subject="a")
    Witness.create(witness_state, "witness.example/w").close()
    return [default_key_file(store), signing_key_path(store), Witness.key_path(witness_state)]


def _use(store: Path, witness_state: Path) -> None:
    """Each secret file read once: the witness key to open the witness, the master key
    to open the store, the signing key to sign."""
    Witness.open(witness_state).close()
    with Memory.open(store, from_file(default_key_file(store))) as memory:
        memory.remember("signed again", subject="a")


# Refused whoever owns the file (root's may be group-readable: see below).
@pytest.mark.parametrize("mode", [0o660, 0o604, 0o620, 0o602, 0o644, 0o666])
@pytest.mark.parametrize("which", ["master key", "signing key", "witness key"])
def test_a_key_file_other_users_may_read_or_change_is_refused(tmp_path: Path, which: str, mode: int) -> None:
    store, state = tmp_path / "m.db", tmp_path / "w.db"
    secret = dict(zip(["master key", "signing key", "witness key"], _secret_files(store, state), strict=True))[which]
    secret.chmod(mode)
    with pytest.raises(ExposedKeyFileError) as caught:
        _use(store, state)
    assert caught.value.message == (
        f"key file {secret} has mode {mode:04o}: other users may read or change it; "
        f"refusing to use it (chmod 600 {secret})"
    )
    assert caught.value.exit_code == 2
    secret.chmod(0o600)
    _use(store, state)
    with Memory.open(store, from_file(default_key_file(store))) as memory:
        assert sorted(r.text for r in memory.list()) == ["signed", "signed again"]  # the refused call wrote nothing


def test_a_key_file_another_user_owns_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whoever owns it could have read the key, or put theirs in its place. The process is
    given another user's id, so that the file it wrote is someone else's."""
    key_file = tmp_path / "master.key"
    write_text_secret(key_file, MASTER.hex())
    Memory.open(tmp_path / "m.db", from_file(key_file), create=True).close()
    owner = key_file.stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    if owner == 0:  # root's own file is another rule's (below): make it someone else's
        os.chown(key_file, 4343, -1)
        owner = 4343
    with pytest.raises(ExposedKeyFileError, match=rf"key file {key_file} is owned by another user \(uid {owner}\)"):
        Memory.open(tmp_path / "m.db", from_file(key_file))
    monkeypatch.setattr(os, "geteuid", lambda: owner)
    Memory.open(tmp_path / "m.db", from_file(key_file)).close()
    key_file.chmod(0o640)  # its owner's, not root's: no group may read it
    with pytest.raises(ExposedKeyFileError, match=r"has mode 0640: other users may read or change it"):
        Memory.open(tmp_path / "m.db", from_file(key_file))


def test_a_key_file_of_root_may_be_group_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL's rule for its server key: the user's own file 0600 at most, or root's
    0640 at most (a secret a service reads through its group, as a Kubernetes secret
    mounted with an fsGroup), whoever reads it, root included."""
    if os.geteuid() != 0:
        pytest.skip("makes a file of root's: run as root (CI does)")
    key_file = tmp_path / "master.key"
    write_text_secret(key_file, MASTER.hex())
    Memory.open(tmp_path / "m.db", from_file(key_file), create=True).close()
    for reader in (0, 4242):  # root itself, and a service account
        monkeypatch.setattr(os, "geteuid", lambda reader=reader: reader)
        for allowed in (0o640, 0o440, 0o400):
            key_file.chmod(allowed)
            Memory.open(tmp_path / "m.db", from_file(key_file)).close()
        for refused in (0o660, 0o644, 0o604):
            key_file.chmod(refused)
            with pytest.raises(ExposedKeyFileError, match=rf"has mode {refused:04o}: other users may read or change"):
                Memory.open(tmp_path / "m.db", from_file(key_file))
    key_file.chmod(0o600)


def test_a_store_in_a_missing_directory_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"cannot open .*: No such file or directory"):
        Memory.open(tmp_path / "nowhere" / "m.db", from_bytes(MASTER), create=True)


def test_wrong_master_key_is_refused(store_path: Path) -> None:
    Memory.open(store_path, from_bytes(MASTER), create=True).close()
    with pytest.raises(MasterKeyError, match="wrong master key"):
        Memory.open(store_path, from_bytes(bytes(32)))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: from_hex("abcd"), "must be 32 bytes"),
        (lambda: from_hex("zz" * 32), "master key in the hex master key given is not hex"),
        (lambda: from_file(Path("/nonexistent/key")).derive(b""), "does not exist"),
        (lambda: from_passphrase(""), "must not be empty"),
    ],
)
def test_malformed_master_keys_are_refused(make: object, message: str) -> None:
    with pytest.raises(MasterKeyError, match=message):
        make()  # type: ignore[operator]


def test_missing_key_store_is_refused(store_path: Path) -> None:
    Memory.open(store_path, from_bytes(MASTER), create=True).close()
    keystore_path(store_path).unlink()
    with pytest.raises(MasterKeyError, match=r"key store .* is missing"):
        Memory.open(store_path, from_bytes(MASTER))


def test_passphrase_master_key(store_path: Path) -> None:
    with Memory.open(store_path, from_passphrase("correct horse"), create=True) as memory:
        memory.remember("kept", subject="a")
    with Memory.open(store_path, from_passphrase("correct horse")) as memory:
        assert [r.text for r in memory.list()] == ["kept"]
    with pytest.raises(MasterKeyError, match="wrong master key"):
        Memory.open(store_path, from_passphrase("wrong horse"))


def test_each_subject_has_its_own_data_key(memory: Memory) -> None:
    a = memory.remember("one", subject="alice")
    b = memory.remember("two", subject="bob")
    c = memory.remember("three", subject="ALICE")
    key_ids = []
    for record in (a, b, c):
        row = memory.backend.get(memory.tenant, record.id)
        assert row is not None
        key_ids.append(row.key_id)
    assert key_ids[0] == key_ids[2] != key_ids[1]


def test_names_and_keys_never_appear_in_clear(memory: Memory, store_path: Path) -> None:
    memory.remember("some text", subject="Zebulon Quartermain", key="zebulon::passport", source="crm/zebulon")
    memory.backend.scrub()
    blob = b"".join(p.read_bytes() for p in store_files(store_path)).lower()
    for needle in (b"zebulon", b"quartermain", b"passport"):
        assert needle not in blob


def test_tampered_ciphertext_fails_authentication(memory: Memory) -> None:
    record = memory.remember("hello", subject="a")
    conn = memory.backend._conn  # type: ignore[attr-defined]
    blob = bytearray(conn.execute("SELECT ciphertext FROM records WHERE id = ?", (record.id,)).fetchone()[0])
    blob[20] ^= 0x01
    conn.execute("UPDATE records SET ciphertext = ? WHERE id = ?", (bytes(blob), record.id))
    with pytest.raises(IntegrityError, match="failed authentication"):
        memory.get(record.id)


def test_ciphertext_moved_to_another_row_fails(memory: Memory) -> None:
    a = memory.remember("alice text", subject="alice")
    b = memory.remember("other alice text", subject="alice")
    conn = memory.backend._conn  # type: ignore[attr-defined]
    conn.execute(
        "UPDATE records SET ciphertext = (SELECT ciphertext FROM records WHERE id = ?) WHERE id = ?", (a.id, b.id)
    )
    with pytest.raises(IntegrityError):
        memory.get(b.id)


def test_destroyed_key_makes_old_backups_unreadable(memory: Memory, store_path: Path, tmp_path: Path) -> None:
    doomed = memory.remember("Carol's diagnosis", subject="Carol")
    kept = memory.remember("Dave's order", subject="Dave")
    memory.backend.scrub()
    backup_dir = tmp_path / "backup"
    backup_dir.mkdir()
    backup = backup_dir / "mem.db"
    shutil.copy(store_path, backup)  # a database backup taken before the erasure

    ref = memory._subject_ref("carol")
    assert memory.keys.destroy_ids(memory.keys.key_ids(memory.tenant, [ref])) == 1
    with pytest.raises(DataKeyDestroyedError):
        memory.get(doomed.id)

    # Pair the old database copy with today's key store, as a restore would.
    shutil.copy(keystore_path(store_path), keystore_path(backup))
    with Memory.open(backup, from_bytes(MASTER)) as restored:
        assert restored.get(kept.id).text == "Dave's order"
        with pytest.raises(DataKeyDestroyedError):
            restored.get(doomed.id)


def test_destroyed_key_leaves_no_bytes_in_the_key_store(memory: Memory, store_path: Path) -> None:
    memory.remember("x", subject="Carol")
    ref = memory._subject_ref("carol")
    row = memory.keys._conn.execute("SELECT wrapped FROM data_keys WHERE subject_ref = ?", (ref,)).fetchone()
    assert row is not None
    wrapped = bytes(row[0])
    memory.keys.destroy_ids(memory.keys.key_ids(memory.tenant, [ref]))
    for path in (keystore_path(store_path), *(Path(str(keystore_path(store_path)) + s) for s in ("-wal", "-shm"))):
        if path.exists():
            data = path.read_bytes()
            assert wrapped not in data and wrapped[12:28] not in data and ref not in data, path


def test_data_key_created_by_one_handle_is_seen_by_another(store_path: Path) -> None:
    with (
        Memory.open(store_path, from_bytes(MASTER), create=True) as one,
        Memory.open(store_path, from_bytes(MASTER)) as two,
    ):
        a = one.remember("from one", subject="shared")
        b = two.remember("from two", subject="shared")
        assert one.get(b.id).text == "from two"
        assert two.get(a.id).text == "from one"
        assert os.path.exists(keystore_path(store_path))
