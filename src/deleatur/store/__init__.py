"""Record store backends: encrypted rows and the full-text index, behind one protocol."""

from .protocol import Backend, RowFilter, StoredRow
from .sqlite import SQLiteBackend

__all__ = ["Backend", "RowFilter", "SQLiteBackend", "StoredRow"]
