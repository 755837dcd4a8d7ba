"""The plain-language scope statement of an erasure certificate.

It is generated from the certificate's own facts, so the verifier can
regenerate it and refuse a certificate whose statement was edited to claim more.
"""

from __future__ import annotations

from typing import Any

STATEMENT_VERSION = "deleatur-scope/v2"
#: How each version names the systems beyond this store. v1 spoke of systems "not
#: registered as erasure targets", as if some could be: none can yet. Certificates
#: issued under v1 keep verifying with its words.
_ELSEWHERE = {
    "deleatur-scope/v1": "other systems not registered as erasure targets (vector stores, caches, files, "
    "LLM provider files, other databases)",
    STATEMENT_VERSION: "copies in other systems, which this store does not reach (vector stores, caches, files, "
    "LLM provider files, other databases)",
}
VERSIONS = tuple(_ELSEWHERE)


def scope_statement(
    *,
    kind: str,
    records: int,
    key_destroyed: bool,
    kept_elsewhere: int,
    other_keys_kept: int,
    wal_truncated: bool,
    version: str = STATEMENT_VERSION,
) -> dict[str, Any]:
    covers = [
        f"the {records} record(s) erased from this deleatur store, every version and history row included",
        "their entries in the store's full-text index (removed with FTS5 secure-delete)",
        "records derived from them through declared lineage, within the erasure's scope",
        "the store's own files: erased text is overwritten (secure_delete)"
        + (" and the write-ahead log truncated" if wal_truncated else ""),
    ]
    if key_destroyed:
        covers.append(
            "the subject's data key, destroyed: copies of the database taken before the erasure can no longer "
            "decrypt these records (crypto-shredding)"
        )
    does_not_cover = [
        _ELSEWHERE[version],
        "records about the subject written under another subject or without one (see `deleatur residue`)",
        "backups of the key store taken before the erasure, which still hold the destroyed key",
        "model weights, embeddings or outputs already derived from the data",
    ]
    if not key_destroyed:
        reason = (
            f" because {kept_elsewhere} of its record(s) remain outside this erasure's scope" if kept_elsewhere else ""
        )
        does_not_cover.append(f"copies of the database taken before the erasure: the subject's key was kept{reason}")
    if not wal_truncated:
        does_not_cover.append(
            "the store's write-ahead log, which connections reading the store kept from being truncated "
            "when this certificate was issued (a later checkpoint clears it)"
        )
    if other_keys_kept:
        does_not_cover.append(
            f"copies of the database taken before the erasure, for derived records of {other_keys_kept} other "
            "subject(s) whose keys were kept because they hold other records"
        )
    if records == 0:
        covers = ["nothing: no record matched this request, and nothing was erased"]
    lines = [f"This certificate attests the {kind} erasure described in it."]
    lines += ["It covers: " + "; ".join(covers) + "."]
    lines += ["It does not cover: " + "; ".join(does_not_cover) + "."]
    return {
        "version": version,
        "covers": covers,
        "does_not_cover": does_not_cover,
        "text": " ".join(lines),
    }
