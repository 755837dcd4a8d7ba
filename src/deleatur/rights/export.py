"""Access and portability (Art. 15 and 20): everything held about a subject or a user.

The export is streamed (records are read, decrypted and written one page at a
time, never all held in memory, no read of the store open while they are written)
and never truncated; a record removed (erased, purged) while it runs is not exported
after its removal. Two formats:

* JSON, schema ``deleatur-export/v1``::

    {"format": "deleatur-export/v1", "exported_at": ..., "tenant": ..., "checkpoint": "<note>",
     "scope": {...},
     "records": [ {<record, as `deleatur get --json` prints it>,
                   "log": [{"index": n, "entry": {<the record's log entries>}}]}, ... ],
     "erasure_requests": [...], "restrictions": [...],
     "decisions": [{"id", "time", "actor", "summary", "sha256", "redactions",
                    "beliefs": [<only the exported records' beliefs>]}],
     "audit": [{"index": n, "entry": {<every call naming the subject or user>}}],
     "counts": {"records": n, "log_entries": m, "decisions": d, "audit_entries": a}}

  ``checkpoint`` is the log's newest signed checkpoint at export time: a receipt
  (inclusion proof) for any listed log entry is ``deleatur log prove INDEX``.
  A decision shows only the beliefs about what is exported: another person's
  values in the same snapshot are theirs, not the requester's. The erasure
  requests are those about the subject or, for a user, those that reached that
  user and no one else (see ``_Export.requests``).

* a CSV bundle: a directory with ``records.csv``, ``log.csv``,
  ``erasure_requests.csv``, ``restrictions.csv``, ``decisions.csv``,
  ``audit.csv`` and ``manifest.json`` (format, scope and counts). Every table has
  its header row, an empty one too. A text cell beginning with ``=``, ``+``, ``-``,
  ``@``, a tab or a carriage return has a ``'`` put before it, so that a spreadsheet
  shows it rather than run it as a formula (see ``_FORMULA_START``).

Export files are made readable by their owner only (0600; a CSV bundle's directory,
when the export creates it, 0700): they hold a person's data in clear.

The export itself is logged (what kind, how many records; no name).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

try:
    import fcntl
except ImportError:  # Windows: no lock tells a live writer's partial output from one left
    _FLOCK = False
else:
    _FLOCK = True

from ..access.audit import ScopedView
from ..clock import isoformat
from ..decisions.snapshots import canonical, explain_any
from ..erasure.requests import ErasureRequest, RequestKind, is_request_id, user_reference
from ..errors import InvalidInputError
from ..log.entries import Entry, EventType
from ..model import EVERYWHERE, Record, SpaceFilter, canonical_subject, check_optional
from .restriction import restrictions

if TYPE_CHECKING:
    from ..memory import Memory

FORMAT = "deleatur-export/v1"


class TextSink(Protocol):
    """Where a JSON export is written: a file, a buffer, or a server's response stream."""

    def write(self, text: str, /) -> object: ...


_BATCH = 500
# The CSV tables of lists, each row a to_json() of its kind, and their columns.
_TABLES = {
    "erasure_requests.csv": (
        "id", "tenant", "kind", "subject", "scope", "basis", "requester", "received_at", "completed_at",
        "deadline", "deadline_met", "status", "error", "counts", "record_ids", "tombstones", "phases",
    ),
    "restrictions.csv": ("subject", "reason", "actor", "since"),
    "decisions.csv": ("id", "time", "actor", "summary", "sha256", "redactions", "beliefs"),
}  # fmt: skip


# A spreadsheet that opens a CSV file takes a cell beginning with one of these for a
# formula, and runs it: =HYPERLINK("http://..."&A1) in a record's text would send the
# cells beside it away. Such a cell is written with a leading ' (read as "text"; OWASP's
# mitigation of CSV injection). Only the CSV bundle: the JSON export is exact.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _inert(row: dict[str, Any]) -> dict[str, Any]:
    return {k: "'" + v if isinstance(v, str) and v.startswith(_FORMULA_START) else v for k, v in row.items()}


def _private(path: Path) -> TextIO:
    """A new file that only its owner may read."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    return open(fd, "w", newline="", encoding="utf-8")


#: The names of the partial outputs an export writes before renaming them (see
#: private_output and export_csv).
_PARTIAL = re.compile(r"\.deleatur-[0-9a-f]{16}\.partial")
#: A partial output no writer holds is abandoned once it is this old: its writer locks it
#: just after making it.
_ABANDONED_AFTER_S = 10.0


@contextmanager
def _writing(partial: Path) -> Iterator[None]:
    """Holds ``partial`` (a file, or a bundle's directory) locked while it is written, so
    that another export's sweep (_remove_abandoned_partials) leaves it alone."""
    if not _FLOCK:
        yield
        return
    fd = os.open(partial, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _remove_abandoned_partials(directory: Path) -> None:
    """Remove the partial outputs (personal data in clear) that exports killed while
    writing left in ``directory``: a process killed outright runs no cleanup. One is
    abandoned if it is this user's, no writer holds its lock, and it was made a while
    ago; what cannot be read or removed is left. Without flock, none is removed."""
    if not _FLOCK:
        return
    try:
        entries = [e for e in os.scandir(directory) if _PARTIAL.fullmatch(e.name)]
    except OSError:
        return
    for entry in entries:
        with contextlib.suppress(OSError):
            info = entry.stat(follow_symlinks=False)
            if info.st_uid != os.geteuid() or time.time() - info.st_mtime < _ABANDONED_AFTER_S:
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: being written
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(entry.path)
                elif stat.S_ISREG(info.st_mode):
                    os.unlink(entry.path)
            finally:
                os.close(fd)


@contextmanager
def private_output(path: Path) -> Iterator[TextIO]:
    """Write ``path`` whole or not at all, readable by its owner only: the text goes to a
    new file beside it, renamed over ``path`` once the writing succeeded. A device (such
    as /dev/null) is written into, since renaming a file over it would replace it. A
    symbolic link, a pipe or a socket is refused (InvalidInputError) before anything is
    written: an export is personal data in plaintext, and one planted at the path the
    caller named would hand it to whoever planted it, or elsewhere. A write that fails
    (a full disk) is InvalidInputError naming the file, and leaves none: an earlier file
    of that name is kept."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a parent that is a file, say
        raise InvalidInputError(f"cannot write {path}: {exc.strerror}") from None
    if mode is not None and stat.S_ISLNK(mode):
        raise InvalidInputError(f"{path} is a symbolic link: name the file itself (or no --out: standard output)")
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISCHR(mode):
        raise InvalidInputError(f"{path} is not a regular file (a pipe or a socket, say): name a file to write")
    try:
        if mode is not None and stat.S_ISCHR(mode):
            with open(path, "w", newline="", encoding="utf-8") as handle:
                yield handle
            return
        _remove_abandoned_partials(path.parent)
        # Not named after the file: a name near the file system's limit would not fit.
        partial = path.with_name(f".deleatur-{secrets.token_hex(8)}.partial")
        try:
            with _private(partial) as handle, _writing(partial):
                yield handle
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"cannot write {path}: {exc.strerror}") from None


RECORD_COLUMNS = (
    "id",
    "tenant",
    "user_id",
    "agent_id",
    "run_id",
    "subject",
    "subject_original",
    "key",
    "text",
    "metadata",
    "source",
    "confidence",
    "derived_from",
    "status",
    "supersedes",
    "reason",
    "actor",
    "created_at",
    "updated_at",
    "expires_at",
)


class _Export:
    def __init__(self, memory: Memory, *, subject: str | None, user_id: str | None) -> None:
        check_optional(user_id, str, "user_id")
        if (subject is None) == (user_id is None):
            raise InvalidInputError("an export needs exactly one of a subject or a user id")
        self.memory = memory
        self.subject = None if subject is None else canonical_subject(subject)
        self.ref = None if self.subject is None else memory._subject_ref(self.subject)
        self.scope = EVERYWHERE if user_id is None else SpaceFilter(user_id=user_id)
        self.records = 0
        self.log_entries = 0
        self.decision_ids: set[str] = set()
        self.exported_ids: set[str] = set()
        self.audit_entries = 0
        self.decision_count = 0

    def scope_json(self) -> dict[str, Any]:
        return {"subject": self.subject, "user_id": self.scope.user_id}

    def exported(self) -> Iterator[tuple[Record, list[dict[str, Any]]]]:
        """The records with their log entries, read a page at a time: no read stays open
        while the caller writes them out (at the pace of a client reading it, for a
        server), and a record removed (erased, purged) meanwhile is not exported after its
        removal: the page is read again, from the last record exported."""
        backend = self.memory.backend
        after = 0
        while True:
            mark = backend.removal_mark()
            page = backend.select_any_page(
                self.memory.tenant, self.scope, subject_ref=self.ref, after=after, limit=_BATCH
            )
            log: dict[str, list[dict[str, Any]]] = {row.id: [] for _, row in page}
            for record_id, index, raw in backend.log_of_records(list(log)):
                log[record_id].append({"index": index, "entry": json.loads(raw)})
            for position, row in page:
                record = self.memory._read_unless_removed(row, mark)
                if record is None:
                    break
                self._count(row.id, log[row.id])
                after = position
                yield record, log[row.id]
            else:
                if len(page) < _BATCH:
                    return

    def _count(self, record_id: str, log: list[dict[str, Any]]) -> None:
        self.records += 1
        self.log_entries += len(log)
        used = self.memory.backend.decisions_using(self.memory.tenant, [record_id])
        if used:
            # Only the ids of records some decision used are kept, to pick their beliefs out.
            self.decision_ids.update(used)
            self.exported_ids.add(record_id)

    def requests(self) -> list[dict[str, Any]]:
        """The requests about the subject; for a user, those that reached the user and no
        one else (an erasure of their account, or of a subject in their spaces), as a key
        scoped to the user reads them: without the counts of records in other users'
        spaces, which are not the user's to see."""
        now = self.memory._clock()
        requests = map(ErasureRequest.from_row, self.memory.backend.requests(self.memory.tenant))
        if self.ref is not None:
            return [r.to_json(now) for r in requests if r.subject_ref == self.ref]
        assert self.scope.user_id is not None
        user = user_reference(self.memory, self.scope.user_id)
        return [r.beyond_scopes_hidden().to_json(now) for r in requests if r.users == (user,)]

    def restrictions(self) -> list[dict[str, Any]]:
        if self.ref is None:
            return []
        pseudonym = self.memory.keys.pseudonym(self.memory.tenant, self.ref, self.subject or "")
        return [r.to_json() for r in restrictions(self.memory) if r.subject == pseudonym]

    def decisions(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The snapshots that used the exported records; ``requests``: the exported erasure requests."""
        request_ids = {r["id"] for r in requests}
        # Read, and their announcements checked, once for every snapshot.
        verifiers = self.memory._verifiers() if self.decision_ids else []
        out = []
        for decision_id in sorted(self.decision_ids):
            body = explain_any(self.memory, decision_id, verifiers).body
            mine = [b for b in body["beliefs"] if b["record"] in self.exported_ids]
            # A redaction names the request that took records from the snapshot (an
            # erasure's, or a rectification's new record) and the records it took: another
            # person's erasure is theirs, as their beliefs are.
            redactions = [shown for r in body["redactions"] if (shown := self._redaction(r, request_ids))]
            out.append(
                {
                    "id": body["id"],
                    "time": isoformat(body["time"]),
                    "actor": body["actor"],
                    "summary": body["summary"],
                    "sha256": hashlib.sha256(canonical(body)).hexdigest(),
                    "redactions": redactions,
                    "beliefs": mine,
                }
            )
        self.decision_count = len(out)
        return out

    def _redaction(self, redaction: dict[str, Any], request_ids: set[str]) -> dict[str, Any] | None:
        """A redaction as the export shows it, or None. The exported erasures' are shown
        whole; another subject's erasure, or another subject's correction, not at all (its
        request id may name them); a purge's or an account erasure's, which may have taken
        this subject's beliefs among others', without the ids of records that are not
        exported (erased records' ids say nothing of whose they were)."""
        request = redaction["request"]
        if request in request_ids:
            return redaction
        if redaction["by"] == "rectification":
            row = self.memory.backend.get(self.memory.tenant, request)  # the correction, where it is held
            if row is None or not self.scope.matches(row.space) or self.ref not in (None, row.subject_ref):
                return None
        else:
            erasure = self.memory.backend.get_request(self.memory.tenant, request) if is_request_id(request) else None
            if erasure is None or ErasureRequest.from_row(erasure).kind is RequestKind.SUBJECT:
                return None
        return {**redaction, "records": [i for i in redaction["records"] if i in self.exported_ids]}

    def audit_trail(self) -> Iterator[dict[str, Any]]:
        """The calls that named this subject (by pseudonym) or this user (by token)."""
        if self.ref is not None:
            token = self.memory.keys.pseudonym(self.memory.tenant, self.ref, self.subject or "")
        else:
            assert self.scope.user_id is not None
            token = self.memory._user_token(self.scope.user_id)
        if token is None:
            return
        scopes = self.memory.principal.scopes
        # A key scoped to users reads the entries as `audit show` shows it them: only those
        # whose users are all within its scopes, the subject by its own pseudonym.
        scoped = None if scopes is None else ScopedView(self.memory, scopes)
        for index, raw in self.memory.backend.log_entries_naming(token):
            entry = json.loads(raw)
            if entry.get("tenant") != self.memory.tenant:
                continue
            if scoped is not None:
                decoded = Entry.decode(raw)
                # Only call entries name a user: no record's user is needed to judge them.
                if not scoped.shows(decoded, None):
                    continue
                entry = json.loads(scoped.unlinked(decoded).encode())
            self.audit_entries += 1
            yield {"index": index, "entry": entry}

    def audit(self) -> None:
        fields: dict[str, object] = {"tenant": self.memory.tenant, "kind": "subject" if self.ref else "user"}
        fields["records"] = self.records
        with self.memory._logged() as events:
            events.append((Entry(EventType.EXPORT, self.memory._clock(), fields), None))

    def counts(self) -> dict[str, int]:
        return {
            "records": self.records,
            "log_entries": self.log_entries,
            "decisions": self.decision_count,
            "audit_entries": self.audit_entries,
        }


def export_json(
    memory: Memory, out: TextSink, *, subject: str | None = None, user_id: str | None = None
) -> dict[str, int]:
    if not callable(getattr(out, "write", None)):
        raise InvalidInputError("out must be a text stream: something with a write method")
    job = _Export(memory, subject=subject, user_id=user_id)
    head = {
        "format": FORMAT,
        "exported_at": isoformat(memory._clock()),
        "tenant": memory.tenant,
        "checkpoint": _checkpoint(memory),
    }
    out.write(json.dumps(head, ensure_ascii=False)[:-1])
    out.write(', "scope": ' + json.dumps(job.scope_json(), ensure_ascii=False) + ', "records": [')
    first = True
    for record, log in job.exported():
        out.write(("" if first else ",\n") + json.dumps({**record.to_json(), "log": log}, ensure_ascii=False))
        first = False
    requests = job.requests()
    out.write('], "erasure_requests": ' + json.dumps(requests, ensure_ascii=False))
    out.write(', "restrictions": ' + json.dumps(job.restrictions(), ensure_ascii=False))
    out.write(', "decisions": ' + json.dumps(job.decisions(requests), ensure_ascii=False))
    out.write(', "audit": [' + ",\n".join(json.dumps(item) for item in job.audit_trail()) + "]")
    out.write(', "counts": ' + json.dumps(job.counts()) + "}\n")
    job.audit()
    return job.counts()


def export_csv(
    memory: Memory, directory: Path, *, subject: str | None = None, user_id: str | None = None
) -> dict[str, int]:
    """The bundle is written whole or not at all: into a new private directory beside
    ``directory``, which becomes ``directory`` once every file is written. An existing
    (empty) directory stays where it is, since it may be the current one or behind a
    symlink: the written files move into it, the manifest last, and it is made private."""
    job = _Export(memory, subject=subject, user_id=user_id)
    if directory.exists() and not directory.is_dir():
        raise InvalidInputError(f"{directory} is a file; a csv export needs a directory")
    if directory.exists() and any(directory.iterdir()):
        raise InvalidInputError(f"{directory} is not empty; refusing to mix exports")
    existing = directory.exists()
    directory = directory.resolve()  # ".", "..", a symlink: the directory they name
    # Named as private_output names its own, so that the sweep finds it and nothing else.
    partial = directory.with_name(f".deleatur-{secrets.token_hex(8)}.partial")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned_partials(directory.parent)
        partial.mkdir(mode=0o700)
    except OSError as exc:
        raise InvalidInputError(f"cannot create {directory}: {exc.strerror}") from None
    try:
        try:
            with _writing(partial):
                _write_bundle(memory, job, partial)
        except OSError as exc:  # a full disk, say: the partial bundle goes below
            raise InvalidInputError(f"cannot write {directory}: {exc.strerror}") from None
        try:
            if existing:
                for name in sorted(os.listdir(partial), key=lambda name: name == "manifest.json"):
                    os.replace(partial / name, directory / name)
                directory.chmod(0o700)
            else:
                os.replace(partial, directory)
        except OSError as exc:
            raise InvalidInputError(f"cannot write {directory}: {exc.strerror}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    job.audit()
    return job.counts()


def _write_bundle(memory: Memory, job: _Export, directory: Path) -> None:
    with _private(directory / "records.csv") as rec_file, _private(directory / "log.csv") as log_file:
        records = csv.DictWriter(rec_file, fieldnames=RECORD_COLUMNS)
        log = csv.writer(log_file)
        records.writeheader()
        log.writerow(["record_id", "index", "entry"])
        for record, entries in job.exported():
            row = record.to_json()
            row["metadata"] = json.dumps(row["metadata"], ensure_ascii=False)
            row["derived_from"] = " ".join(row["derived_from"])
            records.writerow(_inert(row))
            for item in entries:
                log.writerow([record.id, item["index"], json.dumps(item["entry"], sort_keys=True)])
    requests = job.requests()
    _write_table(directory / "erasure_requests.csv", requests)
    _write_table(directory / "restrictions.csv", job.restrictions())
    _write_table(directory / "decisions.csv", job.decisions(requests))
    with _private(directory / "audit.csv") as audit_file:
        audit = csv.writer(audit_file)
        audit.writerow(["index", "entry"])
        for item in job.audit_trail():
            audit.writerow([item["index"], json.dumps(item["entry"], sort_keys=True)])
    manifest = {
        "format": FORMAT,
        "tenant": memory.tenant,
        "checkpoint": _checkpoint(memory),
        "scope": job.scope_json(),
        "counts": job.counts(),
    }
    with _private(directory / "manifest.json") as manifest_file:
        manifest_file.write(json.dumps(manifest, indent=2) + "\n")


def _checkpoint(memory: Memory) -> str | None:
    """The newest signed checkpoint, signed now if the log grew since (entries a handle
    wrote within its checkpoint interval, which the export lists, are then covered by it);
    a store that cannot sign gives the newest it has."""
    if memory.log.signer is not None:
        return memory._signed_checkpoint().format()
    latest = memory.backend.checkpoint()
    return None if latest is None else latest[1]


def _write_table(path: Path, rows: list[dict[str, Any]]) -> None:
    with _private(path) as handle:
        # A row with a key that is not a column is refused (DictWriter's extrasaction).
        writer = csv.DictWriter(handle, fieldnames=_TABLES[path.name])
        writer.writeheader()
        for row in rows:
            writer.writerow(_inert({k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in row.items()}))
