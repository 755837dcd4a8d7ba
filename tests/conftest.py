from __future__ import annotations

import io
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from deleatur import Memory, from_bytes
from deleatur.cli.app import main

MASTER = bytes(range(32))
#: The package's source, for the processes the tests start.
SRC = str(Path(__file__).parent.parent / "src")
BACKENDS = ["sqlite"]
#: Runs the CLI in-process: (arguments..., stdin=bytes) -> (exit code, stdout, stderr).
Cli = Callable[..., tuple[int, str, str]]


class FakeClock:
    """Microseconds since the epoch, moved only by the test."""

    def __init__(self, start: int = 1_790_000_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1_000_000)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "mem.db"


@pytest.fixture(params=BACKENDS)
def memory(request: pytest.FixtureRequest, store_path: Path, clock: FakeClock) -> Iterator[Memory]:
    assert request.param == "sqlite"
    # Every transaction signs its checkpoint, so tests see the log exactly as written.
    mem = Memory.open(store_path, from_bytes(MASTER), clock=clock, create=True, checkpoint_interval_us=0)
    mem.new_signing_key()
    yield mem
    mem.close()


def truncate_log(memory: Memory, new_size: int) -> None:
    """What a careful attacker with database access does: drop the newest entries,
    every hash that covers them, and every checkpoint that mentions them."""
    conn = memory.backend._conn  # type: ignore[attr-defined]
    conn.execute("DELETE FROM log_entries WHERE idx >= ?", (new_size,))
    for level in range(64):
        conn.execute(
            "DELETE FROM log_nodes WHERE pos >= ? AND pos < ?", ((level << 50) | (new_size >> level), (level + 1) << 50)
        )
    conn.execute("DELETE FROM log_checkpoints WHERE size > ?", (new_size,))


def store_files(store_path: Path) -> list[Path]:
    """Every file next to the store that the store or its key store may have written."""
    return sorted(p for p in store_path.parent.iterdir() if p.name.startswith(store_path.name))


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run the CLI in-process (fast); returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("DELEATUR_STORE", str(tmp_path / "cli.db"))
    for var in ("DELEATUR_MASTER_KEY", "DELEATUR_PASSPHRASE", "DELEATUR_MASTER_KEY_FILE", "DELEATUR_TENANT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["deleatur", *args])
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", _Stdin(stdin))
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


class _Stdin:
    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)


@pytest.fixture
def make_unwritable() -> Iterator[Callable[[Path], str]]:
    """Makes a directory one where no file can be made, and returns the reason the system
    gives. Root writes through any mode, so for root the directory is made immutable
    (chattr +i, which binds root too) where anyone else gets a read-only mode."""
    undo: list[Callable[[], object]] = []

    def make(directory: Path) -> str:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "+i", str(directory)], check=True)
            undo.append(lambda: subprocess.run(["chattr", "-i", str(directory)], check=True))
        else:
            directory.chmod(0o555)
            undo.append(lambda: directory.chmod(0o755))
        try:
            os.close(os.open(directory / "probe", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:
            return str(exc.strerror)
        (directory / "probe").unlink()
        raise AssertionError(f"a file can still be made in {directory}")

    yield make
    for step in reversed(undo):
        step()


def start_paused(target: str, code: str, *args: str) -> subprocess.Popen[str]:
    """A process running ``code`` (with ``args`` as its arguments) in which ``target``
    (``module:name`` or ``module:Owner.name``), when called, prints "paused" and waits
    for a line on its standard input before it goes on; returned once it is paused
    there, so a test can set what happens meanwhile. :func:`resume` lets it go on."""
    module, attribute = target.split(":")
    owner, _, name = attribute.rpartition(".")
    script = f"""
import functools, importlib, sys
sys.path.insert(0, {SRC!r})
owner = functools.reduce(getattr, {owner!r}.split(".") if {owner!r} else [], importlib.import_module({module!r}))
original = getattr(owner, {name!r})
def paused(*args, **kwargs):
    print("paused", flush=True)
    sys.stdin.readline()
    return original(*args, **kwargs)
setattr(owner, {name!r}, paused)
{code}
"""
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if line != "paused\n":
        out, err = process.communicate()
        raise AssertionError(f"the process did not pause: {line + out!r} {err!r}")
    return process


def resume(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Let a :func:`start_paused` process go on; its exit code and what it printed since."""
    out, err = process.communicate("\n", timeout=120)
    return process.returncode, out, err


def _let_go_with(barrier: Any, call: Callable[[], str], results: Any) -> None:
    barrier.wait()
    try:
        results.put(call())
    except BaseException as exc:
        results.put(f"failed: {type(exc).__name__}: {exc}")


def run_together(calls: Sequence[Callable[[], str]]) -> list[str]:
    """Each call in a process of its own, all let go at once (not deterministic: a test
    that must see one interleaving pins it with :func:`start_paused`); what each returned,
    or how it failed, sorted."""
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(len(calls)), context.Queue()
    workers = [context.Process(target=_let_go_with, args=(barrier, call, results)) for call in calls]
    for worker in workers:
        worker.start()
    outcomes = sorted(results.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join()
    return outcomes
