"""The residue scan: what tagging missed.

Erasure reaches records tagged with the subject and what declares them as
lineage. A record *about* the subject written under another subject ("Bob met
Alice Smith") is not reached; this scan finds such records by the subject's
identifiers, for an operator to review.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError
from ..model import EVERYWHERE, canonical_subject

if TYPE_CHECKING:
    from ..memory import Memory


@dataclass(frozen=True, slots=True)
class ResidueHit:
    record_id: str
    user_id: str
    agent_id: str
    run_id: str
    subject: str
    identifiers: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.record_id,
            "user_id": self.user_id,
            "agent_id": self.agent_id,
            "run_id": self.run_id,
            "subject": self.subject,
            "identifiers": list(self.identifiers),
        }


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def scan(memory: Memory, subject: str, identifiers: list[str]) -> list[ResidueHit]:
    """Live records of the tenant, not tagged with ``subject``, that mention an identifier."""
    canonical = canonical_subject(subject)
    if not any(i.strip() for i in identifiers):
        raise InvalidInputError("the residue scan needs at least one --identifier")
    # The subject's own name is always an identifier; one needle per folded form.
    needles = {_fold(i.strip()): i.strip() for i in [subject, *identifiers] if i.strip()}
    own = memory._subject_ref(canonical)
    hits = []
    for row in memory.backend.select_any(memory.tenant, EVERYWHERE):
        if row.subject_ref == own:
            continue
        record = memory._decrypt(row)
        haystack = _fold(" ".join([record.text, record.source or "", json.dumps(record.metadata, ensure_ascii=False)]))
        found = tuple(original for needle, original in needles.items() if needle in haystack)
        if found:
            sp = row.space
            hits.append(ResidueHit(row.id, sp.user_id, sp.agent_id, sp.run_id, record.subject_original, found))
    return hits
