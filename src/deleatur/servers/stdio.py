"""MCP over stdio, refusing what the SDK would misread, as the HTTP gate does
(:func:`.auth.misread`): a message that repeats a key in one object, say.

The SDK's transport parses each line of stdin itself, keeping a repeated key's last
value, and leaves a line it cannot parse (not JSON, or nested too deep) unanswered,
its client waiting for good; so the check reads each line before it does, and refuses
those too. A request it refuses is answered
with the gate's JSON-RPC error under the request's own id, since the client waits for
an answer to each request it sent; under a null id if the id cannot be told (the line
is not JSON to its end, or its id is repeated, or neither a string nor an integer), as
JSON-RPC has it. Any other message it refuses (a notification, a batch) is dropped,
and said so on stderr, without naming the key. Either way the SDK never sees it.

While the server runs, the process's stdin reads as empty and its stdout writes to
stderr, through the SDK's own claim of the two (``mcp.server.stdio``): stray output of
the code the tools run stays off the protocol's lines.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import (
    _claim_fd,
    _open_stdin_diversion,
    _open_stdout_diversion,
    _UnownedTextWrapper,
    stdio_server,
)

from .auth import jsonrpc_refusal, misread


class _Answers(anyio.AsyncFile[str]):
    """stdout, written a whole line at a time: the SDK's answers and the refusals are
    written from different tasks, and each write runs in a thread."""

    def __init__(self, fp: _UnownedTextWrapper) -> None:
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
    """stdin's lines, less those the SDK would misread: a request among them is answered
    on ``answers``."""

    def __init__(self, fp: _UnownedTextWrapper, answers: _Answers) -> None:
        super().__init__(fp)
        self._answers = answers

    async def __aiter__(self) -> AsyncIterator[str]:
        while line := await self.readline():
            # A blank line is none of the client's messages: the SDK skips it.
            refused = misread(line, "the message", unread_too=True) if line.strip() else None
            if refused is None:
                yield line
                continue
            request, request_id = _request_id(line)
            if request:
                await self._answers.write(json.dumps(jsonrpc_refusal(refused, request_id)) + "\n")
            else:
                # Not naming the key: a log's line, and a key of metadata may name a person.
                print(_DROPPED, file=sys.stderr, flush=True)


_DROPPED = "deleatur: dropped a message that the SDK would misread or not read (a key repeated in one object, say)"


def _request_id(line: str) -> tuple[bool, str | int | None]:
    """Whether ``line`` is a request (or may be one: it cannot be read to its end), and
    its id if it can be told."""
    try:
        # Objects as their pairs, a repeated key kept; an integer too long to convert, None.
        message = json.loads(line, object_pairs_hook=tuple, parse_int=_int_or_none)
    except (ValueError, RecursionError):
        return True, None
    if not isinstance(message, tuple):
        return False, None  # a batch, which the SDK does not take either
    names = [name for name, _ in message]
    if "method" not in names or "id" not in names:
        return False, None  # a notification (or a response)
    ids = [value for name, value in message if name == "id"]
    request_id = ids[0] if len(ids) == 1 else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return True, None
    return True, request_id


def _int_or_none(digits: str) -> int | None:
    try:
        return int(digits)
    except ValueError:
        return None  # more digits than Python converts


def run_stdio(server: MCPServer[Any]) -> None:
    """Serve ``server`` over the process's stdin and stdout until stdin ends."""
    # The SDK's own claim of fds 0 and 1 (the wire served from duplicates, the fds
    # pointed elsewhere), as its stdio_server() makes it when given no streams. What
    # Python's stdout buffered goes out before either switch: onto the wire only before.
    _flush_stdout()
    stdin_buffer, release_stdin = _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)
    try:
        stdout_buffer, release_stdout = _claim_fd(1, sys.stdout, "wb", _open_stdout_diversion)
        try:
            answers = _Answers(_UnownedTextWrapper(stdout_buffer, encoding="utf-8"))
            # As the SDK reads stdin: UTF-8, whatever the platform's encoding, bad bytes replaced.
            lines = _UnownedTextWrapper(stdin_buffer, encoding="utf-8", errors="replace")
            checked = _Checked(lines, answers)

            async def serve() -> None:
                async with stdio_server(stdin=checked, stdout=answers) as (read, write):
                    # The SDK's run_stdio_async, with these streams (it takes none).
                    lowlevel = server._lowlevel_server
                    await lowlevel.run(read, write, lowlevel.create_initialization_options())

            anyio.run(serve)
        finally:
            _flush_stdout()
            if release_stdout is not None:
                release_stdout()
    finally:
        if release_stdin is not None:
            release_stdin()


def _flush_stdout() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()
