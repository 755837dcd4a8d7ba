"""The embedded default backend: one SQLite file (through apsw, for a current
SQLite whose FTS5 supports ``secure-delete``)."""

from __future__ import annotations

import json
import math
import uuid
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import apsw

from ..clock import Clock
from ..errors import NotFoundError, StoreError
from ..model import REMOVALS_MADE, Space, SpaceFilter, Status, cached_space
from ..sqlitefile import WalCopier, connect, data_version, immediate, savepoint, scrub, sidecar_files
from .heldindex import HeldIndex
from .protocol import WAL_NOT_TRUNCATED, LineageStub, Node, RemovalMark, RowFilter, SpaceRefs, StoredRow
from .schema import identify, prepare

V = TypeVar("V")
_COLUMNS = (
    "id, tenant, user_id, agent_id, run_id, subject_ref, key_ref, key_id, status,"
    " supersedes, confidence, created_at, updated_at, expires_at, ciphertext"
)
_R_COLUMNS = ", ".join("r." + c.strip() for c in _COLUMNS.split(","))
_LINEAGE = "(SELECT group_concat(parent, ' ') FROM lineage WHERE child = r.id)"
_REQUEST_COLUMNS = (
    "tenant",
    "id",
    "kind",
    "subject_pseudonym",
    "subject_ref",
    "scope",
    "basis",
    "requester",
    "received_at",
    "completed_at",
    "status",
    "error",
    "counts",
    "record_ids",
    "tombstones",
    "pending_keys",
    "fingerprint",
    "users",
    "scope_key",
)
_DECISION_COLUMNS = (
    "tenant",
    "id",
    "user_id",
    "agent_id",
    "run_id",
    "created_at",
    "body",
    "key_id",
    "signature",
    "hash",
)
_PRINCIPAL_COLUMNS = ("id", "tenant", "name", "role", "scopes", "key_digest", "created_at", "revoked_at")
_LEVEL_SHIFT = 50
_INDEX_MASK = (1 << _LEVEL_SHIFT) - 1
# A unary plus on "+tenant" keeps the planner on the id index for lookups by id:
# without it, it may prefer records_space and scan the whole tenant.
_SPACE = "r.tenant = ? AND r.user_id = ? AND r.agent_id = ? AND r.run_id = ?"


# Recall's filter on a candidate record r (after the space's index terms matched it).
_VISIBLE = (
    f"{_SPACE} AND r.status = 'ACTIVE' AND (r.expires_at IS NULL OR r.expires_at > ?)"
    " AND r.subject_ref NOT IN (SELECT subject_ref FROM restrictions WHERE tenant = ?)"
)
# BM25 with FTS5's constants, and the name recall's scorer is registered under.
_K1 = 1.2
_B = 0.75
_BM25 = "deleatur_bm25"
#: SQLite's largest rowid.
_MOST_ROWID = (1 << 63) - 1
# The upkeep thread's merges of the full-text index (see _merge_index_segments): the
# pages one may write, and how many segments a level needs for one to merge them.
_MERGE_PAGES = 64
_USERMERGE = 2
#: The meta key of a removal committed but not yet scrubbed from the -wal.
_SCRUB_PENDING = "scrub_pending"
#: Spends confirmation tokens. The digest and the terms go too: keyed hashes over the
#: plan, the subject's name among the rest, and over the requester, they are never
#: compared again, and the row stays until it expires, to let the erasure be repeated.
_SPEND = "UPDATE erasure_confirmations SET used_at = ?, plan_digest = x'', terms = x''"
#: The meta key of the unused data keys committed for destruction (a JSON list of hex ids).
_KEYS_COLLECTING = "keys_collecting"


def _phrase(term: str) -> str:
    """One index term as an FTS5 phrase of the body column: quoted, so it is never syntax."""
    return 'body:"' + term.replace('"', '""') + '"'


def _bm25(api: apsw.FTS5ExtensionApi, *frequencies: apsw.SQLiteValue) -> float:
    """FTS5's bm25() (k1 = 1.2, b = 0.75; higher is better) of the current row, over the
    first ``len(frequencies)`` phrases, given their document frequencies.

    FTS5's own bm25() counts each phrase's documents by walking its whole doclist on
    its first call, a cost that grows with the store; recall bounds it instead.
    """
    cached = api.aux_data
    if cached is None:
        rows = max(api.row_count, 1)
        weights = []
        for phrase, df in enumerate(frequencies):
            assert isinstance(df, int)
            hits = min(df, rows)  # an estimate may exceed the count
            # As FTS5 does: a term in over half the records still weighs a little.
            idf = max(math.log((rows - hits + 0.5) / (hits + 0.5)), 1e-6)
            weights.append((phrase, idf * (_K1 + 1)))
        average = max(api.column_total_size(0) / rows, 1.0)
        # Called once per candidate row: the length norm is reduced to base + slope * size.
        api.aux_data = cached = (_K1 * (1 - _B), _K1 * _B / average, weights)
    base, slope, weights = cached
    norm = base + slope * api.column_size(0)
    offsets = api.phrase_column_offsets
    score = 0.0
    for phrase, weight in weights:
        tf = len(offsets(phrase, 0))
        if tf:
            score += weight * tf / (tf + norm)
    return score


# A dict lookup: the enum's own constructor is a tenth of making a row.
_STATUSES = {status.value: status for status in Status}


def _row(values: tuple[Any, ...]) -> StoredRow:
    lineage = values[15]
    # Positional, in field order (id, tenant, space, subject_ref, key_ref, key_id, status,
    # supersedes, confidence, created_at, updated_at, expires_at, ciphertext, derived_from):
    # keywords took twice as long to make the tuple.
    return StoredRow(
        values[0],
        values[1],
        cached_space(values[2], values[3], values[4]),
        bytes(values[5]),
        None if values[6] is None else bytes(values[6]),
        bytes(values[7]),
        _STATUSES.get(values[8]) or Status(values[8]),
        values[9],
        values[10],
        values[11],
        values[12],
        values[13],
        bytes(values[14]),
        tuple(sorted(lineage.split(" "))) if lineage else (),
    )


def _equal_where_given(pairs: Iterable[tuple[str, Any]]) -> tuple[str, list[Any]]:
    """`` AND column = ?`` for each (column, value) whose value is not None (a filter
    leaves a level open with None), and the values to bind."""
    given = [(column, value) for column, value in pairs if value is not None]
    return "".join(f" AND {column} = ?" for column, _ in given), [value for _, value in given]


def _any_of(tenant: str, where: SpaceFilter, subject_ref: bytes | None) -> tuple[str, list[Any]]:
    """The FROM and WHERE of select_any's rows. In insertion order (rowid), which the
    (tenant, user_id) and (tenant, subject_ref) indexes hold: no sort, so rows stream
    with flat memory, and a page begins with one seek."""
    filters, args = _equal_where_given(
        [
            ("r.subject_ref", subject_ref),
            ("r.user_id", where.user_id),
            ("r.agent_id", where.agent_id),
            ("r.run_id", where.run_id),
        ]
    )
    return f"FROM records r WHERE r.tenant = ?{filters}", [tenant, *args]


def _chunks(values: Iterable[V]) -> Iterator[list[V]]:
    """``values``, each once, in lists short enough to bind in one IN (...)."""
    wanted = list(dict.fromkeys(values))
    for start in range(0, len(wanted), 500):
        yield wanted[start : start + 500]


def _merge_index_segments(conn: apsw.Connection) -> None:
    """Merge some of the full-text index's segments (on the upkeep thread).

    Each write transaction adds a segment to the index, and FTS5 merges them as writes go
    on, but only in steps of 64 pages written: a server's small transactions leave up to
    16 one-page segments waiting (and up to 3 per level above), so a term is looked up
    in 12 segments on average, 18 at worst. A recall reads every one, about 2 µs each:
    at 33k records, 150 µs for 18 segments, 113 µs for one (BENCHMARKS.md). Here, every
    level holding two segments or more (``usermerge``) is merged, about _MERGE_PAGES
    pages at a time (FTS5 writes a term's postings whole), so the write lock is held for
    a few milliseconds. (The setting is the index's own, kept in the store; only such
    merges read it. Set here, not as the store opens: opening writes nothing, and waits
    for no lock.)"""
    with immediate(conn):  # the lock taken first: a read could not become a write later
        if conn.execute("SELECT v FROM ft_config WHERE k = 'usermerge'").fetchall() != [(_USERMERGE,)]:
            conn.execute("INSERT INTO ft(ft, rank) VALUES('usermerge', ?)", (_USERMERGE,)).fetchall()
        conn.execute("INSERT INTO ft(ft, rank) VALUES('merge', ?)", (_MERGE_PAGES,)).fetchall()


def _space_args(tenant: str, space: Space) -> tuple[str, str, str, str]:
    return (tenant, space.user_id, space.agent_id, space.run_id)


class SQLiteBackend:
    def __init__(self, path: Path, conn: apsw.Connection) -> None:
        self.path = path
        # Made once: the HTTP server asks for them on every request.
        self._files = tuple(sidecar_files(path))
        self._conn = conn
        meta = {str(k): str(v) for k, v in conn.execute("SELECT k, v FROM meta")}
        self.store_id: str = meta["store_id"]
        conn.register_fts5_function(_BM25, _bm25)
        self._deferred: HeldIndex | None = None  # while a deferred_index() block is open
        self._depth = 0  # atomic() blocks open
        self._in_snapshot = False
        self._removals = 0  # purges by this connection, whose commits leave data_version as it is
        self._wal_copier: WalCopier | None = None

    @classmethod
    def open(cls, path: Path, *, create: bool, clock: Clock, full_sync: bool = False) -> SQLiteBackend:
        try:
            exists, is_dir = path.exists(), path.is_dir()
        except OSError as exc:  # a name too long, a parent that is a file, ...
            raise StoreError(f"cannot open {path}: {exc.strerror}") from None
        if not create and not exists:
            raise NotFoundError(f"no store at {path}; run `deleatur init` first")
        if is_dir:
            raise StoreError(f"{path} is a directory, not a store file")
        conn = connect(path, create=create, full_sync=full_sync, identify=lambda c: identify(c, path, create=create))
        try:
            prepare(conn, path, new_meta={"store_id": uuid.uuid4().hex, "created_at": str(clock())})
            return cls(path, conn)
        except BaseException:
            conn.close()
            raise

    @contextmanager
    def atomic(self) -> Iterator[None]:
        if self._in_snapshot:
            raise StoreError(
                "a read snapshot is open on this store handle, and can write nothing: make the"
                " call after it ends (nothing was written)"
            )
        self._depth += 1
        try:
            if self._depth == 1:
                with immediate(self._conn):
                    yield
                return
            # Inside another atomic() (a server's group of writes): a savepoint of it.
            held = self._deferred
            mark = None if held is None else held.mark()
            try:
                with savepoint(self._conn):
                    yield
            except BaseException:
                if held is not None and mark is not None:
                    held.undo_to(mark)
                raise
        finally:
            self._depth -= 1

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        self._conn.execute("BEGIN").fetchall()
        self._in_snapshot = True
        try:
            self._conn.execute("SELECT count(*) FROM log_entries").fetchall()  # the snapshot begins here
            yield
        finally:
            self.end_snapshot()

    def end_snapshot(self) -> None:
        if self._in_snapshot:
            self._in_snapshot = False
            self._conn.execute("ROLLBACK").fetchall()

    @contextmanager
    def deferred_index(self) -> Iterator[None]:
        """Inside ``atomic``: hold the index writes back (see :mod:`.heldindex`), and
        make them as the block ends, or before a search reads the index. Inside another
        such block, its writes are the outer block's to make."""
        if self._deferred is not None:
            yield
            return
        held = self._deferred = HeldIndex()
        try:
            yield
        finally:
            self._deferred = None
        self._make_held(held)

    def _make_held(self, held: HeldIndex) -> None:
        deletes, inserts = held.pending()
        if deletes or inserts:
            # All or none, in the transaction they were held in: refused if SQLite has
            # rolled it back itself (they would commit alone, under rowids that later
            # records take); undone whole if one fails (a retry would make some twice).
            with savepoint(self._conn):
                self._conn.executemany("INSERT INTO ft(ft, rowid, body) VALUES ('delete', ?, ?)", deletes)
                self._conn.executemany("INSERT INTO ft(rowid, body) VALUES (?, ?)", inserts)
        held.made_all()

    def erased_accounts(self) -> list[tuple[str, list[str]]] | None:
        """Before a v12 store's first open with its keys (see schema._v12): each account
        erasure's tenant and the blind references of the users it reached, else None."""
        if self._conn.execute("SELECT 1 FROM meta WHERE k = 'rescope_erased'").fetchone() is None:
            return None
        rows = self._conn.execute(
            "SELECT tenant, scope, users FROM erasure_requests"
            " WHERE kind = 'account' AND status != 'failed' AND users IS NOT NULL"
        )
        # Only an erasure of whole accounts (no agent or run named) ended the user's.
        return [
            (str(tenant), str(users).split())
            for tenant, scope, users in rows
            if {k: v for k, v in json.loads(scope).items() if v is not None}.keys() == {"user_id"}
        ]

    def rescoped_erased(self) -> None:
        self._conn.execute("DELETE FROM meta WHERE k = 'rescope_erased'").fetchall()
        self.scrub_after_commit()

    def index_holds_words(self) -> bool:
        """Whether the full-text index is still in its pre-v10 form (see schema._v10)."""
        return self._conn.execute("SELECT 1 FROM meta WHERE k = 'index_terms'").fetchone() is not None

    def indexed_rows(self) -> Iterator[tuple[int, StoredRow]]:
        """Every record the full-text index holds (the active ones), with its rowid."""
        for values in self._conn.execute(
            f"SELECT r.rowid, {_R_COLUMNS}, {_LINEAGE} FROM records r WHERE r.status = 'ACTIVE' ORDER BY r.rowid"
        ):
            yield int(values[0]), _row(values[1:])

    def rebuild_index(self, entries: Iterable[tuple[int, str]]) -> None:
        with immediate(self._conn):
            if not self.index_holds_words():
                return  # another process rebuilt it while this one waited for the lock
            self._conn.execute("INSERT INTO ft(ft) VALUES ('delete-all')")
            self._conn.executemany("INSERT INTO ft(rowid, body) VALUES (?, ?)", entries)
            self._conn.execute("DELETE FROM meta WHERE k = 'index_terms'")
            self.scrub_after_commit()

    def insert_many(self, rows: Sequence[tuple[StoredRow, str]]) -> None:
        if not rows:
            return
        # Explicit rowids (we hold the write lock) let one executemany feed both tables.
        (first,) = self._conn.execute("SELECT coalesce(max(rowid), 0) + 1 FROM records").fetchall()[0]
        start = int(first)  # type: ignore[arg-type]
        self._conn.executemany(
            f"INSERT INTO records(rowid, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    start + n,
                    row.id,
                    row.tenant,
                    row.space.user_id,
                    row.space.agent_id,
                    row.space.run_id,
                    row.subject_ref,
                    row.key_ref,
                    row.key_id,
                    row.status.value,
                    row.supersedes,
                    row.confidence,
                    row.created_at,
                    row.updated_at,
                    row.expires_at,
                    row.ciphertext,
                )
                for n, (row, _) in enumerate(rows)
            ],
        )
        lineage = [(row.id, parent) for row, _ in rows for parent in row.derived_from]
        if lineage:
            self._conn.executemany("INSERT OR IGNORE INTO lineage(child, parent) VALUES (?, ?)", lineage)
        indexed = [(start + n, text) for n, (row, text) in enumerate(rows) if row.status is Status.ACTIVE]
        if self._deferred is not None:
            self._deferred.inserts.extend(indexed)
        else:
            self._conn.executemany("INSERT INTO ft(rowid, body) VALUES (?, ?)", indexed)

    def _one(self, sql: str, args: tuple[Any, ...]) -> StoredRow | None:
        found = self._conn.execute(sql, args).fetchone()
        return None if found is None else _row(found)

    def get(self, tenant: str, record_id: str) -> StoredRow | None:
        return self._one(
            f"SELECT {_R_COLUMNS}, {_LINEAGE} FROM records r WHERE r.id = ? AND +r.tenant = ?", (record_id, tenant)
        )

    def active_by_key(self, tenant: str, space: Space, key_ref: bytes) -> StoredRow | None:
        return self._one(
            f"SELECT {_R_COLUMNS}, {_LINEAGE} FROM records r WHERE {_SPACE} AND r.key_ref = ? AND r.status = 'ACTIVE'",
            (*_space_args(tenant, space), key_ref),
        )

    def set_status(self, record_id: str, status: Status, updated_at: int) -> None:
        self._conn.execute(
            "UPDATE records SET status = ?, updated_at = ? WHERE id = ?", (status.value, updated_at, record_id)
        )

    def unindex(self, record_id: str, *, index_text: str) -> None:
        if self._deferred is not None:
            self._deferred.deletes.extend(
                (int(rowid), index_text)
                for (rowid,) in self._conn.execute("SELECT rowid FROM records WHERE id = ?", (record_id,))
            )
            return
        self._conn.execute(
            "INSERT INTO ft(ft, rowid, body) SELECT 'delete', rowid, ? FROM records WHERE id = ?",
            (index_text, record_id),
        )

    def search(
        self, tenant: str, space: Space, terms: Sequence[str], *, now: int, limit: int, common: int, per_term: int
    ) -> list[tuple[StoredRow, float]]:
        """BM25 over the records holding any of ``terms`` (already folded and prefixed),
        with work bounded by ``per_term`` per term rather than by the store's size.

        A term in more than ``per_term`` records (or ``limit``, if larger) is ranked as
        if its postings were only its ``per_term`` newest matches: it brings those as
        candidates and adds to the score of those records alone, and its document
        frequency is estimated from how densely they fill the newest rowids. A rarer
        term counts in full. If expiry or restriction hides too many candidates,
        ``per_term`` grows eightfold and recall tries again. If every term is in more
        than ``common`` records, the newest matches come first instead, unranked (score
        0). Scores are "higher is better".
        """
        if self._deferred is not None:
            self._make_held(self._deferred)  # the index is read: it must hold what was written
        per_term = max(per_term, limit)
        while True:
            hits, capped = self._rank(tenant, space, terms, now=now, limit=limit, common=common, per_term=per_term)
            if len(hits) == limit or not capped:
                return hits
            per_term *= 8

    def _rank(
        self, tenant: str, space: Space, terms: Sequence[str], *, now: int, limit: int, common: int, per_term: int
    ) -> tuple[list[tuple[StoredRow, float]], bool]:
        """One attempt of :meth:`search`; also says whether a term's candidates were capped."""
        # Each doclist is walked newest-first and stops after per_term + 1 entries: the
        # term's document frequency if it is rare, else where its newest matches begin.
        counts: dict[str, int] = {}
        floors: dict[str, int] = {}
        for term in terms:
            count, floor = self._conn.execute(
                "SELECT count(*), coalesce(min(rowid), 0) FROM"
                " (SELECT rowid FROM ft WHERE ft MATCH ? ORDER BY rowid DESC LIMIT ?)",
                (_phrase(term), per_term + 1),
            ).fetchall()[0]
            assert isinstance(count, int) and isinstance(floor, int)
            if count > per_term:
                floors[term] = floor
            elif count:
                counts[term] = count
        if not counts and not floors:
            return [], False
        # The newest rowid bounds the capped terms' ranges (and estimates their counts);
        # with none, the one range is every rowid, and the statement is not needed.
        newest = _MOST_ROWID
        if floors:
            (found,) = self._conn.execute("SELECT coalesce(max(rowid), 0) FROM records").fetchall()[0]
            assert isinstance(found, int)
            newest = found
        for term, floor in floors.items():
            counts[term] = per_term * newest // max(newest - floor, 1)
        if all(count > common for count in counts.values()):
            return self._newest(tenant, space, " OR ".join(map(_phrase, counts)), now=now, limit=limit), False
        # A capped term is ranked as if its postings were only its newest matches: it
        # brings those as candidates and adds to the score of those records only. So the
        # rowids split into ranges, between one term's first newest match and the next's,
        # and each range is one FTS5 cursor over the terms that count in it: every doclist
        # is walked over at most its newest per_term entries (a rare one, whole).
        rare = [term for term in counts if term not in floors]
        bounds = sorted(set(floors.values()))
        cursors: list[tuple[list[str], int, int]] = []
        for low, high in zip([0, *bounds], [*bounds, newest], strict=True):
            active = rare + [term for term, floor in floors.items() if floor <= low]
            if active and low < high:
                cursors.append((active, low, high))
        # Where no capped term counts, FTS5's own bm25() (in C) gives the same score: its
        # walk of each term's doclist to count it is then bounded too.
        selects, args = [], []
        for active, low, high in cursors:
            frequencies = [counts[term] for term in active] if any(term in floors for term in active) else []
            score = f"{_BM25}(ft, {', '.join('?' * len(frequencies))})" if frequencies else "-bm25(ft)"
            selects.append(f"SELECT rowid, {score} AS score FROM ft WHERE ft MATCH ? AND rowid > ? AND rowid <= ?")
            args += [*frequencies, " OR ".join(map(_phrase, active)), low, high]
        union = " UNION ALL ".join(selects)
        # Rank inside SQLite first, then read only the best candidates' rows; widen the
        # window (up to every candidate) if expiry or restriction filtered too many out.
        candidates = sum(counts[term] for term in rare) + per_term * len(floors)
        window = max(limit * 4, 32)
        while True:
            rows = self._conn.execute(
                f"SELECT {_R_COLUMNS}, {_LINEAGE}, c.score FROM ({union} ORDER BY score DESC LIMIT ?) c"
                f" CROSS JOIN records r ON r.rowid = c.rowid WHERE {_VISIBLE}"
                " ORDER BY c.score DESC, r.rowid DESC LIMIT ?",
                (*args, window, *_space_args(tenant, space), now, tenant, limit),
            ).fetchall()
            if len(rows) == limit or window >= candidates:
                break
            window *= 8
        return [(_row(r[:16]), float(r[16] or 0.0)) for r in rows], bool(floors)

    def _newest(
        self, tenant: str, space: Space, fts_query: str, *, now: int, limit: int
    ) -> list[tuple[StoredRow, float]]:
        """The newest matches first (FTS5 walks its doclist backwards and stops), score 0."""
        window = max(limit * 4, 32)
        while True:
            rows = self._conn.execute(
                f"SELECT {_R_COLUMNS}, {_LINEAGE} FROM"
                " (SELECT rowid FROM ft WHERE ft MATCH ? ORDER BY rowid DESC LIMIT ?) c"
                f" CROSS JOIN records r ON r.rowid = c.rowid WHERE {_VISIBLE} ORDER BY r.rowid DESC LIMIT ?",
                (fts_query, window, *_space_args(tenant, space), now, tenant, limit),
            ).fetchall()
            if len(rows) == limit or window >= 1 << 30:
                break
            matches = sum(
                1 for _ in self._conn.execute("SELECT rowid FROM ft WHERE ft MATCH ? LIMIT ?", (fts_query, window + 1))
            )
            if matches <= window:
                break  # every match was already considered
            window *= 8
        return [(_row(r), 0.0) for r in rows]

    def select(self, where: RowFilter) -> Generator[StoredRow, None, None]:
        sql = f"SELECT {_R_COLUMNS}, {_LINEAGE} FROM records r WHERE {_SPACE}"
        args: list[Any] = list(_space_args(where.tenant, where.space))
        if where.subject_ref is not None:
            sql += " AND r.subject_ref = ?"
            args.append(where.subject_ref)
        if where.key_ref is not None:
            sql += " AND r.key_ref = ?"
            args.append(where.key_ref)
        if where.after is not None:
            sql += " AND r.id > ?"
            args.append(where.after)
        statuses = sorted(s.value for s in where.statuses)
        sql += f" AND r.status IN ({', '.join('?' * len(statuses))}) ORDER BY r.id"
        args.extend(statuses)
        if where.limit is not None:
            sql += " LIMIT ?"
            args.append(where.limit)
        for values in self._conn.execute(sql, args):
            yield _row(values)

    def select_any(
        self, tenant: str, where: SpaceFilter, *, subject_ref: bytes | None = None
    ) -> Generator[StoredRow, None, None]:
        sql, args = _any_of(tenant, where, subject_ref)
        for values in self._conn.execute(f"SELECT {_R_COLUMNS}, {_LINEAGE} {sql} ORDER BY r.rowid", args):
            yield _row(values)

    def select_any_page(
        self, tenant: str, where: SpaceFilter, *, subject_ref: bytes | None = None, after: int, limit: int
    ) -> list[tuple[int, StoredRow]]:
        sql, args = _any_of(tenant, where, subject_ref)
        rows = self._conn.execute(
            f"SELECT r.rowid, {_R_COLUMNS}, {_LINEAGE} {sql} AND r.rowid > ? ORDER BY r.rowid LIMIT ?",
            (*args, after, limit),
        )
        return [(int(values[0]), _row(values[1:])) for values in rows]

    def retention_due(self, tenant: str, *, now: int, created_before: int | None) -> list[StoredRow]:
        sql = f"SELECT {_R_COLUMNS}, {_LINEAGE} FROM records r WHERE r.tenant = ? AND r.expires_at <= ?"
        args: list[Any] = [tenant, now]
        if created_before is not None:
            sql += f" UNION SELECT {_R_COLUMNS}, {_LINEAGE} FROM records r WHERE r.tenant = ? AND r.created_at < ?"
            args += [tenant, created_before]
        return [_row(values) for values in self._conn.execute(sql + " ORDER BY 1", args)]

    def get_setting(self, name: str) -> str | None:
        row = self._conn.execute("SELECT v FROM meta WHERE k = ?", ("setting:" + name,)).fetchone()
        return None if row is None else str(row[0])

    def put_setting(self, name: str, value: str | None) -> None:
        if value is None:
            self._conn.execute("DELETE FROM meta WHERE k = ?", ("setting:" + name,))
        else:
            self._conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES (?, ?)", ("setting:" + name, value))

    def children(self, tenant: str, parents: Iterable[str]) -> set[str]:
        found: set[str] = set()
        for chunk in _chunks(parents):
            # Probe lineage by parent first (its index), then keep the tenant's rows: a
            # plain join lets the planner scan the tenant's records instead.
            rows = self._conn.execute(
                f"SELECT l.child FROM lineage l CROSS JOIN records r ON r.id = l.child"
                f" WHERE l.parent IN ({', '.join('?' * len(chunk))}) AND r.tenant = ?",
                (*chunk, tenant),
            )
            found.update(str(child) for (child,) in rows)
        return found

    def rows(self, tenant: str, ids: Iterable[str]) -> list[StoredRow]:
        out: list[StoredRow] = []
        for chunk in _chunks(ids):
            out += [
                _row(v)
                for v in self._conn.execute(
                    f"SELECT {_R_COLUMNS}, {_LINEAGE} FROM records r"
                    f" WHERE +r.tenant = ? AND r.id IN ({', '.join('?' * len(chunk))}) ORDER BY r.id",
                    (tenant, *chunk),
                )
            ]
        return out

    def holds_subject(self, tenant: str, subject_ref: bytes) -> bool:
        return (
            self._conn.execute(
                "SELECT 1 WHERE EXISTS (SELECT 1 FROM records WHERE tenant = ?1 AND subject_ref = ?2)"
                " OR EXISTS (SELECT 1 FROM restrictions WHERE tenant = ?1 AND subject_ref = ?2)",
                (tenant, subject_ref),
            ).fetchone()
            is not None
        )

    def count_subject(self, tenant: str, subject_ref: bytes) -> int:
        for (value,) in self._conn.execute(
            "SELECT count(*) FROM records WHERE tenant = ? AND subject_ref = ?", (tenant, subject_ref)
        ):
            return int(value)
        return 0

    def put_request(self, row: Mapping[str, Any], *, replace: bool) -> None:
        # A new request takes the next number of its tenant's list, under the write lock
        # (every write holds it from its start), so the list's order is the commit order.
        sql = (
            f"INSERT INTO erasure_requests({', '.join(row)}, seq) VALUES ({', '.join('?' * len(row))},"
            " (SELECT coalesce(max(seq), 0) + 1 FROM erasure_requests WHERE tenant = ?))"
        )
        if replace:
            # Not INSERT OR REPLACE: the request keeps its number, so a cursor naming it
            # keeps its place, and its first receipt, which its deadline runs from.
            # A failure, recorded after its transaction was rolled back, never replaces
            # what another caller's erasure under the same id committed meanwhile, nor
            # (failing before it could compare them) a request for a different erasure.
            changed = ", ".join(f"{c} = excluded.{c}" for c in row if c not in ("tenant", "id", "received_at"))
            sql += (
                f" ON CONFLICT (tenant, id) DO UPDATE SET {changed}"
                " WHERE excluded.fingerprint IS erasure_requests.fingerprint"
                " AND (excluded.status != 'failed' OR erasure_requests.status = 'failed')"
            )
        self._conn.execute(sql, (*row.values(), row["tenant"]))

    def forget_scope_keys(self, tenant: str, user_refs: Sequence[str]) -> None:
        erased = set(user_refs)
        rows = self._conn.execute(
            "SELECT id, users FROM erasure_requests WHERE tenant = ? AND scope_key IS NOT NULL", (tenant,)
        ).fetchall()
        reached = [(tenant, str(i)) for i, users in rows if users is not None and erased & set(str(users).split())]
        self._conn.executemany("UPDATE erasure_requests SET scope_key = NULL WHERE tenant = ? AND id = ?", reached)

    def pending_key_lists(self) -> list[str]:
        return [
            str(k)
            for (k,) in self._conn.execute(
                "SELECT pending_keys FROM erasure_requests WHERE status = 'keys_pending'"
                " UNION ALL SELECT v FROM meta WHERE k = ?",
                (_KEYS_COLLECTING,),
            )
        ]

    def collecting_keys(self) -> list[bytes]:
        row = self._conn.execute("SELECT v FROM meta WHERE k = ?", (_KEYS_COLLECTING,)).fetchone()
        return [] if row is None else [bytes.fromhex(k) for k in json.loads(str(row[0]))]

    def set_collecting_keys(self, key_ids: Sequence[bytes]) -> None:
        if key_ids:
            value = json.dumps([k.hex() for k in key_ids])
            self._conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES (?, ?)", (_KEYS_COLLECTING, value))
        else:
            self._conn.execute("DELETE FROM meta WHERE k = ?", (_KEYS_COLLECTING,))

    def any_restricted(self, tenant: str, subject_refs: Sequence[bytes]) -> bool:
        if not subject_refs:
            return False
        marks = ", ".join("?" * len(subject_refs))
        sql = f"SELECT 1 FROM restrictions WHERE tenant = ? AND subject_ref IN ({marks}) LIMIT 1"
        return self._conn.execute(sql, (tenant, *subject_refs)).fetchone() is not None

    def pending_requests(self) -> list[dict[str, Any]]:
        rows = self._conn.execute(
            f"SELECT {', '.join(_REQUEST_COLUMNS)} FROM erasure_requests WHERE status = 'keys_pending'"
        )
        return [dict(zip(_REQUEST_COLUMNS, row, strict=True)) for row in rows]

    def get_request(self, tenant: str, request_id: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            f"SELECT {', '.join(_REQUEST_COLUMNS)} FROM erasure_requests WHERE tenant = ? AND id = ?",
            (tenant, request_id),
        ).fetchone()
        return None if row is None else dict(zip(_REQUEST_COLUMNS, row, strict=True))

    def requests(self, tenant: str, *, after: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        sql = f"SELECT {', '.join(_REQUEST_COLUMNS)} FROM erasure_requests WHERE tenant = ?"
        args: list[Any] = [tenant]
        if after is not None:
            # An unknown cursor matches nothing (NULL), so it tells no caller which ids exist.
            sql += " AND seq > (SELECT seq FROM erasure_requests WHERE tenant = ? AND id = ?)"
            args += [tenant, after]
        sql += " ORDER BY seq"
        if limit is not None:
            sql, args = sql + " LIMIT ?", [*args, limit]
        return [dict(zip(_REQUEST_COLUMNS, row, strict=True)) for row in self._conn.execute(sql, args)]

    def put_confirmation(self, token_hash: bytes, tenant: str, digest: bytes, terms: bytes, expires_at: int) -> None:
        self._conn.execute(
            "INSERT INTO erasure_confirmations(token_hash, tenant, plan_digest, terms, expires_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (token_hash, tenant, digest, terms, expires_at),
        )

    def use_confirmation(
        self, token_hash: bytes, tenant: str, confirmed: tuple[bytes, bytes] | None, now: int
    ) -> str | None:
        """As the protocol says. Without what it must confirm a spent token passes: it
        still lets the erasure it confirmed be repeated (see erasure.engine)."""
        row = self._conn.execute(
            "SELECT plan_digest, expires_at, used_at, terms FROM erasure_confirmations"
            " WHERE token_hash = ? AND tenant = ?",
            (token_hash, tenant),
        ).fetchone()
        if row is None:
            return "unknown confirmation token"
        if int(row[1]) < now:
            return "confirmation token expired"
        if confirmed is None:
            return None
        if row[2] is not None:
            return "confirmation token already used"
        digest, terms = confirmed
        if bytes(row[0]) != digest:
            return "confirmation token was issued for a different erasure (the blast radius changed) or caller"
        if bytes(row[3]) != terms:
            return "confirmation token was issued for another legal basis or requester: run the dry run with this one"
        self._conn.execute(_SPEND + " WHERE token_hash = ?", (now, token_hash))
        return None

    def spend_confirmations(self, tenant: str, digests: Sequence[bytes], now: int) -> None:
        for chunk in _chunks(digests):
            self._conn.execute(
                _SPEND + f" WHERE tenant = ? AND used_at IS NULL AND plan_digest IN ({', '.join('?' * len(chunk))})",
                (now, tenant, *chunk),
            )

    def drop_confirmations(self, now: int) -> bool:
        # No index on expires_at: the table holds only the tokens of one lifetime, as
        # every issue removes those past theirs.
        removed = self._conn.execute(
            "DELETE FROM erasure_confirmations WHERE expires_at < ? RETURNING 1", (now,)
        ).fetchall()
        if removed:
            self.scrub_after_commit()
        return bool(removed)

    def put_restriction(self, row: Mapping[str, Any]) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO restrictions(tenant, subject_ref, pseudonym, reason, actor, since)"
            " VALUES (:tenant, :subject_ref, :pseudonym, :reason, :actor, :since)",
            dict(row),
        )

    def delete_restriction(self, tenant: str, subject_ref: bytes) -> bool:
        found = self._conn.execute(
            "DELETE FROM restrictions WHERE tenant = ? AND subject_ref = ? RETURNING 1", (tenant, subject_ref)
        ).fetchone()
        if found is not None:
            self.scrub_after_commit()
        return found is not None

    def restrictions(self, tenant: str, subject_ref: bytes | None = None) -> list[dict[str, Any]]:
        sql = "SELECT tenant, subject_ref, pseudonym, reason, actor, since FROM restrictions WHERE tenant = ?"
        args: tuple[Any, ...] = (tenant,)
        if subject_ref is not None:
            sql, args = sql + " AND subject_ref = ?", (tenant, subject_ref)
        names = ("tenant", "subject_ref", "pseudonym", "reason", "actor", "since")
        return [dict(zip(names, row, strict=True)) for row in self._conn.execute(sql + " ORDER BY since", args)]

    def put_decision(self, row: Mapping[str, Any], uses: Sequence[str], *, replace: bool) -> None:
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        self._conn.execute(
            f"{verb} INTO decisions({', '.join(_DECISION_COLUMNS)})"
            f" VALUES ({', '.join(':' + c for c in _DECISION_COLUMNS)})",
            dict(row),
        )
        self._conn.executemany(
            "INSERT OR IGNORE INTO decision_uses(record_id, tenant, decision_id) VALUES (?, ?, ?)",
            [(record_id, row["tenant"], row["id"]) for record_id in uses],
        )

    def decision(self, tenant: str, decision_id: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            f"SELECT {', '.join(_DECISION_COLUMNS)} FROM decisions WHERE tenant = ? AND id = ?", (tenant, decision_id)
        ).fetchone()
        return None if row is None else dict(zip(_DECISION_COLUMNS, row, strict=True))

    def decisions_using(self, tenant: str, record_ids: Iterable[str]) -> list[str]:
        found: set[str] = set()
        for record_id in record_ids:
            found.update(
                str(r[0])
                for r in self._conn.execute(
                    "SELECT decision_id FROM decision_uses WHERE record_id = ? AND tenant = ?", (record_id, tenant)
                )
            )
        return sorted(found)

    def decisions_in(self, tenant: str, scope: SpaceFilter) -> list[str]:
        # No index: only an account erasure asks, and it reads the tenant's decisions once.
        filters, args = _equal_where_given(
            [("user_id", scope.user_id), ("agent_id", scope.agent_id), ("run_id", scope.run_id)]
        )
        rows = self._conn.execute(f"SELECT id FROM decisions WHERE tenant = ?{filters}", (tenant, *args))
        return sorted(str(r[0]) for r in rows)

    def put_principal(self, row: Mapping[str, Any]) -> None:
        self._conn.execute(
            f"INSERT INTO principals({', '.join(_PRINCIPAL_COLUMNS)})"
            f" VALUES ({', '.join(':' + c for c in _PRINCIPAL_COLUMNS)})",
            dict(row),
        )

    def principal(self, principal_id: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            f"SELECT {', '.join(_PRINCIPAL_COLUMNS)} FROM principals WHERE id = ?", (principal_id,)
        ).fetchone()
        return None if row is None else dict(zip(_PRINCIPAL_COLUMNS, row, strict=True))

    def principals(self, tenant: str) -> list[dict[str, Any]]:
        rows = self._conn.execute(
            f"SELECT {', '.join(_PRINCIPAL_COLUMNS)} FROM principals WHERE tenant = ? ORDER BY created_at, id",
            (tenant,),
        )
        return [dict(zip(_PRINCIPAL_COLUMNS, row, strict=True)) for row in rows]

    def revoke_principal(self, tenant: str, principal_id: str, at: int) -> bool:
        return (
            self._conn.execute(
                "UPDATE principals SET revoked_at = ? WHERE tenant = ? AND id = ? AND revoked_at IS NULL RETURNING 1",
                (at, tenant, principal_id),
            ).fetchone()
            is not None
        )

    def set_principal_scopes(self, tenant: str, principal_id: str, scopes: str) -> None:
        self._conn.execute(
            "UPDATE principals SET scopes = ? WHERE tenant = ? AND id = ?", (scopes, tenant, principal_id)
        ).fetchall()

    def purge(self, record_ids: Iterable[str]) -> int:
        count = 0
        for record_id in dict.fromkeys(record_ids):
            count += (
                self._conn.execute("DELETE FROM records WHERE id = ? RETURNING 1", (record_id,)).fetchone() is not None
            )
            self._conn.execute("DELETE FROM lineage WHERE child = ?", (record_id,))
        # A stub serves only while some record still derives from it.
        # (Correlated, so each stub is one probe of lineage_parent, not a list of every parent.)
        self._conn.execute(
            "DELETE FROM lineage_stubs WHERE NOT EXISTS (SELECT 1 FROM lineage WHERE parent = lineage_stubs.id)"
        )
        if count:
            self.scrub_after_commit()
            self._removals += 1
            made = int(self.get_setting(REMOVALS_MADE) or 0)
            self.put_setting(REMOVALS_MADE, str(made + 1))
        return count

    def removal_mark(self) -> RemovalMark:
        return RemovalMark(self._removals, self.data_version(), self.get_setting(REMOVALS_MADE))

    def removed_since(self, mark: RemovalMark) -> bool:
        if mark.own != self._removals:
            return True
        version = self.data_version()
        if version == mark.version:
            return False
        if self.get_setting(REMOVALS_MADE) != mark.count:
            return True
        mark.version = version
        return False

    def still_derived_from(self, record_ids: Iterable[str]) -> set[str]:
        found: set[str] = set()
        for chunk in _chunks(record_ids):
            sql = f"SELECT parent FROM lineage WHERE parent IN ({', '.join('?' * len(chunk))})"
            found.update(str(r[0]) for r in self._conn.execute(sql, chunk))
        return found

    def add_stubs(self, stubs: Sequence[LineageStub]) -> None:
        self._conn.executemany(
            "INSERT OR REPLACE INTO lineage_stubs(id, tenant, subject_ref, user_ref, agent_ref, run_ref)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [(s.id, s.tenant, s.subject_ref, s.user_ref, s.agent_ref, s.run_ref) for s in stubs],
        )

    def lineage_stubs(self, tenant: str, subject_ref: bytes | None, space: SpaceRefs) -> list[str]:
        filters, args = _equal_where_given(
            [
                ("subject_ref", subject_ref),
                ("user_ref", space.user_ref),
                ("agent_ref", space.agent_ref),
                ("run_ref", space.run_ref),
            ]
        )
        rows = self._conn.execute(f"SELECT id FROM lineage_stubs WHERE tenant = ?{filters}", (tenant, *args))
        return sorted(str(r[0]) for r in rows)

    def data_version(self) -> int:
        return data_version(self._conn)

    def log_size(self) -> int:
        (value,) = self._conn.execute("SELECT coalesce(max(idx) + 1, 0) FROM log_entries").fetchall()[0]
        assert isinstance(value, int)
        return value

    def log_append(self, start: int, entries: Sequence[tuple[bytes, str | None, bytes]], nodes: Iterable[Node]) -> None:
        self._conn.executemany(
            "INSERT INTO log_entries(idx, entry, record_id, mac) VALUES (?, ?, ?, ?)",
            [(start + i, entry, record_id, mac) for i, (entry, record_id, mac) in enumerate(entries)],
        )
        self._conn.executemany(
            "INSERT INTO log_nodes(pos, hash) VALUES (?, ?)",
            [(level << _LEVEL_SHIFT | index, h) for level, index, h in nodes],
        )

    def log_nodes(self, positions: Sequence[tuple[int, int]]) -> list[bytes]:
        if not positions:
            return []
        keys = [level << _LEVEL_SHIFT | index for level, index in positions]
        found: dict[int, bytes] = {}
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            rows = self._conn.execute(
                f"SELECT pos, hash FROM log_nodes WHERE pos IN ({', '.join('?' * len(chunk))})", chunk
            )
            found.update((int(pos), bytes(h)) for pos, h in rows)
        missing = [k for k in keys if k not in found]
        if missing:
            raise StoreError(
                f"the log is missing the hash of subtree {missing[0] >> _LEVEL_SHIFT}/{missing[0] & _INDEX_MASK}"
            )
        return [found[k] for k in keys]

    def log_level(self, level: int) -> Iterator[tuple[int, bytes]]:
        low = level << _LEVEL_SHIFT
        for pos, digest in self._conn.execute(
            "SELECT pos, hash FROM log_nodes WHERE pos >= ? AND pos < ? ORDER BY pos", (low, low + (1 << _LEVEL_SHIFT))
        ):
            yield int(pos) & _INDEX_MASK, bytes(digest)

    def log_entries(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        rows = self._conn.execute(
            "SELECT idx, entry FROM log_entries WHERE idx >= ? AND idx < ? ORDER BY idx",
            (start, end if end is not None else 1 << 62),
        )
        for idx, entry in rows:
            yield int(idx), bytes(entry)

    def log_entries_with_macs(self, start: int, end: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        rows = self._conn.execute(
            "SELECT idx, entry, mac FROM log_entries WHERE idx >= ? AND idx < ? ORDER BY idx", (start, end)
        )
        for idx, entry, mac in rows:
            yield int(idx), bytes(entry), None if mac is None else bytes(mac)

    def log_macs_pending(self) -> bool:
        """Whether the entries written before schema v16 still lack their MACs."""
        return self._conn.execute("SELECT 1 FROM meta WHERE k = 'log_macs'").fetchone() is not None

    def mac_log_entries(self, mac: Callable[[int, bytes], bytes]) -> None:
        with immediate(self._conn):
            if not self.log_macs_pending():
                return  # another process gave them theirs while this one waited for the lock
            start = 0
            while True:
                # In batches, each read whole before it is written: a million entries are
                # not held at once, and no cursor reads rows being updated.
                rows = list(self._entries_without_mac(start))
                if not rows:
                    break
                self._conn.executemany(
                    "UPDATE log_entries SET mac = ? WHERE idx = ?", [(mac(idx, raw), idx) for idx, raw in rows]
                )
                start = rows[-1][0] + 1
            self._conn.execute("DELETE FROM meta WHERE k = 'log_macs'")

    def _entries_without_mac(self, start: int) -> Iterator[tuple[int, bytes]]:
        rows = self._conn.execute(
            "SELECT idx, entry FROM log_entries WHERE idx >= ? AND mac IS NULL ORDER BY idx LIMIT 10000", (start,)
        )
        for idx, entry in rows:
            yield int(idx), bytes(entry)

    def log_entries_with_users(self, tenant: str, start: int = 0) -> Iterator[tuple[int, bytes, str | None]]:
        # One scan: the join looks each record up by its unique id, in C.
        rows = self._conn.execute(
            "SELECT l.idx, l.entry, r.user_id FROM log_entries l"
            " LEFT JOIN records r ON r.id = l.record_id AND r.tenant = ? WHERE l.idx >= ? ORDER BY l.idx",
            (tenant, start),
        )
        for idx, entry, user_id in rows:
            yield int(idx), bytes(entry), None if user_id is None else str(user_id)

    def replace_log_entries(self, entries: Sequence[tuple[int, bytes]]) -> None:
        self._conn.executemany("UPDATE log_entries SET entry = ? WHERE idx = ?", [(raw, i) for i, raw in entries])
        self.scrub_after_commit()

    def newest_id(self) -> str | None:
        (newest,) = self._conn.execute("SELECT max(id) FROM records").fetchall()[0]
        return None if newest is None else str(newest)

    def log_entries_naming(self, token: str) -> Iterator[tuple[int, bytes]]:
        # instr() scans in C; the entries are small and a scan of a million takes well under a second.
        for idx, entry in self._conn.execute(
            "SELECT idx, entry FROM log_entries WHERE instr(entry, ?) > 0 ORDER BY idx", (f'"{token}"'.encode(),)
        ):
            yield int(idx), bytes(entry)

    def log_of_records(self, record_ids: Sequence[str]) -> Iterator[tuple[str, int, bytes]]:
        for start in range(0, len(record_ids), 500):
            chunk = record_ids[start : start + 500]
            rows = self._conn.execute(
                f"SELECT record_id, idx, entry FROM log_entries WHERE record_id IN ({', '.join('?' * len(chunk))})"
                " ORDER BY idx",
                tuple(chunk),
            )
            for record_id, idx, entry in rows:
                yield str(record_id), int(idx), bytes(entry)

    def log_indexes_of(self, record_id: str) -> list[int]:
        return [
            int(r[0])
            for r in self._conn.execute("SELECT idx FROM log_entries WHERE record_id = ? ORDER BY idx", (record_id,))
        ]

    def put_checkpoint(self, size: int, note: str, *, replace: bool) -> None:
        if self._depth > 1:
            # A write group signs as it commits, in its own transaction (depth 1).
            raise StoreError("a checkpoint cannot be signed inside a group of writes, which may yet roll back")
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        self._conn.execute(f"{verb} INTO log_checkpoints(size, note) VALUES (?, ?)", (size, note))

    def checkpoint(self, size: int | None = None) -> tuple[int, str] | None:
        if size is None:
            row = self._conn.execute("SELECT size, note FROM log_checkpoints ORDER BY size DESC LIMIT 1").fetchone()
        else:
            row = self._conn.execute("SELECT size, note FROM log_checkpoints WHERE size = ?", (size,)).fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    def checkpoints(self, *, newest_first: bool = False) -> Iterator[tuple[int, str]]:
        order = "DESC" if newest_first else "ASC"
        for size, note in self._conn.execute(f"SELECT size, note FROM log_checkpoints ORDER BY size {order}"):
            yield int(size), str(note)

    def put_signing_key(self, key_id: str, vkey: str, log_index: int, created_at: int) -> None:
        self._conn.execute(
            "INSERT INTO signing_keys(key_id, vkey, log_index, created_at) VALUES (?, ?, ?, ?)",
            (key_id, vkey, log_index, created_at),
        )

    def signing_keys(self) -> list[tuple[str, str, int, int]]:
        rows = self._conn.execute("SELECT key_id, vkey, log_index, created_at FROM signing_keys ORDER BY log_index")
        return [(str(a), str(b), int(c), int(d)) for a, b, c, d in rows]

    def scrub_after_commit(self) -> None:
        """In a transaction that removes data: mark the store until a scrub succeeds, so
        that if the process dies between the commit and the scrub, the next open scrubs.
        Each removal marks it anew, so a scrub clears only a mark that was there before it
        truncated the -wal. Refused inside a nested transaction (a write group's), whose
        commit comes after the removal's call has returned, with no scrub."""
        if self._depth > 1:
            raise StoreError("a removal cannot be made in a group of writes: its -wal is truncated after it commits")
        self._conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES (?, ?)", (_SCRUB_PENDING, uuid.uuid4().hex))

    def scrub_mark(self) -> str | None:
        row = self._conn.execute("SELECT v FROM meta WHERE k = ?", (_SCRUB_PENDING,)).fetchone()
        return None if row is None else str(row[0])

    def scrub_pending(self) -> bool:
        return self.scrub_mark() is not None

    def scrub(self, *, wait: bool = True, settled: str | None = None) -> bool:
        clean = scrub(self._conn, wait=wait)
        if clean and settled is not None:
            with immediate(self._conn):
                self._conn.execute("DELETE FROM meta WHERE k = ? AND v = ?", (_SCRUB_PENDING, settled))
                if self._conn.changes():
                    self._clear_wal_not_truncated()
            # The -wal holds only that change now: truncating it again leaves it empty, as a
            # scrub promises; if a reader arrived meanwhile, what stays is no removed data.
            scrub(self._conn)
        return clean

    def _clear_wal_not_truncated(self) -> None:
        """The requests that said a reader kept the -wal from being truncated no longer
        hold: it was truncated after each of them committed."""
        rows = self._conn.execute(
            "SELECT tenant, id, counts FROM erasure_requests WHERE counts LIKE ?", (f'%"{WAL_NOT_TRUNCATED}"%',)
        ).fetchall()
        for tenant, request_id, text in rows:
            counts = {k: v for k, v in json.loads(str(text)).items() if k != WAL_NOT_TRUNCATED}
            self._conn.execute(
                "UPDATE erasure_requests SET counts = ? WHERE tenant = ? AND id = ?",
                (json.dumps(counts, sort_keys=True), tenant, request_id),
            )

    def files(self) -> list[Path]:
        return list(self._files)

    def upkeep_in_background(self) -> None:
        if self._wal_copier is None:
            self._wal_copier = WalCopier(self.path, self._conn, tidy=_merge_index_segments)
            # A handle dropped without close() would leave the thread, and the store's
            # connection it holds, open for the life of the process.
            weakref.finalize(self, self._wal_copier.close)

    def close(self) -> None:
        if self._wal_copier is not None:
            self._wal_copier.close()
        self._conn.close()
