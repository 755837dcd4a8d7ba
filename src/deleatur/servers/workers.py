"""Several server processes on one listening socket, to use several cores.

A Python process runs its Python code on one core at a time, and each server
process runs its library calls in its event loop on its one handle. More
processes serve more requests on a machine with more cores: they share the store
through SQLite in WAL mode, where reads run side by side and write transactions
(every call's audit entry is one) queue on the database's write lock.

The processes are forked, not spawned: each builds its app from the parent's
opener after the fork, so no SQLite connection crosses a fork, and the master key
never passes through the environment or an import string. The parent only binds
the socket, starts the workers and waits; SIGTERM or SIGINT stops them all, and a
worker that dies stops the others and makes the parent exit non-zero, rather than
leaving a server quietly running at a fraction of its capacity.

On Linux each worker listens on a socket of its own, bound to the same address
with ``SO_REUSEPORT``, and the kernel spreads new connections over them. On one
shared listening socket, whichever worker woke first accepted every connection of
a burst: wrk's 32 keep-alive connections all went to one worker in 5 runs of 13,
and the other idled (BENCHMARKS.md, "The lanes, and a listening socket per worker").
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

import uvicorn
from starlette.types import ASGIApp

from ..errors import InvalidInputError
from .combined_writes import CombinedWritesProtocol

#: The listening socket's backlog: connections wait there until a worker takes them.
BACKLOG = 2048
#: How long a stopping worker lets requests in flight (a slow export) finish.
GRACEFUL_SHUTDOWN_S = 10
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
#: A serving process's collection threshold of its youngest generation (gc.set_threshold).
YOUNG_OBJECTS_COLLECTED_AT = 10_000
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


#: Where each worker can listen on a socket of its own.
_PORT_SHARED = sys.platform == "linux"


def listen(host: str, port: int, *, workers: int = 1) -> socket.socket:
    """The TCP socket on ``host:port`` that :func:`run_workers` serves with ``workers``
    processes: a listening one, or, for several workers on Linux, one bound with
    ``SO_REUSEPORT`` (it holds the port), beside which each worker binds and listens
    on its own (a listening one here would take a share of the connections, which no
    worker accepts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = _socket(family, shared=False)
    try:
        sock.bind((host, port))
        if workers > 1 and _PORT_SHARED:
            # Bound first without SO_REUSEPORT, so that a port another server listens on
            # is refused (with it, a second server of the same user would silently take
            # half of the first one's connections); then again with it, on the same port.
            # A server started in the instant between the two may still share the port.
            bound = sock.getsockname()
            sock.close()
            sock = _socket(family, shared=True)
            sock.bind(bound)
        else:
            sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise InvalidInputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _socket(family: socket.AddressFamily, *, shared: bool) -> socket.socket:
    """A TCP socket to bind a server's address with: ``shared`` with other sockets on
    the same port (``SO_REUSEPORT``), or not."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def _listening(sock: socket.socket) -> socket.socket:
    """A worker's listening socket: ``sock`` itself if it listens, else (see
    :func:`listen`) a new one bound beside it."""
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return sock
    own = _socket(sock.family, shared=True)
    own.bind(sock.getsockname())
    own.listen(BACKLOG)
    sock.close()
    return own


def server_config(app: ASGIApp, *, log_level: str, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration of a server of ``app``; ``options`` (uvicorn's) add to it
    or replace its own."""
    # "auto": uvloop (a dependency). No WebSocket: no route takes one. No access log: a
    # recall's URL holds its query's words, which no log of the server may keep (and
    # uvicorn spelt each request's line even when its level then dropped it).
    own: dict[str, Any] = {
        "http": CombinedWritesProtocol,
        "ws": "none",
        "loop": "auto",
        "lifespan": "on",
        "log_level": log_level,
        "access_log": False,
    }
    return uvicorn.Config(app, **(own | options))


async def _collect_young_objects() -> None:
    gc.collect(0)


class _Stopped(BaseException):
    """A SIGTERM in a server that runs in the command's own process: like Ctrl-C's
    KeyboardInterrupt, it ends whatever is running, be it the app's build or the
    re-raise of the signal with which uvicorn ends after its graceful shutdown."""


def _stopped(_signum: int, _frame: FrameType | None) -> NoReturn:
    raise _Stopped


def _serve(build: Callable[[], ASGIApp], sock: socket.socket, log_level: str) -> int:
    try:
        config = server_config(
            build(),
            log_level=log_level,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            # uvicorn's once-a-second tick calls it (when over 0 s have passed since).
            callback_notify=_collect_young_objects,
            timeout_notify=0,
        )
        config.load()  # the app's middleware and uvicorn's own objects, made now
        # The ~80,000 objects the imports and the app made live as long as the server:
        # out of the collector's reach, each full collection no longer walks them, which
        # stopped every request in flight for 20-35 ms (BENCHMARKS.md). Garbage first.
        gc.collect()
        gc.freeze()
        # The requests in flight hold hundreds of objects: at the default threshold (700
        # more made than freed) the youngest generation was collected every ~15 recalls,
        # for next to nothing, 1.3 % of a worker's time. Past this one, that happened once
        # in 20 s of load, and a server with little to do could keep garbage for hours
        # (a cycle holding an export's pages, say): so it is also collected every second.
        thresholds = gc.get_threshold()
        gc.set_threshold(YOUNG_OBJECTS_COLLECTED_AT, *thresholds[1:])
        try:
            uvicorn.Server(config).run(sockets=[sock])
        finally:
            # In the command's own process, which may go on.
            gc.set_threshold(*thresholds)
            gc.unfreeze()
    except (KeyboardInterrupt, _Stopped):
        return 0  # a stop signal: uvicorn re-raises the one it stopped on
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _end_with(parent: int) -> None:
    """Have the kernel stop this worker when the parent dies, even by SIGKILL, so no
    orphan keeps serving (and holding the port) with nobody to stop it. Linux only;
    elsewhere the parent's own signal handling is all there is."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _child(
    build: Callable[[], ASGIApp],
    sock: socket.socket,
    log_level: str,
    parent: int,
    mask: set[int | signal.Signals],
    ready: tuple[int, int],
) -> NoReturn:
    """A forked worker's whole life: it never returns into the code that forked it.
    It writes a byte to ``ready`` once it listens."""
    status = 1
    try:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _end_with(parent)
        os.close(ready[0])
        listening = _listening(sock)
        os.write(ready[1], b"\0")
        os.close(ready[1])
        status = _serve(build, listening, log_level)
    except Exception:
        traceback.print_exc()
    finally:
        os._exit(status)


def _wait_listening(ready: int, workers: int) -> bool:
    """Whether ``workers`` workers listen: False once one has ended without (a worker
    that ends closes its end of the pipe; the wait for workers then says why)."""
    told = 0
    while told < workers:
        byte = os.read(ready, workers - told)
        if not byte:
            return False
        told += len(byte)
    return True


def how_it_ended(status: int) -> str:
    """A process's end as ``os.wait`` reports it, in words: a worker killed by the
    kernel's OOM killer or an operator ends by a signal, and says nothing itself."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "an unknown signal"
    return f"was killed by signal {-code} ({name})"


def _report_to_stderr(message: str) -> None:
    sys.stderr.write(message + "\n")


def run_workers(
    build: Callable[[], ASGIApp],
    sock: socket.socket,
    *,
    workers: int,
    started: Callable[[], None] = lambda: None,
    died: Callable[[str], None] = _report_to_stderr,
    log_level: str = "warning",
) -> int:
    """Serve ``build()`` apps on ``sock`` from ``workers`` forked processes (one worker
    serves in this process) until a signal stops them; returns the exit status,
    non-zero if a worker failed. ``started`` runs once every worker is forked;
    ``died`` is told, in a line, which worker failed and how (else the server would
    end with status 1 and no word why)."""
    if workers < 1:
        raise ValueError("a server needs at least one worker")
    if workers == 1:
        # On uvloop, as forked workers: on asyncio's loop every response of a worker under
        # wrk took 44 ms at the median, a stall of the loop's, not of the work, at 700
        # requests/s where uvloop served 1,050-1,250 with a lower p99 (BENCHMARKS.md).
        # (When calls waited for locks in the loop, uvloop had served some connections
        # far later than others; since calls no longer wait there, it does not.)
        # A SIGTERM stops it as cleanly as Ctrl-C, with status 0 as several workers give.
        handler = signal.signal(signal.SIGTERM, _stopped)
        try:
            try:
                started()
            except _Stopped:
                return 0  # stopped before serving a request
            return _serve(build, sock, log_level)
        finally:
            signal.signal(signal.SIGTERM, handler)
    live: dict[int, int] = {}  # pid: worker number, from 1
    stopping = False

    def stop(_signum: int = 0, _frame: FrameType | None = None) -> None:
        nonlocal stopping
        stopping = True
        for pid in live:
            with contextlib.suppress(ProcessLookupError):  # already gone: the wait collects it
                os.kill(pid, signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in _STOP_SIGNALS}
    failed = False
    ready = os.pipe()
    unclosed = set(ready)
    try:
        for number in range(1, workers + 1):
            if stopping:
                break
            sys.stdout.flush()
            sys.stderr.flush()
            parent = os.getpid()
            # Blocked around the fork, a stop signal waits until the new worker is in
            # ``live`` (parent) or back on the default handlers (child): neither misses it.
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
            try:
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the child's coverage is not collected
                    _child(build, sock, log_level, parent, mask, ready)
                live[pid] = number
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if stopping:
                stop()  # a stop handled between the fork and ``live[pid]`` reaches this worker too
        os.close(ready[1])
        unclosed.discard(ready[1])
        # Said once every worker listens: a client told the address then is not refused
        # for want of a listening socket (connections wait in a listening one's backlog).
        if _wait_listening(ready[0], len(live)) and not stopping:
            started()
        while live:
            pid, status = os.wait()
            number = live.pop(pid, 0)
            # uvicorn re-raises the signal that stopped it, so a stopped worker may end by it.
            if not stopping or os.waitstatus_to_exitcode(status) not in (0, -signal.SIGTERM, -signal.SIGINT):
                which = f"worker {number} of {workers}" if number else "a child process"
                others = "; stopping the others" if live and not stopping else ""
                died(f"{which} (pid {pid}) {how_it_ended(status)}{others}")
                failed = True
                stop()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for end in unclosed:
            os.close(end)
        sock.close()
    return 1 if failed else 0


__all__ = ["how_it_ended", "listen", "run_workers"]
