from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deleatur import Memory, from_bytes
from deleatur.cli.app import main

MASTER = bytes(range(32))
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
