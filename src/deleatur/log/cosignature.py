"""C2SP tlog-cosignature v1 with Ed25519 (signature type 0x04).

The cosigner signs ``cosignature/v1\\ntime <unix seconds>\\n`` followed by the
whole checkpoint text; its signature line carries 4-byte key ID || 8-byte
big-endian timestamp || 64-byte Ed25519 signature.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .note import COSIGNATURE_ED25519, NoteError, PublicKey, Signature, format_skey, parse_skey, raw_public

_MAX_TIMESTAMP = 2**63 - 1


def cosigned_message(checkpoint_text: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n".encode() + checkpoint_text.encode("utf-8")


class CosignatureVerifier(PublicKey):
    """A witness's Ed25519 cosigning key (signature type 0x04)."""

    sig_type = COSIGNATURE_ED25519

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

    @property
    def skey(self) -> str:
        return format_skey(self.name, COSIGNATURE_ED25519, self._key)

    @classmethod
    def from_skey(cls, skey: str) -> Cosigner:
        return cls(*parse_skey(skey, COSIGNATURE_ED25519))

    def cosign(self, checkpoint_text: str, timestamp: int) -> Signature:
        if not 0 <= timestamp <= _MAX_TIMESTAMP:
            raise NoteError("cosignature timestamp out of range")
        sig = self._key.sign(cosigned_message(checkpoint_text, timestamp))
        return Signature(self.name, self.verifier.key_id, timestamp.to_bytes(8, "big") + sig)
