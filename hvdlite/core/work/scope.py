"""Which ranks of the job a communicator's ranks are: messages and the timeline name job ranks.

A process set's communicator numbers its members 0..n-1. A user reads ranks of the job
(``hvd.rank()``), so every message about a set names its members by their job ranks, and says
which set it is about.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class Scope:
    """A communicator's place in the job: the whole job (id 0), or a process set."""

    process_set_id: int = 0
    members: tuple[int, ...] | None = None  # the job rank of each of the communicator's ranks; None: the job

    def job_rank(self, rank: int) -> int:
        """The job rank of the communicator's ``rank``."""
        return rank if self.members is None else self.members[rank]

    def job_ranks(self, ranks: Iterable[int]) -> list[int]:
        return [self.job_rank(r) for r in ranks]

    @property
    def label(self) -> str:
        """'' for the whole job, else ' in process set <id> [job ranks]' (to append to a message)."""
        return "" if self.members is None else f" in process set {self.process_set_id} {list(self.members)}"

    @property
    def row_prefix(self) -> str:
        """The timeline's prefix for a tensor row of this communicator ('' for the whole job)."""
        return "" if self.members is None else f"process set {self.process_set_id}: "


JOB = Scope()
