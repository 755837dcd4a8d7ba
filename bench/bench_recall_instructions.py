"""Recall's cost in CPU instructions at 10k and 100k records, or other sizes (issue 2's "logarithmic"
criterion), counted by valgrind's callgrind instead of timed.

Timings on this project's shared VMs drift by more than the criterion's margin
(logarithmic growth is log(100k)/log(10k) = 1.25); ``bench_recall_growth.py`` pairs
them to cancel the drift. Instruction counts need no pairing: the same program on the
same store executes the same instructions whatever else the machine is doing. What
they leave out is the price of memory: cache and page misses of a larger file.

Each measurement runs a child under ``valgrind --tool=callgrind`` on its own copy of
a store (a recall appends its audit entry, so a store is never reused), twice: once
with ``--queries`` queries and once with none, after the same warm-up. The difference
over the number of queries is one query's instructions, without the interpreter's
start-up and imports. Children run in parallel, one per CPU. Not a test. From the
repository root (apt-get install valgrind)::

    .venv/bin/python bench/bench_recall_instructions.py             # ~5 minutes on 2 CPUs
    .venv/bin/python bench/bench_recall_instructions.py --json
    .venv/bin/python bench/bench_recall_instructions.py --sizes 10000,100000,1000000   # ~50 minutes
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench_recall_growth import LIMIT, SIZES, public, ranking
from bench_store import MASTER, Corpus, machine, open_store, parse_args, write_batches
from deleatur import Memory

WARM = 100
MIXES = ("zipf", "uniform")
CALLS = {"recall": public, "ranking": ranking}


def build(directory: Path, seed: int, sizes: tuple[int, ...]) -> None:
    args = parse_args([])
    for size in sizes:
        mem = open_store(directory / f"{size}.db")
        write_batches(mem, Corpus(seed, args.vocab, args.subjects, args.keyed), 0, size)
        mem.close()


def child(store: Path, seed: int, mix: str, call: str, queries: int) -> None:
    """What runs under valgrind: the warm-up, then ``queries`` queries."""
    args = parse_args([])
    mem = Memory.open(store, MASTER)
    asker = Corpus(seed, args.vocab, args.subjects, args.keyed)  # the stores' vocabulary
    asker.rng.seed(seed + 1)  # and queries of their own, as in bench_recall_growth.py
    asked = [asker.query(uniform=mix == "uniform") for _ in range(WARM + queries)]
    run = CALLS[call](mem)
    for text, space in asked:
        run(text, space)
    mem.close()


def instructions(stores: Path, work: Path, run_of: tuple[int, str, str, int]) -> int:
    """Instructions of one child run (size, mix, call, queries) on a fresh copy of the store."""
    size, mix, call, queries = run_of
    run = work / f"{size}-{mix}-{call}-{queries}"
    run.mkdir()
    for file in stores.glob(f"{size}.db*"):
        shutil.copy(file, run / file.name)
    # The first WARM queries are the warm-up in both runs: ``queries`` more are measured.
    command = [sys.executable, __file__, "--child", str(run / f"{size}.db"), mix, call, str(queries)]
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={run / 'callgrind.out'}", *command],
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind reported no count:\n{done.stderr[-2000:]}")
    shutil.rmtree(run)
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=200, help="queries measured per run (default 200)")
    parser.add_argument("--stores", type=Path, help="reuse (or build into) this directory's stores, one per size")
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=SIZES,
        help="store sizes, comma-separated (default 10000,100000); each is compared with the one before",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=4, metavar=("STORE", "MIX", "CALL", "QUERIES"), help=argparse.SUPPRESS)
    ours = parser.parse_args()
    seed = parse_args([]).seed
    if ours.child:
        store, mix, call, queries = ours.child
        child(Path(store), seed, mix, call, int(queries))
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        stores = ours.stores or Path(tmp) / "stores"
        stores.mkdir(parents=True, exist_ok=True)
        missing = tuple(size for size in ours.sizes if not (stores / f"{size}.db").exists())
        build(stores, seed, missing)
        sizes = ours.sizes
        runs = [(size, mix, call, n) for size in sizes for mix in MIXES for call in CALLS for n in (0, ours.queries)]
        with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
            counts = dict(zip(runs, pool.map(lambda r: instructions(stores, Path(tmp), r), runs), strict=True))
    result: dict[str, Any] = {}
    for mix in MIXES:
        for call in CALLS:
            per_query = {
                size: (counts[(size, mix, call, ours.queries)] - counts[(size, mix, call, 0)]) / ours.queries
                for size in sizes
            }
            row: dict[str, Any] = {f"{_name(size)}_instructions": round(n) for size, n in per_query.items()}
            for small, large in itertools.pairwise(sizes):
                row[f"ratio_{_name(large)}_{_name(small)}"] = per_query[large] / per_query[small]
            result[f"{call}_{mix}"] = row
    result |= {"queries": ours.queries, "warm_up": WARM, "limit": LIMIT, "machine": machine()}
    if ours.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return
    steps = list(itertools.pairwise(sizes))
    header = "".join(f"{_name(size):>14}" for size in sizes) + "".join(f"{_ratio(lo, hi):>12}" for lo, hi in steps)
    print(f"{'per query':<20}{header}")
    for mix in MIXES:
        for call in CALLS:
            row = result[f"{call}_{mix}"]
            figures = "".join(f"{row[f'{_name(size)}_instructions']:>14,}" for size in sizes)
            ratios = "".join(f"{row[f'ratio_{_name(hi)}_{_name(lo)}']:>12.2f}" for lo, hi in steps)
            print(f"{call + ', ' + mix:<20}{figures}{ratios}")
    logarithmic = ", ".join(f"{_ratio(lo, hi)} {math.log(hi) / math.log(lo):.2f}" for lo, hi in steps)
    print(f"(logarithmic growth would be {logarithmic}; revision {result['machine']['revision']})")


def _sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(n) for n in text.split(","))
    if len(sizes) < 2 or any(size < 2 for size in sizes) or list(sizes) != sorted(set(sizes)):
        raise argparse.ArgumentTypeError("two or more increasing sizes of at least 2 records")
    return sizes


def _name(size: int) -> str:
    return f"{size // 1_000_000}M" if size % 1_000_000 == 0 else f"{size // 1000}k" if size % 1000 == 0 else str(size)


def _ratio(small: int, large: int) -> str:
    return f"{_name(large)}/{_name(small)}"


if __name__ == "__main__":
    main()
