"""Single writes against the -wal's checkpoint interval (``PRAGMA wal_autocheckpoint``),
in alternating runs so the VM's drift falls on every setting alike.

Each run copies one prepared store (10,000 records), opens it, sets the interval on
the handle's connection, and times ``--writes`` single ``remember`` calls of
``bench_store.py``'s workload. Not a test. From the repository root::

    .venv/bin/python bench/bench_wal_checkpoint.py                       # 1,000 vs 10,000 pages, 5 pairs
    .venv/bin/python bench/bench_wal_checkpoint.py --pages 1000,4000,10000,40000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_store import MASTER, Corpus, machine, open_store, parse_args, write_batches
from deleatur import Memory
from deleatur.sqlitefile import WAL_AUTOCHECKPOINT_PAGES


def one_run(template: Path, work: Path, pages: int, writes: int, seed: int) -> float:
    for name in ("store.db", "store.db.keys"):
        shutil.copy(template / name, work / name)
    memory = Memory.open(work / "store.db", MASTER)
    try:
        memory.backend._conn.execute(f"PRAGMA wal_autocheckpoint = {pages}").fetchall()  # type: ignore[attr-defined]
        settings = parse_args([])
        corpus = Corpus(seed, settings.vocab, settings.subjects, settings.keyed)
        items = [corpus.item() for _ in range(writes)]
        started = time.perf_counter()
        for text, subject, key in items:
            memory.remember(text, subject=subject, key=key, source="chat")
        return writes / (time.perf_counter() - started)
    finally:
        memory.close()
        for leftover in work.iterdir():
            leftover.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", default=f"1000,{WAL_AUTOCHECKPOINT_PAGES}", help="intervals to compare")
    parser.add_argument("--pairs", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--writes", type=int, default=3_000, help="single writes per run (default 3000)")
    args = parser.parse_args()
    settings = parse_args([])
    pages = [int(p) for p in args.pages.split(",")]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        template, work = Path(tmp) / "template", Path(tmp) / "work"
        template.mkdir()
        work.mkdir()
        memory = open_store(template / "store.db")
        write_batches(memory, Corpus(settings.seed, settings.vocab, settings.subjects, settings.keyed), 0, 10_000)
        memory.close()
        rates: dict[int, list[float]] = {p: [] for p in pages}
        for round_ in range(args.pairs):
            for p in pages if round_ % 2 == 0 else reversed(pages):
                rates[p].append(one_run(template, work, p, args.writes, settings.seed + round_))
    result = {
        "remember_per_s": {
            p: {"median": statistics.median(r), "runs": [round(x) for x in r]} for p, r in rates.items()
        },
        "writes_per_run": args.writes,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "machine": machine(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
