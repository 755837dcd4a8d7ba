"""Per-call cost of the library's ``remember`` and ``recall``, in process (no HTTP).

Not a test. A store of 5,000 records is written, then the medians of 5 rounds of 500
single ``remember`` calls and of 5 rounds of 300 ``recall`` calls are printed, in
microseconds per call. To compare two revisions, run it from a clean export of each,
alternating, on the same machine::

    PYTHONPATH=<export>/src .venv/bin/python bench/bench_calls.py LABEL
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from deleatur import Memory, NewMemory, from_bytes


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "this revision"
    with (
        tempfile.TemporaryDirectory() as tmp,
        Memory.open(Path(tmp) / "m.db", from_bytes(bytes(32)), create=True) as memory,
    ):
        records = [NewMemory(f"word{i} text about things {i % 97}", subject=f"s{i % 100}") for i in range(5000)]
        memory.remember_many(records)

        def remember(calls: int) -> float:
            start = time.perf_counter()
            for i in range(calls):
                memory.remember(f"note {i} about stuff", subject=f"s{i % 100}")
            return (time.perf_counter() - start) / calls * 1e6

        def recall(calls: int) -> float:
            start = time.perf_counter()
            for i in range(calls):
                memory.recall(f"word{i % 500} things")
            return (time.perf_counter() - start) / calls * 1e6

        remember(300)  # warm-up
        print(f"{label}: remember {statistics.median(remember(500) for _ in range(5)):.1f} µs/call")
        print(f"{label}: recall {statistics.median(recall(300) for _ in range(5)):.1f} µs/call")


if __name__ == "__main__":
    main()
