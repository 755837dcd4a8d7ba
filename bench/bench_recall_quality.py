"""Recall's ranking quality against exact BM25, at 10k and 100k records (or other sizes).

The metric: for each query, the sum of the exact BM25 scores of the records recall
returns, over the sum of the ``limit`` best exact scores (1.0 = recall found records
as good as the best ones). Exact BM25 is FTS5's ``bm25()`` (k1 = 1.2, b = 0.75) over
every match, computed independently of the store: the workload's texts are generated
again from its seed into a plain, in-memory FTS5 table (one token per word occurrence,
prefixed with its space's tag, as the store indexes them), whose
rowids are the store's (records are written in order, one rowid each).

Stores are those of ``bench_store.py``'s workload (as ``bench_recall_instructions.py``
builds them: ``--stores DIR`` reuses ``DIR/<size>.db``); queries are its Zipf and
uniform mixes, seeded as in ``bench_recall_instructions.py``. Not a test. From the
repository root::

    .venv/bin/python bench/bench_recall_quality.py --json
    .venv/bin/python bench/bench_recall_quality.py --stores DIR --sizes 10000,100000
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import unicodedata
from pathlib import Path
from typing import Any

import apsw

from bench_store import BATCH, MASTER, Corpus, machine, open_store, parse_args, write_batches
from deleatur import Memory, Space

_TOKEN = re.compile(r"[^\W_]+")


def _fold(word: str) -> str:
    decomposed = unicodedata.normalize("NFKD", word.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def reference(seed: int, size: int) -> tuple[apsw.Connection, dict[Space, str]]:
    """The workload's first ``size`` records in a plain FTS5 table, rowid = store rowid."""
    args = parse_args([])
    corpus = Corpus(seed, args.vocab, args.subjects, args.keyed)
    tags = {space: f"u{i}x" for i, space in enumerate(corpus.spaces)}
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE VIRTUAL TABLE ref USING fts5(body, tokenize='unicode61 remove_diacritics 2')")
    rows = []
    written = 0
    while written < size:  # the same draws, in the same order, as write_batches
        n = min(BATCH, size - written)
        raw = [corpus.item() for _ in range(n)]
        tag = tags[corpus.batch_space(written // BATCH)]
        for text, _, _ in raw:
            written += 1
            words = _TOKEN.findall(unicodedata.normalize("NFKC", text))
            rows.append((written, " ".join(tag + w for w in words)))
    with conn:
        conn.executemany("INSERT INTO ref(rowid, body) VALUES (?, ?)", rows)
    return conn, tags


def quality(
    mem: Memory, ref: apsw.Connection, tags: dict[Space, str], queries: list[tuple[str, Space]], limit: int
) -> dict[str, float]:
    conn = mem.backend._conn  # type: ignore[attr-defined]
    ratios = []
    for text, space in queries:
        words = list(dict.fromkeys(_fold(w) for w in _TOKEN.findall(unicodedata.normalize("NFKC", text))))
        match = " OR ".join(f'"{tags[space]}{w}"' for w in words)
        exact = {
            int(r): float(s) for r, s in ref.execute("SELECT rowid, -bm25(ref) FROM ref WHERE ref MATCH ?", (match,))
        }
        best = sum(sorted(exact.values(), reverse=True)[:limit])
        if best <= 0:
            continue
        hits = mem._ranked(text, space, limit)
        got = 0.0
        for row, _ in hits:
            (rowid,) = conn.execute("SELECT rowid FROM records WHERE id = ?", (row.id,)).fetchall()[0]
            got += exact.get(int(rowid), 0.0)
        ratios.append(got / best)
    return {
        "mean": statistics.fmean(ratios),
        "median": statistics.median(ratios),
        "share_perfect": sum(r > 0.9999 for r in ratios) / len(ratios),
        "p10": sorted(ratios)[len(ratios) // 10],
        "queries": len(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", type=Path, help="reuse (or build into) this directory's stores, one per size")
    parser.add_argument("--sizes", type=lambda t: tuple(int(n) for n in t.split(",")), default=(10_000, 100_000))
    parser.add_argument("--queries", type=int, default=300, help="queries per mix (default 300)")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    ours = parser.parse_args()
    args = parse_args([])
    seed = args.seed
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stores = ours.stores or Path(tmp)
        stores.mkdir(parents=True, exist_ok=True)
        for size in ours.sizes:
            path = stores / f"{size}.db"
            if not path.exists():
                mem = open_store(path)
                write_batches(mem, Corpus(seed, args.vocab, args.subjects, args.keyed), 0, size)
                mem.close()
            ref, tags = reference(seed, size)
            mem = Memory.open(path, MASTER)
            # The texts must be the store's: check a few.
            conn = mem.backend._conn  # type: ignore[attr-defined]
            for rowid in (1, size // 2, size):
                (rid,) = conn.execute("SELECT id FROM records WHERE rowid = ?", (rowid,)).fetchall()[0]
                stored = mem.get(str(rid), space=mem.backend.get(mem.tenant, str(rid)).space)  # type: ignore[union-attr]
                words = _TOKEN.findall(unicodedata.normalize("NFKC", stored.text))
                tag = tags[stored.space]
                match = " ".join(f'"{tag}{_fold(w)}"' for w in words[:3])
                assert rowid in {r for (r,) in ref.execute("SELECT rowid FROM ref WHERE ref MATCH ?", (match,))}, rowid
            asker = Corpus(seed, args.vocab, args.subjects, args.keyed)
            asker.rng.seed(seed + 1)
            for mix in ("zipf", "uniform"):
                queries = [asker.query(uniform=mix == "uniform") for _ in range(ours.queries)]
                result[f"{mix}_{size}"] = quality(mem, ref, tags, queries, ours.limit)
            mem.close()
            ref.close()
    result["machine"] = machine()
    if ours.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return
    for key, value in result.items():
        if key != "machine":
            print(
                f"{key:<16} mean {value['mean']:.3f}  median {value['median']:.3f}  p10 {value['p10']:.3f}"
                f"  perfect {value['share_perfect']:.2f}  ({value['queries']} queries)"
            )


if __name__ == "__main__":
    main()
