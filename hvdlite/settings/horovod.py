"""Horovod's ``HOROVOD_*`` settings, understood as hvdlite's own (a Horovod user changes only the import line).

Job scripts, container images and cluster templates written for Horovod set ``HOROVOD_*`` variables.
Each one that has an ``HVDLITE_*`` counterpart is translated to it here, in Horovod's units (its
fusion threshold is in bytes and its cycle time in milliseconds, as hvdlite's are). The
``HVDLITE_*`` name wins when both are set; :func:`translate` says so when their values differ. A
``HOROVOD_*`` name hvdlite does not act on is reported, never silently dropped. Pure functions: the
environment comes in as a mapping from :mod:`hvdlite.settings.config`, the one module that reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from ..errors import ConfigError

PREFIX = "HOROVOD_"


def _same(text: str) -> str:
    return text


def _inverted_flag(text: str) -> str:
    """``HOROVOD_STALL_CHECK_DISABLE=1`` is ``HVDLITE_STALL_CHECK=0``."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return "0"
    if lowered in ("0", "false", "no", "off", ""):
        return "1"
    raise ValueError("must be 0/1 (or true/false)")


def _timeline(text: str) -> str:
    """``DYNAMIC`` (Horovod 0.22+): no file at ``init``; ``hvd.start_timeline(path)`` starts one later."""
    return "" if text.strip().upper() == "DYNAMIC" else text


@dataclasses.dataclass(frozen=True)
class Alias:
    """A Horovod variable and the hvdlite variable it stands for (its text translated by ``translate``)."""

    horovod: str
    hvdlite: str
    translate: Callable[[str], str] = _same


ALIASES: tuple[Alias, ...] = tuple(Alias(PREFIX + name, "HVDLITE_" + name) for name in (
    "FUSION_THRESHOLD", "CYCLE_TIME", "CACHE_CAPACITY", "TIMELINE_MARK_CYCLES", "AUTOTUNE", "AUTOTUNE_LOG",
    "HIERARCHICAL_ALLREDUCE", "GPU_OPERATIONS", "DYNAMIC_PROCESS_SETS", "STALL_CHECK_TIME_SECONDS",
    "STALL_SHUTDOWN_TIME_SECONDS", "LOG_LEVEL", "ELASTIC_TIMEOUT", "START_TIMEOUT",
)) + (
    Alias("HOROVOD_TIMELINE", "HVDLITE_TIMELINE", _timeline),
    Alias("HOROVOD_STALL_CHECK_DISABLE", "HVDLITE_STALL_CHECK", _inverted_flag),
    Alias("HOROVOD_ENABLE_ASYNC_COMPLETION", "HVDLITE_ASYNC_COMPLETION"),
)
ALIASES_BY_NAME = {alias.horovod: alias for alias in ALIASES}

# Horovod's build-time choice of a GPU plane per collective; hvdlite chooses one plane for all of them.
GPU_PER_OPERATION = tuple(PREFIX + "GPU_" + op for op in ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL",
                                                          "REDUCESCATTER"))
# Horovod settings whose only supported value is what hvdlite always does: accepted with that value.
ALREADY_SO = {"HOROVOD_CPU_OPERATIONS": "MPI", "HOROVOD_CONTROLLER": "MPI"}
# Horovod's stall shutdown time 0 means "never"; hvdlite always ends a stall (it never hangs).
_NEVER_SHUT_DOWN = ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0")


@dataclasses.dataclass(frozen=True)
class Translation:
    """What the ``HOROVOD_*`` variables of one environment mean to hvdlite."""

    texts: dict[str, tuple[str, str]]  # HVDLITE_* name -> (its text, the HOROVOD_* name it came from)
    notes: tuple[str, ...]  # what a user must hear once: ignored names and values


def translate(env: Mapping[str, str]) -> Translation:
    """The ``HVDLITE_*`` texts that ``env``'s ``HOROVOD_*`` variables stand for, and what to report.

    Where ``env`` sets the ``HVDLITE_*`` name too, that one wins (the caller compares the parsed
    values; :func:`disagreement` words the note when they differ).
    """
    texts: dict[str, tuple[str, str]] = {}
    notes: list[str] = []
    for name in sorted(n for n in env if n.startswith(PREFIX)):
        text = env[name]
        alias = ALIASES_BY_NAME.get(name)
        if (name, text.strip()) == _NEVER_SHUT_DOWN:
            notes.append(f"{name}=0 (never end a stall) is not supported: hvdlite ends a stall after "
                         "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS (default 600)")
        elif alias is not None:
            try:
                texts[alias.hvdlite] = (alias.translate(text), name)
            except ValueError as exc:
                raise ConfigError(f"{name}={text!r} is invalid: {exc}") from None
        elif name in ALREADY_SO:
            if text.strip().upper() != ALREADY_SO[name]:
                notes.append(f"{name}={text!r} is not supported: hvdlite always uses {ALREADY_SO[name]}")
        elif name not in GPU_PER_OPERATION:
            notes.append(f"{name} is a Horovod setting hvdlite does not support; it has no effect "
                         "(README: 'Coming from Horovod' lists the ones it reads)")
    notes += _gpu_per_operation(env, texts)
    return Translation(texts, tuple(notes))


def _gpu_per_operation(env: Mapping[str, str], texts: dict[str, tuple[str, str]]) -> list[str]:
    """``HOROVOD_GPU_ALLREDUCE=NCCL`` and the like: one value for all of them sets the GPU plane (unless
    ``HOROVOD_GPU_OPERATIONS`` does); different values cannot be honoured, and are reported."""
    given = {name: env[name].strip().upper() for name in GPU_PER_OPERATION if name in env}
    if not given:
        return []
    values = set(given.values())
    if len(values) == 1 and values <= {"NCCL", "MPI"}:
        if "HVDLITE_GPU_OPERATIONS" not in texts:
            name = sorted(given)[0]
            texts["HVDLITE_GPU_OPERATIONS"] = (given[name], name)
        return []
    listed = ", ".join(f"{name}={value}" for name, value in sorted(given.items()))
    return [f"{listed}: hvdlite runs every GPU collective on one plane, NCCL or MPI (HVDLITE_GPU_OPERATIONS, "
            "HOROVOD_GPU_OPERATIONS); these per-collective choices have no effect"]


def disagreement(hvdlite_name: str, hvdlite_text: str, horovod_name: str, horovod_text: str) -> str:
    """The note when both names are set to different values."""
    return (f"{hvdlite_name}={hvdlite_text!r} and {horovod_name}={horovod_text!r} are both set and differ; "
            f"{hvdlite_name} wins")
