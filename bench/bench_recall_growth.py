"""Recall growth benchmark (issue 2's "logarithmic" criterion): the same queries on a
10k and a 100k store, timed in alternation, so the machine's drift and noise fall on
both sizes alike instead of on whichever ran later.

``bench_store.py`` measures each size in turn, in one process: on a noisy VM its
10k-to-100k ratio moved by ±0.2 between invocations, more than the margin the
criterion leaves (logarithmic growth is log(100k)/log(10k) = 1.25). Here each query
runs on both stores back to back, in alternating order, and the report gives the
ratio of the medians and the median of the per-query ratios, for

- ``recall``: the public call (ranking, decrypting the hits, and the call's audit
  entry, a write transaction of its own), what a caller pays;
- ``ranking``: the store's ranking query alone, without decryption or audit, where
  any growth with the store's size lives.

Queries are those of ``bench_store.py`` (Zipf and uniform word mixes). "full" rows
keep the queries that return the limit (10) at both sizes: the same output. Not a
test. From the repository root::

    .venv/bin/python bench/bench_recall_growth.py            # 3 rounds, new stores each
    .venv/bin/python bench/bench_recall_growth.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_store import Corpus, machine, open_store, parse_args, percentile, write_batches
from deleatur import Memory, Space

SIZES = (10_000, 100_000)
LIMIT = 10


def ranking(mem: Memory) -> Callable[[str, Space], int]:
    """Recall's ranking query alone (``Memory._ranked``), without decryption or audit.
    It reaches into the library's internals on purpose: that is the part to isolate."""
    return lambda text, space: len(mem._ranked(text, space, LIMIT))


def public(mem: Memory) -> Callable[[str, Space], int]:
    return lambda text, space: len(mem.recall(text, space=space, limit=LIMIT))


def paired(
    small: Callable[[str, Space], int], large: Callable[[str, Space], int], queries: list[tuple[str, Space]]
) -> dict[str, float]:
    """Each query on both stores back to back, the order alternating per query."""
    times: dict[int, list[float]] = {0: [], 1: []}
    full: list[int] = []
    for i, (text, space) in enumerate(queries):
        found = [0, 0]
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            run = small if which == 0 else large
            t0 = time.perf_counter_ns()
            found[which] = run(text, space)
            times[which].append((time.perf_counter_ns() - t0) / 1e6)
        if found == [LIMIT, LIMIT]:
            full.append(i)
    out: dict[str, float] = {}
    for label, picked in (("all", range(len(queries))), ("full", full)):
        if not picked:
            continue  # no query filled the limit at both sizes
        a = [times[0][i] for i in picked]
        b = [times[1][i] for i in picked]
        out |= {
            f"{label}_10k_p50_ms": statistics.median(a),
            f"{label}_100k_p50_ms": statistics.median(b),
            f"{label}_ratio_of_p50": statistics.median(b) / statistics.median(a),
            f"{label}_median_ratio": statistics.median(y / x for x, y in zip(a, b, strict=True)),
            f"{label}_10k_p99_ms": percentile(a, 99),
            f"{label}_100k_p99_ms": percentile(b, 99),
        }
    out["full_share"] = len(full) / len(queries)
    return out


def run_round(args: argparse.Namespace, seed: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        stores = []
        for size in SIZES:
            corpus = Corpus(seed, args.vocab, args.subjects, args.keyed)
            mem = open_store(Path(tmp) / f"{size}.db")
            write_batches(mem, corpus, 0, size)
            stores.append(mem)
        asker = Corpus(seed, args.vocab, args.subjects, args.keyed)  # the stores' vocabulary
        asker.rng.seed(seed + 1)  # and queries of their own
        out: dict[str, float] = {}
        for mix, uniform in (("zipf", False), ("uniform", True)):
            queries = [asker.query(uniform=uniform) for _ in range(args.queries)]
            for name, how in (("recall", public), ("ranking", ranking)):
                paired(how(stores[0]), how(stores[1]), queries[:100])  # warm both caches
                figures = paired(how(stores[0]), how(stores[1]), queries)
                out |= {f"{name}_{mix}_{k}": v for k, v in figures.items()}
        for mem in stores:
            mem.close()
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each on new stores (default 3)")
    parser.add_argument("--queries", type=int, default=2_000, help="queries per mix and round (default 2000)")
    parser.add_argument("--json", action="store_true")
    ours = parser.parse_args()
    args = parse_args([])  # bench_store.py's workload settings
    args.queries = ours.queries
    load_before = os.getloadavg()
    rounds = [run_round(args, args.seed + 10 * r) for r in range(ours.rounds)]
    keys = [k for k in rounds[0] if all(k in r for r in rounds)]
    result: dict[str, Any] = {k: statistics.median(r[k] for r in rounds) for k in keys}
    result["ranges"] = {k: [min(r[k] for r in rounds), max(r[k] for r in rounds)] for k in keys}
    result["rounds"] = ours.rounds
    result["queries"] = ours.queries
    result["loadavg_before"] = load_before
    result["loadavg_after"] = os.getloadavg()
    result["machine"] = machine()
    if ours.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return
    print(f"{'metric':<44}{'10k p50':>10}{'100k p50':>10}{'p50 ratio':>11}{'median ratio':>14}")
    for name in ("recall", "ranking"):
        for mix in ("zipf", "uniform"):
            for label in ("all", "full"):
                key = f"{name}_{mix}_{label}"
                if key + "_ratio_of_p50" not in result:
                    continue
                print(
                    f"{key:<44}{result[key + '_10k_p50_ms']:>10.3f}{result[key + '_100k_p50_ms']:>10.3f}"
                    f"{result[key + '_ratio_of_p50']:>11.2f}{result[key + '_median_ratio']:>14.2f}"
                )
    print(f"logarithmic growth would be {5 / 4:.2f}; load {load_before} -> {os.getloadavg()}")


if __name__ == "__main__":
    main()
