"""The server's group commit of the reads' audit entries, on its own: a group whose
write fails or is cancelled is closed, its entries dropped, and the next read starts
a new group that is written."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from deleatur import Memory, StoreBusyError
from deleatur.servers.groupcommit import AuditGroups, Group


@pytest.mark.parametrize("failure", [StoreBusyError("the lock stayed held"), asyncio.CancelledError()])
def test_a_group_whose_write_fails_is_closed_and_the_next_one_is_written(
    memory: Memory, failure: BaseException
) -> None:
    record = memory.remember("kept", subject="a")
    start = memory.backend.log_size()
    tries: list[int] = []

    async def on_store(work: Callable[[Memory], None]) -> None:
        tries.append(1)
        if len(tries) == 1:
            raise failure
        work(memory)

    async def run() -> None:
        groups = AuditGroups(on_store)
        first: set[Group] = set()
        with groups.collecting(memory, first):
            memory.get(record.id)
        with pytest.raises(type(failure)):
            await groups.written(first)
        later: set[Group] = set()
        with groups.collecting(memory, later):
            memory.get(record.id)
        assert later and later != first  # a new group
        await groups.written(later)

    asyncio.run(run())
    logged = [e.entry.fields["action"] for e in memory.audit_entries(start=start, calls_only=True)]
    assert logged == ["get", "audit.show"]  # the second get; the first was answered with the failure
