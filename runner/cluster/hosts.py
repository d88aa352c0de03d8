"""Host lists: ``-H host1:2,host2:2`` and hostfiles, parsed into (host, slots) pairs."""

from __future__ import annotations

import dataclasses
import re


class HostError(ValueError):
    """A host specification that cannot be used; the message says which entry and why."""



class DiscoveryError(RuntimeError):
    """A source of hosts (the discovery script, a Slurm allocation's node states) failed or printed
    something that is not a host list."""


@dataclasses.dataclass(frozen=True)
class HostSlots:
    host: str
    slots: int


# A name may not begin with "-": ssh would read it as an option (-oProxyCommand=...).
_HOST = re.compile(r"^[A-Za-z0-9_.\[\]:][A-Za-z0-9_.\-\[\]:]*$")


def _entry(text: str, slots_text: str | None, where: str) -> HostSlots:
    host = text.strip()
    if not host or not _HOST.match(host):
        raise HostError(f"{where}: bad host name {text!r}")
    if slots_text is None:
        return HostSlots(host, 1)
    try:
        slots = int(slots_text)
    except ValueError:
        raise HostError(f"{where}: slots for {host!r} must be an integer, got {slots_text!r}") from None
    if slots < 1:
        raise HostError(f"{where}: slots for {host!r} must be >= 1, got {slots}")
    return HostSlots(host, slots)


def parse_hosts(spec: str) -> list[HostSlots]:
    """Parse ``host1:2,host2:2`` (slots default to 1). Repeated hosts add their slots together."""
    if not spec.strip():
        raise HostError("-H: empty host list")
    entries = []
    for item in spec.split(","):
        host, sep, slots = item.rpartition(":")
        entries.append(_entry(host, slots, f"-H entry {item!r}") if sep else _entry(item, None, f"-H entry {item!r}"))
    return _merge(entries)


def parse_hostfile(text: str, path: str = "hostfile") -> list[HostSlots]:
    """Parse lines of ``host slots=N``, ``host:N`` or ``host``; ``#`` starts a comment."""
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        match = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\S+)", line)
        if match:
            entries.append(_entry(match.group(1), match.group(2), where))
        elif " " in line:
            raise HostError(f"{where}: expected 'host slots=N', 'host:N' or 'host', got {raw!r}")
        else:
            host, sep, slots = line.rpartition(":")
            entries.append(_entry(host, slots, where) if sep else _entry(line, None, where))
    if not entries:
        raise HostError(f"{path}: no hosts found")
    return _merge(entries)


def _merge(entries: list[HostSlots]) -> list[HostSlots]:
    merged: dict[str, int] = {}
    for entry in entries:
        merged[entry.host] = merged.get(entry.host, 0) + entry.slots
    return [HostSlots(host, slots) for host, slots in merged.items()]


def total_slots(hosts: list[HostSlots]) -> int:
    return sum(h.slots for h in hosts)


def first_slots(hosts: tuple[HostSlots, ...], count: int) -> tuple[HostSlots, ...]:
    """The first ``count`` slots of ``hosts``, in order (hosts left with none are dropped)."""
    chosen = []
    for entry in hosts:
        if count <= 0:
            break
        chosen.append(HostSlots(entry.host, min(entry.slots, count)))
        count -= entry.slots
    return tuple(chosen)
