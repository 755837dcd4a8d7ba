"""Instructions per request of the HTTP API's ASGI app, driven in process as
``bench_app.py`` drives it (32 concurrent clients, no network, no uvicorn), counted
by callgrind, so another process on the machine does not change the figures
(valgrind must be installed). Not a test. To compare two revisions, run it from a
clean export of each::

    PYTHONPATH=<export>/src .venv/bin/python bench/bench_app_instructions.py recall
    PYTHONPATH=<export>/src .venv/bin/python bench/bench_app_instructions.py remember
    .venv/bin/python bench/bench_app_instructions.py recall --concurrency 16 --every-write-signed

The last is closer to a worker of ``serve http --workers 2`` under 32 clients: each of
its two processes serves about 16 of them, and signs every write (``bench_app.py``'s
options of the same names).

The store is ``bench_http.py``'s (10,000 records, a member's API key), built once
outside valgrind and copied for each run. A child process serves the app's warm-up
(64 requests) and then N requests; it runs under callgrind with N = 0 and with N =
``--requests``, and the difference over N is the figure (the setup, the imports and
the warm-up cancel out). Runs of unchanged code differ by about 0.2 %.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_app import rounds
from bench_http import MASTER, prepare
from bench_server_call_instructions import instructions
from deleatur import Memory, from_bytes
from deleatur.servers.http import create_app


def child(store: Path, operation: str, requests: int, concurrency: int, signed: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for file in store.iterdir():
            shutil.copy(file, Path(tmp) / file.name)
        path = Path(tmp) / "bench.db"
        app = create_app(lambda: Memory.open(path, from_bytes(MASTER)), sign_every_write=signed)
        load = argparse.Namespace(
            operation=operation, requests=requests, rounds=1 if requests else 0, concurrency=concurrency
        )
        asyncio.run(rounds(app, load, (Path(tmp) / "api-key").read_text()))


def count(store: Path, args: argparse.Namespace, requests: int) -> int:
    options = [str(args.concurrency), "signed" if args.every_write_signed else "interval"]
    return instructions(__file__, "--child", str(store), args.operation, str(requests), *options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("operation", nargs="?", choices=("remember", "recall"))
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--every-write-signed", action="store_true", help="as `serve http --workers N`")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        store, operation, requests, concurrency, signing = args.child
        child(Path(store), operation, int(requests), int(concurrency), signing == "signed")
        return
    if args.operation is None:
        parser.error("name the operation: remember or recall")
    with tempfile.TemporaryDirectory() as store:
        (Path(store) / "api-key").write_text(prepare(Path(store) / "bench.db", 10_000))
        # Two valgrind runs at once: one per core of the 2-core machines here.
        with ThreadPoolExecutor(2) as pool:
            base = pool.submit(count, Path(store), args, 0)
            total = pool.submit(count, Path(store), args, args.requests)
            per_request = (total.result() - base.result()) / args.requests
    signing = ", every write signed" if args.every_write_signed else ""
    print(
        f"{args.operation}: {per_request:,.0f} instructions per request"
        f" ({args.requests} requests, {args.concurrency} clients{signing})"
    )


if __name__ == "__main__":
    main()
