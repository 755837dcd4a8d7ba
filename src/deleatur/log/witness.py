"""A minimal C2SP witness (c2sp.org/tlog-witness, add-checkpoint semantics).

For every log it knows (by origin and verifier key) the witness keeps the latest
checkpoint it cosigned. It cosigns a new checkpoint only if the log signed it,
the submitter's old size matches what the witness saw, and a consistency proof
from that checkpoint to the new one verifies. Two checkpoints of the same size
with different roots — a split view — are refused. The check and the update are
one transaction, so concurrent submissions cannot roll the witness back.

**Key rotation.** After `keys rotate` the log signs with a key the witness does
not trust, and ``add_checkpoint`` refuses it, as tlog-witness prescribes (a
witness verifies a checkpoint with the log's configured key). ``update_log``
moves the witness to the new key, given the key (which its operator names) and a
rotation proof (:func:`format_rotation_proof`, `deleatur log rotation-proof`):
a checkpoint signed by the new key, a consistency proof from the checkpoint the
witness last cosigned to it, and the log's key announcements, each proven
included in its tree, each endorsed by the key before it, the trusted key
endorsing (through the chain) the new one. So the rotation is in the log the
witness has followed, and was signed off by the key it trusted.

We chose this explicit step over letting ``add_checkpoint`` switch keys by
itself when a request carries such a proof: the key a witness trusts is its
configuration, and a retired log key that leaked could sign an endorsement of a
key of its own; with the explicit step an attacker also needs the witness's
operator to name that key. The cost is that cosigning pauses from a rotation
until the operator runs `witness update-log`, and the refusal says so.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path

import apsw
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..clock import Clock, system_clock
from ..crypto.signing import read_text_secret, write_text_secret
from ..errors import DeleaturError, InvalidInputError, NotFoundError
from ..model import loads_document
from ..newfiles import check_directory, making
from ..sqlitefile import connect, create_private, immediate, sidecar_files
from .checkpoint import Checkpoint
from .cosignature import Cosigner
from .keychain import KeyEntryProof, proven_key_chain
from .merkle import HASH_SIZE, ProofError, verify_consistency
from .note import Note, NoteError, Signature, Verifier, b64decode, check_key_name, describe, open_note

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


ROTATION_FORMAT = "deleatur-key-rotation-proof/v1"


def format_rotation_proof(request: str, entries: Sequence[KeyEntryProof]) -> str:
    """A rotation proof: an add-checkpoint request and the log's key entries, each with
    its inclusion proof in the tree of the request's checkpoint."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    keys = [{"index": index, "entry": b64(raw), "proof": [b64(h) for h in proof]} for index, raw, proof in entries]
    return json.dumps({"format": ROTATION_FORMAT, "request": request, "key_entries": keys}, indent=2) + "\n"


def parse_rotation_proof(text: str) -> tuple[str, list[KeyEntryProof]]:
    """The request and key entries of a rotation proof, checked for shape only."""
    try:
        data = loads_document(text, "rotation proof")
    except InvalidInputError as exc:
        raise WitnessError(exc.message) from None
    if not isinstance(data, dict) or data.get("format") != ROTATION_FORMAT:
        raise WitnessError(f"not a {ROTATION_FORMAT} document")
    if data.keys() - {"format", "request", "key_entries"}:
        raise WitnessError("rotation proof: it has a member besides format, request and key_entries")
    request, entries = data.get("request"), data.get("key_entries")
    if not isinstance(request, str) or not isinstance(entries, list):
        raise WitnessError("rotation proof: it needs a request and a list of key entries")
    out: list[KeyEntryProof] = []
    for item in entries:
        if not isinstance(item, dict):
            raise WitnessError("rotation proof: a key entry is not an object")
        if item.keys() - {"index", "entry", "proof"}:
            raise WitnessError("rotation proof: a key entry has a member besides index, entry and proof")
        index, raw, proof = item.get("index"), item.get("entry"), item.get("proof")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0 or not isinstance(raw, str):
            raise WitnessError("rotation proof: a key entry needs an index and an entry")
        if not isinstance(proof, list) or not all(isinstance(h, str) for h in proof) or len(proof) > _MAX_PROOF_LINES:
            raise WitnessError("rotation proof: a key entry's proof must be a list of hashes")
        try:
            out.append((index, b64decode(raw, "key entry"), [b64decode(h, "proof hash") for h in proof]))
        except NoteError as exc:
            raise WitnessError(f"rotation proof: {exc.message}") from None
    return request, out


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
        try:
            check_key_name(name)
        except NoteError as exc:  # exit 1 would say the witness failed, where its name is wrong
            raise InvalidInputError(f"witness name: {exc.message}") from None
        key_path = cls.key_path(path)
        check_directory(path.parent)
        for existing in (*sidecar_files(path), key_path):
            if existing.exists():
                raise WitnessError(f"{existing} already exists; refusing to overwrite a witness")
        with making(WitnessError, "a witness") as made:
            # The key is placed first, and never over another: of inits racing for one
            # path, only the one whose key is placed goes on to make the state.
            made.add(key_path, write_text_secret(key_path, Cosigner(name, Ed25519PrivateKey.generate()).skey))
            made.add(path, create_private(path), database=True)
            conn = connect(path, create=True)
            try:
                with immediate(conn):
                    conn.execute(
                        "CREATE TABLE logs(origin TEXT PRIMARY KEY, vkey TEXT NOT NULL, size INTEGER NOT NULL,"
                        " root BLOB NOT NULL, checkpoint TEXT)"
                    )
            finally:
                conn.close()
        return cls.open(path, clock=clock)

    @classmethod
    def open(cls, path: Path, *, clock: Clock = system_clock) -> Witness:
        if not path.exists():
            raise NotFoundError(f"no witness state at {path}; run `deleatur witness init`")
        try:
            cosigner = Cosigner.from_skey(read_text_secret(cls.key_path(path)))
        except FileNotFoundError:
            raise WitnessError(f"witness key {cls.key_path(path)} is missing") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise WitnessError(f"cannot read witness key {cls.key_path(path)}: {exc}") from None
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
                raise WitnessError(
                    f"log {verifier.name} is already known with another key; to follow a key rotation,"
                    " run `deleatur witness update-log` with a proof from `deleatur log rotation-proof`"
                )
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
        with immediate(self._conn):
            _, checkpoint = self._extends(old_size, proof, note, None)
            self._conn.execute(
                "UPDATE logs SET size = ?, root = ?, checkpoint = ? WHERE origin = ?",
                (checkpoint.size, checkpoint.root, note.format(), checkpoint.origin),
            )
        return [self.cosigner.cosign(note.text, self._clock() // 1_000_000)]

    def update_log(self, vkey: str, rotation_proof: str) -> str:
        """Trust ``vkey``, a log's new key, in place of the one the witness trusts, if the
        rotation proof shows the trusted key endorsed it in the log the witness followed
        (see the module docstring). The witness's latest checkpoint stays as it is: the
        next `witness cosign` proves the log extends it, under the new key."""
        new = Verifier.from_vkey(vkey)
        request, entries = parse_rotation_proof(rotation_proof)
        old_size, proof, note = parse_request(request)
        with immediate(self._conn):
            trusted, checkpoint = self._extends(old_size, proof, note, new)
            if checkpoint.origin != new.name:
                raise WitnessError(f"the rotation proof is of log {checkpoint.origin}, not {new.name}")
            if trusted == new:
                return new.name
            try:
                chain = [key for _, key in proven_key_chain(entries, checkpoint)]
            except NoteError as exc:
                raise UntrustedCheckpointError(f"key chain of {new.name}: {exc.message}") from None
            # Forward only: the trusted key, or a key it endorsed, must endorse the new one.
            if trusted not in chain or new not in chain[chain.index(trusted) + 1 :]:
                raise UntrustedCheckpointError(
                    f"{describe(new)} is not endorsed, in the log's key chain, by the key this witness trusts "
                    f"for {new.name}, {describe(trusted)}"
                )
            self._conn.execute("UPDATE logs SET vkey = ? WHERE origin = ?", (new.vkey, new.name))
        return new.name

    def _extends(
        self, old_size: int, proof: list[bytes], note: Note, signer: Verifier | None
    ) -> tuple[Verifier, Checkpoint]:
        """Check, inside the caller's transaction, that ``note`` is signed by ``signer``
        (default: the key trusted for its log) and extends the checkpoint the witness last
        cosigned by ``proof``; returns the trusted key and the parsed checkpoint."""
        try:
            checkpoint = Checkpoint.parse(note.text)
        except NoteError as exc:
            raise WitnessError(f"not a checkpoint: {exc.message}") from None
        row = self._conn.execute("SELECT vkey, size, root FROM logs WHERE origin = ?", (checkpoint.origin,)).fetchone()
        if row is None:
            raise UnknownLogError(f"unknown log {checkpoint.origin}")
        trusted, seen_size, seen_root = Verifier.from_vkey(str(row[0])), int(row[1]), bytes(row[2])
        try:
            open_note(note, [signer or trusted])
        except NoteError as exc:
            hint = ""
            if signer is None and not any(map(trusted.matches, note.signatures)):
                hint = (
                    f" (this witness trusts {describe(trusted)}; if the log rotated its key, run"
                    " `deleatur witness update-log` with a proof from `deleatur log rotation-proof`)"
                )
            raise UntrustedCheckpointError(f"checkpoint of {checkpoint.origin}: {exc.message}{hint}") from None
        if old_size > checkpoint.size:
            raise WitnessError(f"old size {old_size} is larger than the checkpoint's {checkpoint.size}")
        if old_size != seen_size:
            # An update to a new key (signer given) is proven by a rotation proof.
            making = "log rotation-proof" if signer is not None else "log consistency"
            raise ConflictError(
                f"the witness's latest size for {checkpoint.origin} is {seen_size}: send a proof from the"
                f" log's checkpoint of that size (`deleatur log checkpoint --size {seen_size} --out last.txt`,"
                f" then `deleatur {making} last.txt`)",
                seen_size,
            )
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
            raise InconsistentError(f"not consistent with the checkpoint of size {old_size}: {exc.message}") from None
        return trusted, checkpoint
