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
import time
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
        # Guards what follows (taken with ``with``, in C: every call takes the turn).
        self._state = threading.Lock()
        self._changed = threading.Condition(self._state)
        self._waiting = 0
        # Who holds the turn and how many times, or None: one attribute, set by one
        # statement under the lock, so that an exception raised between two statements
        # (a KeyboardInterrupt) never leaves the turn held with no holder, which no thread
        # could give back.
        self._holder: tuple[weakref.ref[_Token], int] | None = None

    def _abandoned(self) -> bool:
        holder = self._holder
        return holder is not None and holder[0]() is None

    def _take(self, me: _Token) -> bool:
        """Under the lock: take the turn (again) if no other thread holds it."""
        holder = self._holder
        if holder is None:
            self._holder = (weakref.ref(me), 1)
            return True
        if holder[0]() is me:
            self._holder = (holder[0], holder[1] + 1)
            return True
        return False

    def acquire(self, timeout: float) -> bool:
        """True once the calling thread holds the turn (again); False if another thread
        kept it for ``timeout`` seconds. Raises :class:`AbandonedTurn` if that thread has
        ended without giving it back."""
        me = _mine()
        with self._state:
            if self._take(me):
                return True
            deadline = time.monotonic() + timeout
            while True:
                if self._abandoned():
                    raise AbandonedTurn
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._waiting += 1
                try:
                    self._changed.wait(min(left, _LOOK_EVERY_S))
                finally:
                    self._waiting -= 1
                if self._take(me):
                    return True

    def try_acquire(self) -> bool:
        """Take the turn if no other thread holds it; never wait."""
        me = _mine()
        with self._state:
            return self._take(me)

    def release(self) -> None:
        me = _mine()
        with self._state:
            holder = self._holder
            if holder is None or holder[0]() is not me:
                raise RuntimeError("this thread does not hold the store handle's turn")
            self._holder = (holder[0], holder[1] - 1) if holder[1] > 1 else None
            if self._waiting:
                self._changed.notify()

    def holds(self) -> bool:
        """Whether the calling thread holds the turn."""
        holder = self._holder
        return holder is not None and holder[0]() is _mine()

    def take_over(self) -> bool:
        """If the thread that holds the turn has ended, the calling thread holds it now
        (once: release it once) and True; else False, changing nothing. Of two threads
        taking over at once, one does."""
        me = _mine()
        with self._state:
            if not self._abandoned():
                return False
            self._holder = (weakref.ref(me), 1)
            return True
