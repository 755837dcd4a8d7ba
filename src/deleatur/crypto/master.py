"""Where the master key comes from.

The master key wraps every subject's data key and derives the blind-index key.
It never enters the database or the key store: it comes from a key file (mode
0600, written by ``deleatur init``), from ``DELEATUR_MASTER_KEY`` (64 hex
digits), or from a passphrase stretched with scrypt using a salt kept in the key
store.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from ..errors import MasterKeyError, StoreError
from ..model import check_path, check_type
from .signing import read_text_secret, write_text_secret

MASTER_KEY_BYTES = 32
# scrypt cost: about 0.1 s and 32 MiB once per open (RFC 7914 §2 guidance for interactive use).
_SCRYPT_N = 2**15
_SCRYPT_R = 8
_SCRYPT_P = 1


@dataclass(frozen=True, slots=True)
class MasterKeySource:
    """A way to obtain the master key; ``derive`` receives the key store's KDF salt."""

    description: str
    derive: Callable[[bytes], bytes]


def _parse_hex(value: str, where: str) -> bytes:
    try:
        key = bytes.fromhex(value.strip())
    except ValueError:
        raise MasterKeyError(f"master key in {where} is not hex") from None
    if len(key) != MASTER_KEY_BYTES:
        raise MasterKeyError(f"master key in {where} must be {MASTER_KEY_BYTES} bytes (64 hex digits)")
    return key


def from_bytes(key: bytes) -> MasterKeySource:
    if len(check_type(key, bytes, "key")) != MASTER_KEY_BYTES:
        raise MasterKeyError(f"master key must be {MASTER_KEY_BYTES} bytes")
    return MasterKeySource("an explicit key", lambda _salt: key)


def from_hex(value: str, where: str = "the hex master key given") -> MasterKeySource:
    key = _parse_hex(check_type(value, str, "value"), check_type(where, str, "where"))
    return MasterKeySource(where, lambda _salt: key)


def from_passphrase(passphrase: str) -> MasterKeySource:
    if not check_type(passphrase, str, "passphrase"):
        raise MasterKeyError("passphrase must not be empty")
    secret = passphrase.encode("utf-8", "surrogateescape")

    def derive(salt: bytes) -> bytes:
        return Scrypt(salt=salt, length=MASTER_KEY_BYTES, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P).derive(secret)

    return MasterKeySource("a passphrase (scrypt)", derive)


def from_file(path: str | os.PathLike[str]) -> MasterKeySource:
    """Read lazily, when the store asks for the key: a missing store is reported as
    such, not as a missing key file."""
    where = check_path(path, "path")

    def derive(_salt: bytes) -> bytes:
        try:
            content = read_text_secret(where)
        except FileNotFoundError:
            raise MasterKeyError(f"master key file {where} does not exist") from None
        except UnicodeDecodeError:
            raise MasterKeyError(f"master key in {where} is not hex") from None
        except OSError as exc:
            raise MasterKeyError(f"cannot read master key file {where}: {exc.strerror}") from None
        return _parse_hex(content, str(where))

    return MasterKeySource(str(where), derive)


def write_key_file(path: Path, key: bytes) -> os.stat_result:
    """Create the key file with mode 0600 from the start (never world-readable, even
    briefly); never over another one, which may be the only copy of a store's key."""
    try:
        return write_text_secret(path, key.hex())
    except FileExistsError:
        raise StoreError(f"{path} already exists; refusing to overwrite a master key") from None


def default_key_file(store_path: Path) -> Path:
    return store_path.with_name(store_path.name + ".master-key")


def from_environment(
    store_path: str | os.PathLike[str], key_file: str | os.PathLike[str] | None = None
) -> MasterKeySource:
    """Resolve the master key the way the CLI does: env key, env passphrase, then key file."""
    store = check_path(store_path, "store_path")
    given = None if key_file is None else check_path(key_file, "key_file")
    if value := os.environ.get("DELEATUR_MASTER_KEY"):
        return from_hex(value, "DELEATUR_MASTER_KEY")
    if passphrase := os.environ.get("DELEATUR_PASSPHRASE"):
        return from_passphrase(passphrase)
    env_file = os.environ.get("DELEATUR_MASTER_KEY_FILE")
    return from_file(given or (Path(env_file) if env_file else default_key_file(store)))
