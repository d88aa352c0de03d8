"""A Slurm allocation as hvdliterun's hosts: its nodes and task slots, from Slurm's own variables.

Inside ``sbatch`` / ``salloc``, Slurm describes the allocation in ``SLURM_JOB_NODELIST`` (a
compressed host list such as ``node[01-04,07],gpu3``) and ``SLURM_TASKS_PER_NODE`` (counts such as
``2(x3),1``: two tasks on each of the first three nodes, one on the fourth). hvdliterun then runs
one rank per task slot, and Hydra starts its proxies through ``srun`` instead of ssh. Pure
functions: the caller passes the environment in.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping

from .hosts import DiscoveryError, HostSlots

# sinfo's long state names (%T) of nodes that must get no rank: drained or draining, down, failing...
# (A node that does not answer shows as e.g. "allocated*" and stays: the job's own deadline judges it.)
_UNUSABLE = ("drain", "down", "fail", "maint", "reboot", "power")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


class SlurmError(ValueError):
    """A Slurm variable that cannot be read; the message names it and its value."""


def in_allocation(env: Mapping[str, str]) -> bool:
    """True inside a Slurm job (``sbatch``, ``salloc``, or a step of one) that names its nodes."""
    return bool(env.get("SLURM_JOB_ID") and (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")))


def allocation_hosts(env: Mapping[str, str]) -> tuple[HostSlots, ...]:
    """The allocation's nodes with their task slots, in Slurm's order."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    nodes = expand_hostlist(nodelist)
    tasks = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_JOB_CPUS_PER_NODE", "")
    counts = expand_counts(tasks) if tasks else [1] * len(nodes)
    if len(counts) != len(nodes):
        raise SlurmError(f"SLURM_TASKS_PER_NODE={tasks!r} gives {len(counts)} counts for the {len(nodes)} nodes "
                         f"of SLURM_JOB_NODELIST={nodelist!r}")
    return tuple(HostSlots(node, count) for node, count in zip(nodes, counts, strict=True))


def describe(env: Mapping[str, str]) -> str:
    """The allocation in words, for messages: job id, node list and task counts."""
    return (f"Slurm job {env.get('SLURM_JOB_ID')} (SLURM_JOB_NODELIST={env.get('SLURM_JOB_NODELIST', '')!r}, "
            f"SLURM_TASKS_PER_NODE={env.get('SLURM_TASKS_PER_NODE', '')!r})")


def usable_nodes(hosts: tuple[HostSlots, ...], timeout: float = 30.0) -> list[HostSlots]:
    """The allocation's nodes that Slurm has not drained, downed or failed (asks ``sinfo``)."""
    command = ["sinfo", "-h", "-N", "-n", ",".join(host.host for host in hosts), "-o", "%N %T"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DiscoveryError(f"{' '.join(command)} could not run: {exc}") from None
    if done.returncode != 0:
        raise DiscoveryError(f"{' '.join(command)} exited with {done.returncode}: {done.stderr.strip()[-300:]}")
    usable = usable_from_sinfo(hosts, done.stdout)
    if not any(host.host in done.stdout.split() for host in hosts):  # a transient answer: keep the last list
        raise DiscoveryError(f"{' '.join(command)} listed none of the allocation's nodes")
    return usable


def usable_from_sinfo(hosts: tuple[HostSlots, ...], sinfo_output: str) -> list[HostSlots]:
    """``hosts`` whose state in ``sinfo -N -o '%N %T'`` output is usable (a node it omits is not)."""
    states = dict(line.split()[:2] for line in sinfo_output.splitlines() if len(line.split()) >= 2)
    return [host for host in hosts
            if host.host in states and not states[host.host].lower().startswith(_UNUSABLE)]


def expand_hostlist(text: str) -> list[str]:
    """``node[01-03,07],gpu[1-2]-x`` -> node01, node02, node03, node07, gpu1-x, gpu2-x (Slurm's order).

    Brackets may appear several times in one name (``r[1-2]n[1-2]``); zero padding is kept.
    """
    names: list[str] = []
    for item in _split_top_level(text.strip(), "SLURM_JOB_NODELIST"):
        names += _expand_one(item, text)
    if not names:
        raise SlurmError(f"SLURM_JOB_NODELIST={text!r} names no node")
    return names


def expand_counts(text: str) -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.strip().split(","):
        match = _COUNT.fullmatch(item.strip())
        if not match or int(match.group(1)) < 1:
            raise SlurmError(f"SLURM_TASKS_PER_NODE={text!r}: {item!r} is not N or N(xM)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _split_top_level(text: str, name: str) -> list[str]:
    """Split on the commas that are not inside brackets."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise SlurmError(f"{name}={text!r}: unbalanced or nested brackets")
        if char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    if depth:
        raise SlurmError(f"{name}={text!r}: unbalanced brackets")
    return [item for item in [*items, text[start:]] if item]


def _expand_one(item: str, whole: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, ranges, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    tails = _expand_one(rest, whole)
    names = []
    for part in ranges.split(","):
        match = _RANGE.fullmatch(part.strip())
        if not match:
            raise SlurmError(f"SLURM_JOB_NODELIST={whole!r}: {part!r} is not N or N-M")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise SlurmError(f"SLURM_JOB_NODELIST={whole!r}: range {part!r} runs backwards")
        width = len(low)
        names += [f"{prefix}{number:0{width}d}{tail}" for number in range(int(low), int(high) + 1) for tail in tails]
    return names
