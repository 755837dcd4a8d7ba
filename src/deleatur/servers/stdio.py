"""MCP over stdio, refusing what the SDK would misread, as the HTTP gate does
(:func:`.auth.misread`): a message that repeats a key in one object, say.

The SDK's transport parses each line of stdin itself, keeping a repeated key's last
value, so the check reads each line before it does. A request it refuses is answered
with the gate's JSON-RPC error under the request's own id, since the client waits for
an answer to each request it sent (under a null id if the line cannot be read to its
end, as JSON-RPC has it). Any other message it refuses is dropped, and said so on
stderr. Either way the SDK never sees it.

While the server runs, the process's stdin reads as empty and its stdout writes to
stderr, as the SDK's own transport has them: stray output of the code the tools run
cannot break the protocol's lines.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from io import TextIOWrapper
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server

from .auth import jsonrpc_refusal, misread


class _Answers(anyio.AsyncFile[str]):
    """stdout, written a whole line at a time: the SDK's answers and the refusals are
    written from different tasks, and each write runs in a thread."""

    def __init__(self, fp: TextIOWrapper) -> None:
        super().__init__(fp)
        self._writing = anyio.Lock()

    async def write(self, line: str) -> int:
        async with self._writing:
            written = await super().write(line)
            await super().flush()
            return written

    async def flush(self) -> None:
        pass  # each line is flushed as it is written


class _Checked(anyio.AsyncFile[str]):
    """stdin's lines, less those the SDK would misread (answered on ``answers``)."""

    def __init__(self, fp: TextIOWrapper, answers: _Answers) -> None:
        super().__init__(fp)
        self._answers = answers

    async def __aiter__(self) -> AsyncIterator[str]:
        while line := await self.readline():
            refused = misread(line, "the message")
            if refused is None:
                yield line
                continue
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                message = {"method": None, "id": None}  # refused before its end: whose, unknown
            if isinstance(message, dict) and "method" in message and "id" in message:
                await self._answers.write(json.dumps(jsonrpc_refusal(refused, message["id"])) + "\n")
            else:
                print(f"deleatur: dropped a message: {refused.message}", file=sys.stderr, flush=True)


@contextmanager
def _diverted(fd: int, to: int) -> Iterator[int]:
    """``fd`` pointed at ``to`` meanwhile; the descriptor it was, duplicated."""
    own = os.dup(fd)
    os.dup2(to, fd)
    try:
        yield own
    finally:
        os.dup2(own, fd)
        # Not closed: a thread may still be blocked reading it, and a descriptor closed
        # under it could be reused by another file (the SDK leaves its own open too).


def run_stdio(server: MCPServer[Any]) -> None:
    """Serve ``server`` over the process's stdin and stdout until stdin ends."""
    with open(os.devnull, "rb") as nothing, _diverted(0, nothing.fileno()) as stdin, _diverted(1, 2) as stdout:
        answers = _Answers(TextIOWrapper(os.fdopen(stdout, "wb", closefd=False), encoding="utf-8"))
        # As the SDK reads stdin: text, whatever the platform's encoding, bad bytes replaced.
        lines = TextIOWrapper(os.fdopen(stdin, "rb", closefd=False), encoding="utf-8", errors="replace")
        checked = _Checked(lines, answers)

        async def serve() -> None:
            async with stdio_server(stdin=checked, stdout=answers) as (read, write):
                # The SDK's run_stdio_async, with these streams (it takes none).
                lowlevel = server._lowlevel_server
                await lowlevel.run(read, write, lowlevel.create_initialization_options())

        anyio.run(serve)
