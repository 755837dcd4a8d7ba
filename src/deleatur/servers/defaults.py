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

#: The legal basis an erasure over HTTP or MCP states when its caller names none (the
#: CLI and the library ask for one): Art. 17, the right the route or tool exercises.
DEFAULT_BASIS = "Art. 17"
#: Live MCP sessions one principal may hold at once: enough for an agent's clients
#: and their reconnections, few enough that no key can take the whole server's.
DEFAULT_SESSIONS_PER_PRINCIPAL = 16
#: Live MCP sessions in all (the SDK's own default is 10,000, some 37 KiB each).
DEFAULT_MAX_SESSIONS = 1_000
#: Seconds a session may go without a request in flight before it ends, freeing its
#: slot (the SDK's own default is 30 minutes). A client whose session ended opens another.
DEFAULT_SESSION_IDLE_TIMEOUT = 600.0

__all__ = [
    "DEFAULT_BASIS",
    "DEFAULT_HANDLES",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSIONS_PER_PRINCIPAL",
    "DEFAULT_SESSION_IDLE_TIMEOUT",
]
