"""The servers' defaults, apart from the servers themselves: the command line shows
them in its help without importing FastAPI, MCP or uvicorn, which would slow every
command, ``deleatur version`` included, by half a second."""

from __future__ import annotations

#: The largest request body accepted: a record's text is at most 64 KiB, so 1 MiB
#: leaves room for metadata and certificates to verify, and no more.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: Every call, a read included, appends its audit entry: more handles than one only
#: queue on SQLite's write lock, and its busy handler's sleeps (measured in BENCHMARKS.md).
DEFAULT_HANDLES = 1

__all__ = ["DEFAULT_HANDLES", "DEFAULT_MAX_BODY_BYTES"]
