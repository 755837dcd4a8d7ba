from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deleatur import Memory, from_bytes

MASTER = bytes(range(32))
BACKENDS = ["sqlite"]


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
    mem = Memory.open(store_path, from_bytes(MASTER), clock=clock, create=True)
    mem.new_signing_key()
    yield mem
    mem.close()


def store_files(store_path: Path) -> list[Path]:
    """Every file next to the store that the store or its key store may have written."""
    return sorted(p for p in store_path.parent.iterdir() if p.name.startswith(store_path.name))
