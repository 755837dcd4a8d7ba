"""Storage limitation (Art. 5(1)(e)): a retention policy per kind of space, and the purge.

The policy gives every new record without an explicit ``expires_at`` one, by the
kind of space it is written to: ``run`` (a run id is set), ``agent`` (an agent id,
no run) or ``user`` (neither). Expired records are never recalled; ``purge``
hard-deletes them (and, with ``older_than``, anything created before a cutoff)
as an erasure of kind ``retention``: the same forensic guarantees, content-free
tombstones, a request and a certificate.

Audit entries have a retention of their own, the deployment operator's to apply:
:func:`prune_audit` prunes old ``call`` entries and writes a retention anchor
(see :mod:`deleatur.log.retention`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..erasure.engine import erase
from ..errors import InvalidInputError, quoted
from ..log.entries import Entry, EventType
from ..log.merkle import leaf_hash
from ..log.retention import digest, pruned, pruned_leaf
from ..model import EVERYWHERE, Space, check_number

if TYPE_CHECKING:
    from ..erasure.engine import ErasureResult
    from ..memory import Memory

KINDS = ("user", "agent", "run")
BASIS = "Art. 5(1)(e) storage limitation"
_DAY_US = 86_400 * 1_000_000
#: About 2,700 years: longer periods mean "keep"; they would overflow SQLite's 64-bit times.
MAX_DAYS = 1_000_000
_MIN_DAYS = 1_000_000 / _DAY_US


def space_kind(space: Space) -> str:
    if space.run_id:
        return "run"
    return "agent" if space.agent_id else "user"


def _setting(memory: Memory, kind: str) -> str:
    """Each tenant has its own policy: one tenant's admin must not expire another's records."""
    return f"retention.{kind}.tenant={memory.tenant}"


def set_policy(memory: Memory, kind: str, days: float | None) -> None:
    if kind not in KINDS:
        raise InvalidInputError(f"retention applies to spaces of kind {', '.join(KINDS)}, not {quoted(kind)}")
    # At least a second: a shorter one (1e-12 days) was stored as 0 µs, and every record
    # of the kind was born expired, written but never recalled.
    if days is not None and not _MIN_DAYS <= check_number(days, "days") <= MAX_DAYS:
        raise InvalidInputError(
            f"a retention period must be a number of days from one second ({_MIN_DAYS:.3g}) to {MAX_DAYS:,}"
        )
    with memory._logged():  # the change and its audit entry commit together
        memory.backend.put_setting(_setting(memory, kind), None if days is None else str(int(days * _DAY_US)))


def policy(memory: Memory) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for kind in KINDS:
        value = memory.backend.get_setting(_setting(memory, kind))
        out[kind] = None if value is None else int(value) / _DAY_US
    return out


def retention_for(memory: Memory, space: Space) -> int | None:
    """The retention period of ``space``'s kind, in microseconds (None: kept until erased)."""
    value = memory.backend.get_setting(_setting(memory, space_kind(space)))
    return None if value is None else int(value)


def purge(
    memory: Memory,
    *,
    older_than_days: float | None,
    request_id: str | None,
    dry_run: bool,
    issue_token: bool = False,
    confirmation: str | None = None,
) -> ErasureResult:
    if older_than_days is not None and not 0 <= check_number(older_than_days, "older_than_days") <= MAX_DAYS:
        raise InvalidInputError(f"older_than_days (--older-than) must be a number of days from 0 to {MAX_DAYS:,}")
    now = memory._clock()
    created_before = None if older_than_days is None else now - int(older_than_days * _DAY_US)
    return erase(
        memory,
        subject=None,
        scope=EVERYWHERE,
        # A new id each run: one per second let a second purge within that second
        # collide with (or silently repeat) the first.
        # None asks for an id; an empty one is bad input, refused as erase refuses it.
        request_id=f"RET-{memory._ids.new()}" if request_id is None else request_id,
        basis=BASIS,
        requester="retention policy",
        dry_run=dry_run,
        retention=(now, created_before),
        issue_token=issue_token,
        confirmation=confirmation,
    )


def prune_audit(memory: Memory, *, older_than_days: float) -> int:
    """Prune the ``call`` entries older than the cutoff, up to the first entry that is
    not, and anchor what was pruned. Returns how many were pruned."""
    if not 0 <= check_number(older_than_days, "older_than_days") <= MAX_DAYS:
        raise InvalidInputError(f"older_than_days (--older-than) must be a number of days from 0 to {MAX_DAYS:,}")
    cutoff = memory._clock() - int(older_than_days * _DAY_US)
    with memory._logged(sign=True) as events:
        start = int(memory.backend.get_setting("audit.pruned_upto") or 0)
        upto, doomed = start, []
        for index, raw in memory.backend.log_entries(start):
            if pruned_leaf(raw) is not None:
                upto = index + 1
                continue
            body = json.loads(raw)
            if body["time"] >= cutoff:
                break
            upto = index + 1
            if body["type"] == EventType.CALL.value:
                doomed.append((index, leaf_hash(raw)))
        if upto == start:
            return 0
        memory.backend.replace_log_entries([(index, pruned(leaf)) for index, leaf in doomed])
        memory.backend.put_setting("audit.pruned_upto", str(upto))
        fields = {"from": start, "upto": upto, "count": len(doomed), "digest": digest(doomed), "before": cutoff}
        events.append((Entry(EventType.RETENTION, memory._clock(), fields), None))
    memory.backend.scrub()  # the pruned entries' pages leave the -wal too
    return len(doomed)
