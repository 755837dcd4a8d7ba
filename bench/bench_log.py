"""Log benchmark (issue 3): append throughput, checkpoint signing, proof generation
and verification at 1,000,000 entries, whole-log verification, and the cost of the
log on `remember_many` (against the store before the log existed).

Not a test. Run from the repository root::

    .venv/bin/python bench/bench_log.py                       # 1M-entry log
    .venv/bin/python bench/bench_log.py --entries 100000      # quicker
    .venv/bin/python bench/bench_log.py --baseline-rev REV    # also: remember_many at REV vs now
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import deleatur
from bench_store import machine, percentile
from deleatur import Memory
from deleatur.log.checkpoint import Checkpoint
from deleatur.log.entries import Entry, EventType
from deleatur.log.merkle import leaf_hash, verify_consistency, verify_inclusion
from deleatur.log.note import Note

MASTER = deleatur.from_bytes(bytes(32))
ROOT = Path(__file__).resolve().parent.parent
TARGETS = {
    "append_per_s": (">=", 50_000.0),
    "checkpoint_ms": ("<=", 1.0),
    "inclusion_proof_ms": ("<=", 1.0),
    "inclusion_verify_ms": ("<=", 1.0),
    "consistency_proof_ms": ("<=", 1.0),
    "consistency_verify_ms": ("<=", 1.0),
}

# Runs in a subprocess against a given source tree: remember_many throughput, no receipts.
_REMEMBER_PROBE = r"""
import statistics, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import deleatur
from deleatur import Memory, NewMemory
n, signed = int(sys.argv[2]), sys.argv[3] == "1"
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "m.db"
    memory = Memory.init(path, deleatur.from_bytes(bytes(32)))[0] if signed else Memory.open(
        path, deleatur.from_bytes(bytes(32)), create=True)
    rates = []
    for b in range(n // 1000):
        batch = [NewMemory(f"note {b} {i} about topic {i % 37} and more words here", subject=f"s{i % 100}")
                 for i in range(1000)]
        t = time.perf_counter()
        memory.remember_many(batch)
        rates.append(1000 / (time.perf_counter() - t))
    single = []
    for i in range(2000):
        t = time.perf_counter()
        memory.remember(f"single {i} words words", subject=f"s{i % 100}")
        single.append(time.perf_counter() - t)
    print(statistics.median(rates), 1 / statistics.median(single))
"""


def _entry(i: int) -> Entry:
    return Entry(
        EventType.WRITE,
        1_790_000_000_000_000 + i,
        {"record": f"01a22a03-19d9-75ea-b6f8-{i:012x}", "tenant": "default", "commitment": f"{i:064x}"},
    )


def _timed(fn: Any, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def run(entries: int, batch: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    results: dict[str, Any] = {"entries": entries}
    with tempfile.TemporaryDirectory() as tmp:
        memory = Memory.init(Path(tmp) / "log.db", MASTER)[0]
        rates = []
        for start in range(0, entries - 1, batch):
            items = [(_entry(i), None) for i in range(start, min(start + batch, entries - 1))]
            t = time.perf_counter()
            with memory.backend.atomic():
                memory.log.append(items)
                memory.log.checkpoint()
            rates.append(len(items) / (time.perf_counter() - t))
        size = memory.backend.log_size()
        results["append_per_s"] = statistics.median(rates)

        def sign() -> None:
            with memory.backend.atomic():
                memory.log.append([(_entry(size), None)])
                memory.log.checkpoint()

        # Appending one entry and signing its checkpoint, one transaction each.
        results["checkpoint_ms"] = statistics.median(_timed(sign, 200))
        size = memory.backend.log_size()
        note = Note.parse(memory.backend.checkpoint(size)[1])  # type: ignore[index]
        root = Checkpoint.parse(note.text).root

        gen, ver = [], []
        for _ in range(1000):
            index = rng.randrange(size)
            t = time.perf_counter()
            proof = memory.log.inclusion_proof(index, size)
            gen.append((time.perf_counter() - t) * 1000)
            leaf = leaf_hash(next(raw for _, raw in memory.backend.log_entries(index, index + 1)))
            t = time.perf_counter()
            verify_inclusion(index, size, leaf, proof, root)
            ver.append((time.perf_counter() - t) * 1000)
        results["inclusion_proof_ms"] = statistics.median(gen)
        results["inclusion_proof_p99_ms"] = percentile(gen, 99)
        results["inclusion_verify_ms"] = statistics.median(ver)

        roots: dict[int, bytes] = {}
        gen, ver = [], []
        for _ in range(300):
            old = rng.randrange(1, size)
            roots.setdefault(old, memory.log.root(old))
            t = time.perf_counter()
            proof = memory.log.consistency_proof(old, size)
            gen.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            verify_consistency(old, size, roots[old], root, proof)
            ver.append((time.perf_counter() - t) * 1000)
        results["consistency_proof_ms"] = statistics.median(gen)
        results["consistency_proof_p99_ms"] = percentile(gen, 99)
        results["consistency_verify_ms"] = statistics.median(ver)

        t = time.perf_counter()
        report = memory.verify_log()
        results["log_verify_s"] = time.perf_counter() - t
        results["log_verify_ok"] = report.ok
        memory.close()
    return results


def remember_rates(src: Path, n: int, *, signed: bool) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", _REMEMBER_PROBE, str(src), str(n), "1" if signed else "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), float(out[1])


def compare(rev: str, n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", tmp, rev], check=True, capture_output=True
        )
        try:
            base_batch, base_single = remember_rates(Path(tmp) / "src", n, signed=False)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tmp], check=True)
    now_batch, now_single = remember_rates(ROOT / "src", n, signed=True)
    return {
        "baseline_remember_many_per_s": base_batch,
        "log_remember_many_per_s": now_batch,
        "remember_many_change_pct": 100 * (now_batch / base_batch - 1),
        "baseline_remember_per_s": base_single,
        "log_remember_per_s": now_single,
        "remember_change_pct": 100 * (now_single / base_single - 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline-rev", help="git revision of the store before the log, to compare remember_many")
    parser.add_argument("--compare-records", type=int, default=50_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {"machine": machine(), **run(args.entries, args.batch, args.seed)}
    if args.baseline_rev:
        results.update(compare(args.baseline_rev, args.compare_records))
    print_results(results, TARGETS, as_json=args.json)


def print_results(results: dict[str, Any], targets: dict[str, tuple[str, float]], *, as_json: bool) -> None:
    """JSON, or one line per figure with its target and whether it was met."""
    if as_json:
        print(json.dumps(results, indent=2))
        return
    for name, value in results.items():
        if name == "machine":
            continue
        verdict = ""
        if name in targets:
            op, bound = targets[name]
            met = value >= bound if op == ">=" else value <= bound
            verdict = f"  target {op} {bound:g}: {'met' if met else 'MISSED'}"
        print(f"{name:32} {value:14,.3f}{verdict}" if isinstance(value, float) else f"{name:32} {value}")


if __name__ == "__main__":
    main()
