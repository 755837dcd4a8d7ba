"""The blast radius of an erasure, computed before anything is deleted (the dry run)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..model import SpaceFilter, Status
from ..store.protocol import StoredRow

if TYPE_CHECKING:
    from ..memory import Memory

RESIDUE_HINT = (
    "records about the subject written under another subject, or with no subject tag, are not reached: "
    "run `deleatur residue SUBJECT --identifier ...` to find them"
)


@dataclass(frozen=True, slots=True)
class PlannedRecord:
    id: str
    user_id: str
    agent_id: str
    run_id: str
    status: Status
    via: str  # "direct" or "lineage"
    subject: str  # the record's own subject (original spelling)


@dataclass(frozen=True, slots=True)
class ErasurePlan:
    """What an erasure would remove. ``destroy_keys`` (blind subject references) and
    ``digest`` are the store's own: the JSON form leaves them out, so a plan read back
    from JSON (a remote client's) has none, and equality does not look at them;
    ``keys_destroyed`` counts the keys either way."""

    subject: str | None  # canonical subject; None for an account erasure
    scope: SpaceFilter
    direct: tuple[PlannedRecord, ...]
    lineage: tuple[PlannedRecord, ...]
    other_subjects: tuple[str, ...]
    spellings: tuple[str, ...]
    keys_destroyed: int
    subjects: int  # distinct subjects among the erased records
    #: The subject's records outside the scope (its key is kept), and the derived records
    #: outside it (not erased); None where the caller may not learn of records beyond its
    #: key's scopes (see :meth:`beyond_scopes_hidden`).
    kept_elsewhere: int | None
    outside_lineage: int | None
    #: A purge's: records past their retention kept because their subject is restricted
    #: (Art. 18(1)(c): the subject may need them for a legal claim).
    kept_restricted: int = 0
    #: A subject's or an account's erasure: records it would erase whose subject is
    #: restricted, the erased subject excepted (derived records, another person in the
    #: account's spaces). Unlike a purge, an erasure does not keep them: the dry run says so.
    erases_restricted: int = 0
    #: The subject references whose every record is erased.
    destroy_keys: tuple[bytes, ...] = field(default=(), compare=False)
    #: What a confirmation token confirms.
    digest: bytes = field(default=b"", compare=False)

    @property
    def ambiguous(self) -> bool:
        return len(self.spellings) > 1

    @property
    def total(self) -> int:
        return len(self.direct) + len(self.lineage)

    @property
    def ids(self) -> list[str]:
        return [r.id for r in (*self.direct, *self.lineage)]

    def beyond_scopes_hidden(self) -> ErasurePlan:
        """The plan as a key scoped to some users sees it: without the counts of records
        beyond its scopes, which would tell it whether (and how much) a person it names
        is known elsewhere in the tenant."""
        return replace(self, kept_elsewhere=None, outside_lineage=None)

    def per_space(self) -> dict[str, int]:
        counts = Counter(f"{r.user_id}/{r.agent_id}/{r.run_id}" for r in (*self.direct, *self.lineage))
        return dict(sorted(counts.items()))

    def to_json(self) -> dict[str, Any]:
        def rows(items: tuple[PlannedRecord, ...]) -> list[dict[str, Any]]:
            return [
                {
                    "id": r.id,
                    "user_id": r.user_id,
                    "agent_id": r.agent_id,
                    "run_id": r.run_id,
                    "status": r.status.value,
                    "subject": r.subject,
                }
                for r in items
            ]

        return {
            "subject": self.subject,
            "scope": self.scope.to_json(),
            "total": self.total,
            "direct": rows(self.direct),
            "lineage": rows(self.lineage),
            "other_subjects": list(self.other_subjects),
            "spellings": list(self.spellings),
            "ambiguous": self.ambiguous,
            "per_space": self.per_space(),
            "keys_destroyed": self.keys_destroyed,
            "subjects": self.subjects,
            "kept_in_other_spaces": self.kept_elsewhere,
            "derived_outside_scope": self.outside_lineage,
            "kept_restricted": self.kept_restricted,
            "erases_restricted": self.erases_restricted,
            # Only a subject erasure has a subject whose residue elsewhere could be looked for.
            "note": RESIDUE_HINT if self.subject is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ErasurePlan:
        """The plan :meth:`to_json` printed, without the store's own references."""

        def rows(items: list[dict[str, Any]], via: str) -> tuple[PlannedRecord, ...]:
            return tuple(
                PlannedRecord(r["id"], r["user_id"], r["agent_id"], r["run_id"], Status(r["status"]), via, r["subject"])
                for r in items
            )

        return cls(
            subject=data["subject"],
            scope=SpaceFilter(**data["scope"]),
            direct=rows(data["direct"], "direct"),
            lineage=rows(data["lineage"], "lineage"),
            other_subjects=tuple(data["other_subjects"]),
            spellings=tuple(data["spellings"]),
            keys_destroyed=data["keys_destroyed"],
            subjects=data["subjects"],
            kept_elsewhere=data["kept_in_other_spaces"],
            outside_lineage=data["derived_outside_scope"],
            kept_restricted=data.get("kept_restricted", 0),  # absent from servers before it
            erases_restricted=data.get("erases_restricted", 0),
        )


def _closure(
    memory: Memory, seeds: list[StoredRow], stubs: list[str], scope: SpaceFilter
) -> tuple[list[StoredRow], int]:
    """Every record reached from ``seeds`` and the lineage ``stubs`` (of records deleted
    before) through declared lineage, transitively, within the scope; and how many
    derived records lie outside it."""
    seen = {r.id for r in seeds} | set(stubs)
    found: list[StoredRow] = []
    outside = 0
    frontier = list(seen)
    while frontier:
        children = memory.backend.children(memory.tenant, frontier) - seen
        frontier = []
        for row in memory.backend.rows(memory.tenant, children):
            seen.add(row.id)
            if scope.matches(row.space):
                found.append(row)
                frontier.append(row.id)
            else:
                outside += 1
    return found, outside


def build_plan(
    memory: Memory, *, subject: str | None, scope: SpaceFilter, retention: tuple[int, int | None] | None = None
) -> ErasurePlan:
    """What an erasure of ``subject`` (or, with ``subject=None``, of every record in
    ``scope``; or, with ``retention=(now, created_before)``, of every record past its
    retention) would remove. Reads only; decrypts to name spellings and subjects."""
    subject_ref = None if subject is None else memory._subject_ref(subject)
    restricted = {bytes(r["subject_ref"]) for r in memory.backend.restrictions(memory.tenant)}
    if retention is not None:
        # Derived records carry their own expiry: a purge follows no lineage.
        now, created_before = retention
        due = memory.backend.retention_due(memory.tenant, now=now, created_before=created_before)
        direct_rows = [row for row in due if row.subject_ref not in restricted]
        kept_restricted = len(due) - len(direct_rows)
        lineage_rows: list[StoredRow] = []
        outside = 0
    else:
        direct_rows = list(memory.backend.select_any(memory.tenant, scope, subject_ref=subject_ref))
        stubs = memory.backend.lineage_stubs(memory.tenant, subject_ref, memory._space_refs(scope))
        lineage_rows, outside = _closure(memory, direct_rows, stubs, scope)
        kept_restricted = 0
    decrypted = {row.id: memory._decrypt(row) for row in (*direct_rows, *lineage_rows)}

    def planned(row: StoredRow, via: str) -> PlannedRecord:
        record = decrypted[row.id]
        sp = row.space
        return PlannedRecord(row.id, sp.user_id, sp.agent_id, sp.run_id, row.status, via, record.subject_original)

    direct = tuple(planned(r, "direct") for r in direct_rows)
    lineage = tuple(planned(r, "lineage") for r in lineage_rows)
    others = sorted({decrypted[r.id].subject for r in lineage_rows if decrypted[r.id].subject != subject})
    spellings = tuple(sorted({decrypted[r.id].subject_original for r in direct_rows})) if subject else ()

    erased_by_ref = Counter(r.subject_ref for r in (*direct_rows, *lineage_rows))
    doomed = {ref for ref, n in erased_by_ref.items() if memory.backend.count_subject(memory.tenant, ref) == n}
    if subject_ref is not None and scope.everywhere and memory.keys.has_key(memory.tenant, subject_ref):
        doomed.add(subject_ref)  # a key left with no records goes too
    destroy = tuple(sorted(doomed))
    kept = 0 if subject_ref is None else memory.backend.count_subject(memory.tenant, subject_ref) - len(direct_rows)
    digest = hashlib.sha256(
        "\n".join([subject or "", repr(scope.to_json()), *sorted(decrypted), *(k.hex() for k in destroy)]).encode()
    ).digest()
    return ErasurePlan(
        subject=subject,
        scope=scope,
        direct=direct,
        lineage=lineage,
        other_subjects=tuple(others),
        spellings=spellings,
        keys_destroyed=len(destroy),
        destroy_keys=destroy,
        subjects=len(erased_by_ref),
        kept_elsewhere=kept,
        outside_lineage=outside,
        kept_restricted=kept_restricted,
        erases_restricted=sum(
            1 for r in (*direct_rows, *lineage_rows) if r.subject_ref in restricted and r.subject_ref != subject_ref
        ),
        digest=digest,
    )
