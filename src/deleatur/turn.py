"""A store handle's turn: one thread at a time uses its connection (see ``Memory``).

It is re-entrant, as an ``RLock``, but owned by the ``Thread`` object rather than by
the thread's id, which a thread started later may be given again. So a turn kept by a
thread that has ended (a write group it began and never ended) is known as such: a
call from another thread is told at once rather than after the busy timeout, and
closing the handle takes the turn over and ends the group. An ``RLock`` cannot do
either: a new thread with the dead one's id would hold it, and no other may release it.
"""

from __future__ import annotations

import threading

#: How often a thread waiting for the turn looks whether its holder has ended.
_LOOK_EVERY_S = 0.25


class AbandonedTurn(Exception):
    """The turn is kept by a thread that has ended (internal: the handle says what)."""


def _ended(thread: threading.Thread) -> bool:
    # The main thread reads as stopped while the interpreter runs its exit handlers,
    # which may still use the handle: it is never taken for ended. A thread that
    # threading did not start (a dummy) always reads as alive.
    return thread is not threading.main_thread() and not thread.is_alive()


class Turn:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: threading.Thread | None = None
        self._depth = 0
        self._taking_over = threading.Lock()

    def acquire(self, timeout: float) -> bool:
        """True once the calling thread holds the turn (again); False if another thread
        kept it for ``timeout`` seconds. Raises :class:`AbandonedTurn` if that thread has
        ended without giving it back."""
        me = threading.current_thread()
        if self._owner is me:
            self._depth += 1
            return True
        if not self._lock.acquire(blocking=False):
            deadline = timeout
            while True:
                owner = self._owner
                if owner is not None and _ended(owner):
                    raise AbandonedTurn
                wait = min(deadline, _LOOK_EVERY_S)
                if self._lock.acquire(timeout=wait):
                    break
                deadline -= wait
                if deadline <= 0:
                    return False
        self._owner, self._depth = me, 1
        return True

    def try_acquire(self) -> bool:
        """Take the turn if no other thread holds it; never wait."""
        if self._owner is threading.current_thread():
            self._depth += 1
            return True
        if not self._lock.acquire(blocking=False):
            return False
        self._owner, self._depth = threading.current_thread(), 1
        return True

    def release(self) -> None:
        if self._owner is not threading.current_thread():
            raise RuntimeError("this thread does not hold the store handle's turn")
        self._depth -= 1
        if not self._depth:
            self._owner = None
            self._lock.release()

    def take_over(self) -> bool:
        """If the thread that holds the turn has ended, the calling thread holds it now
        (once: release it once) and True; else False, changing nothing. Of two threads
        taking over at once, one does."""
        with self._taking_over:
            owner = self._owner
            if owner is None or not _ended(owner):
                return False
            self._owner, self._depth = threading.current_thread(), 1
            return True
