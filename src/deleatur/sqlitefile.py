"""Opening SQLite files so that deleted data leaves no trace.

Both the record store and the key store go through :func:`connect`. Each pragma
is set on its own statement and read back: apsw runs a multi-statement string
lazily, and a silently ignored ``secure_delete`` would leave erased text on
freelist pages.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import apsw

from .errors import NotADeleaturStoreError, StoreBusyError, StoreError

try:
    import fcntl
except ImportError:  # Windows: long reads are known within a process only
    _FLOCK = False
else:
    _FLOCK = True

BUSY_TIMEOUT_MS = 30_000
# Pages the -wal may hold before a commit copies them into the database (SQLite's
# default is 1,000). A single write appends ~18 pages, mostly the same hot pages as the
# last write's (index edges, the full-text index's newest segment, the log's tail);
# a checkpoint copies each distinct page once and syncs both files, so a longer -wal
# means fewer copies and syncs per write: +12-25 % single writes/s (BENCHMARKS.md, Store).
# The -wal grows to ~40 MB between checkpoints; every removal still truncates it.
WAL_AUTOCHECKPOINT_PAGES = 10_000
#: A :class:`WalCopier` given upkeep of its own makes it after this many commits.
TIDY_EVERY_COMMITS = 64
# Waits between tries for a lock another connection holds. SQLite's own busy timeout
# sleeps 1 ms at first and up to 100 ms, where our write transactions (a call's audit
# entry, a write) hold the lock for well under a millisecond: with several server
# processes those sleeps, not the work, set the tail latency.
_BUSY_FIRST_S = 50e-6
_BUSY_MOST_S = 2e-3
# How long a first_try waits before it refuses a lock: the loop it runs on stalls that
# long at most, and the few milliseconds another server process holds the lock for a
# write or two pass without handing the call to a thread (which costs more).
FIRST_TRY_WAIT_MS = 10


def _pragma(conn: apsw.Connection, name: str, value: str, expect: str | int) -> None:
    conn.execute(f"PRAGMA {name} = {value}").fetchall()
    got = conn.execute(f"PRAGMA {name}").fetchone()
    if got is None or str(got[0]).lower() != str(expect).lower():
        raise StoreError(f"could not set PRAGMA {name}={value} (got {got!r})")


@dataclass
class Attempt:
    """A call made where it must not wait for a lock (on an event loop that serves
    other requests): see :func:`first_try`."""

    #: A write lock was found held past FIRST_TRY_WAIT_MS, and refused: the call changed nothing.
    refused: bool = False
    #: Something was committed in this attempt: from then on locks are waited for.
    committed: bool = False
    #: Refused before work that may wait long: it must be made where waiting is harmless.
    patient: bool = False
    beginning: bool = False  # inside immediate()'s BEGIN
    repeatable: bool = False  # inside repeatable()

    @property
    def to_try_again(self) -> bool:
        """A lock was refused and nothing committed: the call may be made again whole."""
        return self.refused and not self.committed


_ATTEMPT: ContextVar[Attempt | None] = ContextVar("deleatur_attempt", default=None)


@contextmanager
def first_try() -> Iterator[Attempt]:
    """Within the block, a write transaction that finds the lock held elsewhere fails
    with StoreBusyError after ``FIRST_TRY_WAIT_MS``, rather than waiting up to
    ``BUSY_TIMEOUT_MS``, as long as nothing was committed since the block began;
    ``refused`` then says the call changed nothing, so it may be made again where
    waiting is harmless (later, or in a worker thread). Once
    something has committed, a later lock is waited for as usual: a call half done is
    finished, never abandoned for a retry that would do its first half twice."""
    attempt = Attempt()
    token = _ATTEMPT.set(attempt)
    try:
        yield attempt
    finally:
        _ATTEMPT.reset(token)


@contextmanager
def repeatable() -> Iterator[None]:
    """Commits in the block are ones a retry of the call would find made and not make
    again (a get-or-create): they leave a :func:`first_try` free to refuse a lock."""
    attempt = _ATTEMPT.get()
    if attempt is None or attempt.repeatable:
        yield
        return
    attempt.repeatable = True
    try:
        yield
    finally:
        attempt.repeatable = False


def refuse_if_first_try(work: str) -> None:
    """Before ``work`` that may wait long for other connections (destroying another
    caller's pending keys, then truncating a -wal that a reader holds): a
    :func:`first_try` that may still refuse does so now, so the call is made again
    where waiting is harmless. Elsewhere, nothing."""
    attempt = _ATTEMPT.get()
    if attempt is not None and not attempt.committed:
        attempt.refused = attempt.patient = True
        raise StoreBusyError(f"{work} may wait for other connections; nothing was changed: try again")


def _note_commit() -> bool:
    attempt = _ATTEMPT.get()
    if attempt is not None and not attempt.repeatable:
        attempt.committed = True
    return False  # let the commit go ahead


def _busy_handler() -> Callable[[int], bool]:
    """Retry a busy lock with short waits that double, for up to ``BUSY_TIMEOUT_MS``
    (``FIRST_TRY_WAIT_MS`` for a :func:`first_try` that may still refuse)."""
    since = 0.0

    def retry(prior: int) -> bool:
        nonlocal since
        attempt = _ATTEMPT.get()
        refusing = attempt is not None and attempt.beginning and not attempt.committed
        now = time.monotonic()
        if prior == 0:
            since = now
        elif now - since >= (FIRST_TRY_WAIT_MS if refusing else BUSY_TIMEOUT_MS) / 1000:
            if attempt is not None and refusing:
                attempt.refused = True
            return False
        time.sleep(min(_BUSY_FIRST_S * 2 ** min(prior, 16), _BUSY_MOST_S))
        return True

    return retry


def is_ours(conn: apsw.Connection, path: Path, application_id: int, what: str) -> bool:
    """True if the database carries ``application_id``; False if it is still empty, so
    it may become one; else the file is something else: NotADeleaturStoreError."""
    found = conn.execute("PRAGMA application_id").fetchall()[0][0]
    if found == application_id:
        return True
    if found != 0 or conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()[0][0]:
        raise NotADeleaturStoreError(f"{path} is not a {what}")
    return False


def create_private(path: Path) -> os.stat_result:
    """A new empty file, owner-only from the first byte (the full-text index holds the
    words of the text, and SQLite gives the -wal and -shm files the database file's
    mode); FileExistsError if there is one. Returns the file's identity, to tell it from
    a file put in its place later."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def connect(
    path: Path,
    *,
    create: bool,
    full_sync: bool = False,
    identify: Callable[[apsw.Connection], None] | None = None,
) -> apsw.Connection:
    """A connection set up for this project's files. ``identify`` raises if the file is
    not the kind the caller expects; it runs before anything is written, since setting
    the journal mode alone rewrites a database's header (and gives an empty file one)."""
    flags = apsw.SQLITE_OPEN_READWRITE | (apsw.SQLITE_OPEN_CREATE if create else 0)
    if create:
        try:
            create_private(path)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StoreError(f"cannot open {path}: {exc.strerror}") from None
    conn = None
    try:
        conn = apsw.Connection(str(path), flags=flags)
        conn.set_busy_handler(_busy_handler())
        conn.set_commit_hook(_note_commit)
        # The query planner stability guarantee: no plan depends on a bound value. Built
        # with STAT4 (as apsw's SQLite is), SQLite re-prepares a statement whose plan
        # looked at a bound value each time that value changes, and FTS5 rebinds its
        # segment lookup (on ft_idx) for every segment a term is read from: without
        # this, every full-text cursor was re-prepared once per segment but one: 13 to 49 %
        # of a recall's ranking instructions at 10k to 1M records (BENCHMARKS.md).
        conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1)
        conn.execute("PRAGMA schema_version").fetchall()  # reads the header: is it SQLite?
        # SQLite opens a file it may not write read-only, asked for read-write or not; the
        # first write (a read's audit entry) would fail with an error naming no file.
        if conn.readonly("main"):
            raise StoreError(f"{path} is read-only to this user: a store must be writable (every call is audited)")
        if identify is not None:
            identify(conn)
        _pragma(conn, "secure_delete", "ON", 1)
        _pragma(conn, "journal_mode", "WAL", "wal")
        # NORMAL in WAL mode: a committed transaction survives a crash of the process
        # (it is in the -wal file); FULL also survives power loss, at an fsync per commit.
        _pragma(conn, "synchronous", "FULL" if full_sync else "NORMAL", 2 if full_sync else 1)
        _pragma(conn, "temp_store", "MEMORY", 2)
        _pragma(conn, "wal_autocheckpoint", str(WAL_AUTOCHECKPOINT_PAGES), WAL_AUTOCHECKPOINT_PAGES)
        return conn
    except BaseException as exc:
        # Closed here, not left to the garbage collector: the file would stay open for as
        # long as the caller keeps the error (whose traceback holds the connection).
        if conn is not None:
            conn.close()
        if isinstance(exc, apsw.NotADBError):
            raise NotADeleaturStoreError(f"{path} is not a deleatur store (not an SQLite database)") from None
        if isinstance(exc, apsw.CantOpenError):
            raise StoreError(f"cannot open {path}") from None
        raise


class WalCopier:
    """Copies the -wal of ``conn``'s database into it from a thread of its own, rather
    than in the commit that grows the -wal past :data:`WAL_AUTOCHECKPOINT_PAGES`.

    Such a commit waited for the copy and its syncs (50-140 ms every few hundred writes
    on a 2-core VM), and so did a server's event loop and every request it held: they
    were its slowest 1 % (BENCHMARKS.md). The thread copies what no reader still needs,
    as SQLite's automatic checkpoint does, and waits for no lock: what it could not do
    now, it tries again after the next commit. Until :meth:`close`.

    ``tidy``, if given, is upkeep of the caller's own that the thread makes on its
    connection (``secure_delete`` on) every :data:`TIDY_EVERY_COMMITS` commits of
    ``conn``: a short write, which fails rather than wait for a lock held elsewhere (the
    connection has no busy handler) and is then tried again after the next commit."""

    def __init__(
        self,
        path: Path,
        conn: apsw.Connection,
        *,
        tidy: Callable[[apsw.Connection], None] | None = None,
        copied: Callable[[], None] = lambda: None,
    ) -> None:
        self._copied = copied  # called in the thread after each try (tests wait for it)
        self._tidy = tidy
        self._due = threading.Event()
        self._copy_due = self._tidy_due = self._tidy_failed = False
        self._commits = 0
        self._closing = False
        # Opened here, not in the thread: a file that cannot be opened is the caller's error.
        # The file the connection has open, whatever the working directory is now, and
        # through the same VFS.
        self._own = apsw.Connection(conn.filename, flags=apsw.SQLITE_OPEN_READWRITE, vfs=conn.open_vfs)
        try:
            # A connection finds the -wal as it first reads; until then it checkpoints nothing.
            self._own.execute("PRAGMA schema_version").fetchall()
            # Its tidy writes as the store's own connections do: what it frees zeroed, a
            # commit durable against a crash of the process (no sync of its own, held under
            # the write lock), and no copy of the -wal but the thread's own.
            _pragma(self._own, "secure_delete", "ON", 1)
            _pragma(self._own, "synchronous", "NORMAL", 1)
            self._own.wal_autocheckpoint(0)
            self._thread = threading.Thread(target=self._copy, name=f"deleatur -wal copier ({path.name})", daemon=True)
            self._thread.start()
        except BaseException:
            self._own.close()
            raise
        self._conn = conn
        conn.set_wal_hook(self._committed)  # in place of the automatic checkpoint

    def _committed(self, _conn: apsw.Connection, _name: str, pages: int) -> int:
        self._commits += 1
        # A tidy that failed (a lock held) is tried again after the next commit.
        if self._tidy is not None and (self._commits >= TIDY_EVERY_COMMITS or self._tidy_failed):
            self._commits = 0
            self._tidy_failed = False
            self._tidy_due = True
            self._due.set()
        if pages >= WAL_AUTOCHECKPOINT_PAGES:
            self._copy_due = True
            self._due.set()
        return apsw.SQLITE_OK

    def _copy(self) -> None:
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._closing:
                    return
                copy, self._copy_due = self._copy_due, False
                tidy, self._tidy_due = self._tidy_due, False
                # Busy (another process's checkpoint, a reader, a writer) or failed (a
                # full disk): the files stay as they are, and a later commit asks again.
                # Nothing ends the thread but close(): the commits no longer copy.
                if copy:
                    with contextlib.suppress(Exception):
                        # The long copy first, taking no lock; then, holding the write lock
                        # for the frames committed meanwhile, the one that has the next writer
                        # begin the -wal again (it cannot while a reader is in it: no wait,
                        # since this connection has no busy handler).
                        self._own.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
                        self._own.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_RESTART)
                if tidy and self._tidy is not None and not self._closing:
                    try:
                        self._tidy(self._own)
                    except Exception:
                        self._tidy_failed = True
                with contextlib.suppress(Exception):
                    self._copied()
        finally:
            self._own.close()

    def close(self) -> None:
        """Stop the thread (after the copy it is making), and give the connection's commits
        their automatic checkpoint back; closing again does nothing."""
        if self._closing:
            return
        self._closing = True
        self._due.set()
        # A collection in the thread itself may close it (the handle dropped unclosed).
        if threading.current_thread() is not self._thread:
            self._thread.join()
        self._conn.wal_autocheckpoint(WAL_AUTOCHECKPOINT_PAGES)


@contextmanager
def immediate(conn: apsw.Connection) -> Iterator[None]:
    """A write transaction that takes the lock up front, so concurrent writers queue
    on the busy timeout instead of failing with SQLITE_BUSY on lock upgrade."""
    attempt = _ATTEMPT.get()
    if attempt is not None:
        attempt.beginning = True
    try:
        conn.execute("BEGIN IMMEDIATE").fetchall()
    except apsw.BusyError:
        held = "holds" if attempt is not None and attempt.refused else f"held for over {BUSY_TIMEOUT_MS / 1000:g} s"
        raise StoreBusyError(
            f"another process {held} the write lock of {conn.filename}; nothing was changed: try again"
        ) from None
    finally:
        if attempt is not None:
            attempt.beginning = False
    try:
        yield
    except BaseException:
        _rollback(conn)
        raise
    try:
        conn.execute("COMMIT").fetchall()
    except BaseException:
        # A commit that failed (a full disk, an I/O error) may leave the transaction
        # open, and every later BEGIN on the connection failing with it.
        _rollback(conn)
        raise


def _rollback(conn: apsw.Connection) -> None:
    # Some errors (a full disk, an interrupt) make SQLite roll the whole transaction
    # back itself: a ROLLBACK then would fail, and hide the error that caused it.
    if not conn.getautocommit():
        conn.execute("ROLLBACK").fetchall()


@contextmanager
def savepoint(conn: apsw.Connection) -> Iterator[None]:
    """A transaction inside the connection's open write transaction: it takes no lock,
    and undoes only its own changes if the block raises. Refused (StoreError) if no
    transaction is open: SQLite rolled the outer one back itself (after a full disk, an
    interrupt), and a savepoint would then begin, and its release commit, one of its own."""
    if conn.getautocommit():
        raise StoreError("the enclosing transaction was rolled back (by an error before this one): nothing was written")
    conn.execute("SAVEPOINT deleatur").fetchall()
    try:
        yield
    except BaseException:
        if not conn.getautocommit():  # else the whole transaction is gone, and the error says why
            # ROLLBACK TO keeps the savepoint open (and the outer transaction with it).
            conn.execute("ROLLBACK TO deleatur").fetchall()
            conn.execute("RELEASE deleatur").fetchall()
        raise
    conn.execute("RELEASE deleatur").fetchall()


def data_version(conn: apsw.Connection) -> int:
    """SQLite's ``PRAGMA data_version``: it changes whenever another connection commits."""
    for (value,) in conn.execute("PRAGMA data_version"):
        return int(value)
    return -1


# Whether a long read the caller knows of is under way: see scrubs_unwaited_during.
_LONG_READ: ContextVar[Callable[[], bool] | None] = ContextVar("deleatur_long_read", default=None)


@contextmanager
def scrubs_unwaited_during(long_read: Callable[[], bool]) -> Iterator[None]:
    """Within the block, a :func:`scrub` made while ``long_read()`` is true waits for no
    reader. A long read that the caller knows of (a server verifying its whole log, or
    streaming an export to a slow client, on a handle of its own) keeps the -wal from
    being truncated for as long as it lasts, and waiting for it would hold up every call
    queued behind this one. Such a scrub fails as one does when a reader outlasts its
    wait: the removal's mark stays, and whoever ends the read truncates the -wal then
    (``Memory.finish_scrub``). Asked at each scrub, so a call that began during the read
    waits as usual for a scrub made after it."""
    token = _LONG_READ.set(long_read)
    try:
        yield
    finally:
        _LONG_READ.reset(token)


def _long_read_marker(database: Path) -> Path:
    return database.with_name(database.name + ".long-reads")


@contextmanager
def long_read(database: Path) -> Iterator[None]:
    """Mark, for every process, a long read of ``database`` (see
    :func:`scrubs_unwaited_during`) for the block: a shared flock on an empty file
    beside it, which the kernel drops if the process dies. Without flock, nothing."""
    if not _FLOCK:
        yield
        return
    fd = os.open(_long_read_marker(database), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # and the lock with it


def long_read_marked(database: Path) -> bool:
    """Whether any process (this one included) marks a long read of ``database``. Two
    processes asking at once each see the other's question as a long read: a scrub then
    does not wait, and says so (its removal's mark stays for the next scrub), which a
    scrub may always do; it never claims a truncation it did not make."""
    if not _FLOCK:
        return False
    try:
        fd = os.open(_long_read_marker(database), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        return False
    finally:
        os.close(fd)


def scrub(conn: apsw.Connection, *, wait: bool = True) -> bool:
    """Move every committed page into the main file and empty the -wal file, so old
    page images holding removed data do not linger there.

    A reader in another connection holding an older snapshot keeps the -wal from
    being truncated (SQLite waits for it up to the busy timeout, or not at all
    without ``wait``, or during a long read: see :func:`scrubs_unwaited_during`):
    then this returns False, and the caller must say so rather than claim the -wal
    is clean. So does another connection's checkpoint (a :class:`WalCopier`'s, another
    process's), which SQLite never waits for: this tries again, as long. A statement
    of ``conn`` itself that is still reading (a stream its handle returned) keeps it
    too, and this returns False at once.
    """
    long_read = _LONG_READ.get()
    if long_read is not None and long_read():
        wait = False
    if not wait:
        conn.set_busy_handler(None)
    retry, tries = _busy_handler(), 0
    try:
        while True:
            busy, frames, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0]
            # -1 frames: it could not begin, another checkpoint holding the lock it needs.
            if busy == 0 or frames != -1 or not wait or not retry(tries):
                return bool(busy == 0)
            tries += 1
    except apsw.BusyError:
        return False
    except apsw.LockedError:
        return False  # a statement of this connection (a stream its handle returned) is reading
    finally:
        if not wait:
            conn.set_busy_handler(_busy_handler())


def sidecar_files(path: Path) -> list[Path]:
    """Every file SQLite may write for the database at ``path``."""
    return [path] + [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]
