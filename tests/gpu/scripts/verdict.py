"""What each training-mode script (torch_modes.py, jax_modes.py) does after a mode: every rank reports."""

from __future__ import annotations

import hvdlite as hvd


def report(framework: str, mode: str, problems: list[str]) -> bool:
    """Print this rank's ``ok``/``FAILED`` line for ``mode``; True if every rank passed. Collective: every
    rank reaches it, also after an error, so one failing mode does not stop the others."""
    verdicts = hvd.allgather_object(problems, name=f"{mode}.verdict")
    if problems:
        print(f"FAILED {framework} {mode}: " + "; ".join(problems), flush=True)
    else:
        print(f"ok {framework} {mode}", flush=True)
    return not any(verdicts)
