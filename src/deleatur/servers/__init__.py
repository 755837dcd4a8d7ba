"""Network shells over the library: an HTTP API (:mod:`.http`) and an MCP server
(:mod:`.mcp`). Each route or tool calls one :class:`~deleatur.Memory` method and
formats its result; the rules live in the library."""

from __future__ import annotations

from .errors import ErrorInfo, error_info
from .pool import HandlePool

__all__ = ["ErrorInfo", "HandlePool", "error_info"]
