"""Memory handles for concurrent requests.

A :class:`~deleatur.Memory` wraps one SQLite connection and runs each write in a
``BEGIN IMMEDIATE`` transaction, so one handle must never serve two threads at
once. Servers run each request in a worker thread and lease a handle for the
call: a free one if there is one, else a new one. Leasing rather than keeping a
handle per thread matters because worker pools retire idle threads, and a
per-thread handle would then stay open with nobody to close it; the pool never
holds more handles than there were requests at once, nor more than ``limit``:
with a limit, a request waits for a free handle (``limit=1`` is one handle behind
a lock).
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

    @contextmanager
    def lease(self) -> Iterator[Memory]:
        with self._lock:
            while True:
                if self._closed:
                    raise RuntimeError("the handle pool is closed")
                if self._free or self._limit is None or self._opened < self._limit:
                    break
                self._lock.wait()
            memory = self._free.pop() if self._free else None
            if memory is None:
                self._opened += 1  # counted before opening, so the limit holds meanwhile
        if memory is None:
            try:
                memory = self._open()
            except BaseException:
                with self._lock:
                    self._opened -= 1
                    self._lock.notify()
                raise
        try:
            yield memory
        finally:
            with self._lock:
                closed = self._closed
                if not closed:
                    self._free.append(memory)
                    self._lock.notify()
            if closed:
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
