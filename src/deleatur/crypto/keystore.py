"""Per-subject data keys, kept in their own SQLite file beside the store.

Every subject gets a random AES-256 data key; its records are encrypted under it.
Data keys are stored only wrapped (AES-256-GCM) by a key derived from the master
key. Destroying a subject's row here is crypto-shredding: every copy of its
records, including database backups taken before, becomes unreadable.

The key store holds no subject names: rows are found by ``subject_ref``, a keyed
blind index (HMAC-SHA-256 under a key derived from the master key).

A key is made before the records it is for commit in the other file, so a crash (or a
write refused under the store's lock) can leave a key for a subject the store holds
nothing on. Every new key is therefore marked *unconfirmed* in the same transaction
that makes it; the mark is dropped once records under it are seen committed, and a
key still marked with nothing under it is destroyed (``erasure.engine.collect_unused_keys``).
"""

from __future__ import annotations

import base64
import hmac
import struct
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from hashlib import sha256
from pathlib import Path

import apsw
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..clock import Clock, Random
from ..errors import (
    DataKeyDestroyedError,
    KeyStoreBusyError,
    MasterKeyError,
    NotADeleaturStoreError,
    StoreBusyError,
)
from ..sqlitefile import connect, data_version, immediate, is_ours, refuse_if_first_try, repeatable, scrub
from .master import MasterKeySource

KEYSTORE_APPLICATION_ID = 0x444C544B  # "DLTK"
KEYSTORE_SCHEMA_VERSION = 2  # 2: unconfirmed_keys
_CHECK_PLAINTEXT = b"deleatur master key check v1"
_NONCE = 12
_CACHE_SIZE = 4096
_SEAL_AAD = b"deleatur/sealed/v1\n"
_LENGTH = struct.Struct(">I")
#: Keys made for a write whose records have not been seen committed (see the module's doc).
_UNCONFIRMED_TABLE = "CREATE TABLE IF NOT EXISTS unconfirmed_keys(key_id BLOB PRIMARY KEY) WITHOUT ROWID"


def _hkdf(master: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(master)


def _frame(parts: tuple[str | bytes, ...]) -> bytes:
    # Length-prefix every part so ("user1", "0") and ("user10", "") never collide.
    # (A plain loop: every record read frames its id, and a generator costs twice this.)
    # "surrogatepass": the same bytes as UTF-8 for any valid text, and still a frame for
    # text that is not (a lone surrogate in a refused call's argument, named in its
    # audit entry as a token), where UTF-8 would raise.
    pieces: list[bytes] = []
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        pieces += (_LENGTH.pack(len(raw)), raw)
    return b"".join(pieces)


#: Bytes of a blind-index reference: HMAC-SHA-256, truncated.
REF_SIZE = 16


class BlindIndex:
    """Keyed pseudonyms for values the store must look up but not hold in clear."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def ref(self, purpose: str, *parts: str | bytes) -> bytes:
        return hmac.new(self._key, _frame((purpose, *parts)), sha256).digest()[:REF_SIZE]

    @staticmethod
    def token(purpose: str, ref: bytes) -> str:
        """A short form of ``ref`` (48 bits), for where it is written often: the
        full-text index and the audit log."""
        return purpose[0] + ref.hex()[:12]


class EntryAuthenticator:
    """MACs of the log's entries (HMAC-SHA-256 under a key derived from the master key):
    an entry's MAC shows that a holder of the store's secrets appended it, which a
    checkpoint's signature alone does not, since the store signs entries anyone who can
    write to the database could have left (see ``TransparencyLog``). It covers the
    entry's leaf hash, not its bytes, so an entry that audit retention pruned to its leaf
    hash keeps its MAC, and its index, so it cannot be moved."""

    def __init__(self, key: bytes, store_id: str) -> None:
        self._key = key
        self._prefix = _frame(("deleatur/log-entry/v1", store_id))

    def mac(self, index: int, leaf: bytes) -> bytes:
        return hmac.digest(self._key, self._prefix + _frame((index.to_bytes(8, "big"), leaf)), "sha256")


class KeyStore:
    def __init__(
        self, path: Path, *, store_id: str, conn: apsw.Connection, master: bytes, random: Random, clock: Clock
    ) -> None:
        self.path = path
        self.store_id = store_id
        self._conn = conn
        self._wrap = AESGCM(_hkdf(master, b"deleatur/v1/wrap"))
        self.index = BlindIndex(_hkdf(master, b"deleatur/v1/index"))
        self.log_entries = EntryAuthenticator(_hkdf(master, b"deleatur/v1/log-entry"), store_id)
        self._random = random
        self._clock = clock
        # Unwrapped keys, each with the key store's data_version when it was last seen in
        # the file: another connection (a server's other handle, a CLI) may destroy a key.
        self._by_id: OrderedDict[bytes, tuple[AESGCM, int]] = OrderedDict()
        self._version = data_version(self._conn)
        #: Keys this handle made that no write of its own has yet committed records under:
        #: at the end of each call, those left are checked and, if unused, destroyed.
        self.unsettled: set[bytes] = set()
        # Marks of keys whose records this handle committed, dropped in its next write
        # transaction on the key store rather than in one of their own.
        self._unmark_later: set[bytes] = set()

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        store_id: str,
        master: MasterKeySource,
        create: bool,
        random: Random,
        clock: Clock,
        full_sync: bool = False,
    ) -> KeyStore:
        if not create and not path.exists():
            raise MasterKeyError(f"key store {path} is missing: the store's records cannot be decrypted")
        conn = connect(path, create=create, full_sync=full_sync, identify=lambda c: cls._identify(c, path, create))
        try:
            key = cls._initialize(conn, path, store_id=store_id, master=master, create=create, random=random)
        except BaseException:
            conn.close()
            raise
        return cls(path, store_id=store_id, conn=conn, master=key, random=random, clock=clock)

    @staticmethod
    def _identify(conn: apsw.Connection, path: Path, create: bool) -> None:
        """Refuse a file that is neither a key store nor, when creating, an empty one."""
        if not is_ours(conn, path, KEYSTORE_APPLICATION_ID, "deleatur key store") and not create:
            raise NotADeleaturStoreError(f"{path} is not a deleatur key store")

    @staticmethod
    def _initialize(
        conn: apsw.Connection, path: Path, *, store_id: str, master: MasterKeySource, create: bool, random: Random
    ) -> bytes:
        app_id = conn.execute("PRAGMA application_id").fetchall()[0][0]
        if app_id == 0 and create:
            salt = random(16)
            key = master.derive(salt)
            wrap = AESGCM(_hkdf(key, b"deleatur/v1/wrap"))
            nonce = random(_NONCE)
            check = nonce + wrap.encrypt(nonce, _CHECK_PLAINTEXT, store_id.encode())
            with immediate(conn):
                conn.execute(f"PRAGMA application_id = {KEYSTORE_APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {KEYSTORE_SCHEMA_VERSION}")
                conn.execute("CREATE TABLE meta(k TEXT PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
                conn.execute(
                    "CREATE TABLE data_keys(key_id BLOB PRIMARY KEY, tenant TEXT NOT NULL,"
                    " subject_ref BLOB NOT NULL, wrapped BLOB NOT NULL, created_at INTEGER NOT NULL,"
                    " UNIQUE(tenant, subject_ref))"
                )
                conn.execute(_UNCONFIRMED_TABLE)
                conn.executemany(
                    "INSERT INTO meta(k, v) VALUES (?, ?)",
                    [("store_id", store_id.encode()), ("kdf_salt", salt), ("master_check", check)],
                )
            return key
        meta = {k: bytes(v) for k, v in conn.execute("SELECT k, v FROM meta")}
        if meta.get("store_id") != store_id.encode():
            raise MasterKeyError(f"key store {path} belongs to another store")
        key = master.derive(meta["kdf_salt"])
        wrap = AESGCM(_hkdf(key, b"deleatur/v1/wrap"))
        check = meta["master_check"]
        try:
            wrap.decrypt(check[:_NONCE], check[_NONCE:], store_id.encode())
        except InvalidTag:
            raise MasterKeyError(f"wrong master key for {path} (from {master.description})") from None
        if conn.execute("PRAGMA user_version").fetchall() == [(1,)]:
            with immediate(conn):
                # An older release's key store: no mark for its keys, all made before (and a
                # key it makes while both releases run goes unmarked: kept, as it always was).
                conn.execute(_UNCONFIRMED_TABLE)
                conn.execute(f"PRAGMA user_version = {KEYSTORE_SCHEMA_VERSION}")
        return key

    def _aad(self, key_id: bytes, tenant: str, subject_ref: bytes) -> bytes:
        return _frame((self.store_id, key_id, tenant, subject_ref))

    def _unwrap(self, key_id: bytes, tenant: str, subject_ref: bytes, wrapped: bytes) -> AESGCM:
        try:
            raw = self._wrap.decrypt(wrapped[:_NONCE], wrapped[_NONCE:], self._aad(key_id, tenant, subject_ref))
        except InvalidTag:
            raise MasterKeyError("a data key failed authentication: the key store was altered") from None
        aead = AESGCM(raw)
        self._remember(key_id, aead)
        return aead

    def refresh(self) -> None:
        """Note whether another connection has changed the key store since the last call:
        if so, each cached key is looked up in the file again before its next use. The
        guard calls this as each call begins, so no call decrypts with a key destroyed
        before it began (a commit on this connection evicts its own destroyed keys)."""
        self._version = data_version(self._conn)

    def _remember(self, key_id: bytes, aead: AESGCM) -> None:
        self._by_id[key_id] = (aead, self._version)
        self._by_id.move_to_end(key_id)
        if len(self._by_id) > _CACHE_SIZE:
            self._by_id.popitem(last=False)

    @contextmanager
    def _locked(self, unchanged: str) -> Iterator[None]:
        """A write transaction on the key store; a lock held elsewhere past the busy timeout
        is the key store's to name (HTTP 503 key_store_busy), not the database's."""
        try:
            with immediate(self._conn):
                yield
        except StoreBusyError:
            raise KeyStoreBusyError(f"the key store is locked by another process; {unchanged}") from None

    def key_for_subject(self, tenant: str, subject_ref: bytes) -> tuple[bytes, AESGCM]:
        """The subject's data key, created if it has none yet.

        Read straight from the file every time rather than cached by subject: another
        process may have destroyed the key, and a write under a destroyed key would be
        unreadable from the start.
        """
        row = self._conn.execute(
            "SELECT key_id, wrapped FROM data_keys WHERE tenant = ? AND subject_ref = ?", (tenant, subject_ref)
        ).fetchone()
        made: bytes | None = None
        if row is None:
            # A retry of the call finds this key made and uses it (sqlitefile.first_try).
            with repeatable(), self._locked("no key was made"):
                # Re-read under the write lock: a concurrent process may have just made it.
                row = self._conn.execute(
                    "SELECT key_id, wrapped FROM data_keys WHERE tenant = ? AND subject_ref = ?",
                    (tenant, subject_ref),
                ).fetchone()
                if row is None:
                    key_id = self._random(16)
                    nonce = self._random(_NONCE)
                    wrapped = nonce + self._wrap.encrypt(
                        nonce, AESGCM.generate_key(bit_length=256), self._aad(key_id, tenant, subject_ref)
                    )
                    self._conn.execute(
                        "INSERT INTO data_keys(key_id, tenant, subject_ref, wrapped, created_at)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (key_id, tenant, subject_ref, wrapped, self._clock()),
                    )
                    self._conn.execute("INSERT INTO unconfirmed_keys(key_id) VALUES (?)", (key_id,))
                    self._drop_marks(self._unmark_later)
                    row = (key_id, wrapped)
                    made = key_id
            if made is not None:  # committed
                self._unmark_later.clear()
                self.unsettled.add(made)
        key_id, wrapped = bytes(row[0]), bytes(row[1])
        cached = self._by_id.get(key_id)
        if cached is not None:
            self._remember(key_id, cached[0])  # just read from the file
            return key_id, cached[0]
        return key_id, self._unwrap(key_id, tenant, subject_ref, wrapped)

    def key_by_id(self, key_id: bytes) -> AESGCM:
        cached = self._by_id.get(key_id)
        if cached is not None:
            aead, seen = cached
            if seen == self._version:
                return aead
            if self.has_key_id(key_id):
                self._remember(key_id, aead)
                return aead
            del self._by_id[key_id]
            raise DataKeyDestroyedError("the data key for this record has been destroyed")
        row = self._conn.execute(
            "SELECT tenant, subject_ref, wrapped FROM data_keys WHERE key_id = ?", (key_id,)
        ).fetchone()
        if row is None:
            raise DataKeyDestroyedError("the data key for this record has been destroyed")
        tenant, subject_ref, wrapped = row
        assert isinstance(subject_ref, bytes) and isinstance(wrapped, bytes)
        return self._unwrap(key_id, str(tenant), subject_ref, wrapped)

    def has_key(self, tenant: str, subject_ref: bytes) -> bool:
        return (
            self._conn.execute(
                "SELECT 1 FROM data_keys WHERE tenant = ? AND subject_ref = ?", (tenant, subject_ref)
            ).fetchone()
            is not None
        )

    def pseudonym(self, tenant: str, subject_ref: bytes, value: str) -> str | None:
        """A keyed pseudonym of ``value`` under a key derived from the subject's data key.

        Once that data key is destroyed nobody, the operator included, can recompute
        the pseudonym, so it can be neither reversed nor confirmed by guessing.
        """
        row = self._conn.execute(
            "SELECT key_id, wrapped FROM data_keys WHERE tenant = ? AND subject_ref = ?", (tenant, subject_ref)
        ).fetchone()
        if row is None:
            return None
        key_id, wrapped = bytes(row[0]), bytes(row[1])
        try:
            raw = self._wrap.decrypt(wrapped[:_NONCE], wrapped[_NONCE:], self._aad(key_id, tenant, subject_ref))
        except InvalidTag:
            raise MasterKeyError("a data key failed authentication: the key store was altered") from None
        secret = _hkdf(raw, b"deleatur/v1/pseudonym")
        return "psn:" + hmac.new(secret, value.encode("utf-8"), sha256).hexdigest()[:32]

    def seal(self, tenant: str, subject_ref: bytes, value: str) -> str | None:
        """``value`` encrypted under the subject's current data key, as text that names
        the key: readable while the key lives, noise once it is destroyed. None if the
        subject has no key (nothing is created for it)."""
        row = self._conn.execute(
            "SELECT key_id FROM data_keys WHERE tenant = ? AND subject_ref = ?", (tenant, subject_ref)
        ).fetchone()
        if row is None:
            return None
        key_id = bytes(row[0])
        nonce = self._random(_NONCE)
        sealed = nonce + self.key_by_id(key_id).encrypt(nonce, value.encode("utf-8"), _SEAL_AAD + key_id)
        return key_id.hex() + ":" + base64.b64encode(sealed).decode("ascii")

    def unseal(self, sealed: str) -> str | None:
        """What :meth:`seal` sealed, or None once its key is destroyed."""
        try:
            key_hex, _, body = sealed.partition(":")
            key_id, raw = bytes.fromhex(key_hex), base64.b64decode(body, validate=True)
        except ValueError:
            return None
        try:
            aead = self.key_by_id(key_id)
        except DataKeyDestroyedError:
            return None
        try:
            return aead.decrypt(raw[:_NONCE], raw[_NONCE:], _SEAL_AAD + key_id).decode("utf-8")
        except (InvalidTag, ValueError):
            return None

    def key_ids(self, tenant: str, subject_refs: Iterable[bytes]) -> list[bytes]:
        """The ids of the subjects' current data keys (the ones an erasure must destroy)."""
        out = []
        for ref in subject_refs:
            row = self._conn.execute(
                "SELECT key_id FROM data_keys WHERE tenant = ? AND subject_ref = ?", (tenant, ref)
            ).fetchone()
            if row is not None:
                out.append(bytes(row[0]))
        return out

    def has_key_id(self, key_id: bytes) -> bool:
        return self._conn.execute("SELECT 1 FROM data_keys WHERE key_id = ?", (key_id,)).fetchone() is not None

    def destroy_ids(self, key_ids: Iterable[bytes], *, wait: bool = True) -> int:
        """Crypto-shred by key id: a key made for the subject after the erasure is spared.
        ``wait``: whether the scrub that follows waits for a reader of the key store."""
        ids = list(key_ids)
        if not ids:
            return 0
        if wait:
            refuse_if_first_try("destroying data keys")
        with self._locked("no key was destroyed"):
            gone = sum(
                self._conn.execute("DELETE FROM data_keys WHERE key_id = ? RETURNING 1", (key_id,)).fetchone()
                is not None
                for key_id in ids
            )
            self._drop_marks(ids)
        for key_id in ids:
            self._by_id.pop(key_id, None)
        self.unsettled.difference_update(ids)
        self.scrub(wait=wait)  # an erasure's settle() checks again, and says if a reader prevented it
        return gone

    def used(self, key_ids: Iterable[bytes]) -> None:
        """Records under these keys have just committed: their marks can go (in this
        handle's next write transaction on the key store, which costs the write nothing)."""
        if not self.unsettled:
            return
        for key_id in key_ids:
            if key_id in self.unsettled:
                self.unsettled.discard(key_id)
                self._unmark_later.add(key_id)

    def unconfirmed(self, key_ids: Iterable[bytes] | None = None) -> list[tuple[bytes, str | None, bytes | None]]:
        """The marked keys (of ``key_ids``, or all) as (key_id, tenant, subject_ref); a mark
        whose key is gone (an older release destroyed it) has no tenant or reference."""
        sql = (
            "SELECT u.key_id, k.tenant, k.subject_ref FROM unconfirmed_keys u"
            " LEFT JOIN data_keys k ON k.key_id = u.key_id"
        )
        if key_ids is None:
            rows = list(self._conn.execute(sql))
        else:
            rows = [row for key_id in key_ids for row in self._conn.execute(sql + " WHERE u.key_id = ?", (key_id,))]
        return [(bytes(k), None if t is None else str(t), None if r is None else bytes(r)) for k, t, r in rows]

    def mark(self, key_ids: Iterable[bytes]) -> None:
        """Mark keys unconfirmed again, as new keys are: what was stored under them is gone,
        so unless something is stored under them first, they are collected as this call
        ends (or, should it be cut off, when the store is next opened)."""
        ids = list(key_ids)
        if not ids:
            return
        with self._locked("no key was marked"):
            self._conn.executemany("INSERT OR IGNORE INTO unconfirmed_keys(key_id) VALUES (?)", ((k,) for k in ids))
        self.unsettled.update(ids)

    def unmark(self, key_ids: Iterable[bytes]) -> None:
        """Drop the marks of keys found in use, now."""
        ids = [*key_ids, *self._unmark_later]
        if not ids:
            return
        with self._locked("no mark was dropped"):
            self._drop_marks(ids)
        self._unmark_later.clear()
        self.unsettled.difference_update(ids)

    def _drop_marks(self, key_ids: Iterable[bytes]) -> None:
        self._conn.executemany("DELETE FROM unconfirmed_keys WHERE key_id = ?", ((key_id,) for key_id in key_ids))

    def scrub(self, *, wait: bool = True) -> bool:
        """Empty the key store's -wal, which still holds destroyed keys' pages after the
        delete; False if a reader kept it from being truncated (see sqlitefile.scrub)."""
        return scrub(self._conn, wait=wait)

    def close(self) -> None:
        self._by_id.clear()
        self._conn.close()
