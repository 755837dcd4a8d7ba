"""Verification reports: an ordered list of numbered checks, as python-tuf lists
its client workflow steps, then notes on what was *not* pinned, then a verdict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Check:
    number: int
    name: str
    passed: bool | None  # None: not applicable here
    detail: str

    def line(self) -> str:
        status = {True: "OK  ", False: "FAIL", None: "n/a "}[self.passed]
        return f"{status} {self.number:>2} {self.name}: {self.detail}"


@dataclass
class Report:
    subject: str
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, passed: bool | None, detail: str) -> bool:
        self.checks.append(Check(len(self.checks) + 1, name, passed, detail))
        return passed is not False

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.passed is not False for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    def lines(self) -> list[str]:
        out = [c.line() for c in self.checks]
        out += [f"NOTE {n}" for n in self.notes]
        verdict = "PASS" if self.ok else "FAIL (" + ", ".join(f"check {c.number} {c.name}" for c in self.failed) + ")"
        out.append(f"VERDICT: {verdict}")
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "subject": self.subject,
            "verdict": "PASS" if self.ok else "FAIL",
            "checks": [
                {"number": c.number, "name": c.name, "passed": c.passed, "detail": c.detail} for c in self.checks
            ],
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Report:
        """The report :meth:`to_json` printed (its verdict follows from the checks)."""
        checks = [Check(c["number"], c["name"], c["passed"], c["detail"]) for c in data["checks"]]
        return cls(data["subject"], checks, list(data["notes"]))
