"""Injectable time and randomness, so tests can pin both."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime

#: A clock returns the current time as integer microseconds since the Unix epoch.
Clock = Callable[[], int]
#: A source of random bytes, called with the number of bytes wanted.
Random = Callable[[int], bytes]


def system_clock() -> int:
    return time.time_ns() // 1000


system_random: Random = os.urandom


def to_datetime(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / 1_000_000, tz=UTC)


def from_datetime(value: datetime) -> int:
    if value.tzinfo is None:
        # A naive datetime would silently mean "the machine's local time".
        raise ValueError("datetime must be timezone-aware")
    return int(value.timestamp() * 1_000_000)


def isoformat(micros: int) -> str:
    return to_datetime(micros).isoformat().replace("+00:00", "Z")


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(value: str, now: int) -> int:
    """An absolute ISO 8601 time (UTC if no offset is given) or a delay such as ``30d``.

    Returns microseconds since the epoch; raises ``ValueError`` naming the problem.
    """
    text = value.strip()
    if len(text) > 1 and text[-1] in _UNITS and text[:-1].isdigit():
        return now + int(text[:-1]) * _UNITS[text[-1]] * 1_000_000
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{value!r} is neither an ISO 8601 time nor a delay like 30d, 12h, 15m") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return from_datetime(parsed)
