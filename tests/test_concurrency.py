"""Two real processes writing one store at once lose nothing."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from multiprocessing.synchronize import Barrier
from pathlib import Path

from deleatur import Memory, NewMemory, from_bytes, sqlitefile

from .conftest import MASTER, FakeClock

SINGLE = 150
BATCH = 300


def _writer(store: str, name: str, barrier: Barrier) -> None:
    with Memory.open(store, from_bytes(MASTER)) as memory:
        barrier.wait()  # start together, so the writes really interleave
        for i in range(SINGLE):
            # Shared subjects: both processes race to create the same new data keys.
            memory.remember(f"{name} single {i}", subject=f"shared {i % 20}", key=f"{name}::{i % 10}")
        memory.remember_many(NewMemory(f"{name} batch {i}", subject=f"shared {i % 30}") for i in range(BATCH))


def test_two_processes_writing_lose_nothing(store_path: Path) -> None:
    Memory.open(store_path, from_bytes(MASTER), create=True).close()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(str(store_path), name, barrier)) for name in ("p1", "p2")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0, 0]

    with Memory.open(store_path, from_bytes(MASTER)) as memory:
        everything = list(memory.list(include_history=True))
        texts = sorted(r.text for r in everything)
        expected = sorted(
            f"{name} {kind} {i}"
            for name in ("p1", "p2")
            for kind, n in (("single", SINGLE), ("batch", BATCH))
            for i in range(n)
        )
        assert texts == expected
        # Each process superseded its own keys: exactly one active value per key.
        for name in ("p1", "p2"):
            for k in range(10):
                assert len(list(memory.list(key=f"{name}::{k}"))) == 1
        # One data key per subject, even though both processes created them concurrently.
        [(count,)] = memory.keys._conn.execute("SELECT count(*) FROM data_keys").fetchall()
        assert count == 30


def test_two_handles_writing_in_one_millisecond_keep_ids_in_commit_order(store_path: Path) -> None:
    """A reader paging by id (after the last id it saw) must never miss a record that
    another handle commits later."""
    clock = FakeClock()  # every write in the same millisecond
    a = Memory.open(store_path, from_bytes(MASTER), clock=clock, create=True)
    b = Memory.open(store_path, from_bytes(MASTER), clock=clock)
    seen: list[str] = []
    for i in range(300):
        writer = a if i % 2 else b
        record = writer.remember(f"note {i}", subject="s")
        assert not seen or record.id > seen[-1]
        seen.append(record.id)
    a.close()
    b.close()


def test_a_long_read_is_marked_for_other_processes_until_it_ends_or_its_process_dies(tmp_path: Path) -> None:
    """A server's long read (an export, a verification) is seen by every process on the
    store, so their scrubs need not wait for it; a killed process leaves no mark."""
    database = tmp_path / "mem.db"
    assert not sqlitefile.long_read_marked(database)  # no marker file yet
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from deleatur import sqlitefile\n"
            f"with sqlitefile.long_read(Path({str(database)!r})):\n"
            "    print('held', flush=True); sys.stdin.readline()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    assert sqlitefile.long_read_marked(database)
    with sqlitefile.long_read(database):  # a second one, here, alongside
        assert sqlitefile.long_read_marked(database)
    assert sqlitefile.long_read_marked(database)  # the other one still holds
    holder.kill()
    holder.wait(timeout=30)
    assert not sqlitefile.long_read_marked(database)
    with sqlitefile.long_read(database):
        assert sqlitefile.long_read_marked(database)
    assert not sqlitefile.long_read_marked(database)
