"""Group commit, for a server whose calls take turns on one store handle: of the reads'
audit entries (:class:`~deleatur.AuditBatch`) and of the writes that make one record
(:class:`~deleatur.WriteGroup`).

Reads join the open group as they run; the first to finish starts the group's write,
which lets the event loop turn once and then waits for the handle's turn like any call,
so every read that runs before it gets there joins it too. While a lock held elsewhere
refuses the write, the group stays open and keeps gathering. Any other call writes the
open group first, in its own turn, so the log lists calls in the order they ran. Each
read is answered once its group is written, or gets the write's error: a read is never
answered before its entry is committed.

A write waits in a queue, and is made when the queue is flushed: the first write to
wait starts the flush, which lets the loop turn once and waits for the handle's turn
like a call, so every write that arrives before it gets there waits with it. The flush
makes them all in one transaction, each a savepoint of it (one that fails undoes its own
writes alone), after the entries of the reads that ran before it, and commits it: the
write lock is held only while the library works, not while requests are parsed and
answered, so another server process gets it in between. While a lock held elsewhere
refuses the flush, the queue keeps gathering. Each write is answered once the flush has
committed, or gets its error.

The turn of the loop lets the requests read meanwhile join: under 32 clients, a commit
recorded 11-18 reads rather than 7 (BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

from ..access.batch import AuditBatch
from ..errors import StoreBusyError
from ..memory import Memory
from ..sqlitefile import first_try

T = TypeVar("T")

#: How a group's write or a flush is made: on the handle in its turn, tried again while
#: a lock held elsewhere refuses it, as the server runs a call (its ``on_store``).
OnStore = Callable[[Callable[[Memory], None]], Awaitable[None]]


class Alone:
    """What a queued write comes back as when it could not be made in the flush without
    waiting for a lock held elsewhere (another process's, on the key store): it changed
    nothing, and is to be made on its own, as a call that is not grouped."""


@dataclass(eq=False)
class _Write(Generic[T]):
    call: Callable[[Memory], T]
    done: asyncio.Future[None]
    queued_at: float = field(default_factory=time.monotonic)
    value: T | Alone | None = None
    error: BaseException | None = None
    settled: bool = False  # its outcome is final: its flush committed, or failed

    def make(self, memory: Memory) -> None:
        """Make the write, keeping what it returned or raised."""
        with first_try() as attempt:
            try:
                self.value = self.call(memory)
            except StoreBusyError as exc:
                self.value, self.error = (Alone(), None) if attempt.to_try_again else (None, exc)
            except Exception as exc:
                self.error = exc


@dataclass(eq=False)
class Group:
    """The entries of reads served one after another, and, once a read waits for them,
    the future it waits on."""

    batch: AuditBatch
    done: asyncio.Future[None] | None = field(default=None)
    written: bool = False


class CommitGroups:
    """The open group of reads and the queue of writes of one server's handle, and their
    commits."""

    def __init__(self, on_store: OnStore) -> None:
        self._on_store = on_store
        self._open: Group | None = None
        self._queue: list[_Write[Any]] = []
        self._queued = threading.Lock()  # a flush may take the queue in a worker thread
        self._flushing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # kept referenced until they end

    # -- reads -----------------------------------------------------------------------

    @contextmanager
    def collecting(self, memory: Memory, joined: set[Group]) -> Iterator[None]:
        """Around one read on ``memory``, in the handle's turn: the entries it would write
        on its own join the open group, which is then added to ``joined``."""
        group = self._open
        if group is None or group.batch.memory is not memory:  # (a pool of one handle keeps it)
            group = self._open = Group(memory.audit_batch())
        before = len(group.batch)
        try:
            with group.batch.collecting():
                yield
        finally:
            if len(group.batch) > before:
                joined.add(group)

    def write_open(self, memory: Memory) -> None:
        """In the handle's turn, before a call that is not a read (in the loop or in a worker
        thread): write the open group, so the reads that ran before it come first in the
        log. Raises what the write raises; the group then stays open."""
        group = self._open
        if group is not None and len(group.batch):
            assert group.batch.memory is memory
            self._commit(group)

    async def written(self, joined: set[Group]) -> None:
        """Return once every group in ``joined`` is written; raise what a write raised."""
        loop = self._loop = asyncio.get_running_loop()
        for group in joined:
            if group.written:
                continue  # a call that is not a read wrote it, before this read got here
            if group.done is None:
                group.done = loop.create_future()
                # Read at once, so a failure every waiter has left is not reported unread.
                group.done.add_done_callback(lambda done: done.cancelled() or done.exception())
                self._start(self._write(group))
            # Shielded: a caller that goes away must not cancel the others' write.
            await asyncio.shield(group.done)

    async def _write(self, group: Group) -> None:
        assert group.done is not None

        def commit(memory: Memory) -> None:
            assert memory is group.batch.memory  # the pool's one handle
            self._commit(group)

        try:
            await asyncio.sleep(0)  # a turn of the loop: see the module's docstring
            await self._on_store(commit)
        except asyncio.CancelledError:
            self._abandon(group)
            group.done.cancel()
            raise
        except Exception as exc:
            self._abandon(group)
            if not group.done.done():
                group.done.set_exception(exc)
        else:
            _resolve(group.done)

    def _abandon(self, group: Group) -> None:
        """Its reads are answered with the error (or, cancelled, not at all): nothing more
        may join it, and what its entries carried is given back."""
        if self._open is group:
            self._open = None
        group.batch.drop()

    def _commit(self, group: Group) -> None:
        """In the handle's turn: write the group, and close it."""
        if group.written:
            return
        group.batch.write()
        self._written(group)

    def _written(self, group: Group) -> None:
        group.written = True
        if self._open is group:
            self._open = None
        if group.done is not None and self._loop is not None:
            # From a worker thread too: the future belongs to the loop.
            self._loop.call_soon_threadsafe(_resolve, group.done)

    # -- writes ----------------------------------------------------------------------

    async def write(self, call: Callable[[Memory], T]) -> T | Alone:
        """Make ``call`` in the next flush: what it returned once the flush has committed,
        or what it (or the commit) raised; :class:`Alone` if it is to be made on its own."""
        loop = self._loop = asyncio.get_running_loop()
        write: _Write[T] = _Write(call, loop.create_future())
        write.done.add_done_callback(lambda done: done.cancelled() or done.exception())
        with self._queued:
            self._queue.append(write)
        if not self._flushing:
            self._flushing = True
            self._start(self._flush())
        # Shielded: a caller that goes away must not cancel the flush.
        await asyncio.shield(write.done)
        if write.error is not None:
            raise write.error
        return write.value  # type: ignore[return-value]  # set once the flush committed

    async def _flush(self) -> None:
        """Flush the queue until it is empty: each flush makes the writes queued by the
        time it gets the handle's turn (and the write lock)."""
        try:
            while self._queue:
                flushed: list[_Write[Any]] = []
                began = time.monotonic()
                try:
                    await asyncio.sleep(0)  # a turn of the loop: see the module's docstring
                    await self._on_store(partial(self._make, flushed=flushed))
                except Exception as exc:
                    if flushed:
                        # Taken and made, then rolled back: never committed (unless the
                        # commit went through, and what failed came after it).
                        failed = [write for write in flushed if not write.settled]
                    elif isinstance(exc, StoreBusyError):
                        # A lock held elsewhere past the busy timeout: for the writes queued
                        # before this flush began to wait for it. Later ones wait on.
                        failed = self._take(queued_by=began)
                    else:
                        failed = self._take()
                    for write in failed:
                        write.value, write.error = None, exc
                    self._settle(failed)
        finally:
            self._flushing = False
            if self._queue:  # only if cancelled: the loop is ending
                for write in self._take():
                    write.done.cancel()

    def _take(self, *, queued_by: float = math.inf) -> list[_Write[Any]]:
        """The writes queued (by ``queued_by``, a ``time.monotonic()``), out of the queue."""
        with self._queued:
            taken = [write for write in self._queue if write.queued_at <= queued_by]
            self._queue = [write for write in self._queue if write.queued_at > queued_by]
        return taken

    def _make(self, memory: Memory, *, flushed: list[_Write[Any]]) -> None:
        """In the handle's turn: the queued writes, in one transaction, after the open group
        of reads' entries (which then commit with them)."""
        transaction = memory.write_group()
        transaction.begin()  # takes the write lock: refused, it changed nothing
        flushed += self._take()
        group = self._open
        try:
            with transaction.joining():
                if group is not None:
                    group.batch.write()
            for write in flushed:
                with transaction.joining():
                    write.make(memory)
            transaction.commit()
        except BaseException:
            if transaction.open:
                transaction.rollback()  # the reads' entries go back to their group, to write again
            raise
        if group is not None:
            self._written(group)
        self._settle(flushed)

    def _settle(self, writes: list[_Write[Any]]) -> None:
        for write in writes:
            write.settled = True
            if self._loop is not None:
                # From a worker thread too: the futures belong to the loop.
                self._loop.call_soon_threadsafe(_resolve, write.done)

    def _start(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
