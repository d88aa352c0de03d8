"""hvdlite started on behalf of a library that was told to use the ``"hvdlite"`` backend."""

from __future__ import annotations

from ...core import runtime
from ...lifecycle import init as start_hvdlite
from .rendezvous import publish


def started() -> runtime.Runtime:
    """Start hvdlite if it is not running, as ``hvd.init()`` would (naming ``"hvdlite"`` to Accelerate
    or Lightning is asking for it); hvdlite's runtime. Collective the first time, like ``hvd.init()``."""
    if not runtime.is_initialized():
        start_hvdlite()
        publish(runtime.current())
    return runtime.current()
