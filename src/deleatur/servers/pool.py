"""Memory handles for concurrent requests.

A :class:`~deleatur.Memory` wraps one SQLite connection and runs each write in a
``BEGIN IMMEDIATE`` transaction, so one handle must never serve two threads at
once. Servers run each request in a worker thread and lease a handle for the
call: a free one if there is one, else a new one. Leasing rather than keeping a
handle per thread matters because worker pools retire idle threads, and a
per-thread handle would then stay open with nobody to close it; the pool never
holds more handles than there were requests at once, nor more than ``limit``:
with a limit, a request waits for a free handle (``limit=1`` is one handle behind
a lock). :meth:`HandlePool.lease_all` takes every handle at once, when a server must
know that its handles append nothing meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..memory import Memory


class HandlePool:
    def __init__(self, open_memory: Callable[[], Memory], *, limit: int | None = None) -> None:
        if limit is not None and limit < 1:
            raise ValueError("a handle pool needs room for at least one handle")
        self._open = open_memory
        self._limit = limit
        self._free: list[Memory] = []
        self._lock = threading.Condition()
        self._opened = 0
        self._closed = False
        # Set while lease_all waits for, then holds, every handle: no lease starts meanwhile.
        self._all = False

    @contextmanager
    def lease(self) -> Iterator[Memory]:
        with self._lock:
            while True:
                if self._closed:
                    raise RuntimeError("the handle pool is closed")
                if not self._all and (self._free or self._limit is None or self._opened < self._limit):
                    break
                self._lock.wait()
            memory = self._free.pop() if self._free else None
            if memory is None:
                self._opened += 1  # counted before opening, so the limit holds meanwhile
        if memory is None:
            memory = self._opened_one()
        try:
            yield memory
        finally:
            self._give_back([memory])

    @contextmanager
    def lease_all(self) -> Iterator[list[Memory]]:
        """Every handle the pool has opened (a new one if it has none), once all are free;
        no other lease starts until the block ends, so they append nothing meanwhile.
        Every request waits for the block: it must not wait in it for a lock another
        process may hold for long (try under sqlitefile.first_try, and leave the block
        to wait, as the HTTP server's verification does)."""
        with self._lock:
            while self._all and not self._closed:
                self._lock.wait()
            self._all = True
            while len(self._free) < self._opened and not self._closed:
                self._lock.wait()
            if self._closed:
                raise RuntimeError("the handle pool is closed")
            handles, self._free = self._free, []
            if not handles:
                self._opened += 1  # counted before opening, as by lease
        try:
            if not handles:
                handles.append(self._opened_one())
            yield handles
        finally:
            self._give_back(handles, all_of_them=True)

    def _opened_one(self) -> Memory:
        """A new handle, already counted in ``_opened``."""
        try:
            return self._open()
        except BaseException:
            with self._lock:
                self._opened -= 1
                self._lock.notify_all()
            raise

    def _give_back(self, handles: list[Memory], *, all_of_them: bool = False) -> None:
        with self._lock:
            closed = self._closed
            if not closed:
                self._free.extend(handles)
            if all_of_them:
                self._all = False
            # A freed handle wakes one waiting lease, unless every lease waits on lease_all
            # (or it has just ended): then they all look again, lease_all among them.
            if self._all or all_of_them:
                self._lock.notify_all()
            else:
                self._lock.notify()
        if closed:
            for memory in handles:
                memory.close()

    @property
    def idle(self) -> int:
        """How many open handles are free now."""
        return len(self._free)

    @property
    def size(self) -> int:
        """How many handles were opened: the most requests served at once."""
        return self._opened

    def close(self) -> None:
        """Close every free handle; one still leased closes when its request ends."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
            self._lock.notify_all()
        for memory in free:
            memory.close()
