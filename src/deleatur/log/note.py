"""C2SP signed notes (c2sp.org/signed-note) with Ed25519 keys, and the verifier-
and signer-key strings of Go's ``golang.org/x/mod/sumdb/note``.

A note is a text ending in a newline, an empty line, then signature lines
``— <key name> <base64(4-byte key ID || signature)>``. Signatures cover the text
only. Verifiers ignore signatures from unknown keys; a known key whose signature
fails rejects the note; a note with no verified known signature is rejected.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Self

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ..errors import DeleaturError

ED25519 = 0x01
#: Timestamped Ed25519 witness cosignatures (c2sp.org/tlog-cosignature).
COSIGNATURE_ED25519 = 0x04
_DASH = "\u2014 "
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f]")
_MAX_SIGNATURES = 100


class NoteError(DeleaturError):
    """A note, a key string or a signature is malformed or does not verify."""


def check_key_name(name: str) -> str:
    # No control characters either: a name is printed (an escape sequence in one would
    # run in the terminal of whoever lists the keys), and a line break would split a note.
    if not name or any(ch.isspace() or ch == "+" or unicodedata.category(ch) == "Cc" for ch in name):
        raise NoteError(f"key name {name!r} must be non-empty with no spaces, '+' or control characters")
    return name


def key_id(name: str, sig_type: int, public_key: bytes) -> bytes:
    """SHA-256(key name || 0x0A || signature type || public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([sig_type]) + public_key).digest()[:4]


def b64decode(value: str, what: str) -> bytes:
    """Standard base64, strictly: only its canonical form, so that one value has one
    encoding (Python, like Go, otherwise ignores the unused low bits of the last
    character, and a changed document would read as the same one)."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise NoteError(f"{what} is not valid base64") from None
    if base64.b64encode(raw).decode("ascii") != value:
        raise NoteError(f"{what} is not canonical base64")
    return raw


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True, slots=True)
class Signature:
    name: str
    key_id: bytes
    signature: bytes

    def line(self) -> str:
        return f"{_DASH}{self.name} {base64.b64encode(self.key_id + self.signature).decode()}\n"


@dataclass(frozen=True, slots=True)
class Note:
    text: str
    signatures: tuple[Signature, ...]

    def __post_init__(self) -> None:
        check_text(self.text)

    def format(self) -> str:
        return self.text + "\n" + "".join(s.line() for s in self.signatures)

    def with_signatures(self, extra: Iterable[Signature]) -> Note:
        return Note(self.text, (*self.signatures, *extra))

    @classmethod
    def parse(cls, data: str) -> Note:
        _check_str(data, "a signed note")
        if not data.endswith("\n"):
            raise NoteError("a signed note must end with a newline")
        split = data.rfind("\n\n")
        if split < 0:
            raise NoteError("a signed note needs an empty line before its signatures")
        text, block = data[: split + 1], data[split + 2 :]
        signatures = []
        # Lines end with "\n" alone (C2SP signed-note): splitlines() would also split at
        # "\r", U+2028 and the like, and take lines Go's parser refuses.
        for line in block[:-1].split("\n"):
            if not line.startswith(_DASH):
                raise NoteError("a signature line must start with an em dash and a space")
            name, _, encoded = line[len(_DASH) :].partition(" ")
            check_key_name(name)
            raw = b64decode(encoded, "signature")
            if len(raw) < 5:
                raise NoteError("a signature is shorter than its key ID")
            signatures.append(Signature(name, raw[:4], raw[4:]))
        if not signatures:
            raise NoteError("a signed note has no signature lines")
        if len(signatures) > _MAX_SIGNATURES:
            raise NoteError(f"a signed note has more than {_MAX_SIGNATURES} signatures")
        return cls(text, tuple(signatures))


def _check_str(value: object, what: str) -> None:
    if not isinstance(value, str):
        raise NoteError(f"{what} must be text (a str), not {type(value).__name__}")


def check_text(text: str) -> None:
    _check_str(text, "note text")
    if not text.endswith("\n"):
        raise NoteError("note text must end with a newline")
    if _CONTROL.search(text):
        raise NoteError("note text must not contain control characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise NoteError("note text must be valid UTF-8") from None


class PublicKey:
    """A named Ed25519 public key of one signature type, as verifiers are configured."""

    sig_type = ED25519

    def __init__(self, name: str, public_key: bytes) -> None:
        self.name = check_key_name(name)
        if len(public_key) != 32:
            raise NoteError("an Ed25519 public key is 32 bytes")
        self.public_key = public_key
        self.key_id = key_id(name, self.sig_type, public_key)
        self._key = Ed25519PublicKey.from_public_bytes(public_key)

    @property
    def vkey(self) -> str:
        """``<name>+<hex key ID>+<base64(type || public key)>``."""
        material = base64.b64encode(bytes([self.sig_type]) + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{material}"

    @classmethod
    def from_vkey(cls, vkey: str) -> Self:
        _check_str(vkey, "a verifier key")
        parts = vkey.strip().split("+", 2)
        if len(parts) != 3:
            raise NoteError("a verifier key is <name>+<hex key id>+<base64 key>")
        name, hex_id, material = parts
        raw = b64decode(material, "verifier key")
        if len(raw) != 33 or raw[0] != cls.sig_type:
            raise NoteError(f"verifier key is not a type 0x{cls.sig_type:02x} Ed25519 key")
        verifier = cls(name, raw[1:])
        if hex_id.lower() != verifier.key_id.hex():
            raise NoteError("verifier key's key ID does not match its name and key")
        return verifier

    def __eq__(self, other: object) -> bool:
        # The same key, however it was obtained: a store's own, or one read from a vkey.
        return isinstance(other, PublicKey) and (other.sig_type, other.name, other.public_key) == (
            self.sig_type,
            self.name,
            self.public_key,
        )

    def __hash__(self) -> int:
        return hash((self.sig_type, self.name, self.public_key))

    def matches(self, signature: Signature) -> bool:
        return signature.name == self.name and signature.key_id == self.key_id

    def verify_bytes(self, message: bytes, signature: bytes) -> bool:
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True


class Verifier(PublicKey):
    """A trusted Ed25519 note key (signature type 0x01)."""

    def verify(self, text: str, signature: Signature) -> bool:
        return self.verify_bytes(text.encode("utf-8"), signature.signature)


def describe(key: PublicKey) -> str:
    """A key as messages name it: its name and key ID."""
    return f"{key.name} (key {key.key_id.hex()})"


def signers_of(note: Note) -> str:
    """The keys a note's signature lines name (unverified: for messages only)."""
    return ", ".join(f"{s.name} (key {s.key_id.hex()})" for s in note.signatures) or "no key"


def format_skey(name: str, sig_type: int, key: Ed25519PrivateKey) -> str:
    """``PRIVATE+KEY+<name>+<hex key ID>+<base64(type || seed)>`` as x/mod/sumdb/note writes it."""
    public = key_id(name, sig_type, raw_public(key.public_key()))
    material = base64.b64encode(bytes([sig_type]) + key.private_bytes_raw()).decode()
    return f"PRIVATE+KEY+{name}+{public.hex()}+{material}"


def parse_skey(skey: str, sig_type: int) -> tuple[str, Ed25519PrivateKey]:
    _check_str(skey, "a signer key")
    parts = skey.strip().split("+", 4)
    if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
        raise NoteError("a signer key is PRIVATE+KEY+<name>+<hex key id>+<base64 key>")
    raw = b64decode(parts[4], "signer key")
    if len(raw) != 33 or raw[0] != sig_type:
        raise NoteError(f"signer key is not a type 0x{sig_type:02x} Ed25519 key")
    key = Ed25519PrivateKey.from_private_bytes(raw[1:])
    if parts[3].lower() != key_id(parts[2], sig_type, raw_public(key.public_key())).hex():
        raise NoteError("signer key's key ID does not match its name and key")
    return check_key_name(parts[2]), key


class Signer:
    """An Ed25519 note signing key."""

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        self.name = check_key_name(name)
        self._key = private_key
        self.verifier = Verifier(name, raw_public(private_key.public_key()))
        self.key_id = self.verifier.key_id

    @classmethod
    def generate(cls, name: str) -> Signer:
        return cls(name, Ed25519PrivateKey.generate())

    @property
    def skey(self) -> str:
        return format_skey(self.name, ED25519, self._key)

    @classmethod
    def from_skey(cls, skey: str) -> Signer:
        return cls(*parse_skey(skey, ED25519))

    def sign_bytes(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def sign(self, text: str) -> Signature:
        check_text(text)
        return Signature(self.name, self.key_id, self._key.sign(text.encode("utf-8")))


def sign_note(text: str, *signers: Signer) -> Note:
    return Note(text, tuple(s.sign(text) for s in signers))


def open_note(note: Note, verifiers: Sequence[Verifier]) -> list[Verifier]:
    """The trusted keys that signed ``note``; raises if none did or a known one failed."""
    verified: list[Verifier] = []
    for signature in note.signatures:
        for verifier in verifiers:
            if verifier.matches(signature):
                if not verifier.verify(note.text, signature):
                    raise NoteError(f"signature by {verifier.name} (key {verifier.key_id.hex()}) does not verify")
                verified.append(verifier)
    if not verified:
        raise NoteError("no signature from a trusted key")
    return verified


def parse_verifier(value: str, name: str) -> Verifier:
    """A pinned key given as a verifier key string, or as 64 hex digits of a raw
    Ed25519 public key for the key name ``name``."""
    text = value.strip()
    if "+" in text:
        return Verifier.from_vkey(text)
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise NoteError("a pinned key is a verifier key (name+id+key) or 64 hex digits") from None
    return Verifier(name, raw)
