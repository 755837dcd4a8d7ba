"""The store's Ed25519 signing key file, and how every secret file is written.

The private key never enters the database. It is written in the signer-key
format of Go's ``golang.org/x/mod/sumdb/note`` (``PRIVATE+KEY+<name>+<id>+<key>``),
whole or not at all, mode 0600 from creation, never over another file, and never
under a name of its own before it is placed (see :func:`write_text_secret`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import time
from pathlib import Path

from ..errors import ExposedKeyFileError, KeyStoreError
from ..log.note import NoteError, Signer

# What open(O_TMPFILE) fails with where the file system (or an old kernel) has no
# unnamed files: the named temporary file is the way left.
_NO_TMPFILE = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})
# When this module was imported, not when the process began. A named temporary file
# last written before then is no write of this process's (each writes its file after
# the import): it is what a killed writer left, or, rarely, the file of a writer in
# another process that has stalled since then between writing and placing it, whose
# write then fails (naming its path) rather than place the secret. One left after this
# import is removed by a process that imports this module later, not by this one.
_STARTED_NS = time.time_ns()


def signing_key_path(store_path: Path) -> Path:
    return store_path.with_name(store_path.name + ".signing-key")


def pending_path(path: Path) -> Path:
    """Where a rotated-to key waits until the rotation has committed."""
    return path.with_name(path.name + ".new")


def write_signer(path: Path, signer: Signer) -> os.stat_result:
    try:
        return write_text_secret(path, signer.skey)
    except FileExistsError:
        raise KeyStoreError(f"{path} already exists; refusing to overwrite a signing key") from None


def write_text_secret(path: Path, text: str) -> os.stat_result:
    """Write a secret whole or not at all, and return the identity of the file placed.

    On Linux the secret is written to an unnamed file in ``path``'s directory
    (``O_TMPFILE``), mode 0600 from creation, synced, then given its name by a link
    from ``/proc/self/fd``, and the directory synced where the system allows
    (:func:`_sync_directory`): a process killed at any point
    leaves either no file or the placed one, never a copy of the secret under another
    name that nothing would remove. The link fails (FileExistsError) if any file is
    at ``path``, so of writers racing for one path
    exactly one places its secret, whole, and the others change nothing; a check
    beforehand would leave a moment in which two both find none, and the later one's
    secret wins. Errors name ``path``, not a temporary file.

    Where there are no unnamed files (another system, a file system without them, no
    ``/proc``), it is written to ``<name>.<random>.tmp`` beside ``path`` (two writers
    never share one), linked into place, and removed. A writer killed
    before the removal leaves that file: each write of a secret first removes those
    of its name last written before this module was imported (:data:`_STARTED_NS`),
    so a killed writer's copy lasts until the same secret is written by a process
    that imported it after the kill.
    """
    data = (text + "\n").encode("ascii")
    try:
        _remove_strays(path)
        placed = _place_unnamed(path, data) or _place_named(path, data)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    _sync_directory(path.parent)
    return placed


def _sync_directory(directory: Path) -> None:
    """Sync ``directory`` so that a name just placed in it survives a crash of the
    machine, where the system allows it; where it does not, the write still succeeds.
    The file's data is synced already: what is at stake is its name alone, and failing
    the write with the file placed would leave a secret its caller does not know it
    made (init never removed it, and a second init refused, finding it there). Windows
    opens no directory (EACCES) and has no ``O_DIRECTORY``, and some file systems
    refuse to sync one (EINVAL)."""
    flag = getattr(os, "O_DIRECTORY", None)
    if flag is None:
        return
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | flag)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _place_unnamed(path: Path, data: bytes) -> os.stat_result | None:
    """``data`` placed at ``path`` from an unnamed file, or None where there is none."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return None
    dir_fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fd = os.open(".", flag | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in _NO_TMPFILE:
                return None
            raise
        try:
            _write_synced(fd, data)
            placed = os.fstat(fd)
            # Through the directory's descriptors, so that os.link calls linkat with
            # AT_SYMLINK_FOLLOW: a plain link(2) links /proc's symlink itself, which
            # fails (EXDEV), rather than the file it stands for.
            os.link(f"/proc/self/fd/{fd}", path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=True)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    return placed


def _place_named(path: Path, data: bytes) -> os.stat_result:
    tmp, fd = _create_temporary(path)
    try:
        try:
            _write_synced(fd, data)
            placed = os.fstat(fd)
        finally:
            os.close(fd)
        os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return placed


def _create_temporary(path: Path) -> tuple[Path, int]:
    while True:
        tmp = path.with_name(f"{path.name}.{secrets.token_hex(8)}.tmp")
        with contextlib.suppress(FileExistsError):
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)


def _write_synced(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def _remove_strays(path: Path) -> None:
    """Remove the temporary files of ``path``'s secret that killed writers left."""
    stray = re.compile(re.escape(path.name) + r"\.[0-9a-f]{16}\.tmp")
    # One that cannot be listed or removed stays for the next write: that does not keep
    # this one from placing its secret, and its own error says more.
    with contextlib.suppress(OSError), os.scandir(path.parent) as entries:
        for entry in entries:
            if stray.fullmatch(entry.name) is not None:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime_ns < _STARTED_NS:
                        os.unlink(entry.path)


def read_text_secret(path: Path) -> str:
    """Read a secret file that only its owner can read or change.

    The rule is PostgreSQL's for its server key (``be-secure-common.c``): the file is
    owned by this process's user with no access for group or others, or owned by root
    and at most group-readable (a secret a service account reads through its group).
    Anything else means another user may have read the key, or swapped it for theirs.
    Systems without POSIX permissions (Windows) are not checked. The mode is read from
    the opened file itself, so the bytes read are those of the file checked.
    """
    with path.open("rb") as file:
        if os.name == "posix":
            _check_private(path, os.fstat(file.fileno()))
        return file.read().decode("ascii")


def _check_private(path: Path, st: os.stat_result) -> None:
    mode = st.st_mode & 0o777
    if st.st_uid == 0:  # whoever reads it, root too: root chose the group it shares it with
        exposed = mode & 0o037
    elif st.st_uid == os.geteuid():
        exposed = mode & 0o077
    else:
        raise ExposedKeyFileError(f"key file {path} is owned by another user (uid {st.st_uid}); refusing to use it")
    if exposed:
        raise ExposedKeyFileError(
            f"key file {path} has mode {mode:04o}: other users may read or change it; "
            f"refusing to use it (chmod 600 {path})"
        )


def read_signer(path: Path) -> Signer | None:
    try:
        text = read_text_secret(path)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyStoreError(f"cannot read signing key {path}: {exc}") from None
    try:
        return Signer.from_skey(text)
    except NoteError as exc:
        raise KeyStoreError(f"signing key {path} is malformed: {exc.message}") from None
