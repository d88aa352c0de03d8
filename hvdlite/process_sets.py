"""Process sets. Only the global set (every rank of the job) exists in this release."""

from __future__ import annotations

from .errors import UnsupportedOperationError


class ProcessSet:
    """A set of ranks a collective runs on; ``ranks=None`` means every rank."""

    def __init__(self, ranks: list[int] | None = None) -> None:
        self.ranks = ranks

    def __repr__(self) -> str:
        return "ProcessSet(global)" if self.ranks is None else f"ProcessSet({self.ranks})"


global_process_set = ProcessSet()


def require_global(process_set: ProcessSet | None, where: str) -> None:
    """Reject any process set but the global one, naming the call."""
    if process_set is not None and process_set is not global_process_set:
        raise UnsupportedOperationError(
            f"{where}: only the global process set is supported in this release, got {process_set!r}")
