"""A store handle's turn: one thread at a time uses its connection (see ``Memory``).

It is re-entrant, as an ``RLock``, but owned by a token each thread keeps in its
thread-local storage, rather than by the thread's id, which a thread started later may
be given again. Python drops a thread's locals as the thread ends (a thread that
``threading`` did not start too; the main thread's last, after the exit handlers), so
a turn kept by a thread that has ended (a write group it began and never ended) is
known as such: a call from another thread is told at once rather than after the busy
timeout, and closing the handle takes the turn over and ends the group. An ``RLock``
could do neither: a new thread with the dead one's id would hold it, and no other may
release it.
"""

from __future__ import annotations

import threading
import weakref

#: How often a thread waiting for the turn looks whether its holder has ended.
_LOOK_EVERY_S = 0.25


class AbandonedTurn(Exception):
    """The turn is kept by a thread that has ended (internal: the handle says what)."""


class _Token:
    """Lives exactly as long as its thread's locals."""


_local = threading.local()


def _mine() -> _Token:
    try:
        token: _Token = _local.token
    except AttributeError:
        token = _local.token = _Token()
    return token


class Turn:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: weakref.ref[_Token] | None = None
        self._depth = 0
        self._taking_over = threading.Lock()

    def _held_by(self, token: _Token) -> bool:
        owner = self._owner
        return owner is not None and owner() is token

    def _abandoned(self) -> bool:
        owner = self._owner
        return owner is not None and owner() is None

    def acquire(self, timeout: float) -> bool:
        """True once the calling thread holds the turn (again); False if another thread
        kept it for ``timeout`` seconds. Raises :class:`AbandonedTurn` if that thread has
        ended without giving it back."""
        if self.try_acquire():
            return True
        left = timeout
        while True:
            if self._abandoned():
                raise AbandonedTurn
            wait = min(left, _LOOK_EVERY_S)
            if self._lock.acquire(timeout=wait):
                self._owner, self._depth = weakref.ref(_mine()), 1
                return True
            left -= wait
            if left <= 0:
                return False

    def try_acquire(self) -> bool:
        """Take the turn if no other thread holds it; never wait."""
        me = _mine()
        if self._held_by(me):
            self._depth += 1
            return True
        if not self._lock.acquire(blocking=False):
            return False
        self._owner, self._depth = weakref.ref(me), 1
        return True

    def release(self) -> None:
        if not self._held_by(_mine()):
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
            if not self._abandoned():
                return False
            self._owner, self._depth = weakref.ref(_mine()), 1
            return True
