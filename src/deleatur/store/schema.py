"""The SQLite store's schema, its version, and the path from each version to the next.

``PRAGMA application_id`` marks the file as ours; ``PRAGMA user_version`` holds
the schema version. Opening a store runs every migration from its version up to
:data:`SCHEMA_VERSION`, all in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import apsw

from ..errors import SchemaVersionError, StoreError
from ..sqlitefile import immediate, is_ours

APPLICATION_ID = 0x444C5452  # "DLTR"


def _v1(conn: apsw.Connection) -> None:
    statements = [
        "CREATE TABLE meta(k TEXT PRIMARY KEY, v TEXT NOT NULL) WITHOUT ROWID",
        """CREATE TABLE records(
            rowid INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            agent_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            subject_ref BLOB NOT NULL,
            key_ref BLOB,
            key_id BLOB NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('ACTIVE', 'RETIRED', 'SUPERSEDED')),
            supersedes TEXT,
            confidence REAL,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            expires_at INTEGER,
            ciphertext BLOB NOT NULL
        )""",
        "CREATE INDEX records_space ON records(tenant, user_id, agent_id, run_id, status)",
        "CREATE INDEX records_subject ON records(tenant, subject_ref)",
        "CREATE INDEX records_key ON records(tenant, user_id, agent_id, run_id, key_ref) WHERE key_ref IS NOT NULL",
        "CREATE TABLE lineage(child TEXT NOT NULL, parent TEXT NOT NULL, PRIMARY KEY (child, parent)) WITHOUT ROWID",
        "CREATE INDEX lineage_parent ON lineage(parent)",
        # Contentless: the index keeps terms, never a copy of the text. Not
        # contentless_delete=1: that records deletions as tombstones and leaves the
        # terms on disk until a merge; removal goes through the 'delete' command instead.
        # Every indexed word carries its space's opaque token as a prefix, so each space
        # has posting lists of its own: a query touches only its space's records.
        "CREATE VIRTUAL TABLE ft USING fts5(body, content='', tokenize='unicode61 remove_diacritics 2')",
        # Deleting from the index removes the terms from its b-tree pages instead of
        # recording a delete marker beside them (SQLite >= 3.42).
        "INSERT INTO ft(ft, rank) VALUES ('secure-delete', 1)",
    ]
    for sql in statements:
        conn.execute(sql).fetchall()


def _v2(conn: apsw.Connection) -> None:
    """The verifiable log. A store migrated from v1 starts its log empty: records
    written before have no write entry, and ``log verify`` says where the log begins."""
    statements = [
        # One row per log entry; record_id links a write to its receipt (ids are not personal).
        "CREATE TABLE log_entries(idx INTEGER PRIMARY KEY, entry BLOB NOT NULL, record_id TEXT)",
        "CREATE INDEX log_entries_record ON log_entries(record_id) WHERE record_id IS NOT NULL",
        # Every complete subtree hash, keyed by level << 50 | index: proofs read O(log n) rows.
        "CREATE TABLE log_nodes(pos INTEGER PRIMARY KEY, hash BLOB NOT NULL)",
        "CREATE TABLE log_checkpoints(size INTEGER PRIMARY KEY, note TEXT NOT NULL)",
        "CREATE TABLE signing_keys(key_id TEXT PRIMARY KEY, vkey TEXT NOT NULL UNIQUE,"
        " log_index INTEGER NOT NULL, created_at INTEGER NOT NULL)",
    ]
    for sql in statements:
        conn.execute(sql).fetchall()


def _v3(conn: apsw.Connection) -> None:
    """Erasure requests (Art. 17) and the single-use confirmation tokens of dry runs."""
    statements = [
        # The subject appears only as a pseudonym keyed by its (soon destroyed) data key,
        # and as the blind index the absence check needs (see README, "Erasure").
        """CREATE TABLE erasure_requests(
            tenant TEXT NOT NULL,
            id TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('subject', 'account', 'retention')),
            subject_pseudonym TEXT,
            subject_ref BLOB,
            scope TEXT NOT NULL,
            basis TEXT NOT NULL,
            requester TEXT NOT NULL,
            received_at INTEGER NOT NULL,
            completed_at INTEGER,
            status TEXT NOT NULL,
            error TEXT,
            counts TEXT NOT NULL,
            record_ids TEXT NOT NULL,
            tombstones TEXT NOT NULL,
            pending_keys TEXT NOT NULL,
            fingerprint BLOB NOT NULL,
            PRIMARY KEY (tenant, id)
        ) WITHOUT ROWID""",
        # Every write checks the keys an erasure committed but has not destroyed yet.
        "CREATE INDEX erasure_pending ON erasure_requests(status) WHERE status = 'keys_pending'",
        """CREATE TABLE erasure_confirmations(
            token_hash BLOB PRIMARY KEY,
            tenant TEXT NOT NULL,
            plan_digest BLOB NOT NULL,
            expires_at INTEGER NOT NULL,
            used_at INTEGER
        ) WITHOUT ROWID""",
    ]
    for sql in statements:
        conn.execute(sql).fetchall()


def _v4(conn: apsw.Connection) -> None:
    """Restriction of processing (Art. 18): the reason is encrypted under the subject's key.
    Retention (Art. 5(1)(e)): the purge finds expired and old records by index."""
    conn.execute("CREATE INDEX records_expiry ON records(tenant, expires_at) WHERE expires_at IS NOT NULL").fetchall()
    conn.execute("CREATE INDEX records_created ON records(tenant, created_at)").fetchall()
    conn.execute(
        """CREATE TABLE restrictions(
            tenant TEXT NOT NULL,
            subject_ref BLOB NOT NULL,
            pseudonym TEXT NOT NULL,
            reason BLOB NOT NULL,
            actor TEXT NOT NULL,
            since INTEGER NOT NULL,
            PRIMARY KEY (tenant, subject_ref)
        ) WITHOUT ROWID"""
    ).fetchall()


def _v5(conn: apsw.Connection) -> None:
    """Principals and their API keys: only a digest of each key's secret is kept."""
    conn.execute(
        """CREATE TABLE principals(
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            name TEXT NOT NULL,
            role TEXT NOT NULL,
            scopes TEXT,
            key_digest BLOB NOT NULL,
            created_at INTEGER NOT NULL,
            revoked_at INTEGER
        ) WITHOUT ROWID"""
    ).fetchall()
    conn.execute("CREATE INDEX principals_tenant ON principals(tenant, created_at)").fetchall()


def _v6(conn: apsw.Connection) -> None:
    """Signed decision snapshots; ``body`` holds values sealed under their subjects' keys."""
    for sql in (
        """CREATE TABLE decisions(
            tenant TEXT NOT NULL,
            id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            agent_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            body BLOB NOT NULL,
            key_id TEXT NOT NULL,
            signature BLOB NOT NULL,
            hash BLOB NOT NULL,
            PRIMARY KEY (tenant, id)
        ) WITHOUT ROWID""",
        """CREATE TABLE decision_uses(
            record_id TEXT NOT NULL,
            tenant TEXT NOT NULL,
            decision_id TEXT NOT NULL,
            PRIMARY KEY (record_id, tenant, decision_id)
        ) WITHOUT ROWID""",
    ):
        conn.execute(sql).fetchall()


def _v7(conn: apsw.Connection) -> None:
    """A user's records in insertion order, straight from an index: an export streams
    them instead of SQLite sorting (and holding) every matching row first."""
    conn.execute("CREATE INDEX records_user ON records(tenant, user_id)").fetchall()


def _v8(conn: apsw.Connection) -> None:
    """Retention policies become per tenant; a store-wide one becomes the default tenant's."""
    conn.execute(
        "UPDATE meta SET k = k || '.tenant=default' WHERE k IN ('retention.user', 'retention.agent', 'retention.run')"
    ).fetchall()


def _v9(conn: apsw.Connection) -> None:
    """Which users an erasure request reached, as blind references (keyed hashes of
    the user ids): a key scoped to them may then read the request and its certificate.
    NULL is the whole tenant, which is also what requests made before say."""
    conn.execute("ALTER TABLE erasure_requests ADD COLUMN users TEXT").fetchall()


def _v10(conn: apsw.Connection) -> None:
    """The full-text index holds keyed hashes of words, not the words. Rebuilding it
    needs the keys, so the store is only marked here; opening it with the master key
    rebuilds the index (``Memory``), then removes the mark. A store with nothing
    indexed needs no rebuild."""
    conn.execute(
        "INSERT INTO meta(k, v) SELECT 'index_terms', 'words'"
        " WHERE EXISTS (SELECT 1 FROM records WHERE status = 'ACTIVE')"
    ).fetchall()


def _v11(conn: apsw.Connection) -> None:
    """Lineage stubs: a hard-deleted record that other records still derive from keeps
    its subject and space, as blind references only, so that a later erasure of that
    subject still finds what was derived from it (a purge, a rectification's
    erase-previous or a space-limited erasure would otherwise cut the link)."""
    for sql in (
        """CREATE TABLE lineage_stubs(
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            subject_ref BLOB NOT NULL,
            user_ref BLOB NOT NULL,
            agent_ref BLOB NOT NULL,
            run_ref BLOB NOT NULL
        ) WITHOUT ROWID""",
        "CREATE INDEX lineage_stubs_subject ON lineage_stubs(tenant, subject_ref)",
    ):
        conn.execute(sql).fetchall()


def _v12(conn: apsw.Connection) -> None:
    """An index for listing requests in pages; and two things an older release kept that
    today's keep no longer. Its confirmation
    tokens' plan digests were plain hashes (of a subject's name, among others): they go
    (a token lives 15 minutes; one issued before the upgrade is then unknown). API keys
    scoped to an account it erased named the user: the store is marked, and opening it
    with the master key keeps those scopes by reference, with a log entry of the rewrite
    (``admin.rescope_erased_accounts``), then unmarks it."""
    conn.execute("DELETE FROM erasure_confirmations").fetchall()
    # The requests are listed a page at a time, in the order received.
    conn.execute(
        "CREATE INDEX IF NOT EXISTS erasure_requests_received ON erasure_requests(tenant, received_at, id)"
    ).fetchall()
    conn.execute(
        "INSERT INTO meta(k, v) SELECT 'rescope_erased', '1'"
        " WHERE EXISTS (SELECT 1 FROM principals WHERE scopes IS NOT NULL)"
        " AND EXISTS (SELECT 1 FROM erasure_requests WHERE kind = 'account' AND users IS NOT NULL)"
    ).fetchall()
    conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES ('scrub_pending', '1')").fetchall()


def _v13(conn: apsw.Connection) -> None:
    """Requests are listed in the order they were recorded, by a number each one gets
    under the write lock, no longer by ``received_at``: an erasure takes its receipt time
    before it waits for the lock, so two of them can commit in the other order, and a page
    read between the two commits would skip the one committed second for good. The
    requests kept so far are numbered in the order v12 listed them, so a cursor taken
    before the upgrade goes on where it was. The table has no rowid to number them by."""
    conn.execute("ALTER TABLE erasure_requests ADD COLUMN seq INTEGER").fetchall()
    conn.execute(
        "UPDATE erasure_requests SET seq = listed.n FROM (SELECT tenant, id,"
        " row_number() OVER (PARTITION BY tenant ORDER BY received_at, id) AS n FROM erasure_requests) AS listed"
        " WHERE listed.tenant = erasure_requests.tenant AND listed.id = erasure_requests.id"
    ).fetchall()
    # IF EXISTS: a store migrated to v12 before v12 made this index has none.
    conn.execute("DROP INDEX IF EXISTS erasure_requests_received").fetchall()
    conn.execute("CREATE UNIQUE INDEX erasure_requests_seq ON erasure_requests(tenant, seq)").fetchall()
    # An older release still running beside the upgrade writes requests without a number
    # (and its INSERT OR REPLACE drops the number of the row it replaces): numbered here,
    # at the end of the list, they stay listed rather than sort first and end the pages.
    conn.execute(
        "CREATE TRIGGER erasure_requests_numbered AFTER INSERT ON erasure_requests WHEN NEW.seq IS NULL BEGIN"
        " UPDATE erasure_requests SET seq ="
        " (SELECT coalesce(max(seq), 0) + 1 FROM erasure_requests WHERE tenant = NEW.tenant)"
        " WHERE tenant = NEW.tenant AND id = NEW.id; END"
    ).fetchall()


def _v14(conn: apsw.Connection) -> None:
    """A subject erasure limited to some spaces keeps the one-time key of its scope's
    pseudonyms, so that a certificate's absence check (``verify --store``) looks for live
    records of the subject inside the erasure's scope only: a record of the subject in
    another user's space is no failure of this erasure. It lets whoever holds the store's
    files, which hold those spaces' ids in clear, tell which spaces the request named;
    its certificate still does not. NULL: the whole tenant, or a request made before."""
    conn.execute("ALTER TABLE erasure_requests ADD COLUMN scope_key BLOB").fetchall()


def _v15(conn: apsw.Connection) -> None:
    """A confirmation token confirms the terms its dry run was made under, the legal basis
    and the requester, beside the plan: one shown under one basis confirmed an erasure
    under another, whose certificate then stated a basis nobody had confirmed. Kept as a
    keyed hash (a requester may be a person's name). The tokens issued before have no
    terms: they go (a token lives 15 minutes; one issued before the upgrade is then
    unknown, and a dry run issues another)."""
    conn.execute("DELETE FROM erasure_confirmations").fetchall()
    # An older release still running beside the upgrade inserts tokens without terms: x''
    # matches no keyed hash, so they confirm nothing here.
    conn.execute("ALTER TABLE erasure_confirmations ADD COLUMN terms BLOB NOT NULL DEFAULT x''").fetchall()
    conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES ('scrub_pending', '1')").fetchall()


def _v16(conn: apsw.Connection) -> None:
    """Every log entry carries a MAC under a key derived from the master key (see
    ``EntryAuthenticator``), and the store signs no entry without a valid one. Computing
    them needs the keys, so the store is only marked here; opening it with the master
    key gives the entries written before theirs (trusting them as they are), then
    removes the mark. A store with an empty log needs none."""
    conn.execute("ALTER TABLE log_entries ADD COLUMN mac BLOB").fetchall()
    conn.execute(
        "INSERT INTO meta(k, v) SELECT 'log_macs', 'pending' WHERE EXISTS (SELECT 1 FROM log_entries)"
    ).fetchall()


def _v17(conn: apsw.Connection) -> None:
    """A space's records in id order, straight from an index: a list stream reads them a
    page at a time, each page one seek from the last id returned, where SQLite sorted
    every record of the space again for each page. The index ends with the id instead
    of the status, which a listing checks on each row it reads."""
    conn.execute("DROP INDEX records_space").fetchall()
    conn.execute("CREATE INDEX records_space ON records(tenant, user_id, agent_id, run_id, id)").fetchall()


#: MIGRATIONS[n] turns a version n-1 store into version n.
MIGRATIONS: dict[int, Callable[[apsw.Connection], None]] = {
    1: _v1,
    2: _v2,
    3: _v3,
    4: _v4,
    5: _v5,
    6: _v6,
    7: _v7,
    8: _v8,
    9: _v9,
    10: _v10,
    11: _v11,
    12: _v12,
    13: _v13,
    14: _v14,
    15: _v15,
    16: _v16,
    17: _v17,
}
SCHEMA_VERSION = max(MIGRATIONS)


def _int(conn: apsw.Connection, sql: str) -> int:
    value = conn.execute(sql).fetchall()[0][0]
    assert isinstance(value, int)
    return value


def identify(conn: apsw.Connection, path: Path, *, create: bool) -> None:
    """Refuse a file that is not a deleatur store, or (unless creating) one not yet made
    into one, before anything is written to it."""
    if not is_ours(conn, path, APPLICATION_ID, "deleatur store") and not create:
        raise StoreError(f"{path} is empty, not an initialized store: remove it, then run `deleatur init`")


def prepare(conn: apsw.Connection, path: Path, *, new_meta: dict[str, str]) -> None:
    """Create or migrate a file :func:`identify` accepted."""
    latest = max(MIGRATIONS)
    version = _int(conn, "PRAGMA user_version")
    if version > latest:
        raise SchemaVersionError(
            f"{path} has schema version {version}; this deleatur understands up to {latest}: upgrade deleatur"
        )
    if version == latest:
        return
    with immediate(conn):
        # Re-read under the lock: another process may have migrated meanwhile.
        version = _int(conn, "PRAGMA user_version")
        for target in range(version + 1, latest + 1):
            MIGRATIONS[target](conn)
        if version == 0:
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}").fetchall()
            conn.executemany("INSERT INTO meta(k, v) VALUES (?, ?)", list(new_meta.items()))
        conn.execute(f"PRAGMA user_version = {latest}").fetchall()
