"""The store's Ed25519 signing key file.

The private key never enters the database. It is written in the signer-key
format of Go's ``golang.org/x/mod/sumdb/note`` (``PRIVATE+KEY+<name>+<id>+<key>``),
atomically (a temporary file of its own with mode 0600 from creation, fsync, link or rename).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import KeyStoreError
from ..log.note import NoteError, Signer


def signing_key_path(store_path: Path) -> Path:
    return store_path.with_name(store_path.name + ".signing-key")


def pending_path(path: Path) -> Path:
    """Where a rotated-to key waits until the rotation has committed."""
    return path.with_name(path.name + ".new")


def write_signer(path: Path, signer: Signer, *, replace: bool) -> os.stat_result:
    try:
        return write_text_secret(path, signer.skey, replace=replace)
    except FileExistsError:
        raise KeyStoreError(f"{path} already exists; refusing to overwrite a signing key") from None


def write_text_secret(path: Path, text: str, *, replace: bool = False) -> os.stat_result:
    """Write a secret whole or not at all, and return the identity of the file placed.

    It is written to a temporary file beside ``path`` with a name of its own (two
    writers never share one, so neither removes or fills the other's), mode 0600 from
    creation, synced, put in place, and the directory synced. Unless ``replace``, it is
    linked into place: the link fails (FileExistsError) if any file is there, so of
    writers racing for one path exactly one places its secret, whole, and the others
    change nothing; a check beforehand would leave a moment in which two both find
    none, and the later one's secret wins. Errors name ``path``, not the temporary file.
    A process killed between making the temporary file and removing it leaves it
    (``<name>.<random>.tmp``, mode 0600), where a fixed name let two writers take it
    from each other.
    """
    tmp: Path | None = None
    try:
        fd, name = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
        tmp = Path(name)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(text + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            placed = os.fstat(handle.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return placed


def read_signer(path: Path) -> Signer | None:
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyStoreError(f"cannot read signing key {path}: {exc}") from None
    try:
        return Signer.from_skey(text)
    except NoteError as exc:
        raise KeyStoreError(f"signing key {path} is malformed: {exc.message}") from None
