"""Record ids: UUIDv7 (RFC 9562 §5.7), time-ordered so ids sort by creation.

Python 3.11 has no ``uuid.uuid7``; this generator also takes an injected clock
and random source, and stays monotonic within one millisecond by using the
12-bit ``rand_a`` field as a counter (RFC 9562 §6.2, method 1).
"""

from __future__ import annotations

import threading
import uuid
from typing import TypeGuard

from .clock import Clock, Random, system_clock, system_random
from .errors import InvalidInputError, quoted


class IdGenerator:
    def __init__(self, clock: Clock = system_clock, random: Random = system_random) -> None:
        self._clock = clock
        self._random = random
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0

    def new(self) -> str:
        with self._lock:
            ms = self._clock() // 1000
            if ms <= self._last_ms:
                ms = self._last_ms
                self._counter += 1
                if self._counter > 0xFFF:
                    # Counter exhausted: borrow the next millisecond rather than repeat.
                    ms += 1
                    self._counter = 0
            else:
                self._counter = int.from_bytes(self._random(2), "big") & 0x7FF
            self._last_ms = ms
            rand_b = int.from_bytes(self._random(8), "big") & ((1 << 62) - 1)
            value = (ms & ((1 << 48) - 1)) << 80
            value |= 0x7 << 76
            value |= self._counter << 64
            value |= 0b10 << 62
            value |= rand_b
        # str(uuid.UUID(int=value)), without the constructor's checks of a value built
        # right here: a server makes an id for every request.
        digits = f"{value:032x}"
        return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"

    def after(self, floor: str | None) -> None:
        """Make every later id sort after ``floor`` (the newest id in the store, read
        under the write lock): ids then follow commit order across handles and
        processes too, so a reader paging by id never misses a record written later."""
        if floor is None:
            return
        value = uuid.UUID(floor).int
        ms, counter = value >> 80, (value >> 64) & 0xFFF
        with self._lock:
            self._last_ms, self._counter = max((ms, counter), (self._last_ms, self._counter))


def is_record_id(value: object) -> TypeGuard[str]:
    if not isinstance(value, str):
        return False
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return False
    return str(parsed) == value and parsed.version == 7


def check_record_id(value: object, what: str | None = None) -> str:
    """A record id, else an InvalidInputError quoting it (after ``what``, the argument's
    name, when there is one)."""
    if not is_record_id(value):
        raise InvalidInputError(f"{'' if what is None else what + ': '}{quoted(value)} is not a record id")
    return value
