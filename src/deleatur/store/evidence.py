"""A read-only view of a store's files, for verifiers that hold no key at all.

It opens the database and the key store read-only and answers only what an
erasure certificate's absence and log checks ask. It needs neither the master
key nor the signing key.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import apsw

from ..errors import NotADeleaturStoreError, NotFoundError, StoreError
from .schema import APPLICATION_ID

_LEVEL_SHIFT = 50


def _readonly(path: Path) -> apsw.Connection:
    if not path.exists():
        raise NotFoundError(f"no store file at {path}")
    if path.is_dir():  # which SQLite opens, to fail at the first read with an I/O error
        raise StoreError(f"{path} is a directory, not a store file")
    try:
        conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        conn.execute("PRAGMA schema_version").fetchall()
    except (apsw.NotADBError, apsw.CantOpenError):
        raise NotADeleaturStoreError(f"{path} is not a deleatur store") from None
    return conn


class StoreEvidence:
    def __init__(self, store: Path) -> None:
        self._db = _readonly(store)
        if self._db.execute("PRAGMA application_id").fetchall()[0][0] != APPLICATION_ID:
            self._db.close()
            raise NotADeleaturStoreError(f"{store} is not a deleatur store")
        self._keys = _readonly(store.with_name(store.name + ".keys"))
        meta = {str(k): str(v) for k, v in self._db.execute("SELECT k, v FROM meta")}
        self.store_id = meta["store_id"]

    def close(self) -> None:
        self._db.close()
        self._keys.close()

    def __enter__(self) -> StoreEvidence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_size(self) -> int:
        for (value,) in self._db.execute("SELECT coalesce(max(idx) + 1, 0) FROM log_entries"):
            return int(value)
        return 0

    def log_entry(self, index: int) -> bytes | None:
        row = self._db.execute("SELECT entry FROM log_entries WHERE idx = ?", (index,)).fetchone()
        return None if row is None else bytes(row[0])

    def log_entries(self, size: int) -> Iterator[tuple[int, bytes]]:
        """The log's first ``size`` entries (those present), oldest first."""
        for idx, raw in self._db.execute("SELECT idx, entry FROM log_entries WHERE idx < ? ORDER BY idx", (size,)):
            yield int(idx), bytes(raw)

    def key_entries(self, size: int) -> list[tuple[int, bytes]]:
        """The log's key announcements among its first ``size`` entries, oldest first (a
        superset: the caller checks each entry's type, and its inclusion)."""
        return [
            (int(idx), bytes(raw))
            for idx, raw in self._db.execute(
                "SELECT idx, entry FROM log_entries WHERE idx < ? AND instr(entry, ?) > 0 ORDER BY idx",
                (size, b'"type":"key"'),
            )
        ]

    def checkpoints_after(self, size: int) -> Iterator[tuple[int, str]]:
        """The stored checkpoints of trees larger than ``size``, smallest first (unverified)."""
        for stored, note in self._db.execute(
            "SELECT size, note FROM log_checkpoints WHERE size > ? ORDER BY size", (size,)
        ):
            yield int(stored), str(note)

    def log_node(self, level: int, index: int) -> bytes:
        row = self._db.execute("SELECT hash FROM log_nodes WHERE pos = ?", (level << _LEVEL_SHIFT | index,)).fetchone()
        if row is None:
            raise NotFoundError(f"the store's log has no subtree {level}/{index}")
        return bytes(row[0])

    def live_ids(self, tenant: str, ids: Iterable[str]) -> list[str]:
        query = "SELECT id FROM records WHERE +tenant = ? AND id IN"
        return [str(found) for found in _present(self._db, query, (tenant,), ids)]

    def live_subject_spaces(self, tenant: str, subject_ref: bytes) -> list[tuple[str, str, str, int]]:
        """The spaces (user, agent, run) holding live records of the subject, each with how many."""
        return [
            (str(user), str(agent), str(run), int(count))
            for user, agent, run, count in self._db.execute(
                "SELECT user_id, agent_id, run_id, count(*) FROM records WHERE tenant = ? AND subject_ref = ?"
                " GROUP BY user_id, agent_id, run_id",
                (tenant, subject_ref),
            )
        ]

    def scope_key(self, tenant: str, request_id: str) -> bytes | None:
        """The one-time key of the request's scope pseudonyms, if the store kept it (see
        ``ErasureRequest.scope_key``); None too in a store from before it kept any (v14),
        which a read-only view does not upgrade."""
        columns = {str(row[1]) for row in self._db.execute("PRAGMA table_info(erasure_requests)")}
        if "scope_key" not in columns:
            return None
        row = self._db.execute(
            "SELECT scope_key FROM erasure_requests WHERE tenant = ? AND id = ?", (tenant, request_id)
        ).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def key_ids_present(self, key_ids: Iterable[bytes]) -> list[bytes]:
        """Those of ``key_ids`` the key store holds."""
        return [
            bytes(found) for found in _present(self._keys, "SELECT key_id FROM data_keys WHERE key_id IN", (), key_ids)
        ]

    def key_created_at(self, tenant: str, subject_ref: bytes) -> int | None:
        """When the subject's data key was made, if it has one."""
        row = self._keys.execute(
            "SELECT created_at FROM data_keys WHERE tenant = ? AND subject_ref = ?", (tenant, subject_ref)
        ).fetchone()
        return None if row is None else int(row[0])


def _present(conn: apsw.Connection, query: str, args: tuple[Any, ...], values: Iterable[Any]) -> list[Any]:
    """What ``query`` (ending in ``IN``) finds of ``values``, asked 500 at a time (SQLite
    binds at most so many)."""
    found: list[Any] = []
    wanted = list(values)
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        found += [row[0] for row in conn.execute(f"{query} ({', '.join('?' * len(chunk))})", (*args, *chunk))]
    return found
