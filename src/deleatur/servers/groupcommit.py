"""Group commit of audit entries, for a server whose calls take turns on one store
handle (see :class:`~deleatur.AuditBatch`).

Calls join the open group as they run; the first to finish starts the group's write,
which waits for the handle's turn like any call, so every call that runs before it
gets there joins it too. While a lock held elsewhere refuses the write, the group
stays open and keeps gathering. Each call is answered once its group is written, or
gets the write's error: a read is never answered before its entry is committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..access.batch import AuditBatch
from ..memory import Memory

#: How a group's write runs: on the handle in its turn, tried again while a lock held
#: elsewhere refuses it (as the server runs a call).
OnHandle = Callable[[Callable[[Memory], None]], Awaitable[None]]


@dataclass(eq=False)
class Group:
    batch: AuditBatch
    done: asyncio.Future[None] | None = field(default=None)


class AuditGroups:
    def __init__(self, on_handle: OnHandle) -> None:
        self._on_handle = on_handle
        self._open: Group | None = None
        self._writes: set[asyncio.Task[None]] = set()  # kept referenced until they end

    @contextmanager
    def collecting(self, memory: Memory, joined: set[Group]) -> Iterator[None]:
        """Around one call on ``memory``, in the handle's turn: the entries it would write
        on its own join the open group, which is then added to ``joined``."""
        group = self._open
        if group is None or group.batch.memory is not memory:
            group = self._open = Group(memory.audit_batch())
        before = len(group.batch)
        try:
            with group.batch.collecting():
                yield
        finally:
            if len(group.batch) > before:
                joined.add(group)

    async def written(self, joined: set[Group]) -> None:
        """Return once every group in ``joined`` is written; raise what a write raised."""
        for group in joined:
            if group.done is None:
                group.done = asyncio.get_running_loop().create_future()
                # Read at once, so a failure every waiter has left is not reported unread.
                group.done.add_done_callback(lambda done: done.cancelled() or done.exception())
                task = asyncio.create_task(self._write(group))
                self._writes.add(task)
                task.add_done_callback(self._writes.discard)
            # Shielded: a caller that goes away must not cancel the others' write.
            await asyncio.shield(group.done)

    async def _write(self, group: Group) -> None:
        assert group.done is not None
        try:
            await self._on_handle(lambda _: self._commit(group))
        except asyncio.CancelledError:
            group.done.cancel()
            raise
        except BaseException as exc:
            # Its calls are answered with the error, so nothing more may join it.
            if self._open is group:
                self._open = None
            group.done.set_exception(exc)
        else:
            group.done.set_result(None)

    def _commit(self, group: Group) -> None:
        group.batch.write()
        if self._open is group:
            self._open = None
