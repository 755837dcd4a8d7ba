"""Index writes held back inside a write transaction, and made together later.

FTS5 writes the terms it has pending to a new segment of its index whenever a savepoint
begins, and whenever a row's rowid is below the last one's: a server's group of writes
(each a savepoint of one transaction) would otherwise leave a segment per write, and the
merges of them, a sixth of each write's instructions. So the writes are held here, and
made once, in rowid order: as the batch or group ends, or before the index is read.

A savepoint that is undone takes back what it held (its own writes are gone), and, if the
index was written while it was open, the writes held before it that were made then: the
undo removed them from the index, so they are held again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: An index write: (rowid, the text indexed).
Write = tuple[int, str]


@dataclass(frozen=True, slots=True)
class Mark:
    """Where the held writes stood as a savepoint began."""

    deletes: int
    inserts: int
    made: tuple[int, int]


@dataclass(slots=True)
class HeldIndex:
    deletes: list[Write] = field(default_factory=list)
    inserts: list[Write] = field(default_factory=list)
    #: How many of the deletes and of the inserts the index has received.
    made: tuple[int, int] = (0, 0)

    def mark(self) -> Mark:
        return Mark(len(self.deletes), len(self.inserts), self.made)

    def undo_to(self, mark: Mark) -> None:
        """After the savepoint begun at ``mark`` was undone."""
        del self.deletes[mark.deletes :], self.inserts[mark.inserts :]
        self.made = mark.made

    def pending(self) -> tuple[list[Write], list[Write]]:
        """The writes the index has not received, as (deletions, insertions), each kind in
        rowid order, leaving out a row both added and removed among them (it never enters
        the index)."""
        deletes, inserts = self.deletes[self.made[0] :], self.inserts[self.made[1] :]
        added = {rowid for rowid, _ in inserts}
        removed = {rowid for rowid, _ in deletes}
        return sorted(d for d in deletes if d[0] not in added), sorted(i for i in inserts if i[0] not in removed)

    def made_all(self) -> None:
        """The index has received every write :meth:`pending` gave (only once it has: a
        failure part-way leaves them pending, to make again)."""
        self.made = (len(self.deletes), len(self.inserts))
