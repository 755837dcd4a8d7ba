"""``deleatur serve http|mcp``: the store behind the HTTP API or an MCP server."""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from ..crypto.master import from_environment
from ..memory import Memory
from ..servers.defaults import (
    DEFAULT_HANDLES,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    DEFAULT_SESSIONS_PER_PRINCIPAL,
)
from ..servers.pool import HandlePool
from .common import Options, app, err, print_error, store_tenant

# The servers (FastAPI, MCP, uvicorn) are imported by the commands that run them:
# at the top, they took half a second from every command, ``deleatur version`` too.
if TYPE_CHECKING:
    from starlette.types import ASGIApp

serve_app = typer.Typer(help="Serve the store over HTTP or MCP.", no_args_is_help=True)
app.add_typer(serve_app, name="serve")

HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on.")]


def _port(port: int) -> int:
    # Checked here: the socket's own refusal of one out of range is an OverflowError.
    if not 0 <= port <= 65535:
        raise typer.BadParameter(f"{port} is not a port: give one from 0 to 65535 (0: any free one)")
    return port


PortOpt = Annotated[int, typer.Option("--port", callback=_port, help="Port to listen on (0: any free one).")]


class Transport(StrEnum):
    stdio = "stdio"
    http = "http"


def _opener() -> Callable[[], Memory]:
    """Opens the configured store; tried once now, so a wrong path or key fails here."""
    master = from_environment(Options.store, Options.key_file)

    def open_memory() -> Memory:
        return Memory.open(Options.store, master, tenant=store_tenant())

    open_memory().close()
    return open_memory


def _serve(name: str, host: str, port: int, tail: str, build: Callable[[], ASGIApp], *, workers: int = 1) -> None:
    """Listen, say where once every worker runs, serve until stopped; exit non-zero if
    a worker failed."""
    from ..servers.workers import listen, run_workers

    sock = listen(host, port, workers=workers)
    where = f"deleatur {name} on http://{host}:{sock.getsockname()[1]}{tail}"
    if workers > 1:
        where += f", {workers} worker processes"
    status = run_workers(build, sock, workers=workers, started=lambda: err.print(where), died=print_error)
    if status:
        raise typer.Exit(status)


@serve_app.command("http")
def serve_http(
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8765,
    max_body_bytes: Annotated[
        int, typer.Option("--max-body-bytes", min=1, help="Larger request bodies get 413.")
    ] = DEFAULT_MAX_BODY_BYTES,
    handles: Annotated[
        int, typer.Option("--handles", min=1, help="Store handles per worker, and library calls running at once.")
    ] = DEFAULT_HANDLES,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Server processes, to use more cores (one per core).")
    ] = 1,
) -> None:
    """The HTTP API (OpenAPI at /openapi.json); every call needs 'Authorization: Bearer <API key>'."""
    from ..servers.http import create_app

    app = functools.partial(
        create_app, _opener(), max_body_bytes=max_body_bytes, handles=handles, sign_every_write=workers > 1
    )
    _serve("HTTP API", host, port, " (OpenAPI at /openapi.json)", app, workers=workers)


@serve_app.command("mcp")
def serve_mcp(
    transport: Annotated[
        Transport,
        typer.Option(
            "--transport",
            help="stdio (as the local operator, or as the principal of --api-key) or http (bearer API keys).",
        ),
    ] = (Transport.stdio),
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8766,
    sessions_per_principal: Annotated[
        int,
        typer.Option(
            "--sessions-per-principal", min=1, help="HTTP: live sessions one principal may hold; more get 429."
        ),
    ] = DEFAULT_SESSIONS_PER_PRINCIPAL,
    max_sessions: Annotated[
        int, typer.Option("--max-sessions", min=1, help="HTTP: live sessions in all; more get 503.")
    ] = DEFAULT_MAX_SESSIONS,
    session_idle_timeout: Annotated[
        float,
        typer.Option(
            "--session-idle-timeout", min=1, help="HTTP: seconds without a request after which a session ends."
        ),
    ] = DEFAULT_SESSION_IDLE_TIMEOUT,
) -> None:
    """An MCP server: over stdio for a local client (as the local operator, or as the
    principal of --api-key), or streamable HTTP at /mcp (bearer API keys)."""
    from ..servers.mcp import build_server, http_app
    from ..servers.stdio import run_stdio

    pool = HandlePool(_opener(), limit=DEFAULT_HANDLES)
    if Options.api_key is not None:
        with pool.lease() as memory:
            memory.authenticate(Options.api_key)  # a wrong key fails here, not on every call
    server = build_server(pool, local_api_key=Options.api_key)
    try:
        if transport is Transport.stdio:
            run_stdio(server)
        else:
            # One process: MCP sessions live in its memory. Its tools run in threads.
            _serve(
                "MCP server",
                host,
                port,
                "/mcp",
                lambda: http_app(
                    server,
                    pool,
                    host=host,
                    sessions_per_principal=sessions_per_principal,
                    max_sessions=max_sessions,
                    idle_timeout=session_idle_timeout,
                ),
            )
    finally:
        pool.close()
