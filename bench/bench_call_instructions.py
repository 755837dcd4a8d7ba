"""Instructions per library ``remember`` + ``recall`` pair, counted by callgrind, so
another process on the machine does not change the figure (valgrind must be
installed). Not a test. To compare two revisions, run it from a clean export of each::

    PYTHONPATH=<export>/src .venv/bin/python bench/bench_call_instructions.py

A child process writes 2,000 records, then makes N single ``remember`` calls and N
``recall`` calls; it runs under callgrind with N = 0 and with N = ``--calls``, and the
difference over N is the figure (the setup and the interpreter's start cancel out).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from deleatur import Memory, NewMemory, from_bytes


def child(calls: int) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        Memory.open(Path(tmp) / "m.db", from_bytes(bytes(32)), create=True) as memory,
    ):
        memory.remember_many(NewMemory(f"word{i} about things {i % 97}", subject=f"s{i % 100}") for i in range(2000))
        for i in range(50):
            memory.remember(f"warm {i}", subject=f"s{i % 100}")
        for i in range(calls):
            memory.remember(f"note {i} about stuff", subject=f"s{i % 100}")
        for i in range(calls):
            memory.recall(f"word{i % 500} things")


def count(calls: int) -> int:
    with tempfile.NamedTemporaryFile(suffix=".cg") as out:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}"]
        command += [sys.executable, __file__, "--child", str(calls)]
        log = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    return int(next(line for line in log.splitlines() if "Collected" in line).split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child)
        return
    per_pair = (count(args.calls) - count(0)) / args.calls
    print(f"{per_pair:,.0f} instructions per remember + recall pair")


if __name__ == "__main__":
    main()
