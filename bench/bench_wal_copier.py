"""Single writes with the -wal copied into the database by the commits themselves
(SQLite's automatic checkpoint, the library's default) or by a thread of its own
(``Memory.upkeep_in_background()``, as a server's handles do): the latency of each
write, the writes per second, and how large the -wal grows.

Each round makes a new store and times ``--writes`` single ``remember`` calls, the two
ways alternating so the VM's drift falls on both alike. Not a test. From the
repository root::

    .venv/bin/python bench/bench_wal_copier.py                # 3 rounds of 6,000 writes each way
    .venv/bin/python bench/bench_wal_copier.py --json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_http import MASTER
from bench_log import print_results
from bench_store import machine, percentile
from deleatur import Memory, from_bytes

WAYS = ("commits", "thread")


def one_round(way: str, writes: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.db"
        wal = path.with_name(path.name + "-wal")
        memory = Memory.init(path, from_bytes(MASTER))[0]
        try:
            if way == "thread":
                memory.upkeep_in_background()
            latencies, largest = [], 0
            started = time.perf_counter()
            for i in range(writes):
                before = time.perf_counter()
                memory.remember(f"note {i} about topic {i % 37}", subject=f"person {i % 50}")
                latencies.append((time.perf_counter() - before) * 1e3)
                if i % 100 == 99:
                    largest = max(largest, wal.stat().st_size)
            elapsed = time.perf_counter() - started
        finally:
            memory.close()
    return {
        "per_s": writes / elapsed,
        "p50_ms": statistics.median(latencies),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
        "largest_wal_mb": largest / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            rounds[way].append(one_round(way, args.writes))
    results: dict[str, Any] = {
        f"{way}_{name}": statistics.median(r[name] for r in rounds[way]) for way in WAYS for name in rounds[way][0]
    }
    results["writes"] = args.writes
    results["rounds"] = args.rounds
    results["machine"] = machine()
    print_results(results, {}, as_json=args.json)


if __name__ == "__main__":
    main()
