"""What both Ray executors share: Ray itself (imported on use), their error, and the GPU variable."""

from __future__ import annotations

from typing import Any

from ..errors import HvdliteError

CUDA_DEVICES = "CUDA_VISIBLE_DEVICES"  # Ray sets each actor's; the driver's must not reach the ranks


class RayJobError(HvdliteError):
    """A Ray executor cannot do what was asked: not started, bad arguments, no room in the cluster."""


def ray_module() -> Any:
    """The ``ray`` module, or an ImportError naming the extra that installs it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("hvdlite.ray needs Ray: pip install 'hvdlite[ray]'") from exc
    return ray
