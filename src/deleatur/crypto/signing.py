"""The store's Ed25519 signing key file.

The private key never enters the database. It is written in the signer-key
format of Go's ``golang.org/x/mod/sumdb/note`` (``PRIVATE+KEY+<name>+<id>+<key>``),
atomically (a temporary file with mode 0600 from creation, fsync, rename).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import KeyStoreError
from ..log.note import NoteError, Signer


def signing_key_path(store_path: Path) -> Path:
    return store_path.with_name(store_path.name + ".signing-key")


def pending_path(path: Path) -> Path:
    """Where a rotated-to key waits until the rotation has committed."""
    return path.with_name(path.name + ".new")


def write_signer(path: Path, signer: Signer, *, replace: bool) -> None:
    try:
        write_text_secret(path, signer.skey, replace=replace)
    except FileExistsError:
        raise KeyStoreError(f"{path} already exists; refusing to overwrite a signing key") from None


def write_text_secret(path: Path, text: str, *, replace: bool = True) -> None:
    """Atomically write a secret: mode 0600 from creation, fsync, rename, fsync the directory.
    With ``replace=False`` the file is linked into place rather than renamed: the link
    fails (FileExistsError) if a file is there, where a check beforehand would leave a
    moment in which two writers both find none, and the later one's key wins."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(text + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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
