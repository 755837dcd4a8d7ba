"""deleatur: agent memory in which every data-subject right is built in.

The public surface is re-exported here; everything else is internal.
"""

from .crypto.master import MasterKeySource, from_bytes, from_environment, from_file, from_hex, from_passphrase
from .errors import (
    DataKeyDestroyedError,
    DeleaturError,
    IntegrityError,
    InvalidInputError,
    KeyStoreError,
    MasterKeyError,
    NotADeleaturStoreError,
    NotFoundError,
    SchemaVersionError,
    StoreError,
)
from .memory import Memory, StoreInfo
from .model import Hit, NewMemory, Record, Space, Status, canonical_subject

__version__ = "0.1.0"

__all__ = [
    "DataKeyDestroyedError",
    "DeleaturError",
    "Hit",
    "IntegrityError",
    "InvalidInputError",
    "KeyStoreError",
    "MasterKeyError",
    "MasterKeySource",
    "Memory",
    "NewMemory",
    "NotADeleaturStoreError",
    "NotFoundError",
    "Record",
    "SchemaVersionError",
    "Space",
    "Status",
    "StoreError",
    "StoreInfo",
    "__version__",
    "canonical_subject",
    "from_bytes",
    "from_environment",
    "from_file",
    "from_hex",
    "from_passphrase",
]
