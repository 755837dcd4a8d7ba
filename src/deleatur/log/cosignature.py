"""C2SP tlog-cosignature v1 with Ed25519 (signature type 0x04).

The cosigner signs ``cosignature/v1\\ntime <unix seconds>\\n`` followed by the
whole checkpoint text; its signature line carries 4-byte key ID || 8-byte
big-endian timestamp || 64-byte Ed25519 signature.
"""

from __future__ import annotations

import base64

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .note import COSIGNATURE_ED25519, NoteError, Signature, b64decode, check_key_name, key_id, raw_public

_MAX_TIMESTAMP = 2**63 - 1


def cosigned_message(checkpoint_text: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n".encode() + checkpoint_text.encode("utf-8")


class CosignatureVerifier:
    sig_type = COSIGNATURE_ED25519

    def __init__(self, name: str, public_key: bytes) -> None:
        self.name = check_key_name(name)
        if len(public_key) != 32:
            raise NoteError("an Ed25519 public key is 32 bytes")
        self.public_key = public_key
        self.key_id = key_id(name, self.sig_type, public_key)
        self._key = Ed25519PublicKey.from_public_bytes(public_key)

    @property
    def vkey(self) -> str:
        material = base64.b64encode(bytes([self.sig_type]) + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{material}"

    @classmethod
    def from_vkey(cls, vkey: str) -> CosignatureVerifier:
        parts = vkey.strip().split("+", 2)
        if len(parts) != 3:
            raise NoteError("a verifier key is <name>+<hex key id>+<base64 key>")
        raw = b64decode(parts[2], "cosigner key")
        if len(raw) != 33 or raw[0] != cls.sig_type:
            raise NoteError("cosigner key is not a type 0x04 Ed25519 cosignature key")
        verifier = cls(parts[0], raw[1:])
        if parts[1].lower() != verifier.key_id.hex():
            raise NoteError("cosigner key's key ID does not match its name and key")
        return verifier

    def matches(self, signature: Signature) -> bool:
        return signature.name == self.name and signature.key_id == self.key_id

    def verify(self, checkpoint_text: str, signature: Signature) -> int:
        """The cosignature's timestamp; raises :class:`NoteError` if it does not verify."""
        if len(signature.signature) != 8 + 64:
            raise NoteError(f"cosignature by {self.name} has the wrong length")
        timestamp = int.from_bytes(signature.signature[:8], "big")
        if timestamp > _MAX_TIMESTAMP:
            raise NoteError(f"cosignature by {self.name} has an out-of-range timestamp")
        try:
            self._key.verify(signature.signature[8:], cosigned_message(checkpoint_text, timestamp))
        except InvalidSignature:
            raise NoteError(f"cosignature by {self.name} does not verify") from None
        return timestamp


class Cosigner:
    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.verifier = CosignatureVerifier(name, raw_public(private_key.public_key()))
        self.name = self.verifier.name

    def cosign(self, checkpoint_text: str, timestamp: int) -> Signature:
        if not 0 <= timestamp <= _MAX_TIMESTAMP:
            raise NoteError("cosignature timestamp out of range")
        sig = self._key.sign(cosigned_message(checkpoint_text, timestamp))
        return Signature(self.name, self.verifier.key_id, timestamp.to_bytes(8, "big") + sig)
