"""HTTP benchmark (issue 6): `remember` and `recall` request rates and latency
percentiles under 32 concurrent clients against `deleatur serve http` on loopback.

The server runs in its own process (the real command), so the load generator
does not share its interpreter; on a 2-core machine the two still share the CPU.

The clients are 32 keep-alive HTTP/1.1 connections driven by asyncio streams, not
httpx: on this machine httpx's AsyncClient with 32 connections tops out near
400 requests/s even against a hello-world ASGI app that serves 7,000/s to these
connections, so it would measure itself (``--httpx`` runs it anyway, to compare).
Not a test. Run from the repository root::

    .venv/bin/python bench/bench_http.py                    # 3 rounds of 10 s per operation
    .venv/bin/python bench/bench_http.py --handles 4        # four store handles (default: one)
    .venv/bin/python bench/bench_http.py --workers 2        # two server processes (default: one)
    .venv/bin/python bench/bench_http.py --wrk              # load from wrk (apt-get install wrk)

With ``--wrk`` the load comes from wrk, a C program that takes far less of the
shared CPU than the asyncio clients; its latency percentiles are its own
(``--latency``), and every response must be a 2xx.

``*_server_cpu_us`` is the CPU time (user and system) the server's processes used per
request: on a VM whose speed drifts from run to run, it moves less than the rates do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx

from bench_log import print_results
from bench_store import machine, percentile
from deleatur import Memory, NewMemory, Role, from_bytes
from deleatur.servers.defaults import DEFAULT_HANDLES

MASTER = bytes(32)
TARGETS = {
    "remember_per_s": (">=", 1500.0),
    "recall_per_s": (">=", 3000.0),
    "remember_p99_ms": ("<=", 50.0),
    "recall_p99_ms": ("<=", 50.0),
}
WORDS = [f"w{i}" for i in range(2000)]


def prepare(path: Path, records: int) -> str:
    """A store with ``records`` records to recall from, and a member's API key."""
    memory = Memory.init(path, from_bytes(MASTER))[0]
    with memory:
        for start in range(0, records, 10_000):
            memory.remember_many(
                NewMemory(
                    f"note {i} {WORDS[i % len(WORDS)]} {WORDS[(i * 7) % len(WORDS)]}", subject=f"person {i % 500}"
                )
                for i in range(start, min(start + 10_000, records))
            )
        return memory.create_principal("bench", Role.MEMBER)[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(path: Path, port: int, handles: int, workers: int) -> subprocess.Popen[bytes]:
    command = [str(Path(sys.executable).with_name("deleatur")), "serve", "http", "--port", str(port)]
    command += ["--handles", str(handles), "--workers", str(workers)]
    env = {**os.environ, "DELEATUR_STORE": str(path), "DELEATUR_MASTER_KEY": MASTER.hex()}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_ready(url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with status {server.returncode}")
        try:
            httpx.get(f"{url}/openapi.json", timeout=1).raise_for_status()
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise SystemExit("the server did not start within 30 s")


class Connection:
    """One keep-alive HTTP/1.1 connection: a request, then its response read by Content-Length."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str) -> None:
        self.reader, self.writer = reader, writer
        self.auth = f"Authorization: Bearer {key}\r\nHost: bench\r\n"

    async def request(self, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
        head = f"{method} {target} HTTP/1.1\r\n{self.auth}"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        length = next(int(v) for k, _, v in (x.partition(b":") for x in lines) if k.lower() == b"content-length")
        return int(lines[0].split()[1]), await self.reader.readexactly(length)


Request = Callable[[Any, int], Awaitable[None]]


async def hammer(
    url: str, key: str, clients: int, seconds: float, request: Request, *, use_httpx: bool
) -> dict[str, float]:
    """``clients`` concurrent loops of ``request`` for ``seconds``: rate and latencies."""
    latencies: list[float] = []
    host, port = url.removeprefix("http://").split(":")
    http = None
    if use_httpx:
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        http = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, limits=limits, timeout=30)
        connections: list[Any] = [http] * clients
    else:
        opened = [await asyncio.open_connection(host, int(port)) for _ in range(clients)]
        connections = [Connection(r, w, key) for r, w in opened]
    stop = time.perf_counter() + seconds

    async def loop(n: int) -> None:
        i = 0
        while time.perf_counter() < stop:
            t = time.perf_counter()
            await request(connections[n], n * 1_000_000 + i)
            latencies.append(time.perf_counter() - t)
            i += 1

    began = time.perf_counter()
    await asyncio.gather(*(loop(n) for n in range(clients)))
    elapsed = time.perf_counter() - began
    if http is not None:
        await http.aclose()
    else:
        for connection in connections:
            connection.writer.close()
    ms = [x * 1000 for x in latencies]
    return {"per_s": len(latencies) / elapsed, "p50_ms": statistics.median(ms), "p99_ms": percentile(ms, 99)}


async def _call(connection: Any, method: str, target: str, body: dict[str, Any] | None, expect: int) -> None:
    if isinstance(connection, httpx.AsyncClient):
        response = await connection.request(method, target, json=body)
        status, content = response.status_code, response.content
    else:
        status, content = await connection.request(method, target, b"" if body is None else json.dumps(body).encode())
    if status != expect:
        raise SystemExit(f"{method} {target} failed: {status} {content[:200]!r}")


async def remember(connection: Any, i: int) -> None:
    body = {"text": f"bench note {i} {WORDS[i % len(WORDS)]}", "subject": f"person {i % 500}"}
    await _call(connection, "POST", "/v1/memories", body, 201)


async def recall(connection: Any, i: int) -> None:
    query = urlencode({"q": WORDS[(i * 31) % len(WORDS)], "limit": 10})
    await _call(connection, "GET", f"/v1/memories/search?{query}", None, 200)


# The same requests as ``remember`` and ``recall`` above, as wrk scripts (Lua).
_WRK_SCRIPTS = {
    "remember": """
local words, n = {}, 0
for i = 0, %(words)d - 1 do words[i + 1] = "w" .. i end
wrk.headers["Content-Type"] = "application/json"  -- a headers argument would drop -H's
request = function()
  n = n + 1
  local text = string.format("bench note %%d %%s", n, words[n %% %(words)d + 1])
  local body = string.format('{"text": "%%s", "subject": "person %%d"}', text, n %% 500)
  return wrk.format("POST", "/v1/memories", nil, body)
end
""",
    "recall": """
local words, n = {}, 0
for i = 0, %(words)d - 1 do words[i + 1] = "w" .. i end
request = function()
  n = n + 1
  return wrk.format("GET", "/v1/memories/search?q=" .. words[(n * 31) %% %(words)d + 1] .. "&limit=10")
end
""",
}


def wrk(url: str, key: str, clients: int, seconds: float, operation: str) -> dict[str, float]:
    """One wrk run of ``operation``: rate and wrk's latency percentiles; any non-2xx fails."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(_WRK_SCRIPTS[operation] % {"words": len(WORDS)})
        script.flush()
        command = ["wrk", "-t1", f"-c{clients}", f"-d{max(seconds, 1.0):.0f}s", "--latency", "-s", script.name]
        command += ["-H", f"Authorization: Bearer {key}", url]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"wrk saw failed requests:\n{out}")
    latency = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.strip().startswith(("50%", "99%"))}
    rate = next(float(line.split()[1]) for line in out.splitlines() if line.startswith("Requests/sec:"))
    return {"per_s": rate, "p50_ms": _ms(latency["50%"]), "p99_ms": _ms(latency["99%"])}


def _ms(value: str) -> float:
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if value.endswith(unit):
            return float(value.removesuffix(unit)) * scale
    raise ValueError(f"wrk latency {value!r}")


def server_cpu_s(server: subprocess.Popen[bytes]) -> float:
    """CPU seconds (user and system) the server's processes have used so far: the server
    and its workers, which it forks before it serves (Linux's /proc)."""
    # pgrep fails when it finds none: one worker serves in the server's own process.
    found = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True, check=False)
    children = found.stdout.split()
    ticks = 0
    for pid in [str(server.pid), *children]:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def run_round(args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        key = prepare(path, args.records)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = start_server(path, port, args.handles, args.workers)
        try:
            wait_ready(url, server)
            out: dict[str, float] = {}
            for name, request in (("remember", remember), ("recall", recall)):
                # A warm-up second first: connections, handles, caches.
                if args.wrk:
                    wrk(url, key, args.clients, 1.0, name)
                    used = server_cpu_s(server)
                    figures = wrk(url, key, args.clients, args.seconds, name)
                else:
                    asyncio.run(hammer(url, key, args.clients, 1.0, request, use_httpx=args.httpx))
                    used = server_cpu_s(server)
                    figures = asyncio.run(hammer(url, key, args.clients, args.seconds, request, use_httpx=args.httpx))
                # Steadier than the rates on a shared VM: what each request cost the server.
                figures["server_cpu_us"] = (server_cpu_s(server) - used) / (figures["per_s"] * args.seconds) * 1e6
                out.update({f"{name}_{k}": v for k, v in figures.items()})
            return out
        finally:
            server.terminate()
            server.wait(timeout=30)


def load_options(doc: str | None) -> argparse.ArgumentParser:
    """The options of the load (shared with ``bench_http_ceiling.py``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0, help="per operation and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="the server's worker processes")
    parser.add_argument("--json", action="store_true")
    return parser


def main() -> None:
    parser = load_options(__doc__)
    parser.add_argument("--records", type=int, default=10_000, help="records in the store before the rounds")
    parser.add_argument("--handles", type=int, default=DEFAULT_HANDLES, help="the server's --handles")
    parser.add_argument("--wrk", action="store_true", help="drive the load with wrk instead")
    parser.add_argument("--httpx", action="store_true", help="drive the load with httpx.AsyncClient instead")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rounds = [run_round(args) for _ in range(args.rounds)]
    results: dict[str, Any] = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    results["rounds"] = args.rounds
    results["clients"] = args.clients
    results["handles"] = args.handles
    results["workers"] = args.workers
    results["load_generator"] = "wrk" if args.wrk else "httpx.AsyncClient" if args.httpx else "asyncio streams"
    results["loadavg_before"] = " ".join(f"{x:.2f}" for x in load_before)
    results["loadavg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results["machine"] = machine()
    print_results(results, TARGETS, as_json=args.json)


if __name__ == "__main__":
    main()
