from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from deleatur.ids import IdGenerator, is_record_id

from .conftest import FakeClock


@given(st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=200))
def test_ids_are_uuid7_and_strictly_increasing(steps: list[int]) -> None:
    now = [1_790_000_000_000_000]

    def clock() -> int:
        return now[0]

    gen = IdGenerator(clock=clock)
    ids = []
    for step in steps:
        now[0] += step  # microseconds: many ids share a millisecond
        ids.append(gen.new())
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    for value in ids:
        assert uuid.UUID(value).version == 7
        assert is_record_id(value)


def test_id_embeds_the_clock_millisecond() -> None:
    gen = IdGenerator(clock=lambda: 1_790_000_000_123_456, random=bytes)
    assert uuid.UUID(gen.new()).int >> 80 == 1_790_000_000_123


def test_non_ids_are_rejected() -> None:
    assert not is_record_id("nope")
    assert not is_record_id(str(uuid.uuid4()))
    assert not is_record_id(str(uuid.UUID(int=0x01A22A0319D975EAB6F80A895B612B14)).upper())


def test_ids_follow_the_newest_id_another_generator_made() -> None:
    clock = FakeClock()
    first, second = IdGenerator(clock), IdGenerator(clock)
    ahead = [first.new() for _ in range(50)]  # the same millisecond, a random counter start
    second.after(ahead[-1])
    assert all(second.new() > ahead[-1] for _ in range(50))
    second.after(None)
    behind = IdGenerator(clock)
    behind.after(second.new())
    behind.after(ahead[0])  # an older floor never moves a generator back
    assert behind.new() > ahead[-1]
