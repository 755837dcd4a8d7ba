"""A minimal C2SP witness (c2sp.org/tlog-witness, add-checkpoint semantics).

For every log it knows (by origin and verifier key) the witness keeps the latest
checkpoint it cosigned. It cosigns a new checkpoint only if the log signed it,
the submitter's old size matches what the witness saw, and a consistency proof
from that checkpoint to the new one verifies. Two checkpoints of the same size
with different roots — a split view — are refused. The check and the update are
one transaction, so concurrent submissions cannot roll the witness back.
"""

from __future__ import annotations

import base64
from pathlib import Path

import apsw
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..clock import Clock, system_clock
from ..crypto.signing import write_text_secret
from ..errors import DeleaturError, NotFoundError
from ..sqlitefile import connect, immediate
from .checkpoint import Checkpoint
from .cosignature import Cosigner
from .merkle import HASH_SIZE, ProofError, verify_consistency
from .note import Note, NoteError, Signature, Verifier, b64decode, check_key_name, open_note

_MAX_PROOF_LINES = 63


class WitnessError(DeleaturError):
    """The witness refuses a checkpoint; ``status`` is the tlog-witness HTTP status."""

    exit_code = 2
    status = 400


class UnknownLogError(WitnessError):
    status = 404


class UntrustedCheckpointError(WitnessError):
    status = 403


class ConflictError(WitnessError):
    """The old size is not what the witness saw, or the same size has another root."""

    status = 409

    def __init__(self, message: str, latest_size: int) -> None:
        super().__init__(message)
        self.latest_size = latest_size


class InconsistentError(WitnessError):
    status = 422


def format_request(old_size: int, proof: list[bytes], checkpoint: Note) -> str:
    """The add-checkpoint request body: old size, proof lines, empty line, checkpoint."""
    lines = [f"old {old_size}", *(base64.b64encode(h).decode() for h in proof)]
    return "\n".join(lines) + "\n\n" + checkpoint.format()


def parse_request(body: str) -> tuple[int, list[bytes], Note]:
    head, sep, rest = body.partition("\n\n")
    if not sep:
        raise WitnessError("add-checkpoint: no empty line before the checkpoint")
    lines = head.split("\n")
    if not lines[0].startswith("old "):
        raise WitnessError("add-checkpoint: the first line must be 'old <size>'")
    size_text = lines[0][4:]
    if not size_text.isdigit() or (size_text != "0" and size_text.startswith("0")):
        raise WitnessError("add-checkpoint: old size must be a decimal with no leading zeroes")
    if len(lines) - 1 > _MAX_PROOF_LINES:
        raise WitnessError(f"add-checkpoint: more than {_MAX_PROOF_LINES} proof lines")
    try:
        proof = [b64decode(line, "proof line") for line in lines[1:]]
        note = Note.parse(rest)
    except NoteError as exc:
        raise WitnessError(f"add-checkpoint: {exc.message}") from None
    if any(len(h) != HASH_SIZE for h in proof):
        raise WitnessError("add-checkpoint: every proof line must be a 32-byte hash")
    return int(size_text), proof, note


class Witness:
    def __init__(self, path: Path, conn: apsw.Connection, cosigner: Cosigner, clock: Clock) -> None:
        self.path = path
        self._conn = conn
        self.cosigner = cosigner
        self._clock = clock

    @staticmethod
    def key_path(path: Path) -> Path:
        return path.with_name(path.name + ".key")

    @classmethod
    def create(cls, path: Path, name: str, *, clock: Clock = system_clock) -> Witness:
        check_key_name(name)
        if path.exists() or cls.key_path(path).exists():
            raise WitnessError(f"{path} already exists; refusing to overwrite a witness")
        write_text_secret(cls.key_path(path), Cosigner(name, Ed25519PrivateKey.generate()).skey)
        conn = connect(path, create=True)
        with immediate(conn):
            conn.execute(
                "CREATE TABLE logs(origin TEXT PRIMARY KEY, vkey TEXT NOT NULL, size INTEGER NOT NULL,"
                " root BLOB NOT NULL, checkpoint TEXT)"
            )
        conn.close()
        return cls.open(path, clock=clock)

    @classmethod
    def open(cls, path: Path, *, clock: Clock = system_clock) -> Witness:
        if not path.exists():
            raise NotFoundError(f"no witness state at {path}; run `deleatur witness init`")
        try:
            cosigner = Cosigner.from_skey(cls.key_path(path).read_text(encoding="ascii"))
        except FileNotFoundError:
            raise WitnessError(f"witness key {cls.key_path(path)} is missing") from None
        except NoteError as exc:
            raise WitnessError(f"witness key {cls.key_path(path)}: {exc.message}") from None
        return cls(path, connect(path, create=False), cosigner, clock)

    def close(self) -> None:
        self._conn.close()

    @property
    def vkey(self) -> str:
        return self.cosigner.verifier.vkey

    def add_log(self, vkey: str) -> str:
        """Trust a log's checkpoint key; its origin is the key's name."""
        verifier = Verifier.from_vkey(vkey)
        with immediate(self._conn):
            known = self._conn.execute("SELECT vkey FROM logs WHERE origin = ?", (verifier.name,)).fetchone()
            if known is not None and known[0] != verifier.vkey:
                raise WitnessError(f"log {verifier.name} is already known with another key")
            self._conn.execute(
                "INSERT OR IGNORE INTO logs(origin, vkey, size, root) VALUES (?, ?, 0, ?)",
                (verifier.name, verifier.vkey, bytes(32)),
            )
        return verifier.name

    def logs(self) -> list[tuple[str, str, int]]:
        return [(str(o), str(v), int(s)) for o, v, s in self._conn.execute("SELECT origin, vkey, size FROM logs")]

    def add_checkpoint(self, body: str) -> list[Signature]:
        """Cosign a checkpoint submitted as a tlog-witness add-checkpoint request."""
        old_size, proof, note = parse_request(body)
        try:
            checkpoint = Checkpoint.parse(note.text)
        except NoteError as exc:
            raise WitnessError(f"not a checkpoint: {exc.message}") from None
        with immediate(self._conn):
            row = self._conn.execute(
                "SELECT vkey, size, root FROM logs WHERE origin = ?", (checkpoint.origin,)
            ).fetchone()
            if row is None:
                raise UnknownLogError(f"unknown log {checkpoint.origin}")
            vkey, seen_size, seen_root = str(row[0]), int(row[1]), bytes(row[2])
            try:
                open_note(note, [Verifier.from_vkey(vkey)])
            except NoteError as exc:
                raise UntrustedCheckpointError(f"checkpoint of {checkpoint.origin}: {exc.message}") from None
            if old_size > checkpoint.size:
                raise WitnessError(f"old size {old_size} is larger than the checkpoint's {checkpoint.size}")
            if old_size != seen_size:
                raise ConflictError(f"the witness's latest size for {checkpoint.origin} is {seen_size}", seen_size)
            if old_size == checkpoint.size and seen_size > 0 and seen_root != checkpoint.root:
                raise ConflictError(
                    f"split view: a checkpoint of size {seen_size} with a different root was cosigned before",
                    seen_size,
                )
            if old_size == 0 and proof:
                raise InconsistentError("the proof must be empty when the old size is zero")
            try:
                if old_size > 0:
                    verify_consistency(old_size, checkpoint.size, seen_root, checkpoint.root, proof)
            except ProofError as exc:
                raise InconsistentError(
                    f"not consistent with the checkpoint of size {old_size}: {exc.message}"
                ) from None
            self._conn.execute(
                "UPDATE logs SET size = ?, root = ?, checkpoint = ? WHERE origin = ?",
                (checkpoint.size, checkpoint.root, note.format(), checkpoint.origin),
            )
        return [self.cosigner.cosign(note.text, self._clock() // 1_000_000)]
