"""Where hvdliterun's torchrun mode starts in a rank (``hvdlite/torch/bootstrap/sitecustomize.py``),
and the ``PYTHONPATH`` that does or does not start it. Pure, and free of torch: the launcher uses it."""

from __future__ import annotations

import os

TORCH_BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch", "bootstrap")


def with_bootstrap(pythonpath: str) -> str:
    """``pythonpath`` (a ``PYTHONPATH`` value, maybe empty) led by the bootstrap directory."""
    return os.pathsep.join([TORCH_BOOTSTRAP_DIR, *without_bootstrap(pythonpath).split(os.pathsep)]).rstrip(os.pathsep)


def without_bootstrap(pythonpath: str) -> str:
    """``pythonpath`` without the bootstrap directory (what a rank's children get): may be empty."""
    return os.pathsep.join(p for p in pythonpath.split(os.pathsep)
                           if p and os.path.abspath(p) != TORCH_BOOTSTRAP_DIR)
