"""Injectable time and randomness, so tests can pin both."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from .errors import quoted

#: A clock returns the current time as integer microseconds since the Unix epoch.
Clock = Callable[[], int]
#: A source of random bytes, called with the number of bytes wanted.
Random = Callable[[int], bytes]


def system_clock() -> int:
    return time.time_ns() // 1000


system_random: Random = os.urandom


# Exact integer arithmetic: through float seconds, a time near the year 9999 lost
# its last microseconds and could round past the end of the calendar.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_datetime(micros: int) -> datetime:
    return _EPOCH + micros * _MICROSECOND


def from_datetime(value: datetime) -> int:
    if value.tzinfo is None:
        # A naive datetime would silently mean "the machine's local time".
        raise ValueError("datetime must be timezone-aware")
    return (value - _EPOCH) // _MICROSECOND


#: The last microsecond a time is written for (9999-12-31T23:59:59.999999Z): later
#: ones have no ISO 8601 form, so no stored time may lie beyond it.
LATEST = 253_402_300_799_999_999


# A naive datetime's isoformat() has no "+00:00" to replace: isoformat() runs for every
# time of every record a server answers with, and this spelling takes 40 % less.
_NAIVE_EPOCH = datetime(1970, 1, 1)


def isoformat(micros: int) -> str:
    """The time in ISO 8601, UTC ("Z"), with microseconds unless there are none."""
    return (_NAIVE_EPOCH + micros * _MICROSECOND).isoformat() + "Z"


def from_isoformat(text: str) -> int:
    """An ISO 8601 time (UTC if it names no offset) in microseconds: the inverse of
    :func:`isoformat`. Raises ``ValueError`` if it is not one."""
    parsed = datetime.fromisoformat(text)
    return from_datetime(parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC))


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: ASCII digits only: str.isdigit() also takes "²", which int() then refuses.
_DIGITS = re.compile(r"[0-9]+")


def parse_when(value: str, now: int) -> int:
    """An absolute time, as microseconds since the epoch (the number every shell takes,
    here as text: a command line has nothing else) or an ISO 8601 time (UTC if no
    offset is given), or a delay such as ``30d``.

    Returns microseconds since the epoch; raises ``ValueError`` naming the problem.
    """
    text = value.strip()
    if len(text) > 1 and text[-1] in _UNITS and _DIGITS.fullmatch(text[:-1]):
        when = now + int(text[:-1]) * _UNITS[text[-1]] * 1_000_000
    elif _DIGITS.fullmatch(text) and len(text) != 8:
        # Digits are microseconds, but eight are an ISO 8601 date (20261130). Python
        # also reads 11 to 21 digits as a date and a time run together, which nobody
        # means. A time in seconds or milliseconds by mistake reads as 1970 and is
        # refused as past; past 19 digits (and int()'s limit) it is after 9999.
        when = int(text) if len(text) <= 19 else LATEST + 1
    else:
        try:
            when = from_isoformat(text)
        except ValueError:
            raise ValueError(
                f"{quoted(value)} is neither microseconds, an ISO 8601 time nor a delay like 30d, 12h, 15m"
            ) from None
    if not 0 <= when <= LATEST:
        raise ValueError(f"{quoted(value)} is {'before 1970' if when < 0 else 'after the year 9999'}")
    return when
