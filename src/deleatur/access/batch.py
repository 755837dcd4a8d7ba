"""Group commit: of audit entries (:class:`AuditBatch`) and of write calls
(:class:`WriteGroup`).

Every call leaves an audit entry. A write's goes into the write's own transaction; a
read's (or a refusal's, or a failure's) takes a transaction of its own, and that
transaction, with its log append and its wait for the write lock, is a fifth of a
recall. A server serving many reads at once collects their entries in an
:class:`AuditBatch` and writes them in one transaction, answering none of those calls
before it has: a call not yet recorded has not happened, as far as its caller knows.

A write's own transaction costs it as much again: taking the lock, writing the pages it
changed to the -wal (the hot ones, index edges and the log's tail, again for every
write), and, where every write is signed, a checkpoint. A server serving many writes at
once makes them in a :class:`WriteGroup`: one transaction, each call a savepoint of it,
committed and signed once, and again no call answered before the commit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from ..errors import DeleaturError, StoreError
from ..log.entries import Entry
from ..sqlitefile import first_try
from . import calls

if TYPE_CHECKING:
    from ..memory import Memory


class AuditBatch:
    """The entries calls on one store handle would have written in transactions of their
    own, collected while :meth:`collecting` and written by :meth:`write`."""

    def __init__(self, memory: Memory) -> None:
        self.memory = memory
        self._entries: list[Entry] = []
        self._uncommitted: list[Entry] = []  # written in an open write group

    def __len__(self) -> int:
        return len(self._entries)

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Calls on the handle (or on a view of it) in the block add their entries here.
        Blocks nest: the innermost collects."""
        shared = self.memory._shared
        # In the handle's turn: blocks of two threads ending out of order would leave the
        # handle's entries going to a batch nobody writes.
        with self.memory._turn():
            outer, shared.deferred = shared.deferred, self._entries
            try:
                yield
            finally:
                shared.deferred = outer

    def write(self) -> None:
        """Write the entries collected so far, all in one transaction; they leave the
        batch once it commits. A write that fails (refused by a lock held elsewhere, say)
        keeps them, to try again, and entries collected meanwhile go with them. In a
        :class:`WriteGroup` (inside its ``joining``) they are written in its transaction,
        and commit with it."""
        if not self._entries:
            return
        with self.memory._turn():
            self._write()

    def _write(self) -> None:
        if self.memory._shared.reading:
            raise StoreError("an audit batch cannot be written inside a read snapshot: write it once the snapshot ends")
        written = self._entries[:]
        with self.memory._logged(audit_only=True) as events:
            events.extend((entry, None) for entry in written)
        del self._entries[: len(written)]
        group = self.memory._shared.group
        if group is not None:
            if not self._uncommitted:
                group.after_commit(self._uncommitted.clear)
                group.after_rollback(self._restore)
            self._uncommitted += written

    def _restore(self) -> None:
        """The write group they were written in rolled back: they are to write again."""
        self._entries[:0] = self._uncommitted
        self._uncommitted.clear()

    def drop(self) -> None:
        """Forget the entries collected, and those written in a write group that has not
        committed: their calls are answered with an error instead. A refused API key's
        entry gives back its place in the budget of refusals written, and the count of
        unwritten ones it carried."""
        for entry in [*self._uncommitted, *self._entries]:
            calls.refusal_unwritten(self.memory, entry)
        self._uncommitted.clear()
        self._entries.clear()


class WriteGroup:
    """Write calls on one store handle made in one transaction and committed together.

    A call made on the handle (or a view of it) inside :meth:`joining` writes in the
    group's transaction, which the first call to join begins (it takes the write lock:
    StoreBusyError, having changed nothing, if another connection holds it). Each call's
    own transaction is a savepoint of the group's, so a call that fails undoes its own
    writes alone. Nothing the calls wrote is durable, or visible to other connections,
    before :meth:`commit`: answer none of them before it returns. A commit that fails, or
    :meth:`rollback`, undoes every call's writes.

    The log's new entries are signed once, as the group commits (when this handle's
    checkpoint interval says so, as a single write's would be), and the calls' full-text
    index writes are made then too, together (a recall inside the group makes those so
    far first, and so finds what the group wrote). While the group is open,
    it keeps the handle's turn: a call from another thread waits for it to end, and one
    from its own thread outside :meth:`joining` is refused (StoreError), a read
    included, since every call writes its audit entry; so, inside it, are removals (which
    must truncate the -wal after their own commit) and read snapshots. A group is used
    once: after it has committed or rolled back, joining it is refused, and so is
    committing one that rolled back (whose calls' writes are gone)."""

    def __init__(self, memory: Memory) -> None:
        self.memory = memory
        self.joined = False
        self._transaction: AbstractContextManager[None] | None = None
        self._held_index: AbstractContextManager[None] | None = None
        self._after: list[Callable[[], None]] = []
        self._undo: list[Callable[[], None]] = []
        self._ended: str | None = None  # "committed" or "rolled back"
        self._thread: threading.Thread | None = None  # the thread that began it

    @property
    def open(self) -> bool:
        """The group's transaction has begun and not yet ended."""
        return self._transaction is not None

    def begin(self) -> None:
        """Begin the group's transaction, if it has not begun: it takes the write lock
        (StoreBusyError, having changed nothing, if another connection holds it), and the
        handle's turn (see :class:`~deleatur.Memory`), which the group keeps until it ends:
        calls from other threads wait for it."""
        if self._ended is not None:
            raise StoreError(f"this write group has {self._ended}: make a new one (Memory.write_group())")
        if self._transaction is not None:
            self._check_thread()
            return
        self.memory._take_turn()
        try:
            self._begin()
        except BaseException:
            self.memory._shared.turn.release()
            raise
        self._thread = threading.current_thread()

    def _begin(self) -> None:
        shared = self.memory._shared
        if shared.reading:
            raise StoreError("a write group cannot begin inside a read snapshot")
        if shared.group is not None:
            raise StoreError("another write group is open on this store handle: commit it first")
        self.memory._refresh()  # a closed handle is refused as every call refuses it
        transaction = self.memory.backend.atomic()
        transaction.__enter__()
        # The calls' index writes are made once, as the group commits: each call's
        # savepoint would otherwise write its own to the index (see store.heldindex).
        held = self.memory.backend.deferred_index()
        held.__enter__()
        self._transaction, self._held_index = transaction, held
        shared.group = self

    def _check_thread(self) -> None:
        if self._thread is not threading.current_thread():
            raise StoreError("this write group was begun by another thread: that thread joins it and ends it")

    @contextmanager
    def joining(self) -> Iterator[None]:
        """Calls on the handle in the block write in the group's transaction, which
        begins here if it has not (see :meth:`begin`)."""
        self.begin()
        self.joined = True
        try:
            yield
        finally:
            self.joined = False

    def after_commit(self, work: Callable[[], None]) -> None:
        """Run ``work`` once the group has committed (not at all if it rolls back)."""
        self._after.append(work)

    def after_rollback(self, work: Callable[[], None]) -> None:
        """Run ``work`` if the group rolls back (not at all if it commits)."""
        self._undo.append(work)

    def commit(self) -> None:
        """Sign the new entries if due, and commit. Raises what a failed commit raised,
        having undone every call's writes; StoreError if the group had rolled back (by
        :meth:`rollback`, or as its handle closed), so its calls' writes are gone."""
        if self._ended == "rolled back":
            raise StoreError("this write group was rolled back: nothing its calls wrote was committed")
        if self._transaction is None:
            return  # it has committed, or nothing joined it
        self._check_thread()
        try:
            self._commit(self._transaction)
        finally:
            self.memory._shared.turn.release()

    def _commit(self, transaction: AbstractContextManager[None]) -> None:
        self._ended = "committed"
        try:
            held, self._held_index = self._held_index, None
            if held is not None:
                held.__exit__(None, None, None)
            signed = self.memory._sign_group()
        except BaseException as exc:
            self._end(exc)
            raise
        self._transaction = None
        self.memory._shared.group = None
        try:
            transaction.__exit__(None, None, None)
        except BaseException:
            self._rolled_back()
            raise
        if signed:
            self.memory._shared.unsigned = False
        after, self._after, self._undo = self._after, [], []
        for work in after:
            work()
        self._collect_keys()

    def rollback(self) -> None:
        """Undo every call's writes: their callers must get an error, not an answer.
        Refused (StoreError) once the group has committed."""
        if self._ended == "committed":
            raise StoreError("this write group has committed: its calls' writes are stored")
        if self._transaction is not None:
            self._check_thread()
            try:
                self._end(StoreError("the write group was rolled back"))
            finally:
                self.memory._shared.turn.release()
        self._ended = "rolled back"

    def roll_back_abandoned(self) -> None:
        """As the handle closes, in the turn the group's thread kept though it has ended:
        undo every call's writes (none of them was answered)."""
        if self._transaction is not None:
            self._end(StoreError("the write group was rolled back: the thread that began it ended"))
        self._ended = "rolled back"

    def _end(self, error: BaseException) -> None:
        transaction, self._transaction = self._transaction, None
        held, self._held_index = self._held_index, None
        self.memory._shared.group = None
        try:
            if held is not None:
                held.__exit__(type(error), error, None)  # its writes are not made
            if transaction is not None:
                transaction.__exit__(type(error), error, None)
        finally:
            self._rolled_back()

    def _rolled_back(self) -> None:
        self._ended = "rolled back"
        self.memory.log.rolled_back()
        undo, self._after, self._undo = self._undo, [], []
        for work in undo:
            work()
        self._collect_keys()

    def _collect_keys(self) -> None:
        """The data keys made for calls whose records did not commit go, as they would at
        a call's end outside a group; never with a long wait for a lock (a first try's).
        If that fails (a lock held elsewhere), they wait for a later call's end, or the
        next open: the group has ended either way, and its outcome stands."""
        if self.memory.keys.unsettled:
            with first_try(), contextlib.suppress(DeleaturError):
                self.memory._collect_unsettled_keys()
