"""Group commit of audit entries.

Every call leaves an audit entry. A write's goes into the write's own transaction; a
read's (or a refusal's, or a failure's) takes a transaction of its own, and that
transaction, with its log append and its wait for the write lock, is a fifth of a
recall. A server serving many reads at once collects their entries in an
:class:`AuditBatch` and writes them in one transaction, answering none of those calls
before it has: a call not yet recorded has not happened, as far as its caller knows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..errors import StoreError
from ..log.entries import Entry
from . import calls

if TYPE_CHECKING:
    from ..memory import Memory


class AuditBatch:
    """The entries calls on one store handle would have written in transactions of their
    own, collected while :meth:`collecting` and written by :meth:`write`."""

    def __init__(self, memory: Memory) -> None:
        self.memory = memory
        self._entries: list[Entry] = []

    def __len__(self) -> int:
        return len(self._entries)

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Calls on the handle (or on a view of it) in the block add their entries here.
        Blocks nest: the innermost collects."""
        shared = self.memory._shared
        outer, shared.deferred = shared.deferred, self._entries
        try:
            yield
        finally:
            shared.deferred = outer

    def write(self) -> None:
        """Write the entries collected so far, all in one transaction; they leave the
        batch once it commits. A write that fails (refused by a lock held elsewhere, say)
        keeps them, to try again, and entries collected meanwhile go with them."""
        if not self._entries:
            return
        if self.memory._shared.reading:
            raise StoreError("an audit batch cannot be written inside a read snapshot: write it once the snapshot ends")
        written = len(self._entries)
        with self.memory._logged(audit_only=True) as events:
            events.extend((entry, None) for entry in self._entries)
        del self._entries[:written]

    def drop(self) -> None:
        """Forget the entries collected: they will not be written, and their calls are
        answered with an error instead. A refused API key's entry gives back its place in
        the budget of refusals written, and the count of unwritten ones it carried."""
        for entry in self._entries:
            calls.refusal_unwritten(self.memory, entry)
        self._entries.clear()
