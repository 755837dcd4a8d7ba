"""Storage limitation (Art. 5(1)(e)): a retention policy per kind of space, and the purge.

The policy gives every new record without an explicit ``expires_at`` one, by the
kind of space it is written to: ``run`` (a run id is set), ``agent`` (an agent id,
no run) or ``user`` (neither). Expired records are never recalled; ``purge``
hard-deletes them (and, with ``older_than``, anything created before a cutoff)
as an erasure of kind ``retention``: the same forensic guarantees, content-free
tombstones, a request and a certificate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..erasure.engine import erase
from ..errors import InvalidInputError
from ..model import EVERYWHERE, Space

if TYPE_CHECKING:
    from ..erasure.engine import ErasureResult
    from ..memory import Memory

KINDS = ("user", "agent", "run")
BASIS = "Art. 5(1)(e) storage limitation"
_DAY_US = 86_400 * 1_000_000
#: About 2,700 years: longer periods mean "keep"; they would overflow SQLite's 64-bit times.
MAX_DAYS = 1_000_000


def space_kind(space: Space) -> str:
    if space.run_id:
        return "run"
    return "agent" if space.agent_id else "user"


def set_policy(memory: Memory, kind: str, days: float | None) -> None:
    if kind not in KINDS:
        raise InvalidInputError(f"retention applies to spaces of kind {', '.join(KINDS)}, not {kind!r}")
    if days is not None and not 0 < days <= MAX_DAYS:
        raise InvalidInputError(f"a retention period must be a positive number of days, at most {MAX_DAYS:,}")
    with memory.backend.atomic():
        memory.backend.put_setting(f"retention.{kind}", None if days is None else str(int(days * _DAY_US)))


def policy(memory: Memory) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for kind in KINDS:
        value = memory.backend.get_setting(f"retention.{kind}")
        out[kind] = None if value is None else int(value) / _DAY_US
    return out


def retention_for(memory: Memory, space: Space) -> int | None:
    """The retention period of ``space``'s kind, in microseconds (None: kept until erased)."""
    value = memory.backend.get_setting(f"retention.{space_kind(space)}")
    return None if value is None else int(value)


def purge(memory: Memory, *, older_than_days: float | None, request_id: str | None, dry_run: bool) -> ErasureResult:
    if older_than_days is not None and not 0 <= older_than_days <= MAX_DAYS:
        raise InvalidInputError(f"--older-than must be a number of days from 0 to {MAX_DAYS:,}")
    now = memory._clock()
    created_before = None if older_than_days is None else now - int(older_than_days * _DAY_US)
    return erase(
        memory,
        subject=None,
        scope=EVERYWHERE,
        request_id=request_id or f"RET-{now // 1_000_000}",
        basis=BASIS,
        requester="retention policy",
        dry_run=dry_run,
        retention=(now, created_before),
    )
