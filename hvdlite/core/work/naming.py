"""Request names: given by the user, or generated so that every rank produces the same one."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ...ops import Collective


class NameGenerator:
    """Deterministic names: ``<collective>.noname.<n>`` counted per collective kind.

    Ranks that call the same collectives in the same order get the same names, as in Horovod.
    """

    def __init__(self) -> None:
        self._counters: collections.Counter[Collective] = collections.Counter()

    def next(self, collective: Collective) -> str:
        self._counters[collective] += 1
        return f"{collective.name.lower()}.noname.{self._counters[collective]}"

    def undo(self, collective: Collective) -> None:
        """Give back the last generated name of ``collective``: the call that took it failed on this
        rank before reaching its peers, so they must not see the sequence shifted."""
        self._counters[collective] -= 1

    def resolve(self, name: str | None, collective: Collective) -> str:
        """``name`` if given (must be a non-empty str), else the next generated name."""
        if name is None:
            return self.next(collective)
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor name must be a non-empty string, got {name!r}")
        return name


_GENERATED = re.compile(r"([a-z]+)\.noname\.(\d+)")


def diverged_generated_names(pending: Mapping[str, Iterable[int]]) -> list[tuple[list[str], str]]:
    """Generated names that can never complete, because ranks are at different points of the sequence.

    ``pending``: name -> the ranks that submitted it, for the names waiting for other ranks. Each
    rank's oldest generated name of a collective is where that rank is in the sequence; two ranks
    at different points means one skipped or added an unnamed collective (for instance one that
    failed on that rank alone), and every later generated name is shifted. Returns, per collective
    with such a divergence, the names to fail and the message saying so.
    """
    oldest: dict[str, dict[int, tuple[int, str]]] = {}  # collective -> rank -> (number, name)
    for name, ranks in pending.items():
        match = _GENERATED.match(name)
        if match is None:
            continue
        kind, number = match.group(1), int(match.group(2))
        for rank in ranks:
            current = oldest.setdefault(kind, {}).get(rank)
            if current is None or (number, name) < current:
                oldest[kind][rank] = (number, name)
    diverged = []
    for kind, by_rank in sorted(oldest.items()):
        if len({number for number, _ in by_rank.values()}) < 2:
            continue
        at = ", ".join(f"rank {rank} at {kind} #{number} ({name!r})" for rank, (number, name) in sorted(by_rank.items()))
        message = (f"ranks called different sequences of unnamed {kind} collectives: {at}. A rank that skipped or "
                   f"added an unnamed {kind} (one that failed on that rank alone, or a branch on the rank) shifts "
                   "every later generated name; give these collectives names (name=...)")
        names = sorted(name for name in pending if (m := _GENERATED.match(name)) and m.group(1) == kind)
        diverged.append((names, message))
    return diverged


_OBJECT = re.compile(r"([a-z]+)_object\.noname\.([^.]+)\.object\.")


def object_name(collective: Collective, type_name: str) -> str:
    """The base name of an unnamed object collective: after the object's type, as Horovod names it."""
    return f"{collective.name.lower()}_object.noname.{type_name}.object"


def diverged_object_names(pending: Mapping[str, Iterable[int]]) -> list[tuple[list[str], str]]:
    """Unnamed object collectives that can never complete: ranks passed objects of different types.

    Object collectives block, so in step every rank waits on one of a kind; when each rank waiting
    waits on exactly one and their types differ, no rank can go on. Returns the names to fail and why.
    """
    types: dict[str, dict[int, set[str]]] = {}  # kind -> rank -> the types it waits on
    for name, ranks in pending.items():
        if match := _OBJECT.match(name):
            for rank in ranks:
                types.setdefault(match.group(1), {}).setdefault(rank, set()).add(match.group(2))
    diverged = []
    for kind, by_rank in sorted(types.items()):
        if len(by_rank) < 2 or any(len(names) != 1 for names in by_rank.values()):
            continue
        if len({next(iter(names)) for names in by_rank.values()}) < 2:
            continue
        at = ", ".join(f"rank {rank} {next(iter(names))!r}" for rank, names in sorted(by_rank.items()))
        message = (f"ranks called {kind}_object with objects of different types: {at}. An unnamed {kind}_object is "
                   "named after its object's type, as in Horovod: pass the same type on every rank, or name the "
                   "call (name=...)")
        diverged.append((sorted(n for n in pending if (m := _OBJECT.match(n)) and m.group(1) == kind), message))
    return diverged


class CallNames:
    """Names for a caller that issues its collectives in one order on every rank but names none of
    them (a torch process group): ``call.<kind>.<slot>.<signature>``.

    The names repeat from step to step, so the response cache answers them (generated names never
    repeat): ``slot`` counts the calls, of every kind, modulo :attr:`WINDOW` (one sequence, as gloo
    tags every call of a group from one counter: after ranks diverged by one call, each of another
    kind, their next calls match again), and ``signature`` (dtype and shape) makes a name's
    arguments the same each time it comes back. Before a name is reused,
    the call that last used it must have finished (:meth:`take` waits for it): a name is never in
    flight twice. A rank that called something else (another shape, or a call skipped) ends up with
    names its peers do not have and the reverse: :func:`diverged_call_names` fails them at once.
    """

    WINDOW = 4

    def __init__(self) -> None:
        self._calls = 0
        self._last: dict[str, Any] = {}  # name -> the handles of the call that last used it

    def take(self, kind: str, signature: str) -> str:
        """The next name for a call of ``kind`` with ``signature``, free to use (waits if it is not)."""
        return self.take_of(self.names_of(kind, signature))

    @classmethod
    def names_of(cls, kind: str, signature: str) -> tuple[str, ...]:
        """The names of a call of ``kind`` with ``signature``, slot by slot (for :meth:`take_of`)."""
        return tuple(f"call.{kind}.{slot}.{signature}" for slot in range(cls.WINDOW))

    def take_of(self, names: tuple[str, ...]) -> str:
        """:meth:`take` for a caller that keeps a call's :meth:`names_of` (a per-call path)."""
        name = names[self._calls % self.WINDOW]
        self._calls += 1
        for handle in self._last.pop(name, ()):
            handle.join()  # W calls ago: finished on every rank but a slow one's
        return name

    def used(self, name: str, handles: Iterable[Any]) -> None:
        """Record the core handles of the call that took ``name``."""
        self._last[name] = list(handles)
        if len(self._last) > 4 * self.WINDOW * 256:  # finished calls' entries: drop the oldest
            del self._last[next(iter(self._last))]


_CALL = re.compile(r"call\.([a-z_]+)\.\d+\.(.+)")


def call_kind(name: str) -> str | None:
    """The kind of a :class:`CallNames` name (None for other names)."""
    match = _CALL.match(name)
    return match.group(1) if match else None


def diverged_call_names(pending: Mapping[str, Iterable[int]]) -> list[tuple[list[str], str]]:
    """:class:`CallNames` that can never complete: two ranks each wait on a call that the other has
    not made, whatever their kinds. In one sequence of calls that cannot happen (the slower rank has
    made no call the faster has not), so it means the ranks' sequences differ: another shape,
    another collective (rank 0 reduces while rank 1 broadcasts), or a call skipped."""
    waiting: dict[int, set[str]] = {}  # rank -> the calls (names) it waits on
    for name, ranks in pending.items():
        if _CALL.match(name):
            for rank in ranks:
                waiting.setdefault(rank, set()).add(name)
    ranks = sorted(waiting)
    if not any(waiting[a] - waiting[b] and waiting[b] - waiting[a] for a in ranks for b in ranks if a < b):
        return []
    at = ", ".join(f"rank {rank}: {sorted(_described_call(n) for n in waiting[rank])}" for rank in ranks)
    message = (f"ranks made different calls at the same point (each rank's waiting calls, as collective "
               f"dtype[shape]): {at}. Every rank of a process group must make the same calls in the same order")
    return [(sorted(set().union(*waiting.values())), message)]


def _described_call(name: str) -> str:
    """``call.allreduce.2.float32[4]SUM1.0`` -> ``allreduce float32[4]SUM1.0``."""
    match = _CALL.match(name)
    return f"{match.group(1)} {match.group(2)}"


def group_member_names(base: str, count: int) -> list[str]:
    """Names of the members of a grouped operation: ``base.0`` ... ``base.<count-1>``."""
    return [f"{base}.{index}" for index in range(count)]


def clashing_names(names: list[str], in_flight: set[str]) -> list[str]:
    """The names of a submission that are already in flight, or repeated within it (sorted)."""
    unique = set(names)
    if len(unique) == len(names):
        return sorted(unique & in_flight)
    return sorted({name for name in names if name in in_flight or names.count(name) > 1})
