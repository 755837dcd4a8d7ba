"""The library entry point: an encrypted, subject-aware memory store.

Every shell (CLI, HTTP, MCP) calls these methods; none of them holds logic of
its own.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import itertools
import json
import os
import re
import threading
import unicodedata
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import apsw
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .access import admin, calls
from .access.audit import AuditTrail, ScopedView
from .access.audit import entries as audit_entries
from .access.audit import verify as verify_audit
from .access.batch import AuditBatch, WriteGroup
from .access.guard import Call, Needed, guarded, in_space, no_user, of_filter, of_scopes, of_user
from .access.principals import Capability, Principal, Role
from .clock import Clock, Random, isoformat, parse_when, system_clock, system_random
from .crypto.keystore import _LENGTH, KeyStore, _frame
from .crypto.master import MASTER_KEY_BYTES, MasterKeySource, default_key_file, from_file, write_key_file
from .crypto.signing import pending_path, read_signer, signing_key_path, write_signer
from .decisions.snapshots import Decision
from .decisions.snapshots import explain as explain_decision
from .decisions.snapshots import record as record_decision
from .decisions.snapshots import redact as redact_decisions
from .erasure.certificate import build_certificate
from .erasure.engine import (
    ErasureResult,
    collect_unused_keys,
    erase,
    finish_all_pending,
    get_request,
    pending_key_ids,
    settle,
)
from .erasure.requests import ErasureRequest, check_request_id
from .erasure.residue import ResidueHit, scan
from .errors import (
    AccessDeniedError,
    AuthenticationError,
    DataKeyDestroyedError,
    DeleaturError,
    IntegrityError,
    InvalidInputError,
    KeyStoreError,
    NotADeleaturStoreError,
    NotFoundError,
    SigningKeyMissingError,
    StoreBusyError,
    StoreError,
)
from .ids import IdGenerator, check_record_id
from .log.checkpoint import Checkpoint
from .log.cosignature import CosignatureVerifier
from .log.entries import Entry, EventType, commitment
from .log.note import Note, NoteError, Signature, Signer, Verifier, open_note
from .log.receipt import Receipt
from .log.report import Report
from .log.tlog import LogError, TransparencyLog
from .log.tlogproof import TlogProof
from .log.verify import announce_key, verify_log
from .log.witness import format_request, format_rotation_proof
from .model import (
    DEFAULT_MAX_TEXT_BYTES,
    DEFAULT_SPACE,
    ERASURES_MADE,
    EVERYWHERE,
    Hit,
    NameCache,
    NewMemory,
    Record,
    Space,
    SpaceFilter,
    Status,
    canonical_key,
    canonical_subject,
    check_int,
    check_items,
    check_metadata_size,
    check_number,
    check_optional,
    check_path,
    check_query,
    check_recall_limit,
    check_stated,
    check_tenant,
    check_type,
    check_who,
    erased_ref,
    forget_cached_names,
    forget_names_again_since,
    names_forgotten,
    record_json,
    validate_text,
)
from .newfiles import Made, check_directory, exclusive_lock, init_lock, making
from .rights.export import TextSink, export_csv, export_json
from .rights.restriction import Restriction, check_writable, restrict, restrictions, unrestrict
from .rights.retention import policy, prune_audit, purge, retention_for, set_policy
from .sqlitefile import BUSY_TIMEOUT_MS, create_private, sidecar_files
from .store.protocol import Backend, LineageStub, RemovalMark, RowFilter, SpaceRefs, StoredRow
from .store.sqlite import SQLiteBackend
from .turn import AbandonedTurn, Turn

_NONCE = 12
# json.loads's own scanner (C), called without the wrapping (typeshed leaves it out).
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _payload(plain: bytes) -> dict[str, Any]:
    """A record's decrypted JSON, decoded as json.loads would, minus what a payload this
    store wrote (compact, UTF-8, one object) never needs: the guess at the encoding and
    the skipping of whitespace around it (a tenth of reading a record)."""
    text = plain.decode("utf-8", "surrogatepass")
    try:
        payload, end = _SCAN(text, 0)
    except (StopIteration, json.JSONDecodeError):  # the scanner's errors at and below the top
        end = -1
    if end != len(text) or not isinstance(payload, dict):
        raise IntegrityError("a record's payload is not the JSON object this store writes")
    return payload


#: Single writes within this long of the last checkpoint share the next one.
DEFAULT_CHECKPOINT_INTERVAL_US = 100_000
_MAX_QUERY_TERMS = 32
#: A query made only of terms each found in more records than this returns the newest
#: matches, unranked.
_COMMON_TERM_DOCS = 10_000
#: A query term found in more records than this counts only in its newest this many.
_TERM_CANDIDATES = 250
#: Records a list or versions stream reads at once (see Memory._stream).
_STREAM_PAGE = 256
#: Why :meth:`Memory.history` finds nothing: the servers, which page the versions, say it too.
NO_SUCH_KEY = "no record with this key in this space"
RECTIFY_NEEDS_REASON = "rectify needs a reason"
#: How many checkpoints back a cosignature given without a size is looked for (one
#: signature check each): a witness cosigns the checkpoint it was sent, and the log
#: gets a checkpoint for every 100 ms of writes since.
_COSIGNED_LOOKBACK = 1000
# Word characters but "_", as FTS5's unicode61 tokenizer splits them.
_TOKEN = re.compile(r"[^\W_]+")


def _fold_term(word: str) -> str:
    """A word as the index and a query both see it: case-folded, without diacritics."""
    if word.isascii():
        return word.lower()  # the same, a tenth of the time: most words are ASCII
    decomposed = unicodedata.normalize("NFKD", word.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def keystore_path(store_path: Path) -> Path:
    return store_path.with_name(store_path.name + ".keys")


def _read_cosignatures(lines: str) -> tuple[Note | None, tuple[Signature, ...]]:
    """The cosigned checkpoint the input carries (None for bare signature lines), and
    the signatures."""
    try:
        if "\n\n" in lines:  # a note: the checkpoint's text, an empty line, signature lines
            note = Note.parse(lines)
            return note, note.signatures
        # Bare signature lines parse as the signature block of a note of any text.
        return None, Note.parse("-\n\n" + lines).signatures
    except NoteError as exc:
        raise InvalidInputError(f"cosignature lines: {exc.message}") from None


def _checkpoint_size(text: str) -> int:
    try:
        return Checkpoint.parse(text).size
    except NoteError as exc:
        raise InvalidInputError(f"cosigned checkpoint: {exc.message}") from None


@dataclass(frozen=True, slots=True)
class StoreInfo:
    """Where a store's parts live; printed by ``deleatur init``."""

    store: Path
    key_store: Path
    master_key: str
    store_id: str
    tenant: str


@dataclass(slots=True)
class _Shared:
    """State every view of one open store shares (see :meth:`Memory.as_principal`)."""

    signed_at: int
    keys_announced: bool
    #: This process appended entries that no checkpoint covers yet.
    unsigned: bool = False
    #: The store's data_version when this handle last checked which key signs the log.
    signer_checked: int = -1
    #: The store's data_version when this handle last read how many erasures were made,
    #: and that count (see model.ERASURES_MADE).
    erasures_checked: int = -1
    erasures_made: str | None = None
    #: Where calls' entries go that would be written in transactions of their own,
    #: inside a read snapshot (which can write nothing) or an :class:`AuditBatch`.
    deferred: builtins.list[Entry] | None = None
    #: Inside a read snapshot.
    reading: bool = False
    #: A scrub of this handle's found a reader in a -wal: each call tries again as it ends.
    scrub_owed: bool = False
    scrubs: int = 0
    #: The write group whose transaction is open on the handle.
    group: WriteGroup | None = None
    #: close() has closed the handle: closing it again does nothing.
    closed: bool = False
    #: Held by the thread whose call (or write group, read snapshot, batch collecting,
    #: stream's step) is using the handle's connection: another thread's call waits its turn.
    turn: Turn = field(default_factory=Turn)


R, W, D, V, A = Capability.READ, Capability.WRITE, Capability.DELETE, Capability.VERIFY, Capability.ADMIN


def _pinned(keys: object) -> builtins.list[Verifier] | None:
    return None if keys is None else check_items(keys, Verifier, "pinned_keys")


# Made once: json.dumps makes an encoder for every call given options (every write).
_PAYLOAD_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def _dumps(value: Mapping[str, Any]) -> bytes:
    return _PAYLOAD_JSON(value).encode("utf-8")


class _TurnAbandoned(StoreError):
    """The handle's turn is kept by a thread that has ended (see :class:`~deleatur.turn.Turn`)."""


class _RotationLockHeld(LogError):
    """The rotation's lock was not to be had, where it would only finish a rotation."""


class Memory:
    """An open store. Use :meth:`open` or :meth:`init`; close it (or use ``with``).

    One handle (with the views :meth:`as_principal` makes of it) holds one SQLite
    connection, whose transactions two threads calling at once would interleave: threads
    that share a handle take turns, each call waiting for the one in progress (up to the
    busy timeout, then StoreBusyError). A write group or a read snapshot keeps the turn
    until it ends, and is ended by the thread that began it (a write group whose thread
    ended without ending it refuses other threads' calls at once, and :meth:`close`
    rolls it back: see ``deleatur.turn``); a stream a call returns
    (``list``, ``versions``) takes it for each step. Threads that should work at once
    each open the store, as processes do; the store's locks keep them apart."""

    def __init__(
        self,
        backend: Backend,
        keys: KeyStore,
        *,
        tenant: str,
        master_description: str,
        clock: Clock,
        random: Random,
        max_text_bytes: int,
        checkpoint_interval_us: int = DEFAULT_CHECKPOINT_INTERVAL_US,
    ) -> None:
        self.backend: Backend = backend
        self.keys = keys
        self.tenant = check_tenant(tenant)
        self._aad_prefixes: dict[str, bytes] = {}
        self.master_description = master_description
        self.max_text_bytes = max_text_bytes
        self._clock = clock
        self._random = random
        self._ids = IdGenerator(clock, random)
        self._tokens = NameCache()  # emptied by an erasure (forget_cached_names)
        self._term_hashers: dict[str, hashlib.blake2b] = {}
        self.signing_key_path = signing_key_path(Path(backend.files()[0]))
        self.log = TransparencyLog(
            backend,
            origin=f"deleatur/{backend.store_id}",
            signer=self._load_signer(),
            mac=keys.log_entries.mac,
            clock=clock,
        )
        if backend.log_macs_pending():
            # Schema v16, before anything here signs: the entries written before get
            # their MACs, trusted as they are (see README, "Upgrading to schema v16").
            backend.mac_log_entries(self.log.entry_mac)
        self.checkpoint_interval_us = checkpoint_interval_us
        self._shared = _Shared(signed_at=-checkpoint_interval_us, keys_announced=bool(backend.signing_keys()))
        self._refusals = calls.RefusalBudget()  # shared with the views, as _shared is
        #: Who this handle acts for: the local operator, unless it is a view made by
        #: :meth:`as_principal`. Every public call is authorized and audited as them.
        self.principal = Principal.local_operator(self.tenant)
        self._calls = threading.local()  # this thread's calls in progress, innermost last
        self._owner = True
        # An erasure whose records were deleted but whose keys a crash kept alive
        # is finished before anything else happens; so are data keys made for writes
        # that a crash cut off before their records committed.
        finish_all_pending(self)
        collect_unused_keys(self)
        signer = self.log.signer
        self._key_announced_at_open = signer is not None and not self._shared.keys_announced
        if signer is not None and self._key_announced_at_open:
            # new_signing_key (init's last step) wrote the key file and died before the
            # announcement committed: finish it, or the log signs with a key it never named.
            self._announce_first_key(signer)
        if self.backend.index_holds_words():
            self._hash_index_terms()
        erased = self.backend.erased_accounts()
        if erased is not None:
            admin.rescope_erased_accounts(self, erased)
        # A removal committed, then its process died before the scrub (or a reader held
        # it off). Without waiting: a reader still there would stall every open; the mark
        # stays for the next removal's scrub, or the next open.
        self.finish_scrub(wait=False)

    # -- opening -----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        master: MasterKeySource,
        *,
        tenant: str = "default",
        clock: Clock = system_clock,
        random: Random = system_random,
        max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
        full_sync: bool = False,
        create: bool = False,
        checkpoint_interval_us: int = DEFAULT_CHECKPOINT_INTERVAL_US,
    ) -> Memory:
        store_path = check_path(path, "path")
        check_type(master, MasterKeySource, "master")
        check_tenant(tenant)  # here too, not only in __init__: by then the files are open
        check_int(max_text_bytes, "max_text_bytes", low=1)
        check_int(checkpoint_interval_us, "checkpoint_interval_us", low=0)
        check_type(full_sync, bool, "full_sync")
        check_type(create, bool, "create")
        backend = SQLiteBackend.open(store_path, create=create, clock=clock, full_sync=full_sync)
        keys = None
        try:
            keys = KeyStore.open(
                keystore_path(store_path),
                store_id=backend.store_id,
                master=master,
                create=create,
                random=random,
                clock=clock,
                full_sync=full_sync,
            )
            # Opening also finishes what a crash or an older release left (pending erasures,
            # an unannounced key, a migration, a scrub), any of which may fail: close then.
            return cls(
                backend,
                keys,
                tenant=tenant,
                master_description=master.description,
                clock=clock,
                random=random,
                max_text_bytes=max_text_bytes,
                checkpoint_interval_us=checkpoint_interval_us,
            )
        except BaseException:
            if keys is not None:
                keys.close()
            backend.close()
            raise

    @classmethod
    def init(
        cls,
        path: str | os.PathLike[str],
        master: MasterKeySource | None = None,
        *,
        key_file: str | os.PathLike[str] | None = None,
        tenant: str = "default",
        clock: Clock = system_clock,
        random: Random = system_random,
        max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
    ) -> tuple[Memory, StoreInfo]:
        """Create a store, its key store and (unless ``master`` is given) a master key file.

        Never overwrites anything, and removes what it made if a later step fails, so a
        failed init leaves the directory as it was. An init that was killed part way is
        finished by running it again: a master key file it wrote is used, not replaced,
        and a store it made that nothing has used yet gets its signing key. One init of
        a store runs at a time: another, while it runs, is refused (StoreError). A
        directory missing (NotFoundError), not a directory, or where no file can be made
        (StoreError) is refused naming it, and leaves nothing made.
        """
        store_path = check_path(path, "path")
        check_optional(master, MasterKeySource, "master")
        key_path = None if key_file is None else check_path(key_file, "key_file", written=True)
        options: dict[str, Any] = {"tenant": tenant, "clock": clock, "random": random, "max_text_bytes": max_text_bytes}
        # Checked before the lock file is made beside the store: a directory missing, or
        # another file where it should be, is the error to report, not the lock's.
        check_directory(store_path.parent)
        if os.path.isdir(store_path):
            raise StoreError(f"{store_path} is a directory, not a store file")
        if master is None:
            key_path = key_path or default_key_file(store_path)
            check_directory(key_path.parent)
        with init_lock(store_path):
            if master is None:
                assert key_path is not None
                if key_path.exists() and (store_path.exists() or not keystore_path(store_path).exists()):
                    master = from_file(key_path)  # an earlier init's, perhaps killed before it made the store
            if store_path.exists():
                return cls._finish_init(store_path, master, options)
            # SQLite would take up a -wal or -shm found beside a new database as its own (a
            # store removed while a process had it open leaves them): they are not ours to
            # use, nor to remove if this init fails.
            strays = [*sidecar_files(store_path)[1:], *sidecar_files(keystore_path(store_path))]
            for orphan in (*strays, signing_key_path(store_path)):
                if orphan.exists():
                    raise StoreError(
                        f"{orphan} exists but its store {store_path} does not: if an init was interrupted or the"
                        " store removed, and no process has it open, remove that file (it serves no store) and"
                        " run init again"
                    )
            with making(StoreError, "it") as made:  # only these are removed on failure
                if master is None:
                    assert key_path is not None
                    made.add(key_path, write_key_file(key_path, random(MASTER_KEY_BYTES)))
                    master = from_file(key_path)
                for new in (store_path, keystore_path(store_path)):
                    made.add(new, create_private(new), database=True)
                memory = cls.open(store_path, master, create=True, **options)
                try:
                    memory.new_signing_key()  # removes its key file if it fails
                except BaseException:
                    memory.close()
                    raise
            return memory, memory.info()

    @classmethod
    def _finish_init(
        cls, store_path: Path, master: MasterKeySource | None, options: dict[str, Any]
    ) -> tuple[Memory, StoreInfo]:
        """``init`` over an existing store: finish it if an init was killed before its
        signing key was announced and nothing has used the store since; else refuse."""
        refusal = StoreError(f"{store_path} already exists; refusing to overwrite it")
        if master is None:
            raise refusal
        # Files an init made and was killed before it set up are set up now; but never a
        # key store for a store that has been used (moved, unmounted, lost: a new, empty
        # one would make every record read as crypto-shredded).
        memory = cls.open(store_path, master, create=not _holds_entries(store_path), **options)
        try:
            # Opening announces a key file that init wrote and did not get to announce.
            interrupted = memory.log.signer is None or memory._key_announced_at_open
            if not interrupted or memory.backend.log_size() > len(memory.backend.signing_keys()):
                raise refusal
            if memory.log.signer is None:
                memory.new_signing_key()
        except BaseException:
            memory.close()
            raise
        return memory, memory.info()

    def info(self) -> StoreInfo:
        return StoreInfo(
            store=Path(self.backend.files()[0]),
            key_store=self.keys.path,
            master_key=self.master_description,
            store_id=self.backend.store_id,
            tenant=self.tenant,
        )

    def upkeep_in_background(self) -> None:
        """From now until :meth:`close`, the upkeep a commit would otherwise wait for
        (copying SQLite's -wal into the database, every few hundred writes) is done in a
        thread of its own: for a server, whose every request in flight would wait for
        that commit. The thread also merges the full-text index's segments every so many
        commits, which small write transactions leave for every recall to read. Calling
        it again does nothing."""
        if not self._owner:
            raise self._deny("only the handle that opened the store runs its upkeep", "operator")
        with self._turn():
            self._refresh()  # a closed handle is refused as every call refuses it
            self.backend.upkeep_in_background()

    def close(self) -> None:
        """Close the store; closing it again does nothing. A view made by
        :meth:`as_principal` owns nothing: closing it does nothing, and the handle that
        opened the store closes it. A call another thread is making on the handle ends
        first. A write group left open by a thread that has ended is rolled back; a read
        snapshot left open is ended, and the entries of the calls made in it written."""
        if not self._owner:
            return
        turn = self._shared.turn
        while not turn.take_over():
            try:
                with self._turn():
                    if not self._shared.closed:
                        self._close()
                return
            except _TurnAbandoned:
                continue  # its holder ended while this waited: take the turn over
        try:
            self._close(abandoned=True)
        finally:
            turn.release()

    def _close(self, *, abandoned: bool = False) -> None:
        """Roll back an open write group (its calls were never answered), sign what this
        handle wrote, and close the files. A failure leaves the handle open, to close
        again; but in the turn a thread that has ended kept (``abandoned``, with a group
        it began) the files are closed whatever fails, since nothing else could use the
        handle again."""
        group = self._shared.group
        finished = False
        try:
            if self._shared.reading:
                self._end_snapshot_left_open()
            if group is not None:
                if abandoned:
                    group.roll_back_abandoned()
                else:
                    group.rollback()
            if self._shared.unsigned and self._current_signer() is not None:
                # No entry this handle wrote is left without a signed checkpoint (which
                # covers the log to its end). A handle that wrote nothing signs nothing: a
                # tail another connection left stays for verification to find, and a
                # verification (which writes nothing) leaves the store as it found it, its
                # verdict repeatable.
                try:
                    self._checkpoint()
                except IntegrityError:
                    # The log holds entries the store did not write: no later close could
                    # sign either, so the files close, and the caller learns why.
                    finished = True
                    raise
            finished = True
        finally:
            if finished or abandoned:
                self._shared.closed = True
                try:
                    self.keys.close()
                finally:
                    self.backend.close()

    def _end_snapshot_left_open(self) -> None:
        """A read snapshot is open as the handle closes (in the closing thread, or one that
        has ended without ending it): end it, and write the entries of the calls made in
        it, whose answers were returned; its block, if it ever ends, then ends nothing."""
        entries = self._shared.deferred or []
        self._shared.deferred = None
        self._shared.reading = False
        self.backend.end_snapshot()
        if entries:
            with self._logged(audit_only=True) as events:
                events.extend((entry, None) for entry in entries)
            entries.clear()

    # -- principals, authorization and the audit of calls --------------------------

    def as_principal(self, principal: Principal) -> Memory:
        """A view of this store that acts for ``principal``, inside its tenant: every
        call on it is authorized against the principal's capabilities and scopes, and
        audited. Views share the open store's connection: use one handle (and its
        views) from one thread at a time. Only the handle that opened the store makes
        views: a view cannot make another, so no principal can act as a wider one."""
        if not self._owner:
            raise self._deny("only the handle that opened the store can act for another principal", "operator")
        if not isinstance(principal, Principal):
            raise InvalidInputError("as_principal needs a Principal (see authenticate)")
        if principal.revoked_at is not None:
            raise AuthenticationError("this principal's key has been revoked")
        view = self._in_tenant(principal.tenant)
        view.principal = principal
        view._calls = threading.local()
        view._owner = False
        return view

    def _in_tenant(self, tenant: str) -> Memory:
        # What copy.copy does, without its generic protocol's detours (a server makes a
        # view per request).
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        view.tenant = tenant
        return view

    def _hash_index_terms(self) -> None:
        """Schema v10: rebuild an index of words into one of their keyed hashes (every
        tenant's), then truncate the -wal, which held the words' pages."""
        views: dict[str, Memory] = {}

        def entries() -> Iterator[tuple[int, str]]:
            for rowid, row in self.backend.indexed_rows():
                view = views.get(row.tenant) or views.setdefault(row.tenant, self._in_tenant(row.tenant))
                yield rowid, view._index_text(row.space, view._decrypt(row).text)

        self.backend.rebuild_index(entries())
        self.backend.scrub()

    @property
    def _current(self) -> Call | None:
        return calls.current(self)

    def authenticate(self, api_key: str) -> Principal:
        """The principal an API key belongs to. Every refusal (malformed, unknown,
        revoked) reads the same, so a caller learns nothing about other keys."""
        with self._turn():
            return admin.authenticate(self, api_key)

    @guarded("principal.create", A, of_scopes)
    def create_principal(
        self, name: str, role: Role | str, *, scopes: Iterable[str] | None = None, tenant: str | None = None
    ) -> tuple[Principal, str]:
        """A new principal and its API key, which is shown here once and never stored.

        Only the operator may create principals in another tenant; a scoped admin may
        only hand out scopes it holds itself (the guard checks the scopes asked for)."""
        return admin.create(self, name, role, scopes, tenant)

    @guarded("principal.list", A)
    def principals(self) -> builtins.list[Principal]:
        return admin.listing(self)

    @guarded("principal.revoke", A)
    def revoke_principal(self, principal_id: str) -> None:
        """Revoke a principal's key at once; its audit entries stay."""
        admin.revoke(self, principal_id)

    # The guard's hooks (see deleatur.access.guard); the logic is in deleatur.access.calls.

    def _enter_call(
        self, action: str, capability: Needed, users: Iterable[str] | None, request: Any, extra: dict[str, Any]
    ) -> Call:
        self._take_turn()
        try:
            call = calls.enter(self, action, capability, users, request, extra=extra)
        except BaseException:
            self._shared.turn.release()
            raise
        call.names_forgotten = names_forgotten()
        call.scrubs = self._shared.scrubs
        return call

    def _leave_call(self, call: Call, error: BaseException | None) -> None:
        try:
            # A call that began before an erasure emptied the caches of names may have
            # read, and cached, what it erased.
            forget_names_again_since(call.names_forgotten)
            calls.leave(self, call, error)
            # Not while entries are deferred (in a read snapshot, or a server's group of
            # reads): the collection takes the write lock, which such a call never waits
            # for. Nor in a write group, whose calls' keys are not settled before it commits.
            deferring = self._shared.deferred is not None or self._shared.group is not None
            if self._current is None and not deferring and not isinstance(error, StoreBusyError):
                if self.keys.unsettled:
                    self._collect_unsettled_keys()
                if self._shared.scrub_owed and call.scrubs == self._shared.scrubs:
                    # What a removal left in a -wal goes as soon as its reader has ended,
                    # not at the removal's next status read, or the next open. (Not after
                    # a call that tried itself: what it reported stays what it found.)
                    with contextlib.suppress(StoreBusyError):
                        self._scrub(wait=False)
        finally:
            self._shared.turn.release()

    def _take_turn(self) -> None:
        """Wait for the handle's connection while another thread uses it (see the class)."""
        try:
            taken = self._shared.turn.acquire(timeout=BUSY_TIMEOUT_MS / 1000)
        except AbandonedTurn:
            raise _TurnAbandoned(
                "a thread that has ended without ending it holds this store handle's turn (a write"
                " group or a read snapshot it began): nothing was done; close the handle (which"
                " rolls such a group back) and open the store again"
            ) from None
        if not taken:
            raise StoreBusyError(
                f"this store handle was in use by another thread for over {BUSY_TIMEOUT_MS / 1000:g} s:"
                " nothing was done; a thread that must not wait opens the store itself"
            )

    @contextmanager
    def _turn(self) -> Iterator[None]:
        self._take_turn()
        try:
            yield
        finally:
            # A block a thread left open as it ended (a read snapshot) may end only when it
            # is collected, in any thread, after close() took its turn over and gave it back.
            if not self._shared.closed or self._shared.turn.holds():
                self._shared.turn.release()

    def _collect_unsettled_keys(self) -> None:
        """Destroy the keys this handle made for writes that did not commit (refused or
        failed under the lock). With a lock held elsewhere they wait for a later call's
        end, or the next open."""
        with contextlib.suppress(StoreBusyError):
            collect_unused_keys(self, self.keys.unsettled)

    def _deny(self, message: str, missing: str) -> AccessDeniedError:
        return calls.deny(self, message, missing)

    def _name_subject(self, subject: str | None) -> None:
        calls.name_subject(self, subject)

    def _scrub(self, *, wait: bool = True) -> bool:
        """Truncate the -wal of the database and of the key store, as an erasure must:
        False if a reader kept either from being truncated (the calls that follow on this
        handle then try again as they end)."""
        done = self._truncate_wals(wait=wait)
        self._shared.scrub_owed = not done
        self._shared.scrubs += 1
        return done

    def _truncate_wals(self, *, wait: bool) -> bool:
        # The mark as it was before either -wal was truncated: a removal marks the store
        # anew after it also destroyed keys, so a mark cleared here was truncated away in both.
        mark = self.backend.scrub_mark()
        keys = self.keys.scrub(wait=wait)
        return self.backend.scrub(wait=wait, settled=mark if keys else None) and keys

    def finish_scrub(self, *, wait: bool = True) -> bool:
        """Truncate both -wal files if a removal left them unscrubbed (a reader kept them
        from being truncated, or its process died first), as the next removal or open
        would; ``wait``: for readers, as a removal's scrub does. False if one still kept
        them, and the store stays marked. A server calls it as a long read of its own
        ends (see sqlitefile.scrubs_unwaited_during)."""
        with self._turn():
            return not self.backend.scrub_pending() or self._scrub(wait=wait)

    def _audit(self, entry: Entry) -> None:
        """A call's entry in a transaction of its own (a read's, a refusal's, a failure's);
        inside a read snapshot, once it ends."""
        if self._shared.deferred is not None:
            self._shared.deferred.append(entry)
            return
        with self._logged(audit_only=True) as events:
            events.append((entry, None))

    def _user_token(self, user_id: str) -> str:
        ref = erased_ref(user_id)
        if ref is not None:  # a scope kept by reference (see principals.rescope_erased_user)
            return self.keys.index.token("user", ref)
        return self._token("user", user_id)

    def _user_ref(self, user_id: str) -> str:
        """A user id's full blind reference (hex): how erasure requests and erased scopes keep it."""
        return self.keys.index.ref("user", self.tenant, user_id).hex()

    # -- the signing key and the log ---------------------------------------------

    def _load_signer(self, *, rotating: bool = False) -> Signer | None:
        """The current signing key, taking up the key of a rotation that committed but
        did not get to move its key file into place (:meth:`_finish_rotation`).
        ``rotating``: the caller holds the rotation's lock."""
        signer = self._finish_rotation(locked=rotating) or read_signer(self.signing_key_path)
        if signer is not None:
            keys = self.backend.signing_keys()
            if keys and keys[-1][0] != signer.key_id.hex():
                raise KeyStoreError(
                    f"signing key {self.signing_key_path} is not this store's current key ({keys[-1][0]})"
                )
        return signer

    def _finish_rotation(self, *, locked: bool) -> Signer | None:
        """The pending key (:func:`pending_path`) if the log announced it, moved into
        place when the rotation's lock can be had; None if there is no such key.

        A pending key not yet announced is left alone: its rotation may be waiting for
        the lock (one that was killed leaves a file the next rotation removes before it
        writes its own). The file is moved only under the lock, read again there: a
        rotation writes the pending file only while it holds the lock, so the file moved
        is the key found announced. Moved without the lock, a rotation that began
        meanwhile had its own key, written and not yet announced, moved over the
        announced one, and when it failed the store's key was lost. While another
        holds the lock (a rotation, which finishes this one as it begins, or a handle
        moving this same key), or where it cannot be had, the key is used as read and
        the file left where it is."""
        pending = pending_path(self.signing_key_path)
        waiting = read_signer(pending)
        if waiting is None or waiting.key_id.hex() not in {key_id for key_id, *_ in self.backend.signing_keys()}:
            return None
        if not locked:
            try:
                with self._rotation_lock(_RotationLockHeld):
                    return self._finish_rotation(locked=True)
            except _RotationLockHeld:
                return waiting
        with contextlib.suppress(FileNotFoundError):  # moved meanwhile by a release that takes no lock
            os.replace(pending, self.signing_key_path)
        return waiting

    def _rotation_lock(self, error: type[DeleaturError]) -> AbstractContextManager[None]:
        lock = self.signing_key_path.with_name(self.signing_key_path.name + ".rotate-lock")
        busy = f"another rotation of the signing key {self.signing_key_path} is running"
        return exclusive_lock(lock, busy, error)

    @contextmanager
    def _logged(
        self, *, sign: bool = False, audit_only: bool = False
    ) -> Iterator[builtins.list[tuple[Entry, str | None]]]:
        """A write transaction whose events are appended to the log before it commits:
        the change and its record are one unit.

        The new tree head is signed in the same transaction when ``sign`` is set
        (erasures), or when the last checkpoint this handle signed is older than
        ``checkpoint_interval_us``: signing costs more than the write itself, so single
        writes arriving together share a checkpoint. Receipts, `log checkpoint`,
        certificates and ``close()`` sign whatever is not yet covered; a tail a crash
        left uncovered stays visible to `log verify` until the next checkpoint.

        ``audit_only`` transactions (a call's audit entry and nothing else, or an
        upgrade's rewrite as the store opens) go ahead without the signing key: a read
        must not go unrecorded because the key is missing, and its entry stays uncovered,
        failing `log verify`, until it returns. They go ahead too, unsigned, where the log
        holds entries the store did not write (which it refuses to sign, IntegrityError):
        an operator can still read the store and its log to see what was added.

        In a :class:`WriteGroup` the transaction is a savepoint of the group's, and only
        an erasure's (``sign``) is signed on its own: the group signs as it commits.
        """
        if self.log.signer is None and self._shared.keys_announced and not audit_only:
            # Writing on would leave entries no checkpoint covers, and verification failing.
            raise self._no_signer()
        group = self._shared.group
        if group is not None and not group.joined:
            raise StoreError("a write group is open on this store handle: commit it before any call outside it")
        events: builtins.list[tuple[Entry, str | None]] = []
        call = self._current
        with self.backend.atomic():
            yield events
            if call is not None and not call.logged:
                events.append((calls.entry(self, call), None))
            if events:
                self.log.append(events)
                signed = (group is None or sign) and self._signing_due(sign)
                if signed:
                    try:
                        self.log.sign_appended()
                    except IntegrityError:
                        if not audit_only:
                            raise
                        # The log holds entries the store did not write, and the check
                        # wrote nothing: a read is recorded all the same, uncovered.
                        signed = False
                    else:
                        self._shared.signed_at = self._clock()
        if events:
            self._shared.unsigned = not signed
            self.log.committed()
        if call is not None:
            call.logged = True

    def _signing_due(self, sign: bool) -> bool:
        """Whether a transaction that appended entries signs the log: always if ``sign``
        (and the handle has the key that signs it), else once the last checkpoint this
        handle signed is ``checkpoint_interval_us`` old."""
        due = sign or self._clock() - self._shared.signed_at >= self.checkpoint_interval_us
        return self.log.signer is not None and due and self._current_signer() is not None

    def _sign_group(self) -> bool:
        """In a write group's transaction, as it commits: sign the log if the group's
        entries (or others this handle left unsigned) are due to be; whether it did."""
        if not self._shared.unsigned or not self._signing_due(False):
            return False
        self.log.checkpoint()
        self._shared.signed_at = self._clock()
        return True

    def _after_commit(self, work: Callable[[], None]) -> None:
        """Run ``work`` once the write transaction just left has committed: now, or, in a
        write group, as the group commits."""
        if self._shared.group is None:
            work()
        else:
            self._shared.group.after_commit(work)

    def _no_signer(self) -> DeleaturError:
        """The error of a call that must sign and has no key, saying what to do: every
        call says the same. A store that never had a key gets one from `keys new`; the
        file of a key the log announced must be restored: a new first key would break the
        log's chain of keys, and a rotation needs the old key to endorse the new one."""
        if self._shared.keys_announced or self.backend.signing_keys():
            missing = SigningKeyMissingError(
                f"the signing key {self.signing_key_path} is missing: this store's log cannot be signed without"
                " it; restore it from a backup (neither `deleatur keys new` nor `deleatur keys rotate` can"
                " replace a key the log announced)"
            )
            missing.remote_message = (
                "the store's signing key is missing on the server: nothing that must be signed can be done"
                " until its operator restores it"
            )
            return missing
        return LogError("this store has no signing key; run `deleatur keys new`")

    def _operator_only(self, what: str) -> None:
        """Refuse ``what`` to anyone but the deployment operator (a tenant's admin is
        refused, and the refusal audited): it changes what every tenant shares."""
        if not self.principal.operator:
            raise self._deny(f"{what} is the deployment operator's alone", "operator")

    @guarded("log.new_key", A)
    def new_signing_key(self) -> Signer:
        """Give a store its first signing key (announced as the first key of its log).
        The deployment operator's alone, as is a rotation."""
        self._operator_only("a store's signing key, on which every tenant's evidence rests,")
        if self.log.signer is not None:
            raise InvalidInputError("this store already has a signing key; run `deleatur keys rotate` to replace it")
        if self.backend.signing_keys():
            raise self._no_signer()
        signer = Signer.generate(self.log.origin)
        try:
            with Made() as made:  # the key file goes if its announcement fails
                made.add(self.signing_key_path, write_signer(self.signing_key_path, signer))
                self._announce_first_key(signer)
        except BaseException:
            self.log.signer = None
            raise
        return signer

    def _announce_first_key(self, signer: Signer) -> None:
        # The key, its checkpoint and the call's audit entry (if any) commit together.
        with self._logged(sign=True):
            self.log.signer = signer
            if not self.backend.signing_keys():  # another process opening the store may have
                self.log.announce_key(signer, previous=None)
                self.log.checkpoint()
        self._shared.keys_announced = True

    @guarded("log.rotate_key", A)
    def rotate_signing_key(self) -> Signer:
        """Replace the signing key: the new key is announced in the log, endorsed by the
        old one, and the checkpoint at the rotation is signed by both. Checkpoints signed
        before stay verifiable with the old public key; the old private key is gone.

        One rotation of a store runs at a time, holding a lock beside the key file
        (``<key>.rotate-lock``): another meanwhile is refused at once, as is one that
        began with a key another rotation has replaced since (LogError), having changed
        nothing. Two at once wrote one pending key file, each over the other's: the first
        to commit moved the other's key into place, and the other announced its own as
        the successor of a key no longer current, breaking the log's key chain.

        The deployment operator's alone: the key signs every tenant's checkpoints,
        receipts and certificates, and their verifiers pin it."""
        self._operator_only("rotating the signing key, on which every tenant's evidence rests,")
        old = self.log.signer
        if old is None:
            raise self._no_signer()
        new = Signer.generate(self.log.origin)
        pending = pending_path(self.signing_key_path)
        with self._rotation_lock(LogError):
            # Read again under the lock: a rotation that committed since this call began
            # replaced the key this one would endorse its successor with.
            current = self._load_signer(rotating=True)
            if current is None:
                raise self._no_signer()  # its file removed since this handle read it
            if current.key_id != old.key_id:
                raise self._rotated_meanwhile()
            # A pending key left now is a killed rotation's, never announced: one that
            # was, _load_signer has just moved into place.
            pending.unlink(missing_ok=True)
            write_signer(pending, new)
            try:
                with self._logged(sign=True):
                    if self.backend.signing_keys()[-1][0] != old.key_id.hex():
                        raise self._rotated_meanwhile()  # by a release that takes no lock
                    self.log.announce_key(new, previous=old)
                    self.log.signer = new
                    self.log.checkpoint(old)
            except BaseException:
                self.log.signer = old
                pending.unlink(missing_ok=True)
                raise
            with contextlib.suppress(FileNotFoundError):  # moved already by a release that takes no lock
                os.replace(pending, self.signing_key_path)
        placed = read_signer(self.signing_key_path)
        if placed is None or placed.key_id != new.key_id:
            raise KeyStoreError(f"the new signing key did not reach {self.signing_key_path}; the rotation is logged")
        return new

    def _rotated_meanwhile(self) -> LogError:
        return LogError(
            f"another rotation replaced the signing key {self.signing_key_path} since this one began"
            f" (the log's current key is {self.backend.signing_keys()[-1][0]}); nothing was changed"
        )

    def _current_signer(self, version: int | None = None) -> Signer | None:
        """The signing key, read again if another process (`keys rotate` beside a running
        server) rotated it since this handle read it: signing with the retired key would
        leave checkpoints that no key current at their size signed. Asked as each call
        begins and before any signing; the key list is read only when another connection
        has committed since the last check (``version``: the store's data_version, read
        just now)."""
        signer = self.log.signer
        if signer is None:
            return None
        if version is None:
            version = self.backend.data_version()
        if version != self._shared.signer_checked:
            keys = self.backend.signing_keys()
            if keys and keys[-1][0] != signer.key_id.hex():
                self.log.signer = signer = self._load_signer()
            self._shared.signer_checked = version
        return signer

    def _refresh(self) -> None:
        """As each call begins: take up what another connection changed that this handle
        keeps in memory (a destroyed data key, a rotated signing key)."""
        try:
            self.keys.refresh()
        except apsw.ConnectionClosedError:
            raise StoreError("this store handle is closed: open the store again") from None
        version = self.backend.data_version()
        if version != self._shared.erasures_checked:
            # Another connection has committed: an erasure by another process, perhaps,
            # whose names this process may hold in its caches (it empties its own).
            made = self.backend.get_setting(ERASURES_MADE)
            if made != self._shared.erasures_made and self._shared.erasures_checked != -1:
                forget_cached_names()  # (a handle's first look has nothing to compare)
            self._shared.erasures_made = made
            self._shared.erasures_checked = version
        self._current_signer(version)

    @guarded("log.public_key", (V, R, W), no_user, audit=False)
    def public_key(self) -> Verifier:
        """The log's current verifier key, to hand to verifiers out of band."""
        signer = self._current_signer()
        if signer is None:
            raise self._no_signer()
        return signer.verifier

    @guarded("log.keys", (V, R, W), no_user, audit=False)
    def signing_keys(self) -> builtins.list[dict[str, Any]]:
        """Every key the log announced, oldest first (the store's own view: pin one)."""
        current = None if self.log.signer is None else self.log.signer.verifier.vkey
        return [
            {"key_id": key.key_id.hex(), "vkey": key.vkey, "log_index": index, "current": key.vkey == current}
            for index, key in self._log_keys()
        ]

    @guarded("log.keys", (V, R, W), no_user, audit=False)
    def announced_keys(self) -> builtins.list[Verifier]:
        """The verifiers of every key the log announced (unpinned checks trust these)."""
        return self._verifiers()

    def _verifiers(self) -> builtins.list[Verifier]:
        return [key for _, key in self._log_keys()]

    def _log_keys(self) -> builtins.list[tuple[int, Verifier]]:
        """The keys the log announced, oldest first, each with the index of its entry. The
        store's list of them (``signing_keys``) only says where to look, for anyone who
        can write the database can add a key of theirs to it: each listed entry must be
        one the store wrote (its MAC), announce the listed key, and be endorsed by the key
        before it. IntegrityError names the first listed key that is not so."""
        keys: builtins.list[tuple[int, Verifier]] = []
        for key_id, vkey, index, _ in self.backend.signing_keys():
            entry = self.log.written(index) if index >= 0 else None
            if entry is None or entry.type is not EventType.KEY or entry.fields.get("vkey") != vkey:
                problem: str | None = "which is no announcement of it the store wrote"
            else:
                problem = announce_key(entry, index, keys)
                if problem is None and keys[-1][1].key_id.hex() != key_id:
                    problem = "under another key id"
            if problem is not None:
                raise IntegrityError(
                    f"the store lists signing key {key_id} as announced at log entry {index}, {problem}:"
                    " its list of keys was altered; `deleatur log verify` compares it with the log"
                )
        return keys

    @guarded("log.checkpoint", (V, R, W), audit=False)
    def checkpoint(self, *, size: int | None = None) -> Note:
        """The latest signed checkpoint (signing one now if the log grew without one), or
        the stored one of tree size ``size``, with any cosignatures a witness added to it."""
        if size is None:
            return self._checkpoint()
        check_int(size, "size", low=0)
        found = self.backend.checkpoint(size)
        if found is None:
            raise NotFoundError(f"no stored checkpoint of size {size}")
        return Note.parse(found[1])

    def _checkpoint(self) -> Note:
        call = self._current
        if call is not None and not call.logged:
            with self._logged(sign=True):
                pass  # the call's own entry, covered by the checkpoint it hands out
        return self._signed_checkpoint()

    def _signed_checkpoint(self) -> Note:
        """The newest checkpoint, signed now if the log grew since."""
        latest = self.backend.checkpoint()
        if latest is not None and latest[0] == self.backend.log_size():
            return Note.parse(latest[1])
        if self.log.signer is None:
            raise self._no_signer()
        with self.backend.atomic():
            return self.log.checkpoint()

    @guarded("log.receipt", R, in_space)
    def receipt(self, record_id: str, *, space: Space = DEFAULT_SPACE) -> Receipt:
        """A write receipt: the record's log entry, proven included under a signed checkpoint."""
        self._row_in_space(record_id, space)
        indexes = self.backend.log_indexes_of(record_id)
        if not indexes:
            raise NotFoundError(f"record {record_id} has no write entry in the log", record_id=record_id)
        index = indexes[0]
        note = self._checkpoint()
        size = Checkpoint.parse(note.text).size
        entry = self.log.entry(index)
        proof = TlogProof(index, tuple(self.log.inclusion_proof(index, size)), note)
        return Receipt(record_id=record_id, entry=entry, proof=proof)

    @guarded("log.prove", (V, R), audit=False)
    def prove(self, index: int) -> TlogProof:
        """A C2SP tlog-proof that entry ``index`` is in the log; the entry rides in ``extra``.
        Another tenant's entries are not handed out (key announcements belong to all), nor
        any to a key scoped to some users: an entry proven is the raw one, which its audit
        trail shows only in part (other users' calls, pseudonyms it can match to names).
        Such a key proves its records' entries with :meth:`receipt`."""
        check_int(index, "index", low=0)
        if self.principal.scopes is not None:
            raise self._deny(
                "a key scoped to some users proves no raw log entry (it may be about other users):"
                " a record's entry is proven by the record's receipt, which a key that may read it gets",
                "scope",
            )
        note = self._checkpoint()
        size = Checkpoint.parse(note.text).size
        if not index < size:
            raise InvalidInputError(f"index {index} is outside the log (size {size})")
        entry = self.log.entry(index)
        if json.loads(entry).get("tenant", self.tenant) != self.tenant:
            raise NotFoundError(f"entry {index} is not this tenant's")
        return TlogProof(index, tuple(self.log.inclusion_proof(index, size)), note, extra=entry)

    @guarded("log.consistency", (V, R), audit=False)
    def consistency_request(self, old: Note, *, new_witness: bool = False) -> str:
        """Prove the current log extends ``old``, as a tlog-witness add-checkpoint body.
        With ``new_witness``, ask a witness that has not seen this log yet to cosign
        ``old`` itself: a request from size 0, which needs no proof; later requests
        then start from ``old``."""
        check_type(new_witness, bool, "new_witness")
        previous, current, size = self._extension_of(old)
        if new_witness:
            return format_request(0, [], old)
        return format_request(previous.size, self.log.consistency_proof(previous.size, size), current)

    @guarded("log.consistency", (V, R), audit=False)
    def rotation_proof(self, old: Note) -> str:
        """What a witness that cosigned ``old`` needs to follow this log's key rotations
        (`witness update-log`): the add-checkpoint request proving the log extends ``old``
        up to a checkpoint signed by the current key, and every key announcement with its
        inclusion proof in that checkpoint's tree."""
        previous, current, size = self._extension_of(old)
        entries = [
            (index, self.log.entry(index), self.log.inclusion_proof(index, size))
            for index, _ in self._log_keys()
            if index < size
        ]
        request = format_request(previous.size, self.log.consistency_proof(previous.size, size), current)
        return format_rotation_proof(request, entries)

    def _extension_of(self, old: Note) -> tuple[Checkpoint, Note, int]:
        """``old`` parsed, once checked to be a checkpoint this log signed of a prefix of
        it, with the current checkpoint and its size."""
        check_type(old, Note, "old")
        try:
            open_note(old, self._verifiers())
            previous = Checkpoint.parse(old.text)
        except NoteError as exc:
            raise InvalidInputError(f"old checkpoint: {exc.message}") from None
        if previous.origin != self.log.origin:
            raise InvalidInputError(f"old checkpoint is from log {previous.origin}, not {self.log.origin}")
        current = self._checkpoint()
        size = Checkpoint.parse(current.text).size
        if previous.size > size:
            raise LogError(f"the log has {size} entries, fewer than the old checkpoint's {previous.size}")
        if self.log.root(previous.size) != previous.root:
            raise LogError(f"this log's root at size {previous.size} differs from the old checkpoint's")
        return previous, current, size

    @guarded("log.cosign", A)
    def add_cosignatures(self, lines: str, witness: CosignatureVerifier, *, size: int | None = None) -> Note:
        """Attach a witness's cosignatures to a stored checkpoint, after checking each one.

        ``lines`` are the witness's note signature lines, or the cosigned checkpoint
        with them, whose own size then names the checkpoint. Otherwise it is the one of
        tree size ``size``, or else the one the cosignatures verify for: the latest, or
        one of the 999 before it, since the log may have grown after the witness was
        sent the checkpoint it cosigned."""
        check_type(lines, str, "lines")
        check_type(witness, CosignatureVerifier, "witness")
        if size is not None:
            check_int(size, "size", low=0)
        carried, signatures = _read_cosignatures(lines)
        mine = [s for s in signatures if witness.matches(s)]
        if not mine:
            raise InvalidInputError(f"no signature line from witness {witness.name} ({witness.key_id.hex()})")
        if carried is not None:
            carried_size = _checkpoint_size(carried.text)
            if size is not None and size != carried_size:
                raise InvalidInputError(f"the cosigned checkpoint is of size {carried_size}, not {size}")
            size = carried_size
        if size is None:
            candidates = list(itertools.islice(self.backend.checkpoints(newest_first=True), _COSIGNED_LOOKBACK))
        else:
            found = self.backend.checkpoint(size)
            if found is None:
                raise NotFoundError(f"no checkpoint of size {size}")
            candidates = [found]
        if not candidates:
            raise NotFoundError("the log has no checkpoint")
        for found_size, stored in candidates:
            note = Note.parse(stored)
            if carried is not None and carried.text != note.text:
                raise InvalidInputError(f"the cosigned checkpoint of size {size} is not the one this log signed")
            try:
                for signature in mine:
                    witness.verify(note.text, signature)
            except NoteError as exc:
                if size is None:
                    continue
                raise InvalidInputError(f"cosignature for the checkpoint of size {found_size}: {exc.message}") from None
            known = set(note.signatures)
            cosigned = note.with_signatures(s for s in mine if s not in known)
            # A witness's signatures need no signing key of ours: the call goes ahead without one.
            with self._logged(audit_only=True):
                self.backend.put_checkpoint(found_size, cosigned.format(), replace=True)
            return cosigned
        raise InvalidInputError(
            f"cosignature by {witness.name} does not verify for any of the latest {len(candidates):,} checkpoints"
            f" (the latest is of size {candidates[0][0]}); if the witness cosigned an older one, give its size"
        )

    @property
    def unsigned(self) -> bool:
        """Whether this handle has entries to sign: it appended entries that no checkpoint
        covers yet, and holds the log's signing key. Its next write signs them once its
        checkpoint interval has passed, as do :meth:`sign_pending` and ``close()``; until
        then `log verify` finds them uncovered."""
        return self._shared.unsigned and self.log.signer is not None

    @guarded("log.sign", V, audit=False)
    def sign_pending(self) -> None:
        """Sign the entries this handle appended within the checkpoint interval, as
        ``close()`` would. Only if it has some: a checkpoint covers the log up to its end,
        so a tail another connection left after them (a crash's, or an intruder's) is
        covered with them; a handle with none to sign leaves such a tail for verification
        to find."""
        self._sign_pending()

    def _sign_pending(self) -> None:
        if self.unsigned:
            with self.backend.atomic():
                self.log.checkpoint()
            self._shared.unsigned = False

    def read_snapshot(self) -> AbstractContextManager[None]:
        """Calls in the block that only read see the store as it was when the block began
        (a server verifies the log as of a moment its own handle had signed all it wrote),
        and are authorized as of then: a key revoked since still reads, one revoked before
        is refused. The entry such a call writes on its own (a read's, a refusal's) is
        written as the block ends, since a read snapshot can write nothing."""
        # Returned, not decorated: the guard's coverage test takes any public method that
        # has __wrapped__ for a guarded one.
        return self._read_snapshot()

    @contextmanager
    def _read_snapshot(self) -> Iterator[None]:
        # In the handle's turn for its whole life: another thread's call would run in the
        # snapshot's transaction (or fail to begin its own), its entry in the snapshot's batch.
        with self._turn():
            if self._shared.group is not None:
                raise StoreError("a read snapshot cannot begin while a write group is open on this store handle")
            if self._shared.reading:
                raise StoreError("a read snapshot is already open on this store handle")
            batch = AuditBatch(self)
            began = names_forgotten()
            try:
                with batch.collecting(), self.backend.snapshot():
                    self._shared.reading = True
                    try:
                        yield
                    finally:
                        self._shared.reading = False
            finally:
                forget_names_again_since(began)  # the snapshot read what an erasure removed since
                batch.write()

    def write_group(self) -> WriteGroup:
        """A group in which write calls on this handle share one transaction, committed
        (and signed) once: a server's group commit of writes. Answer none of its calls
        before :meth:`WriteGroup.commit` returns."""
        return WriteGroup(self)

    def audit_batch(self) -> AuditBatch:
        """A batch to collect the entries that calls would write in transactions of their
        own (a read's, a refusal's, a failure's) and write them in one: a server's group
        commit. Answer none of those calls before :meth:`AuditBatch.write` returns."""
        return AuditBatch(self)

    @guarded("log.verify", V, audit=False)
    def verify_log(
        self,
        *,
        pinned_keys: builtins.list[Verifier] | None = None,
        pinned_checkpoint: Note | None = None,
        size: int | None = None,
    ) -> Report:
        """Re-derive the whole log from its entries and check every checkpoint.

        Entries this process appended within the checkpoint interval are signed first,
        as ``close()`` would sign them; any other entry no checkpoint covers fails the
        coverage check. With ``size``, the log as its stored checkpoint of that tree size
        left it (one a verifier was given, say): the entries and checkpoints since are
        newer than the verification, and nothing is signed first."""
        check_optional(pinned_checkpoint, Note, "pinned_checkpoint")
        return self._verify_log(pinned_keys=_pinned(pinned_keys), pinned_checkpoint=pinned_checkpoint, size=size)

    def _verify_log(
        self,
        *,
        pinned_keys: builtins.list[Verifier] | None = None,
        pinned_checkpoint: Note | None = None,
        size: int | None = None,
        pin_with: str = "deleatur log verify --expected-checkpoint FILE",
        key_with: str = "deleatur log verify --expected-pubkey",
    ) -> Report:
        refused = None
        if size is not None:
            check_int(size, "size", low=0)
            if self.backend.checkpoint(size) is None:
                raise NotFoundError(f"no stored checkpoint of size {size}")
        else:
            try:
                self._sign_pending()
            except IntegrityError as exc:
                refused = exc  # entries the store did not write: verified as they are, and said why

        def level(height: int) -> Iterator[tuple[int, bytes]]:
            # The stored subtrees wholly within the first ``size`` entries.
            nodes = self.backend.log_level(height)
            return nodes if size is None else ((i, h) for i, h in nodes if (i + 1) << height <= size)

        report = verify_log(
            self.backend.log_entries(end=size),
            ((n, note) for n, note in self.backend.checkpoints() if size is None or n <= size),
            level,
            pinned_keys=pinned_keys,
            pinned_checkpoint=pinned_checkpoint,
            consistency=self.log.consistency_proof,
            listed_keys=[(k, v, i) for k, v, i, _ in self.backend.signing_keys() if size is None or i < size],
            pin_with=pin_with,
            key_with=key_with,
        )
        if refused is not None:
            report.notes.append(f"NOT SIGNED: {refused.message}")
        return report

    @guarded("audit.show", V)
    def audit_entries(
        self,
        *,
        start: int = 0,
        limit: int | None = None,
        calls_only: bool = False,
        actor: str | None = None,
        scan: int | None = None,
    ) -> AuditTrail:
        """The audit trail of this tenant, oldest first (see :mod:`deleatur.access.audit`):
        at most ``limit`` entries, read from at most ``scan`` of the log's; once read, the
        trail's ``resume`` says where the log goes on (None: it was read to its end)."""
        return audit_entries(self, start=start, limit=limit, calls_only=calls_only, actor=actor, scan=scan)

    @guarded("audit.verify", V, audit=False)
    def verify_audit(
        self,
        *,
        pinned_keys: builtins.list[Verifier] | None = None,
        state: str | os.PathLike[str] | None = None,
        size: int | None = None,
    ) -> Report:
        """Verify the whole trail; with ``state``, also that it extends the checkpoint
        the last passing verification recorded there (which catches a cut-back tail).
        ``size``: as of the stored checkpoint of that tree size (see :meth:`verify_log`)."""
        where = None if state is None else check_path(state, "state", written=True)
        return verify_audit(self, pinned_keys=_pinned(pinned_keys), state=where, size=size)

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    # -- encryption --------------------------------------------------------------

    def _subject_ref(self, canonical: str) -> bytes:
        return self.keys.index.ref("subject", self.tenant, canonical)

    def _key_ref(self, space: Space, key: str) -> bytes:
        return self.keys.index.ref("key", self.tenant, space.user_id, space.agent_id, space.run_id, key)

    def _index_text(self, space: Space, text: str) -> str:
        """What the full-text index receives for ``text``: its index terms."""
        return " ".join(self._index_terms(space, _TOKEN.findall(unicodedata.normalize("NFKC", text))))

    def _index_terms(self, space: Space, words: Iterable[str]) -> builtins.list[str]:
        """Each word, folded, as a keyed hash (64 bits) prefixed with its space's token.
        The index thus holds no word in clear: FTS5 keeps fragments of terms it no longer
        holds as page separators until it next merges their segment, and those fragments
        are then of hashes, which nothing but the store's keys can test a guess against."""
        prefix = self._scope_token(space)
        keyed = self._term_hashers.get(self.tenant)
        if keyed is None:
            key = self.keys.index.ref("index-term", self.tenant)
            keyed = self._term_hashers[self.tenant] = hashlib.blake2b(key=key, digest_size=8)
        terms = []
        for word in words:
            term = keyed.copy()  # a copy of the keyed state costs half of keying anew
            term.update(_fold_term(word).encode())
            terms.append(prefix + term.hexdigest())
        return terms

    def _scope_token(self, space: Space) -> str:
        # One opaque token per space: the index matches it exactly, so "user1"
        # never matches "user10", and the index holds no user ids in clear.
        return self._token("scope", space.user_id, space.agent_id, space.run_id)

    def _token(self, purpose: str, *parts: str) -> str:
        """An opaque per-tenant token (a blind index) of ``parts``, kept for reuse: every
        write and every audit entry needs one. The handle's views share the cache (a
        server makes a view per request), so it is keyed by tenant too."""
        key = (self.tenant, purpose, *parts)
        token = self._tokens.get(key)
        if token is None:
            ref = self.keys.index.ref(purpose, self.tenant, *parts)
            # 48 bits: short, so the index stays small; two spaces sharing a prefix would
            # only share posting lists, since search filters on the space columns too.
            token = self._tokens[key] = self.keys.index.token(purpose, ref)
            if len(self._tokens) > 4096:
                # An erasure in another thread may empty the cache meanwhile.
                with contextlib.suppress(StopIteration, RuntimeError, KeyError):
                    self._tokens.pop(next(iter(self._tokens)))
        return token

    def _aad(self, record_id: str, subject_ref: bytes) -> bytes:
        # Framing is concatenation, so the part shared by all of a tenant's records is made once.
        prefix = self._aad_prefixes.get(self.tenant)
        if prefix is None:
            prefix = _frame(("deleatur/record/v1", self.backend.store_id, self.tenant))
            self._aad_prefixes[self.tenant] = prefix
        # _frame((record_id, subject_ref)), inlined: every record read makes one.
        rid = record_id.encode("utf-8")
        return b"".join((prefix, _LENGTH.pack(len(rid)), rid, _LENGTH.pack(len(subject_ref)), subject_ref))

    def _fields(self, row: StoredRow) -> tuple[Any, ...]:
        """The fields of the record ``row`` stores, in :class:`Record`'s order: its
        personal content decrypted and authenticated."""
        aead = self.keys.key_by_id(row.key_id)
        try:
            plain = aead.decrypt(row.ciphertext[:_NONCE], row.ciphertext[_NONCE:], self._aad(row.id, row.subject_ref))
        except InvalidTag:
            raise IntegrityError(f"record {row.id} failed authentication", record_id=row.id) from None
        payload = _payload(plain)
        # Taken positionally, in field order: keywords took a third of making the record.
        return (
            row.id,
            row.tenant,
            row.space,
            payload["subject"],
            payload["subject_original"],
            payload["key"],
            payload["text"],
            payload["metadata"],
            payload["source"],
            row.confidence,
            row.derived_from,
            row.status,
            row.supersedes,
            row.created_at,
            row.updated_at,
            row.expires_at,
            bytes.fromhex(payload["nonce"]),
            payload["reason"],
            payload["actor"],
        )

    def _decrypt(self, row: StoredRow) -> Record:
        return Record(*self._fields(row))

    # -- writing -----------------------------------------------------------------

    @guarded("remember", W, in_space)
    def remember(
        self,
        text: str,
        *,
        subject: str,
        space: Space = DEFAULT_SPACE,
        key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        source: str | None = None,
        confidence: float | None = None,
        derived_from: Iterable[str] = (),
        expires_at: int | str | None = None,
        for_legal_claim: bool = False,
    ) -> Record:
        """Write one memory; a new value for an existing key supersedes the old one.
        ``expires_at``, if given, must be later than now: microseconds since the epoch, an
        ISO 8601 time (UTC if it has no offset, as records show it) or a delay like ``30d``."""
        if isinstance(expires_at, str):
            try:
                expires_at = parse_when(expires_at, self._clock())
            except ValueError as exc:
                raise InvalidInputError(f"expires_at: {exc}") from None
        item = NewMemory(
            text=text,
            subject=subject,
            key=key,
            metadata={} if metadata is None else metadata,
            source=source,
            confidence=confidence,
            derived_from=tuple(check_items(derived_from, str, "derived_from")),
            expires_at=expires_at,
        )
        return self._remember_many([item], space, for_legal_claim)[0]

    @guarded("remember", W, in_space)
    def remember_many(
        self, items: Iterable[NewMemory], *, space: Space = DEFAULT_SPACE, for_legal_claim: bool = False
    ) -> list[Record]:
        """Write many memories in one transaction: all of them, or none. Writes about a
        restricted subject (Art. 18) are refused unless ``for_legal_claim``."""
        return self._remember_many(check_items(items, NewMemory, "items"), space, for_legal_claim)

    def _remember_many(self, batch: builtins.list[NewMemory], space: Space, for_legal_claim: bool) -> list[Record]:
        check_type(space, Space, "space")
        check_type(for_legal_claim, bool, "for_legal_claim")
        now = self._clock()
        for item in batch:
            validate_text(item.text, self.max_text_bytes)
            check_metadata_size(item.metadata, self.max_text_bytes)
            if item.expires_at is not None and item.expires_at <= now:
                # Such a record would never be recalled, and the next purge would erase it.
                raise InvalidInputError(f"expires_at {isoformat(item.expires_at)} is in the past")
        if not batch:
            return []
        refs = self._subject_refs(batch)
        # Refuse bad lineage and restricted subjects before any data key is made, so a
        # refused write leaves no trace in the key store either; checked again under the lock.
        self._check_writable(refs.values(), self._lineage_sources(batch), for_legal_claim)
        seen = self.backend.data_version()
        keys = self._data_keys(refs)
        # A batch makes its index writes at its end (see deferred_index); one write gains
        # nothing from that and would pay for the bookkeeping.
        deferred: AbstractContextManager[None] = self.backend.deferred_index() if len(batch) > 1 else nullcontext()
        with self._logged() as events, deferred:
            self._check_writable(refs.values(), self._lineage_sources(batch), for_legal_claim)
            self._ids.after(self.backend.newest_id())  # ids follow commit order (see IdGenerator.after)
            keys = self._live_keys(keys, seen)
            retention = retention_for(self, space)
            pending: builtins.list[tuple[StoredRow, str]] = []
            records = [
                self._write(
                    item, space, keys, events, retention=retention, pending=pending, for_legal_claim=for_legal_claim
                )
                for item in batch
            ]
            self.backend.insert_many(pending)
        self._after_commit(partial(self.keys.used, [key_id for _, key_id, _ in keys.values()]))
        return records

    def _check_writable(
        self, subject_refs: Iterable[bytes], sources: builtins.list[StoredRow], for_legal_claim: bool
    ) -> None:
        """Art. 18: refuse a write about a restricted subject, or deriving from one's record
        (that is processing it too), unless it serves a legal claim."""
        refs = {*subject_refs, *(row.subject_ref for row in sources)}
        check_writable(self, sorted(refs), for_legal_claim=for_legal_claim)

    def _subject_refs(self, batch: builtins.list[NewMemory]) -> dict[str, bytes]:
        """The blind reference of each subject of ``batch``, by canonical subject."""
        return {c: self._subject_ref(c) for c in dict.fromkeys(canonical_subject(i.subject) for i in batch)}

    def _data_keys(self, subject_refs: Mapping[str, bytes]) -> dict[str, tuple[bytes, bytes, AESGCM]]:
        """Each subject's (subject_ref, key_id, key), by canonical subject, made before the
        write transaction: a record without its key would be lost, while a key whose records
        never commit is only collected later (see collect_unused_keys)."""
        return {
            canonical: (ref, *self.keys.key_for_subject(self.tenant, ref)) for canonical, ref in subject_refs.items()
        }

    def _live_keys(
        self, keys: dict[str, tuple[bytes, bytes, AESGCM]], seen: int | None = None
    ) -> dict[str, tuple[bytes, bytes, AESGCM]]:
        """Under the write lock: never write under a key an erasure (or a collection of
        unused keys) has destroyed or has committed to destroy. Such a key is destroyed now
        and the subject gets a new one.

        ``seen`` is the store's data_version from before the keys were read: if no other
        connection has committed since, no erasure or collection finished meanwhile (each
        commits to the store after destroying keys), and a key that was there then is there
        now unless it is pending (which is checked regardless).
        """
        pending = pending_key_ids(self)
        recheck = seen is None or self.backend.data_version() != seen
        fresh = dict(keys)
        for canonical, (ref, key_id, _) in keys.items():
            if key_id in pending or (recheck and not self.keys.has_key_id(key_id)):
                fresh[canonical] = (ref, *self._key_not_pending(ref, pending))
        return fresh

    def _key_not_pending(self, ref: bytes, pending: set[bytes] | None = None) -> tuple[bytes, AESGCM]:
        """Under the write lock: the subject's data key, never one that a committed erasure
        is yet to destroy (the subject's current key may be one, made after the key this
        caller first read): such a key is destroyed now, and the subject gets a new one."""
        pending = pending_key_ids(self) if pending is None else pending
        while True:
            key_id, aead = self.keys.key_for_subject(self.tenant, ref)
            if key_id not in pending:
                return key_id, aead
            self.keys.destroy_ids([key_id])

    def _lineage_sources(self, batch: list[NewMemory]) -> builtins.list[StoredRow]:
        """The records the batch derives from, each checked to exist for this caller."""
        lineage = {parent for item in batch for parent in item.derived_from}
        if not lineage:
            return []
        for parent in lineage:
            check_record_id(parent, "derived_from")
        # A scoped key may derive only from records it may see: a record outside its
        # scopes reads as unknown, so lineage cannot probe, or link into, other users.
        rows = self.backend.rows(self.tenant, lineage)
        sources = [r for r in rows if self.principal.covers([r.space.user_id], self._user_ref)]
        missing = lineage - {row.id for row in sources}
        if missing:
            raise NotFoundError(f"derived_from names unknown record id {sorted(missing)[0]}")
        return sources

    def _write(
        self,
        item: NewMemory,
        space: Space,
        keys: Mapping[str, tuple[bytes, bytes, AESGCM]],
        events: builtins.list[tuple[Entry, str | None]],
        *,
        reason: str | None = None,
        actor: str | None = None,
        erased: tuple[str, ...] = (),
        retention: int | None = None,
        pending: builtins.list[tuple[StoredRow, str]] | None = None,
        for_legal_claim: bool = False,
    ) -> Record:
        """Insert one record (inside the caller's transaction), superseding its key's current
        value, and queue its log entry: a salted commitment, never the text. The caller has
        checked that the record's own subject is writable; the superseded value's subject,
        which may be another, is checked here.

        With ``pending``, the row is queued for one batched insert by the caller; a keyed
        record first flushes the queue, so its supersession sees every earlier row.
        ``retention`` is the space's retention period, for records without an expiry.
        """
        canonical = canonical_subject(item.subject)
        subject_ref, key_id, aead = keys[canonical]
        now = self._clock()
        key = None if item.key is None else canonical_key(item.key)
        key_ref = None if key is None else self._key_ref(space, key)
        supersedes = None
        if key_ref is not None:
            if pending:
                self.backend.insert_many(pending)
                pending.clear()
            current = self.backend.active_by_key(self.tenant, space, key_ref)
            if current is not None:
                if current.subject_ref != subject_ref:
                    # Else a write under a restricted subject's key, about another subject,
                    # would retire the restricted value (Art. 18).
                    check_writable(self, [current.subject_ref], for_legal_claim=for_legal_claim)
                self._deactivate(current, Status.SUPERSEDED, now)
                supersedes = current.id
        # Positional, in field order, as in _decrypt.
        record = Record(
            self._ids.new(),
            self.tenant,
            space,
            canonical,  # subject
            item.subject,  # subject_original
            key,
            item.text,
            dict(item.metadata),
            item.source,
            item.confidence,
            tuple(sorted(set(item.derived_from))),
            Status.ACTIVE,
            supersedes,
            now,  # created_at
            now,  # updated_at
            item.expires_at if item.expires_at is not None or retention is None else now + retention,
            self._random(16),  # nonce
            reason,
            actor,
        )
        payload = _dumps(
            {
                "v": 1,
                "text": record.text,
                "metadata": record.metadata,
                "subject": canonical,
                "subject_original": record.subject_original,
                "key": key,
                "source": record.source,
                "nonce": record.nonce.hex(),
                "reason": reason,
                "actor": actor,
            }
        )
        nonce = self._random(_NONCE)
        row = StoredRow(
            id=record.id,
            tenant=self.tenant,
            space=space,
            subject_ref=subject_ref,
            key_ref=key_ref,
            key_id=key_id,
            status=Status.ACTIVE,
            supersedes=supersedes,
            confidence=record.confidence,
            created_at=now,
            updated_at=now,
            expires_at=record.expires_at,
            ciphertext=nonce + aead.encrypt(nonce, payload, self._aad(record.id, subject_ref)),
            derived_from=record.derived_from,
        )
        queued = (row, self._index_text(space, record.text))
        if pending is None:
            self.backend.insert_many([queued])
        else:
            pending.append(queued)
        fields: dict[str, object] = {
            "record": record.id,
            "tenant": self.tenant,
            "commitment": commitment(record.nonce, key, record.text).hex(),
        }
        if supersedes is not None:
            fields["supersedes"] = supersedes
        if reason is not None:
            fields["erased"] = list(erased)
        events.append((Entry(EventType.RECTIFY if reason is not None else EventType.WRITE, now, fields), record.id))
        return record

    @guarded("rectify", W, in_space)
    def rectify(
        self,
        key: str,
        text: str,
        *,
        reason: str,
        actor: str,
        space: Space = DEFAULT_SPACE,
        erase_previous: bool = False,
        for_legal_claim: bool = False,
    ) -> Record:
        """Art. 16: replace the current value of ``key`` with a corrected one.

        The new record supersedes the old and records who corrected it and why. With
        ``erase_previous`` every earlier value of the key is hard-deleted, with the same
        forensic guarantees as an erasure.
        """
        check_type(space, Space, "space")
        check_type(erase_previous, bool, "erase_previous")
        check_type(for_legal_claim, bool, "for_legal_claim")
        if erase_previous and D not in self.principal.capabilities:
            raise self._deny("rectify --erase-previous hard-deletes: it needs the delete capability", D.value)
        if erase_previous and self.principal.role is Role.AGENT:
            # Agents hard-delete only what a dry run showed them, and this has no dry run.
            raise self._deny(
                "an agent may not hard-delete earlier values; a member or admin may, or erase with a dry-run token",
                "confirmation",
            )
        validate_text(text, self.max_text_bytes)
        check_stated(reason, "reason", missing=RECTIFY_NEEDS_REASON)
        actor = check_who(actor, "actor", missing="rectify needs an actor")
        key_ref = self._key_ref(space, canonical_key(key))
        with self._logged() as events:
            # Read the current value under the write lock, so a concurrent writer's
            # newer value is the one superseded, never silently orphaned.
            current_row = self.backend.active_by_key(self.tenant, space, key_ref)
            if current_row is None:
                raise NotFoundError("no active value for this key in this space")
            if current_row.expires_at is not None and current_row.expires_at <= self._clock():
                # A correction keeps the value's expiry: it would be born expired, never
                # recalled, and its retention must not be stretched by a correction either.
                raise NotFoundError(
                    f"the value of this key expired at {isoformat(current_row.expires_at)} and awaits"
                    " purge_expired; remember a new value instead"
                )
            # A legal claim allows writing a correction, never hard-deleting what is held
            # under restriction (Art. 18(1)(c) keeps it for the subject's claim).
            check_writable(self, [current_row.subject_ref], for_legal_claim=None if erase_previous else for_legal_claim)
            self._ids.after(self.backend.newest_id())
            current = self._decrypt(current_row)
            # The correction derives from what the value did: restricted sources stay unused.
            sources = self.backend.rows(self.tenant, current.derived_from)
            check_writable(self, [row.subject_ref for row in sources], for_legal_claim=for_legal_claim)
            item = NewMemory(
                text=text,
                subject=current.subject_original,
                key=current.key,
                metadata=current.metadata,
                source=current.source,
                confidence=current.confidence,
                derived_from=current.derived_from,
                expires_at=current.expires_at,
            )
            earlier_rows = builtins.list(self._key_rows(space, key_ref)) if erase_previous else []
            # An earlier value may be another subject's (a key's values need not share one),
            # whose restriction keeps it as firmly as the current value's keeps that.
            check_writable(self, [r.subject_ref for r in earlier_rows], for_legal_claim=None)
            earlier = {r.id for r in earlier_rows}
            record = self._write(
                item,
                space,
                self._live_keys(self._data_keys(self._subject_refs([item]))),
                events,
                retention=retention_for(self, space),
                reason=reason.strip(),
                actor=actor,
                erased=tuple(sorted(earlier)),
            )
            # Re-read after the write: the value it superseded has left the index since.
            self._purge(r for r in self._key_rows(space, key_ref) if r.id in earlier)
            redact_decisions(self, sorted(earlier), record.id, self._clock(), events, by="rectification")
            if erase_previous:
                self.backend.scrub_after_commit()
        if erase_previous:
            self._scrub()
        return record

    @guarded("forget", W, in_space)
    def forget(self, *, space: Space = DEFAULT_SPACE, record_id: str | None = None, key: str | None = None) -> Record:
        """Retire a fact: it is no longer recalled, and stays in history."""
        check_type(space, Space, "space")
        if (record_id is None) == (key is None):
            raise InvalidInputError("forget needs exactly one of an id or a key")
        with self._logged() as events:
            if record_id is not None:
                row = self._row_in_space(record_id, space)
                if row.status is not Status.ACTIVE:
                    raise InvalidInputError(
                        f"record {record_id} is {row.status.value}, not ACTIVE", record_id=record_id
                    )
            else:
                assert key is not None
                found = self.backend.active_by_key(self.tenant, space, self._key_ref(space, canonical_key(key)))
                if found is None:
                    raise NotFoundError("no active value for this key in this space")
                row = found
            check_writable(self, [row.subject_ref], for_legal_claim=None)
            now = self._clock()
            self._deactivate(row, Status.RETIRED, now)
            events.append((Entry(EventType.RETIRE, now, {"record": row.id, "tenant": self.tenant}), row.id))
            self.backend.scrub_after_commit()
        self._scrub()  # the retired text's index terms leave the -wal too
        return self._decrypt(self._row_in_space(row.id, space))

    def _deactivate(self, row: StoredRow, status: Status, now: int) -> None:
        """Take an active row out of recall: new status, and its terms out of the index."""
        self.backend.unindex(row.id, index_text=self._index_text(row.space, self._decrypt(row).text))
        self.backend.set_status(row.id, status, now)

    def _purge(self, rows: Iterable[StoredRow]) -> int:
        """Hard-delete rows inside the caller's transaction; the caller scrubs after commit.
        A row that records kept here still derive from leaves a stub (blind references of
        its subject and space), so a later erasure of its subject still follows lineage."""
        doomed = list(rows)
        for row in doomed:
            if row.status is Status.ACTIVE:
                self.backend.unindex(row.id, index_text=self._index_text(row.space, self._decrypt(row).text))
        count = self.backend.purge(row.id for row in doomed)
        derived_from = self.backend.still_derived_from(row.id for row in doomed)
        if derived_from:
            self.backend.add_stubs([self._stub(row) for row in doomed if row.id in derived_from])
        return count

    def _stub(self, row: StoredRow) -> LineageStub:
        refs = self._space_refs(SpaceFilter(row.space.user_id, row.space.agent_id, row.space.run_id))
        assert refs.user_ref is not None and refs.agent_ref is not None and refs.run_ref is not None
        return LineageStub(row.id, row.tenant, row.subject_ref, refs.user_ref, refs.agent_ref, refs.run_ref)

    def _space_refs(self, scope: SpaceFilter) -> SpaceRefs:
        """``scope`` as the blind references lineage stubs keep."""
        index = self.keys.index

        def ref(level: str, value: str | None) -> bytes | None:
            return None if value is None else index.ref("stub-" + level, self.tenant, value)

        return SpaceRefs(ref("user", scope.user_id), ref("agent", scope.agent_id), ref("run", scope.run_id))

    def _hard_delete(self, record_ids: Iterable[str]) -> int:
        """The lowest-level delete: rows, lineage and index terms, then a scrub.

        Erasure and rectification build on this; it writes no tombstone.
        """
        with self.backend.atomic():
            rows = [row for rid in record_ids if (row := self.backend.get(self.tenant, rid)) is not None]
            count = self._purge(rows)
        self.backend.scrub()
        return count

    # -- decision snapshots ---------------------------------------------------------

    @guarded("decision.record", W, in_space)
    def record_decision(
        self, summary: str, used: Iterable[str], *, space: Space = DEFAULT_SPACE, for_legal_claim: bool = False
    ) -> Decision:
        """Sign and keep a snapshot of exactly the beliefs (records) a decision used.
        See :mod:`deleatur.decisions.snapshots`."""
        check_type(space, Space, "space")
        check_type(for_legal_claim, bool, "for_legal_claim")
        with self._logged() as events:
            used_ids = check_items(used, str, "used")
            return record_decision(self, summary, used_ids, space, events, for_legal_claim=for_legal_claim)

    @guarded("decision.explain", R, in_space)
    def explain_decision(self, decision_id: str, *, space: Space = DEFAULT_SPACE) -> Decision:
        """The snapshot, after checking its hash and signature (IntegrityError names
        the failed check); erased beliefs appear redacted. To a key scoped to some users,
        the redactions by erasures beyond its scopes are left out, as its audit trail
        leaves out their entries: the body it gets then no longer hashes to ``hash``."""
        check_type(space, Space, "space")
        decision = explain_decision(self, decision_id, space, self._verifiers())
        if self.principal.scopes is None:
            return decision
        view = ScopedView(self, self.principal.scopes)
        shown = [r for r in decision.body["redactions"] if view.shows_redaction(r)]
        return replace(decision, body={**decision.body, "redactions": shown})

    # -- erasure (Art. 17) ---------------------------------------------------------

    @guarded("erase", D, of_filter)
    def erase(
        self,
        subject: str,
        *,
        request_id: str,
        basis: str,
        requester: str,
        scope: SpaceFilter = EVERYWHERE,
        dry_run: bool = False,
        allow_ambiguous: bool = False,
        issue_token: bool = False,
        confirmation: str | None = None,
        require_confirmation: bool = False,
    ) -> ErasureResult:
        """Erase every record of ``subject`` (in ``scope``; all spaces by default) and
        every record derived from them, with tombstones, and destroy the subject's key.

        ``dry_run`` only reports the blast radius (and, with ``issue_token``, returns a
        single-use confirmation token). A repeated ``request_id`` returns the earlier
        result; a failed one may be retried, by any ``requester`` (one line; or, for a
        request an older release recorded with one of several lines, that one). See
        :mod:`deleatur.erasure.engine`. An agent principal must always confirm with the
        token of a dry run.
        """
        self._name_subject(subject)
        return erase(
            self,
            subject=check_type(subject, str, "subject"),
            scope=check_type(scope, SpaceFilter, "scope"),
            request_id=request_id,
            basis=basis,
            requester=requester,
            dry_run=dry_run,
            allow_ambiguous=allow_ambiguous,
            issue_token=issue_token,
            confirmation=confirmation,
            require_confirmation=require_confirmation,
        )

    @guarded("erase_all", D, of_user)
    def erase_all(
        self,
        *,
        user_id: str,
        request_id: str,
        basis: str,
        requester: str,
        agent_id: str | None = None,
        run_id: str | None = None,
        dry_run: bool = False,
        issue_token: bool = False,
        confirmation: str | None = None,
        require_confirmation: bool = False,
    ) -> ErasureResult:
        """Account deletion: every space of ``user_id`` (or one, with agent/run), and no other user's."""
        return erase(
            self,
            subject=None,
            scope=SpaceFilter(check_type(user_id, str, "user_id"), agent_id, run_id),
            request_id=request_id,
            basis=basis,
            requester=requester,
            dry_run=dry_run,
            issue_token=issue_token,
            confirmation=confirmation,
            require_confirmation=require_confirmation,
        )

    @guarded("erasure.certificate", (R, V), calls.of_request)
    def certificate(self, request_id: str) -> dict[str, Any]:
        """A portable, signed erasure certificate (see :mod:`deleatur.erasure.certificate`)."""
        request = settle(self, get_request(self, request_id))
        calls.name_request_users(self, request)
        # A key scoped to users gets a certificate without the counts beyond its scopes.
        return build_certificate(self, request, beyond_scopes_hidden=self.principal.scopes is not None)

    @guarded("erasure.residue", R)
    def residue(self, subject: str, identifiers: Iterable[str]) -> builtins.list[ResidueHit]:
        """Live records not tagged with ``subject`` that mention one of its identifiers."""
        return scan(self, subject, check_items(identifiers, str, "identifiers"))

    # -- access and portability (Art. 15, 20) ---------------------------------------

    @guarded("export", R, of_user)
    def export_json(self, out: TextSink, *, subject: str | None = None, user_id: str | None = None) -> dict[str, int]:
        """Stream everything held about a subject or a user as JSON (``deleatur-export/v1``)."""
        self._name_subject(subject)
        return export_json(self, out, subject=subject, user_id=user_id)

    @guarded("export", R, of_user)
    def export_csv(
        self, directory: str | os.PathLike[str], *, subject: str | None = None, user_id: str | None = None
    ) -> dict[str, int]:
        """The same export as a CSV bundle in an empty directory."""
        self._name_subject(subject)
        return export_csv(self, check_path(directory, "directory", written=True), subject=subject, user_id=user_id)

    # -- storage limitation (Art. 5(1)(e)) ---------------------------------------------

    @guarded("retention.set", A)
    def set_retention(self, kind: str, days: float | None) -> None:
        """Records written to spaces of ``kind`` (user, agent, run) expire after ``days``."""
        set_policy(self, kind, days)

    @guarded("retention.show", (R, V))
    def retention_policy(self) -> dict[str, float | None]:
        return policy(self)

    @guarded("purge", D)
    def purge(
        self,
        *,
        older_than_days: float | None = None,
        request_id: str | None = None,
        dry_run: bool = False,
        issue_token: bool = False,
        confirmation: str | None = None,
    ) -> ErasureResult:
        """Hard-delete expired records (and those older than ``older_than_days``), with
        tombstones and crypto-shredding, as an erasure request of kind ``retention``.
        Without a ``request_id`` it gets a new ``RET-`` one; an empty one is refused, as
        ``erase`` refuses it. An agent principal must confirm with the token of a dry
        run, as for ``erase``."""
        return purge(
            self,
            older_than_days=older_than_days,
            request_id=request_id,
            dry_run=dry_run,
            issue_token=issue_token,
            confirmation=confirmation,
        )

    @guarded("purge.audit", A)
    def prune_audit(self, *, older_than_days: float) -> int:
        """Prune audit (``call``) entries older than ``older_than_days``, leaving their leaf
        hashes and a retention anchor, so the log still verifies. The deployment
        operator's alone: a tenant's admin is refused, and the refusal audited."""
        self._operator_only("pruning audit entries")
        return prune_audit(self, older_than_days=check_number(older_than_days, "older_than_days"))

    # -- restriction (Art. 18) ------------------------------------------------------

    @guarded("restrict", D)
    def restrict(self, subject: str, *, reason: str, actor: str) -> Restriction:
        """Restrict processing of a subject: kept, never recalled, writes refused."""
        self._name_subject(subject)
        return restrict(self, subject, reason=reason, actor=actor)

    @guarded("unrestrict", D)
    def unrestrict(self, subject: str, *, actor: str) -> None:
        self._name_subject(subject)
        unrestrict(self, subject, actor=actor)

    @guarded("restrictions", R)
    def restrictions(self) -> builtins.list[Restriction]:
        return restrictions(self)

    @guarded("erasure.status", (R, V), calls.of_request)
    def erasure_request(self, request_id: str) -> ErasureRequest:
        return calls.readable_request(self, request_id)

    @guarded("erasure.list", (R, V), calls.own_scopes)
    def erasure_requests(self, *, limit: int | None = None, after: str | None = None) -> builtins.list[ErasureRequest]:
        """The tenant's erasure requests in the order they were recorded (a failed request
        retried keeps its place); for a key scoped to users, those in theirs. ``limit`` and
        ``after`` (the last request id of the previous page) page through them, missing
        none that commits meanwhile; an id that names no request gives an empty page."""
        if limit is not None:
            check_int(limit, "limit", low=1)
        if after is not None:
            check_request_id(after)
        return calls.readable_requests(self, limit=limit, after=after)

    # -- reading -----------------------------------------------------------------

    def _row_in_space(self, record_id: str, space: Space) -> StoredRow:
        check_type(space, Space, "space")
        row = self.backend.get(self.tenant, check_record_id(record_id, "record_id"))
        # A record in another space is reported exactly like a missing one, so a caller
        # cannot probe which ids exist outside its space.
        if row is None or row.space != space:
            raise NotFoundError(f"no record {record_id} in this space", record_id=record_id)
        return row

    @guarded("get", R, in_space)
    def get(self, record_id: str, *, space: Space = DEFAULT_SPACE) -> Record:
        return self._decrypt(self._row_in_space(record_id, space))

    @guarded("recall", R, in_space)
    def recall(self, query: str, *, space: Space = DEFAULT_SPACE, limit: int = 10) -> list[Hit]:
        """Full-text search (BM25) over the active, unexpired, unrestricted records of one space.

        The work is bounded per query word, not by the size of the store: a word found
        in more than ``_TERM_CANDIDATES`` (250) records of the space counts only in its
        newest matches (that many, or ``limit`` if larger), as if the index held no
        older ones; a rarer word counts in every record that holds it. A query whose
        every word is in more than ``_COMMON_TERM_DOCS`` (10,000) records returns the
        newest matches, unranked (score 0).
        """
        return [Hit(self._decrypt(row), score) for row, score in self._ranked(query, space, limit)]

    @guarded("recall", R, in_space)
    def recall_json(
        self, query: str, *, space: Space = DEFAULT_SPACE, limit: int = 10
    ) -> builtins.list[dict[str, Any]]:
        """:meth:`recall`'s hits as their JSON (:meth:`Hit.to_json`), made without the
        records: what a server answers with, for a third less of the work per hit."""
        hits = []
        for row, score in self._ranked(query, space, limit):
            made = record_json(*self._fields(row))
            made["score"] = score
            hits.append(made)
        return hits

    def _ranked(self, query: str, space: Space, limit: int) -> builtins.list[tuple[StoredRow, float]]:
        """Recall's ranking: the stored rows of the best matches, still encrypted."""
        check_type(space, Space, "space")
        check_recall_limit(limit)
        words = _TOKEN.findall(unicodedata.normalize("NFKC", check_query(query)))
        if not words:
            raise InvalidInputError("query has no searchable words")
        wanted = list(dict.fromkeys(self._index_terms(space, words[:_MAX_QUERY_TERMS])))
        return self.backend.search(
            self.tenant,
            space,
            wanted,
            now=self._clock(),
            limit=limit,
            common=_COMMON_TERM_DOCS,
            per_term=_TERM_CANDIDATES,
        )

    @guarded("list", R, in_space)
    def list(
        self,
        *,
        space: Space = DEFAULT_SPACE,
        subject: str | None = None,
        key: str | None = None,
        include_history: bool = False,
        limit: int | None = None,
        after: str | None = None,
    ) -> Iterator[Record]:
        """Records of one space, oldest first, streamed; active ones unless ``include_history``.
        ``after`` continues from a record id (pages for remote callers). The arguments are
        checked (and the call audited) when it is made, not when the first record is read.
        The store is read a page at a time: a record removed (erased, purged) while the
        stream is read is not returned after its removal, and one added may be."""
        check_type(space, Space, "space")
        check_type(include_history, bool, "include_history")
        if after is not None:
            check_record_id(after, "after")
        if limit is not None:
            check_int(limit, "limit", low=1)
        where = RowFilter(
            tenant=self.tenant,
            space=space,
            subject_ref=None if subject is None else self._subject_ref(canonical_subject(subject)),
            key_ref=None if key is None else self._key_ref(space, canonical_key(key)),
            statuses=frozenset(Status) if include_history else frozenset({Status.ACTIVE}),
            limit=limit,
            after=after,
        )
        return self._stream(_Paging(where))

    @guarded("history", R, in_space)
    def history(self, key: str, *, space: Space = DEFAULT_SPACE) -> builtins.list[Record]:
        """Every version of a key in one space, oldest first."""
        return builtins.list(self._versions(key, space, limit=None, after=None))

    @guarded("history", R, in_space)
    def versions(
        self, key: str, *, space: Space = DEFAULT_SPACE, limit: int | None = None, after: str | None = None
    ) -> Iterator[Record]:
        """The versions :meth:`history` returns, streamed as :meth:`list` streams records,
        and audited as a ``history`` call: at most ``limit`` of them, after the version
        ``after`` (pages for remote callers, which a key rewritten many times would fill
        past any bound at once). A key with no version is not found, as by ``history``,
        when the call is made; after a cursor, a page may hold none."""
        return self._versions(key, space, limit=limit, after=after)

    def _key_rows(self, space: Space, key_ref: bytes) -> Generator[StoredRow, None, None]:
        """The rows of every version of a key, of every status, oldest first."""
        return self.backend.select(RowFilter(self.tenant, space, key_ref=key_ref, statuses=frozenset(Status)))

    def _versions(self, key: str, space: Space, *, limit: int | None, after: str | None) -> Iterator[Record]:
        check_type(space, Space, "space")
        if after is not None:
            check_record_id(after, "after")
        if limit is not None:
            check_int(limit, "limit", low=1)
        key_ref = self._key_ref(space, canonical_key(key))
        where = RowFilter(self.tenant, space, key_ref=key_ref, statuses=frozenset(Status), limit=limit, after=after)
        paging = _Paging(where)
        # The first page is read now, so that an unknown key fails inside the guarded
        # call, which audits it as a failed one.
        self._read_page(paging)
        if not paging.rows and after is None:
            raise NotFoundError(NO_SUCH_KEY)
        return self._stream(paging)

    def _stream(self, paging: _Paging) -> Generator[Record, None, None]:
        """The records ``paging`` reads, a page at a time, each step in the handle's turn
        (see the class), as a call: a stream is read after the call that made it returned.
        No read stays open between steps (none keeps the -wal from being truncated), and
        a record removed (erased, purged) while the stream is read is not returned after
        its removal: the page is read again, from the last record returned."""
        while True:
            with self._turn():
                if self._shared.closed:
                    raise StoreError("this store handle is closed: open the store again")
                record = self._next_record(paging)
            if record is None:
                return
            yield record

    def _next_record(self, paging: _Paging) -> Record | None:
        while True:
            if not paging.rows:
                if paging.ended:
                    return None
                self._read_page(paging)
                continue
            row = paging.rows.popleft()
            record = self._read_unless_removed(row, paging.mark)
            if record is None:
                paging.read_again()
                continue
            paging.taken(row.id)
            return record

    def _read_unless_removed(self, row: StoredRow, mark: RemovalMark) -> Record | None:
        """The record ``row`` stores, or None if records were removed since ``mark``
        (the caller reads its page again, without what went). Checked once the record is
        read, a cached key having read it too, so that a removal before this point is
        seen. A key destroyed with no removal since (a database restored beside a later
        key store) is reported, as get() reports it."""
        try:
            record = self._decrypt(row)
        except DataKeyDestroyedError:
            if self.backend.removed_since(mark):
                return None  # erased since the page was read: its keys go after its commit
            raise
        return None if self.backend.removed_since(mark) else record

    def _read_page(self, paging: _Paging) -> None:
        began = names_forgotten()
        paging.mark = self.backend.removal_mark()  # before the read: a removal during it shows
        try:
            paging.read(self.backend.select(replace(paging.where, after=paging.last, limit=paging.wanted())))
        finally:
            # A removal through another handle of this process, in another thread, may
            # have emptied the caches of names while this read made rows of what it removed.
            forget_names_again_since(began)


@dataclass(slots=True)
class _Paging:
    """A stream's place: ``where`` read a page at a time, after the last record returned."""

    where: RowFilter
    rows: deque[StoredRow] = field(default_factory=deque)
    mark: RemovalMark = field(default_factory=lambda: RemovalMark(-1, -1, None))
    last: str | None = None
    left: int | None = None  # records still to return, if ``where`` has a limit
    ended: bool = False  # the last page read was the last one

    def __post_init__(self) -> None:
        self.last, self.left = self.where.after, self.where.limit

    def wanted(self) -> int:
        return _STREAM_PAGE if self.left is None else min(_STREAM_PAGE, self.left)

    def read(self, rows: Iterable[StoredRow]) -> None:
        wanted = self.wanted()
        self.rows.extend(rows)
        self.ended = len(self.rows) < wanted

    def read_again(self) -> None:
        """From the last record returned: the rows read may hold some removed since."""
        self.rows.clear()
        self.ended = self.left == 0

    def taken(self, record_id: str) -> None:
        self.last = record_id
        if self.left is not None:
            self.left -= 1
            self.ended = self.ended or self.left == 0


def _holds_entries(store_path: Path) -> bool:
    """Whether the store's log has any entry (a file not yet set up has none). Opened to
    write, though it only reads: an init killed inside SQLite's first transaction on the
    file left a hot journal, which only a connection that may write can roll back."""
    conn = apsw.Connection(str(store_path), flags=apsw.SQLITE_OPEN_READWRITE)
    # The init that made the store may still be closing it (its last checkpoint locks it).
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    try:
        return bool(conn.execute("SELECT 1 FROM log_entries LIMIT 1").fetchall())
    except apsw.SQLError:
        return False  # no such table: an init killed before it made the schema
    except apsw.NotADBError:
        raise NotADeleaturStoreError(f"{store_path} is not a deleatur store (not an SQLite database)") from None
    finally:
        conn.close()
