"""A response in one write to the socket, not two.

uvicorn writes a response's head when the app sends ``http.response.start`` and its
body when the app sends ``http.response.body``, and uvloop's transport sends each at
once: two ``send`` system calls, two TCP segments and two wake-ups of the client for
every response. The two writes were 9 % of a server process's time under a recall
load (py-spy, BENCHMARKS.md). :class:`CombinedWrites` holds what is written until the
event loop's next turn and then writes it once, so a head and the body sent right after
it leave together. It writes at once whatever passes 64 KiB (asyncio's own high-water
mark), so a streamed body still meets the transport's flow control, and it writes what
it holds before the connection is closed, or as the client ends its side of it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: What is held is written at once past this many bytes (asyncio's default high-water mark).
MOST_HELD = 64 * 1024


class CombinedWrites(asyncio.Transport):
    """``transport``, its writes of one turn of ``loop`` made as one: what uvicorn's
    HTTP/1.1 protocol uses of a transport once the connection is made (its flow control
    keeps the socket's own transport). Other methods are the base class's, which raise."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        chunk = bytes(data)
        if len(chunk) >= MOST_HELD:
            self.write_held()
            self._write(chunk)  # after what was held, and not copied into one with it
            return
        if not self._held:
            self._loop.call_soon(self.write_held)
        self._held.append(chunk)
        self._size += len(chunk)
        if self._size >= MOST_HELD:
            self.write_held()

    def write_held(self) -> None:
        """Write what is held now."""
        if not self._held:
            return  # written already: past MOST_HELD, or before a close
        data = b"".join(self._held)
        self._held.clear()
        self._size = 0
        self._write(data)

    def _write(self, data: bytes) -> None:
        if not self._transport.is_closing():  # closed by the peer meanwhile: nowhere to go
            self._transport.write(data)

    def close(self) -> None:
        self.write_held()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class CombinedWritesProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools) writing through :class:`CombinedWrites`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # its flow control and addresses: the socket's own
        self._combined = CombinedWrites(transport, self.loop)
        self.transport = self._combined

    def eof_received(self) -> None:
        # A client that ends its side once it has sent its request: uvloop's transport
        # closes as this returns, and takes no more writes, so what is held goes now
        # (and the close lets it drain).
        self._combined.write_held()
        super().eof_received()
