"""Signed snapshots of the beliefs a decision used, redacted when a subject is erased."""
