"""Instructions per ``recall`` and per ``remember`` as the HTTP server makes them (a
principal's view made from an API key, then the call: a recall's ten decryptions and
its audit entry, a remember's record and entries), and per part, counted by callgrind,
so another process on the machine does not change the figures (valgrind must be
installed). Not a test. To compare two revisions, run it from a clean export of each::

    PYTHONPATH=<export>/src .venv/bin/python bench/bench_server_call_instructions.py

The store is ``bench_http.py``'s (10,000 records; one query word, ~10 matches), built
once outside valgrind and copied for each run. A child process makes N calls of one
part; it runs under callgrind with N = 0 and with N = ``--calls``, and the difference
over N is the figure (the setup and the interpreter's start cancel out). The parts:

- ``view``: ``authenticate`` + ``as_principal``, as the server does per request;
- ``ranking``: the store's ranking query alone (the rows, still encrypted);
- ``decrypt``: decrypting one query's ten rows into records;
- ``recall``: the whole call (a view, then ``recall``), audit entry included;
- ``grouped``: the same, its audit entry group-committed with those of 31 others, as the
  server writes the entries of the reads it serves at once (``servers/groupcommit.py``);
- ``remember``: a view, then ``remember`` (one word, 500 subjects), in a transaction of its
  own, signed as each write is with ``--workers N`` (``checkpoint_interval_us = 0``);
- ``remember-grouped``: the same, made in a ``WriteGroup`` with 15 others and signed once
  per group, as the server makes the writes it serves at once.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_http import WORDS, prepare
from deleatur import Memory, Space, from_bytes
from deleatur.servers.auth import as_caller

PARTS = ("view", "ranking", "decrypt", "recall", "grouped", "remember", "remember-grouped")
GROUP = 32
WRITE_GROUP = 16
MASTER = bytes(32)


def child(store: Path, part: str, calls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for file in store.iterdir():
            shutil.copy(file, Path(tmp) / file.name)
        key = (Path(tmp) / "api-key").read_text()
        with Memory.open(Path(tmp) / "bench.db", from_bytes(MASTER)) as memory:
            rows = [row for row, _ in memory._ranked(WORDS[1], Space(), 10)]
            for i in range(50):  # warm-up: caches, prepared statements
                as_caller(memory, key).recall(WORDS[(i * 31) % len(WORDS)])
            # (Made only where used: revisions before them have no audit_batch, write_group.)
            batch = memory.audit_batch() if part == "grouped" else None
            writes = memory.write_group() if part == "remember-grouped" else None
            if part.startswith("remember"):
                memory.checkpoint_interval_us = 0
            for i in range(calls):
                word = WORDS[(i * 31) % len(WORDS)]
                if part == "remember":
                    as_caller(memory, key).remember(f"note {word}", subject=f"person {i % 500}")
                elif writes is not None:
                    with writes.joining():
                        as_caller(memory, key).remember(f"note {word}", subject=f"person {i % 500}")
                    if (i + 1) % WRITE_GROUP == 0 or i == calls - 1:
                        writes.commit()
                        writes = memory.write_group()  # a group is used once
                elif part == "view":
                    as_caller(memory, key)
                elif part == "ranking":
                    memory._ranked(word, Space(), 10)
                elif part == "decrypt":
                    for row in rows:
                        memory._decrypt(row)
                elif part == "recall":
                    as_caller(memory, key).recall(word)
                elif batch is not None:
                    with batch.collecting():
                        as_caller(memory, key).recall(word)
                    if len(batch) == GROUP or i == calls - 1:
                        batch.write()


def instructions(script: str, *args: str) -> int:
    """The instructions ``python script args...`` runs, counted by callgrind."""
    with tempfile.NamedTemporaryFile(suffix=".cg") as out:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}", sys.executable, script, *args]
        log = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    return int(next(line for line in log.splitlines() if "Collected" in line).split()[-1])


def count(store: Path, part: str, calls: int) -> int:
    return instructions(__file__, "--child", str(store), part, str(calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated, of: " + ", ".join(PARTS))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        store, part, calls = args.child
        child(Path(store), part, int(calls))
        return
    parts = args.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory() as store:
        (Path(store) / "api-key").write_text(prepare(Path(store) / "bench.db", 10_000))
        # Two valgrind runs at a time: one per core of the 2-core machines here.
        with ThreadPoolExecutor(2) as pool:
            base = pool.submit(count, Path(store), "view", 0)
            totals = {part: pool.submit(count, Path(store), part, args.calls) for part in parts}
            for part in parts:
                per_call = (totals[part].result() - base.result()) / args.calls
                print(f"{part}: {per_call:,.0f} instructions per call", flush=True)


if __name__ == "__main__":
    main()
