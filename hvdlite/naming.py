"""Request names: given by the user, or generated so that every rank produces the same one."""

from __future__ import annotations

import collections

from .ops import Collective


class NameGenerator:
    """Deterministic names: ``<collective>.noname.<n>`` counted per collective kind.

    Ranks that call the same collectives in the same order get the same names, as in Horovod.
    """

    def __init__(self) -> None:
        self._counters: collections.Counter[Collective] = collections.Counter()

    def next(self, collective: Collective) -> str:
        self._counters[collective] += 1
        return f"{collective.name.lower()}.noname.{self._counters[collective]}"

    def resolve(self, name: str | None, collective: Collective) -> str:
        """``name`` if given (must be a non-empty str), else the next generated name."""
        if name is None:
            return self.next(collective)
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor name must be a non-empty string, got {name!r}")
        return name


def group_member_names(base: str, count: int) -> list[str]:
    """Names of the members of a grouped operation: ``base.0`` ... ``base.<count-1>``."""
    return [f"{base}.{index}" for index in range(count)]


def clashing_names(names: list[str], in_flight: set[str]) -> list[str]:
    """The names of a submission that are already in flight, or repeated within it (sorted)."""
    unique = set(names)
    if len(unique) == len(names):
        return sorted(unique & in_flight)
    return sorted({name for name in names if name in in_flight or names.count(name) > 1})
