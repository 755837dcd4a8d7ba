"""Erasure benchmark (issue 4): erasing a subject with 10 records among N (default
1,000,000), its dry run, certificate generation and offline verification.

Not a test. Run from the repository root::

    .venv/bin/python bench/bench_erasure.py                  # 1M records (a few minutes to build)
    .venv/bin/python bench/bench_erasure.py --records 100000
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import deleatur
from bench_log import print_results
from bench_store import machine, percentile
from deleatur import Memory, NewMemory
from deleatur.erasure.verify import verify_certificate
from deleatur.store.evidence import StoreEvidence

MASTER = deleatur.from_bytes(bytes(32))
TARGETS = {
    "erase_ms": ("<=", 50.0),
    "dry_run_ms": ("<=", 20.0),
    "certificate_ms": ("<=", 50.0),
    "verify_ms": ("<=", 20.0),
}
BASIS = "Art. 17(1)(a)"


def build(path: Path, records: int, targets: int) -> Memory:
    memory = Memory.init(path, MASTER)[0]
    per_target = 10
    filler = records - targets * per_target
    for start in range(0, filler, 10_000):
        memory.remember_many(
            NewMemory(f"ordinary note {i} about topic {i % 997} and matter {i % 13}", subject=f"person {i % 1000}")
            for i in range(start, min(start + 10_000, filler))
        )
    for t in range(targets):
        # Nine direct records (two versions of one key among them) and one derived record.
        direct = memory.remember_many(
            [NewMemory(f"target {t} fact {j}", subject=f"Target {t}") for j in range(8)]
            + [NewMemory(f"target {t} phone {j}", subject=f"Target {t}", key=f"target{t}::phone") for j in range(1)]
        )
        memory.remember(f"summary of target {t}", subject=f"Target {t}", derived_from=[direct[0].id])
    return memory


def run(records: int, rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {"records": records}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.db"
        t = time.perf_counter()
        memory = build(path, records, rounds * 2)
        results["build_s"] = time.perf_counter() - t
        key = memory.announced_keys()[0]

        dry = []
        for r in range(rounds):
            t = time.perf_counter()
            plan = memory.erase(f"Target {rounds + r}", request_id=f"DRY-{r}", basis=BASIS, requester="b", dry_run=True)
            dry.append((time.perf_counter() - t) * 1000)
            assert plan.plan is not None and plan.plan.total == 10
        erase, cert, verify_ms, verify_offline = [], [], [], []
        for r in range(rounds):
            t = time.perf_counter()
            done = memory.erase(f"Target {r}", request_id=f"DSAR-{r}", basis=BASIS, requester="b")
            erase.append((time.perf_counter() - t) * 1000)
            assert done.request is not None and done.request.counts["records"] == 10
            t = time.perf_counter()
            document = memory.certificate(f"DSAR-{r}")
            cert.append((time.perf_counter() - t) * 1000)
            text = json.dumps(document)
            evidence = StoreEvidence(path)
            t = time.perf_counter()
            report = verify_certificate(json.loads(text), expected_key=key, store=evidence)
            verify_ms.append((time.perf_counter() - t) * 1000)
            evidence.close()
            assert report.ok, report.lines()
            t = time.perf_counter()
            verify_certificate(json.loads(text), expected_key=key)
            verify_offline.append((time.perf_counter() - t) * 1000)
        results.update(
            {
                "erase_ms": statistics.median(erase),
                "erase_p99_ms": percentile(erase, 99),
                "dry_run_ms": statistics.median(dry),
                "certificate_ms": statistics.median(cert),
                "verify_ms": statistics.median(verify_ms),
                "verify_offline_ms": statistics.median(verify_offline),
                "certificate_bytes": len(text),
            }
        )
        memory.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {"machine": machine(), **run(args.records, args.rounds)}
    print_results(results, TARGETS, as_json=args.json)


if __name__ == "__main__":
    main()
