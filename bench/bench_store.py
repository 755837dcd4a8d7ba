"""Store benchmark (issue 2): write throughput, single-write latency, recall latency,
size on disk and peak memory of an encrypted deleatur store at growing sizes.

Not a test: pytest never collects it (it lives outside ``tests/`` and its name does
not match ``test_*.py``). Run it from the repository root::

    .venv/bin/python bench/bench_store.py              # 10k and 100k, RSS at 100k
    .venv/bin/python bench/bench_store.py --million    # adds the 1M peak-RSS run
    .venv/bin/python bench/bench_store.py --json       # machine-readable output

The synthetic workload: a vocabulary of ``--vocab`` pseudo-words drawn with a Zipf
(s=1) distribution, 8-20 words per record, ~100 subjects (also Zipf), five spaces
(user ids) of which one holds 80% of the records, and a small share of records
written under a fact key (so some writes supersede an earlier value). Queries are
1-3 words drawn from the same vocabulary and distribution, in the same space mix
(a second mix draws them uniformly, so mostly rare words).

Stores are made with ``Memory.open(..., create=True)``, which gives them no signing
key; ``--signed`` uses ``Memory.init`` instead, so writes also sign the log's
checkpoints (what a store made by ``deleatur init`` does).
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import itertools
import json
import math
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

import deleatur
from deleatur import Memory, NewMemory, Space

MASTER = deleatur.from_bytes(bytes(32))
BATCH = 1_000
WINDOW = 10_000
SPACE_WEIGHTS = (0.80, 0.05, 0.05, 0.05, 0.05)
TARGETS = {
    "remember_many_per_s": (">=", 10_000.0),
    "remember_per_s": (">=", 2_000.0),
    "recall_p50_ms": ("<=", 5.0),
    "recall_p99_ms": ("<=", 20.0),
    "peak_rss_mb": ("<=", 150.0),
}

_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


def _zipf_cum(n: int, s: float = 1.0) -> list[float]:
    return list(itertools.accumulate(1.0 / (rank**s) for rank in range(1, n + 1)))


class Corpus:
    """Deterministic synthetic memories and queries (seeded; record ids and nonces are not)."""

    def __init__(self, seed: int, vocab: int, subjects: int, keyed: float) -> None:
        self.rng = random.Random(seed)
        words: set[str] = set()
        while len(words) < vocab:
            syllables = self.rng.choice((1, 2, 2, 2, 3, 3, 3, 4))
            words.add("".join(self.rng.choice(_CONSONANTS) + self.rng.choice(_VOWELS) for _ in range(syllables)))
        # Short words are the frequent ones, as in natural language.
        self.words = sorted(sorted(words), key=len)
        self.word_cum = _zipf_cum(vocab)
        names = sorted({self._name() for _ in range(subjects * 2)})[:subjects]
        self.rng.shuffle(names)
        self.subjects = names
        self.subject_cum = _zipf_cum(len(names))
        self.spaces = [Space(user_id=f"user{i}") for i in range(len(SPACE_WEIGHTS))]
        self.space_cum = list(itertools.accumulate(SPACE_WEIGHTS))
        self.keyed = keyed

    def _name(self) -> str:
        def part() -> str:
            return "".join(self.rng.choice(_CONSONANTS) + self.rng.choice(_VOWELS) for _ in range(2)).title()

        return f"{part()} {part()}"

    def text(self) -> str:
        count = self.rng.randint(8, 20)
        return " ".join(self.rng.choices(self.words, cum_weights=self.word_cum, k=count)).capitalize() + "."

    def subject(self) -> str:
        return self.rng.choices(self.subjects, cum_weights=self.subject_cum)[0]

    def space(self) -> Space:
        return self.spaces[bisect.bisect(self.space_cum, self.rng.random() * self.space_cum[-1])]

    def batch_space(self, batch_number: int) -> Space:
        """The space of the n-th batch of 1,000: four in five go to the main space."""
        if batch_number % 5 != 4:
            return self.spaces[0]
        return self.spaces[1 + (batch_number // 5) % (len(self.spaces) - 1)]

    def item(self) -> tuple[str, str, str | None]:
        subject = self.subject()
        key = f"{subject.split()[0].lower()}::attr{self.rng.randrange(50)}" if self.rng.random() < self.keyed else None
        return self.text(), subject, key

    def query(self, *, uniform: bool = False) -> tuple[str, Space]:
        count = self.rng.randint(1, 3)
        words = (
            self.rng.choices(self.words, k=count)
            if uniform
            else self.rng.choices(self.words, cum_weights=self.word_cum, k=count)
        )
        return " ".join(words), self.space()


# -- measuring ---------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def open_store(path: Path, *, signed: bool = False) -> Memory:
    if signed:
        return Memory.init(path, MASTER)[0]
    return Memory.open(path, MASTER, create=True)


@dataclass
class BatchTimes:
    records: int = 0
    call_s: float = 0.0  # remember_many alone
    total_s: float = 0.0  # NewMemory construction (validation) + remember_many


def write_batches(mem: Memory, corpus: Corpus, start: int, stop: int) -> BatchTimes:
    """Write records start..stop (store counts) in batches of BATCH; text generation is not timed."""
    times = BatchTimes()
    written = start
    while written < stop:
        size = min(BATCH, stop - written)
        raw = [corpus.item() for _ in range(size)]
        space = corpus.batch_space(written // BATCH)
        t0 = time.perf_counter()
        items = [NewMemory(text=t, subject=s, key=k, source="chat") for t, s, k in raw]
        t1 = time.perf_counter()
        mem.remember_many(items, space=space)
        t2 = time.perf_counter()
        times.records += size
        times.call_s += t2 - t1
        times.total_s += t2 - t0
        written += size
    return times


def time_remember(mem: Memory, corpus: Corpus, calls: int) -> dict[str, float]:
    raw = [(*corpus.item(), corpus.space()) for _ in range(calls)]
    latencies: list[float] = []
    start = time.perf_counter()
    for text, subject, key, space in raw:
        t0 = time.perf_counter_ns()
        mem.remember(text, subject=subject, key=key, space=space, source="chat")
        latencies.append((time.perf_counter_ns() - t0) / 1e6)
    wall = time.perf_counter() - start
    return {
        "remember_p50_ms": statistics.median(latencies),
        "remember_p99_ms": percentile(latencies, 99),
        "remember_per_s": calls / wall,
    }


def time_recall(mem: Memory, corpus: Corpus, queries: int, *, uniform: bool = False) -> dict[str, float]:
    asked = [corpus.query(uniform=uniform) for _ in range(queries)]
    latencies: list[float] = []
    full: list[float] = []  # queries that filled the limit: the same output at every size
    hits = 0
    for text, space in asked:
        t0 = time.perf_counter_ns()
        found = mem.recall(text, space=space, limit=10)
        latencies.append((time.perf_counter_ns() - t0) / 1e6)
        hits += len(found)
        if len(found) == 10:
            full.append(latencies[-1])
    prefix = "recall_uniform" if uniform else "recall"
    return {
        f"{prefix}_p50_ms": statistics.median(latencies),
        f"{prefix}_p99_ms": percentile(latencies, 99),
        f"{prefix}_max_ms": max(latencies),
        f"{prefix}_mean_hits": hits / queries,
        f"{prefix}_full_p50_ms": statistics.median(full) if full else 0.0,
        f"{prefix}_full_p99_ms": percentile(full, 99) if full else 0.0,
        f"{prefix}_full_share": len(full) / queries,
    }


def checkpoint_size(store: Path) -> int:
    """Bytes of the store and its key store after a TRUNCATE checkpoint of both."""
    total = 0
    for db in (store, store.with_name(store.name + ".keys")):
        conn = apsw.Connection(str(db))
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0][0]
            if busy:
                raise RuntimeError(f"checkpoint of {db} was blocked")
        finally:
            conn.close()
        total += sum(p.stat().st_size for p in (db, db.with_name(db.name + "-wal")) if p.exists())
    return total


def run_once(workdir: Path, sizes: Sequence[int], args: argparse.Namespace, seed: int) -> dict[str, Any]:
    corpus = Corpus(seed, args.vocab, args.subjects, args.keyed)
    store = workdir / "store.db"
    mem = open_store(store, signed=args.signed)
    count = 0
    per_size: dict[str, dict[str, float]] = {}
    try:
        for size in sizes:
            window_start = max(count, size - WINDOW)
            count += write_batches(mem, corpus, count, window_start).records
            window = write_batches(mem, corpus, count, size)
            count += window.records
            figures: dict[str, float] = {
                "records": count,
                "remember_many_per_s": window.records / window.call_s,
                "remember_many_incl_newmemory_per_s": window.records / window.total_s,
                "store_bytes_per_record": checkpoint_size(store) / count,
            }
            figures |= time_recall(mem, corpus, args.queries)
            figures |= time_recall(mem, corpus, args.queries, uniform=True)
            figures |= time_remember(mem, corpus, args.calls)
            count += args.calls
            per_size[str(size)] = figures
    finally:
        mem.close()
    return per_size


# -- peak RSS, in a fresh process ----------------------------------------------------


def _vmhwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def rss_child(n: int, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Runs in its own process: write n records, then recall; report the peak RSS."""
    after_import = _vmhwm_kib()
    corpus = Corpus(args.seed, args.vocab, args.subjects, args.keyed)
    store = workdir / "store.db"
    mem = open_store(store, signed=args.signed)
    try:
        start = time.perf_counter()
        times = write_batches(mem, corpus, 0, n)
        write_s = time.perf_counter() - start
        recall = time_recall(mem, corpus, args.queries)
    finally:
        mem.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "records": n,
        # VmHWM: this process image's own peak RSS. ru_maxrss (KiB on Linux) survives
        # execve, so it also counts the parent's RSS at fork time: an upper bound only.
        "peak_rss_mb": _vmhwm_kib() / 1024,
        "ru_maxrss_mb": usage.ru_maxrss / 1024,
        "rss_after_import_mb": after_import / 1024,
        "write_wall_s": write_s,
        "remember_many_per_s": times.records / times.call_s,
        "store_bytes_per_record": checkpoint_size(store) / n,
        **recall,
    }


def run_rss(n: int, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    workdir.mkdir()
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--rss-child",
        str(n),
        "--out",
        str(workdir),
        "--queries",
        str(args.queries),
        "--vocab",
        str(args.vocab),
        "--subjects",
        str(args.subjects),
        "--keyed",
        str(args.keyed),
        "--seed",
        str(args.seed),
        *(["--signed"] if args.signed else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# -- reporting -----------------------------------------------------------------------


def revision() -> str | None:
    """The git commit of the deleatur imported, with "+dirty" if its src/ has uncommitted changes."""
    root = Path(deleatur.__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "python": platform.python_version(),
        "sqlite": apsw.sqlite_lib_version(),
        "apsw": apsw.apsw_version(),
        "platform": platform.platform(),
        "deleatur": deleatur.__version__,
        "deleatur_path": str(Path(deleatur.__file__).resolve().parent),
        "revision": revision(),
        "python_loop_ns": python_loop_ns(),
    }


def python_loop_ns() -> float:
    """Nanoseconds per iteration of an empty Python loop (best of 5): how fast this VM
    runs this Python, so figures from different VMs can be put side by side (19 on the
    Intel VM of 2026-11-30, where the AMD VM ran the library 2.5-3.5 times faster)."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter_ns()
        for _ in range(1_000_000):
            pass
        best = min(best, (time.perf_counter_ns() - started) / 1_000_000)
    return round(best, 1)


def medians(runs: Sequence[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for size in runs[0]:
        out[size] = {metric: statistics.median(r[size][metric] for r in runs) for metric in runs[0][size]}
    return out


def met(metric: str, value: float) -> bool | None:
    if metric not in TARGETS:
        return None
    op, bound = TARGETS[metric]
    return value >= bound if op == ">=" else value <= bound


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def table(result: dict[str, Any]) -> Iterator[str]:
    m = result["machine"]
    yield f"machine: {m['nproc']} CPU(s), {m['cpu']}; Python {m['python']}; SQLite {m['sqlite']}"
    c = result["config"]
    yield f"deleatur {m['deleatur']} at {m['revision']} ({m['deleatur_path']}); started {result['date']}"
    yield "load average (1, 5, 15 min) at start {}, at end {}".format(
        *(", ".join(f"{x:.2f}" for x in m[k]) for k in ("loadavg_at_start", "loadavg_at_end"))
    )
    yield (
        f"runs: {c['repeat']} (medians); keyed share {c['keyed']};"
        f" signed checkpoints: {'yes' if c['signed'] else 'no'};"
        f" {c['calls']} remember calls, {c['queries']} queries per mix and size"
    )
    yield ""
    sizes = list(result["median"])
    labels = [f"{int(s) // 1000}k" for s in sizes]
    rows = [
        ("remember_many records/s (batches of 1,000)", "remember_many_per_s"),
        ("  incl. NewMemory construction", "remember_many_incl_newmemory_per_s"),
        ("remember calls/s (one txn each)", "remember_per_s"),
        ("remember p50 ms", "remember_p50_ms"),
        ("remember p99 ms", "remember_p99_ms"),
        ("recall p50 ms", "recall_p50_ms"),
        ("recall p99 ms", "recall_p99_ms"),
        ("recall max ms", "recall_max_ms"),
        ("recall mean hits (limit 10)", "recall_mean_hits"),
        ("recall p50 ms, queries with 10 hits", "recall_full_p50_ms"),
        ("recall p99 ms, queries with 10 hits", "recall_full_p99_ms"),
        ("  share of queries with 10 hits", "recall_full_share"),
        ("recall p50 ms, uniform-term queries", "recall_uniform_p50_ms"),
        ("recall p99 ms, uniform-term queries", "recall_uniform_p99_ms"),
        ("recall p50 ms, uniform, with 10 hits", "recall_uniform_full_p50_ms"),
        ("recall p99 ms, uniform, with 10 hits", "recall_uniform_full_p99_ms"),
        ("  share of uniform queries with 10 hits", "recall_uniform_full_share"),
        ("store bytes/record", "store_bytes_per_record"),
    ]
    head = f"{'metric':<44}" + "".join(f"{lab:>12}" for lab in labels) + f"{'ratio':>8}  {'target':<12}met"
    yield head
    yield "-" * len(head)
    for label, key in rows:
        values = [result["median"][s][key] for s in sizes]
        ratio = f"{values[-1] / values[0]:>8.2f}" if values[0] else f"{'':>8}"
        target = ""
        verdict = ""
        if key in TARGETS:
            op, bound = TARGETS[key]
            target = f"{op} {bound:,.0f}" if bound >= 100 else f"{op} {bound:g}"
            verdict = "/".join("yes" if met(key, v) else "NO" for v in values)
        yield f"{label:<44}" + "".join(f"{_fmt(v):>12}" for v in values) + f"{ratio}  {target:<12}{verdict}"
    if len(sizes) > 1:
        growth = math.log(int(sizes[-1])) / math.log(int(sizes[0]))
        yield f"(ratio = {labels[-1]} / {labels[0]}; logarithmic growth would be log({sizes[-1]})/log({sizes[0]})"
        yield f" = {growth:.2f} for per-operation costs)"
    if len(result["runs"]) > 1:
        yield ""
        yield "spread over the runs (min - max):"
        for label, key in rows:
            if key in TARGETS:
                per_size = [[r[s][key] for r in result["runs"]] for s in sizes]
                yield f"  {label:<42}" + "".join(f"{_fmt(min(v)) + ' - ' + _fmt(max(v)):>20}" for v in per_size)
    if result["rss"]:
        yield ""
        yield (
            f"{'peak RSS, fresh process (write N, then recall)':<48}{'VmHWM MB':>9}{'maxrss':>10}"
            f"{'writes/s':>10}{'p50 ms':>8}{'p99 ms':>8}{'B/rec':>7}  target"
        )
        for r in result["rss"]:
            verdict = "yes" if met("peak_rss_mb", r["peak_rss_mb"]) else "NO"
            yield (
                f"{'  N = ' + format(r['records'], ','):<48}{r['peak_rss_mb']:>9.1f}{r['ru_maxrss_mb']:>10.1f}"
                f"{r['remember_many_per_s']:>10,.0f}{r['recall_p50_ms']:>8.2f}{r['recall_p99_ms']:>8.2f}"
                f"{r['store_bytes_per_record']:>7.0f}  <= 150 MB: {verdict}"
            )
        yield f"  (VmHWM after imports alone: {result['rss'][0]['rss_after_import_mb']:.1f} MB; maxrss = ru_maxrss,"
        yield "   which on Linux also counts the benchmark parent's RSS at fork: an upper bound)"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="keep the stores in a new directory under DIR (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--save", type=Path, help="also write the JSON result to this file")
    parser.add_argument("--million", action="store_true", help="also measure peak RSS at N = 1,000,000 (minutes)")
    parser.add_argument("--sizes", default="10000,100000", help="store sizes to measure at (default 10000,100000)")
    parser.add_argument("--repeat", type=int, default=3, help="independent runs; medians are reported (default 3)")
    parser.add_argument("--calls", type=int, default=2_000, help="single remember() calls per size")
    parser.add_argument("--queries", type=int, default=1_000, help="recall() queries per size")
    parser.add_argument("--vocab", type=int, default=5_000, help="vocabulary size (default 5000)")
    parser.add_argument("--subjects", type=int, default=100, help="number of subjects (default 100)")
    parser.add_argument(
        "--keyed", type=float, default=0.0, help="share of records written under a fact key (default 0; try 0.05)"
    )
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--signed", action="store_true", help="make stores with Memory.init (signed checkpoints)")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocess runs")
    parser.add_argument("--rss-child", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rss_child is not None:
        print(json.dumps(rss_child(args.rss_child, args.out, args)))
        return 0
    sizes = sorted(int(s) for s in args.sizes.split(","))
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    host = machine() | {"loadavg_at_start": os.getloadavg()}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="bench-store-", dir=args.out))
    try:
        runs = []
        for i in range(args.repeat):
            workdir = base / f"run{i + 1}"
            workdir.mkdir()
            runs.append(run_once(workdir, sizes, args, args.seed + i))
            print(f"run {i + 1}/{args.repeat} done", file=sys.stderr)
        rss_sizes = [] if args.no_rss else [100_000] + ([1_000_000] if args.million else [])
        rss = []
        for n in rss_sizes:
            rss.append(run_rss(n, base / f"rss-{n}", args))
            print(f"peak RSS run N={n} done", file=sys.stderr)
    finally:
        if args.out is None:
            shutil.rmtree(base, ignore_errors=True)
    result: dict[str, Any] = {
        "date": started,
        "machine": host | {"loadavg_at_end": os.getloadavg()},
        "config": {
            "sizes": sizes,
            "repeat": args.repeat,
            "batch": BATCH,
            "window": WINDOW,
            "calls": args.calls,
            "queries": args.queries,
            "vocab": args.vocab,
            "subjects": args.subjects,
            "keyed": args.keyed,
            "space_weights": SPACE_WEIGHTS,
            "seed": args.seed,
            "signed": args.signed,
            "out": None if args.out is None else str(base),
        },
        "targets": {k: {"op": op, "value": v} for k, (op, v) in TARGETS.items()},
        "median": medians(runs),
        "runs": runs,
        "rss": rss,
    }
    if args.save is not None:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(table(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
