"""The small protocol every record-store backend implements.

A backend stores rows whose personal content is already encrypted; it sees
plaintext only to feed its full-text index. Everything else (validation, keys,
supersession rules) lives above it, in :mod:`deleatur.memory`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from ..model import Space, SpaceFilter, Status

#: The count an erasure request carries while the -wal may still hold page images of
#: what it erased: a reader's snapshot kept the -wal from being truncated. The scrub that
#: clears the store's mark (:meth:`Backend.scrub`) clears it from every request.
WAL_NOT_TRUNCATED = "wal_not_truncated"

#: A complete subtree of the log: (level, index, hash).
Node = tuple[int, int, bytes]


@dataclass(frozen=True, slots=True)
class LineageStub:
    """A hard-deleted record others derive from: its subject and space, as blind references."""

    id: str
    tenant: str
    subject_ref: bytes
    user_ref: bytes
    agent_ref: bytes
    run_ref: bytes


@dataclass(frozen=True, slots=True)
class SpaceRefs:
    """A space filter as blind references; None matches any value at its level."""

    user_ref: bytes | None
    agent_ref: bytes | None
    run_ref: bytes | None


class StoredRow(NamedTuple):
    """A record as stored: its personal content still encrypted.

    A named tuple rather than a frozen dataclass, immutable all the same: one is made
    for every record read, and a frozen dataclass's ``__init__`` (an
    ``object.__setattr__`` per field) cost four times as much, a twentieth of a recall
    served over HTTP."""

    id: str
    tenant: str
    space: Space
    subject_ref: bytes
    key_ref: bytes | None
    key_id: bytes
    status: Status
    supersedes: str | None
    confidence: float | None
    created_at: int
    updated_at: int
    expires_at: int | None
    ciphertext: bytes
    derived_from: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RowFilter:
    """Which rows of one space to list; ``None`` means "any"."""

    tenant: str
    space: Space
    subject_ref: bytes | None = None
    key_ref: bytes | None = None
    statuses: frozenset[Status] = frozenset({Status.ACTIVE})
    limit: int | None = None
    after: str | None = None  # only ids greater than this one (a page's cursor)


@dataclass(slots=True)
class RemovalMark:
    """Where the store's removals of records stood when a read began (see
    :meth:`Backend.removed_since`)."""

    own: int  # this connection's removals
    version: int  # data_version: other connections' commits
    count: str | None  # the store's count of removals (REMOVALS_MADE)


class Backend(Protocol):
    store_id: str

    def atomic(self) -> AbstractContextManager[None]:
        """One write transaction; everything inside commits together or not at all.
        Inside another, a savepoint of it: what it wrote is undone alone if it raises,
        and commits with the outer one."""
        ...

    def snapshot(self) -> AbstractContextManager[None]:
        """One read transaction: reads inside see the store as it was when it began
        (which it does on entry), whatever other connections commit meanwhile."""
        ...

    def end_snapshot(self) -> None:
        """End the open :meth:`snapshot`'s read transaction now, before its block ends (a
        handle closing while it is open); its block then ends nothing. No snapshot open:
        nothing."""
        ...

    def deferred_index(self) -> AbstractContextManager[None]:
        """Inside ``atomic``: the index writes of ``insert_many`` and ``unindex`` are made
        together when it exits (not at all if it raises), or before a ``search`` reads the
        index; those of a savepoint (a nested ``atomic``) that raises are not made. Inside
        another, its writes are the outer one's."""
        ...

    def insert_many(self, rows: Sequence[tuple[StoredRow, str]]) -> None:
        """Insert rows, each with the text its index entry gets (active rows only)."""
        ...

    def index_holds_words(self) -> bool: ...

    def indexed_rows(self) -> Iterator[tuple[int, StoredRow]]: ...

    def rebuild_index(self, entries: Iterable[tuple[int, str]]) -> None:
        """Replace the index of words with ``entries`` (rowid, index text), unless another
        process did it first, and clear the mark of schema v10."""
        ...

    def get(self, tenant: str, record_id: str) -> StoredRow | None: ...

    def active_by_key(self, tenant: str, space: Space, key_ref: bytes) -> StoredRow | None: ...

    def set_status(self, record_id: str, status: Status, updated_at: int) -> None: ...

    def unindex(self, record_id: str, *, index_text: str) -> None:
        """Remove a row's terms from the full-text index. The caller passes exactly what
        it indexed: a contentless index can only remove terms it is told."""
        ...

    def search(
        self, tenant: str, space: Space, terms: Sequence[str], *, now: int, limit: int, common: int, per_term: int
    ) -> list[tuple[StoredRow, float]]:
        """The best ``limit`` active, unexpired, unrestricted records of ``space`` holding
        any of ``terms`` (folded, with the space's prefix), by BM25, higher first. A term
        in more than ``per_term`` records (or ``limit``) counts only in its newest
        ``per_term`` matches (more if too few of them are visible); if every term is in
        more than ``common`` records, the newest matches come first, with score 0."""
        ...

    def select(self, where: RowFilter) -> Generator[StoredRow, None, None]:
        """The rows ``where`` names, in record id order, read as they are taken: closing
        the generator ends the read."""
        ...

    # -- erasure ----------------------------------------------------------------

    def select_any(
        self, tenant: str, where: SpaceFilter, *, subject_ref: bytes | None = None
    ) -> Generator[StoredRow, None, None]:
        """Rows of every status in the spaces ``where`` matches (optionally of one subject),
        read as they are taken: closing the generator ends the read."""
        ...

    def select_any_page(
        self, tenant: str, where: SpaceFilter, *, subject_ref: bytes | None = None, after: int, limit: int
    ) -> list[tuple[int, StoredRow]]:
        """Up to ``limit`` of :meth:`select_any`'s rows, in its order, each with its
        position: those after the position ``after`` (0: from the first)."""
        ...

    def retention_due(self, tenant: str, *, now: int, created_before: int | None) -> list[StoredRow]:
        """Rows whose ``expires_at`` has passed, or (if given) created before ``created_before``."""
        ...

    def get_setting(self, name: str) -> str | None: ...

    def put_setting(self, name: str, value: str | None) -> None: ...

    def children(self, tenant: str, parents: Iterable[str]) -> set[str]:
        """Ids of records that declare any of ``parents`` in their lineage."""
        ...

    def rows(self, tenant: str, ids: Iterable[str]) -> list[StoredRow]: ...

    def count_subject(self, tenant: str, subject_ref: bytes) -> int: ...

    def holds_subject(self, tenant: str, subject_ref: bytes) -> bool:
        """Whether any record, or a restriction, of the subject is stored."""
        ...

    def put_request(self, row: Mapping[str, Any], *, replace: bool) -> None:
        """Insert a request row; ``replace`` only to update one this caller owns. An
        update keeps the request's place in :meth:`requests` and its ``received_at``,
        and a failed request never replaces one that ran."""
        ...

    def forget_scope_keys(self, tenant: str, user_refs: Sequence[str]) -> None:
        """Drop the scope key of every request of ``tenant`` that reached one of these
        users (blind references): their account is erased, and with its key beside it a
        request's scope pseudonym would confirm a guessed user id."""
        ...

    def pending_key_lists(self) -> list[str]:
        """The JSON lists of data key ids committed for destruction: each request's awaiting
        it, and the unused keys being collected (cheap: every write asks)."""
        ...

    def collecting_keys(self) -> list[bytes]:
        """Unused data keys committed for destruction (see ``collect_unused_keys``)."""
        ...

    def set_collecting_keys(self, key_ids: Sequence[bytes]) -> None: ...

    def any_restricted(self, tenant: str, subject_refs: Sequence[bytes]) -> bool: ...

    def pending_requests(self) -> list[dict[str, Any]]:
        """Requests of every tenant whose keys are committed for destruction but not yet gone."""
        ...

    def get_request(self, tenant: str, request_id: str) -> dict[str, Any] | None: ...

    def requests(self, tenant: str, *, after: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """A tenant's requests in the order they were first recorded (committed), from
        after the request ``after``: a page read while others commit misses none."""
        ...

    def put_confirmation(self, token_hash: bytes, tenant: str, digest: bytes, terms: bytes, expires_at: int) -> None:
        """A token issued for the plan ``digest`` under the terms (basis, requester) ``terms``."""
        ...

    def use_confirmation(
        self, token_hash: bytes, tenant: str, confirmed: tuple[bytes, bytes] | None, now: int
    ) -> str | None:
        """Spend a token issued for ``confirmed`` (digest, terms); returns why it is
        refused, or None. With None, only check that the tenant issued it and it has not
        expired. A spent token keeps neither: neither is compared with it again."""
        ...

    def spend_confirmations(self, tenant: str, digests: Sequence[bytes], now: int) -> None:
        """Inside ``atomic``: spend, as :meth:`use_confirmation` does, the tenant's unspent
        tokens issued for any of ``digests``."""
        ...

    def drop_confirmations(self, now: int) -> bool:
        """Inside ``atomic``: remove every tenant's tokens expired by ``now``; whether any
        went. If any did, the store is marked for a scrub (see :meth:`scrub_after_commit`)."""
        ...

    # -- restriction (Art. 18) ----------------------------------------------------

    def put_restriction(self, row: Mapping[str, Any]) -> None: ...

    def delete_restriction(self, tenant: str, subject_ref: bytes) -> bool: ...

    def restrictions(self, tenant: str, subject_ref: bytes | None = None) -> list[dict[str, Any]]: ...

    # -- decision snapshots (see deleatur.decisions) -------------------------------

    def put_decision(self, row: Mapping[str, Any], uses: Sequence[str], *, replace: bool) -> None: ...

    def decision(self, tenant: str, decision_id: str) -> dict[str, Any] | None: ...

    def decisions_using(self, tenant: str, record_ids: Iterable[str]) -> list[str]: ...

    def decisions_in(self, tenant: str, scope: SpaceFilter) -> list[str]: ...

    # -- principals (see deleatur.access) -----------------------------------------

    def put_principal(self, row: Mapping[str, Any]) -> None: ...

    def principal(self, principal_id: str) -> dict[str, Any] | None:
        """One principal of any tenant (authentication comes before knowing the tenant)."""
        ...

    def principals(self, tenant: str) -> list[dict[str, Any]]: ...

    def revoke_principal(self, tenant: str, principal_id: str, at: int) -> bool: ...

    def set_principal_scopes(self, tenant: str, principal_id: str, scopes: str) -> None: ...

    def purge(self, record_ids: Iterable[str]) -> int:
        """Hard-delete rows and their lineage (inside ``atomic``; unindex active rows
        first), and the lineage stubs nothing derives from any more; counted in the
        store, in the same transaction, for :meth:`removed_since`."""
        ...

    def removal_mark(self) -> RemovalMark:
        """Where the store's removals of records stand now."""
        ...

    def removed_since(self, mark: RemovalMark) -> bool:
        """Whether records may have been removed since ``mark`` was taken, by this
        connection or another (outside a read transaction: one sees none). Reads nothing
        while no other connection has committed; ``mark`` takes up their other commits."""
        ...

    def still_derived_from(self, record_ids: Iterable[str]) -> set[str]:
        """Which of ``record_ids`` (hard-deleted) some record still derives from."""
        ...

    def add_stubs(self, stubs: Sequence[LineageStub]) -> None: ...

    def lineage_stubs(self, tenant: str, subject_ref: bytes | None, space: SpaceRefs) -> list[str]:
        """Ids of the stubs of ``subject_ref`` (any subject's, if None) in the spaces
        ``space`` matches."""
        ...

    # -- the verifiable log (see deleatur.log.tlog) -------------------------------

    def log_size(self) -> int: ...

    def data_version(self) -> int:
        """Changes whenever another connection commits (SQLite's PRAGMA data_version)."""
        ...

    def log_append(self, start: int, entries: Sequence[tuple[bytes, str | None, bytes]], nodes: Iterable[Node]) -> None:
        """Store entries ``start..`` (each with its record id and MAC) and the
        complete-subtree hashes they finish."""
        ...

    def log_nodes(self, positions: Sequence[tuple[int, int]]) -> list[bytes]:
        """Hashes of complete subtrees at (level, index); raises if one is missing."""
        ...

    def log_level(self, level: int) -> Iterator[tuple[int, bytes]]:
        """(index, hash) of the stored subtrees of one level, in index order."""
        ...

    def log_entries(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]: ...

    def log_entries_with_macs(self, start: int, end: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        """(index, entry, MAC) of the entries ``start..end-1``; the MAC is None where the
        entry has none (it was not written through the store)."""
        ...

    def log_macs_pending(self) -> bool:
        """Whether the entries written before schema v16 still lack their MACs."""
        ...

    def mac_log_entries(self, mac: Callable[[int, bytes], bytes]) -> None:
        """Schema v16, under the write lock: give every entry without a MAC ``mac(index,
        entry)``, and end the upgrade's mark; nothing once it has ended."""
        ...

    def log_entries_with_users(self, tenant: str, start: int = 0) -> Iterator[tuple[int, bytes, str | None]]:
        """(index, entry, user id) from ``start``: the user id of the record an entry of a
        write, rectification or retirement is about, while ``tenant`` still holds that
        record; None for every other entry."""
        ...

    def log_indexes_of(self, record_id: str) -> list[int]: ...

    def replace_log_entries(self, entries: Sequence[tuple[int, bytes]]) -> None:
        """Overwrite stored entries in place (audit retention prunes them to their leaf hash)."""
        ...

    def newest_id(self) -> str | None:
        """The greatest record id in the store (of any tenant)."""
        ...

    def log_entries_naming(self, token: str) -> Iterator[tuple[int, bytes]]:
        """(index, entry) of every log entry whose bytes contain ``token`` (a pseudonym or
        an opaque user token: entries hold nothing else that could name anyone)."""
        ...

    def log_of_records(self, record_ids: Sequence[str]) -> Iterator[tuple[str, int, bytes]]:
        """(record id, index, entry) of every log entry naming one of ``record_ids``."""
        ...

    def put_checkpoint(self, size: int, note: str, *, replace: bool) -> None:
        """Store a signed checkpoint; ``replace`` only to add signatures to the same tree.
        Refused inside a nested transaction (a write group's savepoint): the group may yet
        roll back the tree it would sign."""
        ...

    def checkpoint(self, size: int | None = None) -> tuple[int, str] | None:
        """The checkpoint of that size, or the latest one."""
        ...

    def checkpoints(self, *, newest_first: bool = False) -> Iterator[tuple[int, str]]:
        """(size, note) of every stored checkpoint, by size."""
        ...

    def put_signing_key(self, key_id: str, vkey: str, log_index: int, created_at: int) -> None: ...

    def signing_keys(self) -> list[tuple[str, str, int, int]]:
        """(key id, verifier key, log index of its announcement, created at), oldest first."""
        ...

    def scrub(self, *, wait: bool = True, settled: str | None = None) -> bool:
        """After a purge commits: leave no removed bytes in journals or free pages.
        False if other connections' read snapshots kept the -wal from being truncated
        (waiting for them up to the busy timeout, or not at all without ``wait``).
        ``settled``: the mark (:meth:`scrub_mark`) read before the rest of the store (the
        key store's -wal) was truncated clean; a clean scrub then clears that mark, and
        :data:`WAL_NOT_TRUNCATED` from the requests that carry it, in one transaction
        (not a newer mark: a removal committed since may have pages in either -wal)."""
        ...

    def scrub_mark(self) -> str | None:
        """The mark of :meth:`scrub_after_commit` (a new one for each removal), or None."""
        ...

    def scrub_after_commit(self) -> None:
        """Inside a transaction that removes or rewrites data: mark the store until a
        scrub succeeds, so that if the process dies before it, the next open scrubs.
        Refused inside a nested transaction (a write group's savepoint), whose commit
        comes after the removal's call has returned, with no scrub."""
        ...

    def erased_accounts(self) -> list[tuple[str, list[str]]] | None:
        """Before a v12 store's first open with its keys: each account erasure's tenant
        and the blind references (hex) of the users it reached; else None."""
        ...

    def rescoped_erased(self) -> None:
        """Inside ``atomic``: the scopes of ``erased_accounts`` are kept by reference now."""
        ...

    def scrub_pending(self) -> bool:
        """Whether a removal committed and no scrub has succeeded since (a crash between)."""
        ...

    def files(self) -> list[Path]: ...

    def upkeep_in_background(self) -> None:
        """From now until :meth:`close`, do in a thread of its own the upkeep a commit
        would otherwise wait for, or that would otherwise wait (SQLite: copying the -wal
        into the database, merging the full-text index's segments)."""
        ...

    def close(self) -> None: ...
