"""How the settings' texts are parsed: each parser returns the value, or raises ``ValueError`` saying
what the text must be (:mod:`hvdlite.settings.config` adds the variable's name and text)."""

from __future__ import annotations

import math
import re
from typing import Any

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be a finite number >= 0")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise ValueError("must be > 0")
    return value


def nice(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 19:
        raise ValueError("must be an integer from 0 to 19")
    return value


def flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be 0/1 (or true/false)")


def log_level(text: str) -> str:
    upper = text.strip().upper()
    if upper not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
    return upper


def cooldown_range(text: str) -> tuple[float, float]:
    parts = text.split()
    if len(parts) != 2:
        raise ValueError("expected two numbers, LOW HIGH")
    low, high = (non_negative_float(part) for part in parts)
    if low > high:
        raise ValueError(f"LOW {low} is above HIGH {high}")
    return low, high


def pair(values: Any) -> str:
    return " ".join(str(value) for value in values)


def any_text(text: str) -> str:
    return text


def env_forward(text: str) -> str:
    """``all``, ``none`` or a comma-separated list of ``NAME`` / ``PREFIX*`` (see ``runner/environment.py``)."""
    text = text.strip()
    if text in ("all", "none"):
        return text
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError("give all, none, or a comma-separated list of variable names (NAME or PREFIX*)")
    for item in items:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", item):
            raise ValueError(f"{item!r} is not a variable name or PREFIX*")
    return ",".join(items)


def torch_backend(text: str) -> str:
    """``hvdlite`` (hvdliterun's torchrun mode), or empty (off)."""
    name = text.strip().lower()
    if name not in ("", "hvdlite"):
        raise ValueError("must be hvdlite (the process groups a torchrun script asks for run on hvdlite's backend)")
    return name


def gpu_operations(text: str) -> str:
    upper = text.strip().upper()
    if upper not in ("NCCL", "MPI"):
        raise ValueError("must be NCCL or MPI")
    return upper
