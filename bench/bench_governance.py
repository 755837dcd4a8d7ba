"""Governance benchmark (issue 5): the per-call cost of authorization and of the
audit entry, streaming a user's export, and ``verify_audit`` over a large trail.

Not a test. Run from the repository root::

    .venv/bin/python bench/bench_governance.py           # 100k-record export, 1M-entry trail (minutes)
    .venv/bin/python bench/bench_governance.py --quick   # smoke run, seconds
    .venv/bin/python bench/bench_governance.py --json

Authorization: ``checkpoint()`` is guarded with ``audit=False`` and ``_checkpoint()``
is its unguarded body, so their difference is the guard alone (request id, the
capability and scope decision, no log entry). ``get()`` is guarded *and* audited:
against the raw ``_decrypt(backend.get(...))`` it shows guard plus one ``call``
entry appended in its own transaction. Variants run interleaved, in rotating
order, ``--rounds`` times ``--calls`` calls; medians of the per-round means.

Export: one user with ``--export-records`` records (and a smaller user, to show
that memory does not grow with the export), among other users' records; each
export runs in a fresh process, which reports its own peak RSS (VmHWM).

Audit verification: a trail of ``call`` entries as the guard writes them (batches
of 10,000, one signed checkpoint each), verified at each size in ``--verify-sizes``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw

from bench_log import print_results
from bench_store import MASTER, Corpus, _vmhwm_kib, machine, open_store
from deleatur import Memory, NewMemory, Space
from deleatur.access import calls
from deleatur.access.guard import Call
from deleatur.access.principals import Capability, Role
from deleatur.log.entries import Entry, EventType

TARGETS = {
    "authorization_us": ("<=", 50.0),
    "export_json_per_s": (">=", 20_000.0),
    "export_csv_per_s": (">=", 20_000.0),
    # "In seconds": under a minute, against the peer's 220 s extrapolated to 1M.
    "verify_1000000_s": ("<=", 60.0),
}
USER = "u1"
SMALL_USER = "u-small"
OTHERS = ("u2", "u3", "u4", "u5")
PEER_VERIFY_S_PER_ENTRY = 2.2 / 10_000


# -- authorization and the audit entry -------------------------------------------------


BLOCK = 100  # calls per block; the variants take turns block by block, so they share the machine's noise

#: (name, guarded variant, its unguarded baseline): paired per round, medians of the differences.
PAIRS = (
    ("authorization_us", "checkpoint_scoped_us", "checkpoint_raw_us"),
    ("authorization_root_us", "checkpoint_root_us", "checkpoint_raw_us"),
    ("get_guard_and_audit_us", "get_scoped_us", "get_raw_us"),
    ("get_view_minus_root_us", "get_scoped_us", "get_root_us"),
)


def _block_s(fn: Callable[[], object], calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - t


def run_auth(workdir: Path, rounds: int, calls: int) -> dict[str, Any]:
    memory = open_store(workdir / "auth.db", signed=True)
    space = Space(user_id=USER)
    record_id = memory.remember_many(
        [NewMemory(f"note {i} about things", subject="Ann Lee") for i in range(100)], space=space
    )[0].id
    member, api_key = memory.create_principal("bench", Role.MEMBER)
    scoped_principal, _ = memory.create_principal("bench-scoped", Role.MEMBER, scopes=[USER])
    view, scoped = memory.as_principal(member), memory.as_principal(scoped_principal)
    tenant = memory.tenant

    def decision() -> None:
        # The guard's entry alone (request id, capability and scope check), then what
        # its exit does for an unaudited success.
        call = scoped._enter_call("get", Capability.READ, (USER,), None, {})
        call.audit, call.logged = False, True
        scoped._leave_call(call, None)

    variants: dict[str, Callable[[], object]] = {
        "get_raw_us": lambda: memory._decrypt(memory.backend.get(tenant, record_id)),  # type: ignore[arg-type]
        "get_root_us": lambda: memory.get(record_id, space=space),
        "get_member_us": lambda: view.get(record_id, space=space),
        "get_scoped_us": lambda: scoped.get(record_id, space=space),
        "checkpoint_raw_us": memory._checkpoint,
        "checkpoint_root_us": memory.checkpoint,
        "checkpoint_scoped_us": scoped.checkpoint,
        "enter_call_us": decision,
        "authenticate_us": lambda: memory.authenticate(api_key),
    }
    for fn in variants.values():  # warm up caches and the log's right edge
        _block_s(fn, BLOCK)
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        spent = dict.fromkeys(names, 0.0)
        for b in range(max(1, calls // BLOCK)):
            shift = (r + b) % len(names)
            for name in names[shift:] + names[:shift]:
                spent[name] += _block_s(variants[name], BLOCK)
        for name in names:
            samples[name].append(spent[name] / (max(1, calls // BLOCK) * BLOCK) * 1e6)
    memory.close()
    out: dict[str, Any] = {name: statistics.median(v) for name, v in samples.items()}
    for name, guarded, baseline in PAIRS:
        out[name] = statistics.median(g - b for g, b in zip(samples[guarded], samples[baseline], strict=True))
    out["audit_entry_us"] = out["get_guard_and_audit_us"] - out["authorization_us"]
    out["auth_spread"] = {name: [round(min(v), 1), round(max(v), 1)] for name, v in samples.items()}
    return out


# -- export ----------------------------------------------------------------------------


def build_export_store(path: Path, records: int, small: int, others: int, seed: int) -> float:
    corpus = Corpus(seed, 5_000, 100, 0.0)
    memory = open_store(path, signed=True)
    plan = [(USER, records), (SMALL_USER, small)] + [(u, others // len(OTHERS)) for u in OTHERS]
    t = time.perf_counter()
    for user, count in plan:
        space = Space(user_id=user)
        for start in range(0, count, 1_000):
            items = [NewMemory(corpus.text(), subject=corpus.subject()) for _ in range(min(1_000, count - start))]
            memory.remember_many(items, space=space)
    built = time.perf_counter() - t
    memory.close()
    return built


def export_child(fmt: str, store: Path, user: str, out: Path) -> dict[str, Any]:
    """In a fresh process: open the store, export one user, report time and peak RSS."""
    memory = Memory.open(store, MASTER)
    before = _vmhwm_kib()
    apsw.memory_high_water(True)
    t = time.perf_counter()
    if fmt == "json":
        with out.open("w", encoding="utf-8") as handle:
            counts = memory.export_json(handle, user_id=user)
        size = out.stat().st_size
    else:
        counts = memory.export_csv(out, user_id=user)
        size = sum(p.stat().st_size for p in out.iterdir())
    seconds = time.perf_counter() - t
    peak = _vmhwm_kib()
    memory.close()
    return {
        "records": counts["records"],
        "log_entries": counts["log_entries"],
        "seconds": seconds,
        "per_s": counts["records"] / seconds,
        "bytes": size,
        "rss_before_mb": before / 1024,
        "peak_rss_mb": peak / 1024,
        # SQLite's own allocations (page cache, sorter), which tracemalloc would not see.
        "sqlite_high_water_mb": apsw.memory_high_water() / 2**20,
    }


def _export_in_child(fmt: str, store: Path, user: str, out: Path) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--export-child", fmt, str(store), user, str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run_export(workdir: Path, records: int, *, small: int, others: int, repeat: int, seed: int) -> dict[str, Any]:
    store = workdir / "export.db"
    out: dict[str, Any] = {"export_records": records, "export_small_records": small, "export_other_records": others}
    out["export_build_s"] = build_export_store(store, records, small, others, seed)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(repeat):
        for fmt in ("json", "csv"):
            for user in (SMALL_USER, USER):
                target = workdir / f"{fmt}-{user}-{r}" / ("export.json" if fmt == "json" else "bundle")
                target.parent.mkdir()
                result = _export_in_child(fmt, store, user, target)
                expected = records if user == USER else small
                if result["records"] != expected:
                    raise RuntimeError(f"export of {user} gave {result['records']} records, not {expected}")
                runs.setdefault((fmt, user), []).append(result)
    for (fmt, user), results in runs.items():
        tag = f"export_{fmt}" if user == USER else f"export_{fmt}_small"
        out[f"{tag}_per_s"] = statistics.median(x["per_s"] for x in results)
        out[f"{tag}_s"] = statistics.median(x["seconds"] for x in results)
        out[f"{tag}_peak_rss_mb"] = statistics.median(x["peak_rss_mb"] for x in results)
        out[f"{tag}_sqlite_high_water_mb"] = statistics.median(x["sqlite_high_water_mb"] for x in results)
        out[f"{tag}_rss_before_mb"] = statistics.median(x["rss_before_mb"] for x in results)
        out[f"{tag}_mb"] = results[0]["bytes"] / 1e6
    out["export_log_entries_per_record"] = runs[("json", USER)][0]["log_entries"] / records
    return out


# -- verify_audit ------------------------------------------------------------------------

_ACTIONS = ("get", "recall", "remember", "list", "export")


def call_templates(memory: Memory) -> list[dict[str, Any]]:
    """Fields of ``call`` entries as the guard writes them, for a few actors, actions and users."""
    views = [memory] + [memory.as_principal(memory.create_principal(f"agent {k}", Role.AGENT)[0]) for k in range(3)]
    return [
        dict(calls.entry(v, Call(action, "", (f"user{k}",))).fields)
        for v in views
        for action in _ACTIONS
        for k in range(20)
    ]


def extend_trail(memory: Memory, templates: list[dict[str, Any]], target: int, batch: int) -> None:
    """Append ``call`` entries, one transaction and signed checkpoint per batch, up to ``target``."""
    size = memory.backend.log_size()
    while size < target:
        n = min(batch, target - size)
        items = [
            (
                Entry(
                    EventType.CALL,
                    memory._clock(),
                    {**templates[(size + i) % len(templates)], "request": memory._ids.new()},
                ),
                None,
            )
            for i in range(n)
        ]
        with memory.backend.atomic():
            memory.log.append(items)
            memory.log.checkpoint()
        size += n


def run_verify(workdir: Path, sizes: list[int], repeat: int, batch: int) -> dict[str, Any]:
    memory = open_store(workdir / "trail.db", signed=True)
    out: dict[str, Any] = {}
    build = 0.0
    templates = call_templates(memory)
    for size in sizes:
        t = time.perf_counter()
        extend_trail(memory, templates, size, batch)
        build += time.perf_counter() - t
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            report = memory.verify_audit()
            times.append(time.perf_counter() - t)
            if not report.ok:
                raise RuntimeError(f"verify_audit failed at {size}: {report}")
        entries = memory.backend.log_size()
        out[f"verify_{size}_s"] = statistics.median(times)
        out[f"verify_{size}_us_per_entry"] = statistics.median(times) / entries * 1e6
        out[f"verify_{size}_build_s"] = build
        out[f"verify_{size}_peer_s"] = entries * PEER_VERIFY_S_PER_ENTRY
    memory.close()
    return out


# -- main ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a few seconds")
    parser.add_argument("--rounds", type=int, help="authorization rounds (default 10; quick 3)")
    parser.add_argument("--calls", type=int, help="calls per variant and round (default 2000; quick 300)")
    parser.add_argument("--export-records", type=int, help="records of the exported user (default 100000)")
    parser.add_argument("--export-repeat", type=int, help="exports per format and user (default 3; quick 1)")
    parser.add_argument("--verify-sizes", help="trail sizes, comma-separated (default 10000,100000,1000000)")
    parser.add_argument("--verify-repeat", type=int, help="verifications per size (default 3; quick 1)")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--export-child", nargs=4, metavar=("FMT", "STORE", "USER", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export_child:
        fmt, store, user, out = args.export_child
        print(json.dumps(export_child(fmt, Path(store), user, Path(out))))
        return
    q = args.quick
    rounds = args.rounds or (3 if q else 10)
    calls = args.calls or (300 if q else 2_000)
    records = args.export_records or (5_000 if q else 100_000)
    export_repeat = args.export_repeat or (1 if q else 3)
    sizes = [int(s) for s in (args.verify_sizes or ("1000,10000" if q else "10000,100000,1000000")).split(",")]
    verify_repeat = args.verify_repeat or (1 if q else 3)

    results: dict[str, Any] = {
        "machine": machine(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg": {"start": os.getloadavg()},
    }
    with tempfile.TemporaryDirectory(prefix="bench-governance-") as tmp:
        workdir = Path(tmp)
        results.update(run_auth(workdir, rounds, calls))
        results["loadavg"]["after_auth"] = os.getloadavg()
        print("authorization done", file=sys.stderr)
        results.update(
            run_export(workdir, records, small=records // 10, others=records // 5, repeat=export_repeat, seed=args.seed)
        )
        results["loadavg"]["after_export"] = os.getloadavg()
        print("export done", file=sys.stderr)
        results.update(run_verify(workdir, sizes, verify_repeat, 10_000))
        results["loadavg"]["after_verify"] = os.getloadavg()
    if len(sizes) > 1:
        first, last = sizes[0], sizes[-1]
        results["verify_time_ratio"] = results[f"verify_{last}_s"] / results[f"verify_{first}_s"]
        results["verify_size_ratio"] = last / first
    if args.json:
        print_results(results, TARGETS, as_json=True)
        return
    m = results["machine"]
    print(f"{m['nproc']} CPU(s), {m['cpu']}; Python {m['python']}; SQLite {m['sqlite']}; rev {m['revision']}")
    print(f"{results['date']}; load average {results['loadavg']}")
    print_results(
        {k: v for k, v in results.items() if k not in ("loadavg", "date", "auth_spread")}, TARGETS, as_json=False
    )


if __name__ == "__main__":
    main()
