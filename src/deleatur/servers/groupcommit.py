"""Group commit of the reads' audit entries, for a server whose calls take turns on one
store handle (see :class:`~deleatur.AuditBatch`).

Reads join the open group as they run; the first to finish starts the group's write,
which waits for the handle's turn like any call, so every read that runs before it
gets there joins it too. While a lock held elsewhere refuses the write, the group
stays open and keeps gathering. Any other call writes the open group first, in its own
turn, so the log lists calls in the order they ran. Each read is answered once its
group is written, or gets the write's error: a read is never answered before its entry
is committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..access.batch import AuditBatch
from ..memory import Memory

#: How a group's write is made: on the handle in its turn, tried again while a lock held
#: elsewhere refuses it, as the server runs a call (its ``on_store``).
OnStore = Callable[[Callable[[Memory], None]], Awaitable[None]]


@dataclass(eq=False)
class Group:
    """The entries of reads served one after another, and, once a read waits for them,
    the future it waits on."""

    batch: AuditBatch
    done: asyncio.Future[None] | None = field(default=None)
    written: bool = False


class AuditGroups:
    """The open group of one server's handle, and the writes of the groups."""

    def __init__(self, on_store: OnStore) -> None:
        self._on_store = on_store
        self._open: Group | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writes: set[asyncio.Task[None]] = set()  # kept referenced until they end

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
        self._loop = asyncio.get_running_loop()
        for group in joined:
            if group.written:
                continue  # a call that is not a read wrote it, before this read got here
            if group.done is None:
                group.done = self._loop.create_future()
                # Read at once, so a failure every waiter has left is not reported unread.
                group.done.add_done_callback(lambda done: done.cancelled() or done.exception())
                task = asyncio.create_task(self._write(group))
                self._writes.add(task)
                task.add_done_callback(self._writes.discard)
            # Shielded: a caller that goes away must not cancel the others' write.
            await asyncio.shield(group.done)

    async def _write(self, group: Group) -> None:
        assert group.done is not None

        def commit(memory: Memory) -> None:
            assert memory is group.batch.memory  # the pool's one handle
            self._commit(group)

        try:
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
        group.written = True
        if self._open is group:
            self._open = None
        if group.done is not None and self._loop is not None:
            # From a worker thread too: the future belongs to the loop.
            self._loop.call_soon_threadsafe(_resolve, group.done)


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
