"""Stage timers for the small-op breakdowns (``small_op_breakdown.py`` and its CUDA variant,
``small_op_breakdown_gpu.py``): wrap a stage's entry points so that each adds its own time, less
that of the timed calls inside it, to ``SPENT[stage]``; the rows are exclusive and add up."""

from __future__ import annotations

import time
from collections import defaultdict

from hvdlite import api
from hvdlite.core.engine import Engine
from hvdlite.core.pipeline import communicator, negotiate
from hvdlite.core.pipeline.execute import Executor
from hvdlite.core.planes.host import HostPlane

SPENT: dict[str, int] = defaultdict(int)
_NESTED: list[int] = []  # for each timed call in progress, the time of the timed calls inside it


def wrap(owner: object, attribute: str, stage: str) -> None:
    """Replace ``owner.attribute`` by a version that adds its own time (less that of timed calls
    inside it) to ``SPENT[stage]``: every stage's figure is exclusive, and they add up."""
    original = getattr(owner, attribute)

    def timed(*args, **kwargs):
        start = time.perf_counter_ns()
        _NESTED.append(0)
        try:
            return original(*args, **kwargs)
        finally:
            elapsed = time.perf_counter_ns() - start
            SPENT[stage] += elapsed - _NESTED.pop()
            if _NESTED:
                _NESTED[-1] += elapsed

    setattr(owner, attribute, timed)


def instrument_pipeline(submit: str, prefix: str = "") -> None:
    """Timers on the stages every allreduce passes, host or device (``submit``: the core submit's
    label; ``prefix``: before the others')."""
    wrap(api, "allreduce_async", submit)
    for name in ("agree", "lone_vector", "agree_lone"):
        wrap(negotiate.Negotiator, name, prefix + "negotiate")
    wrap(communicator.fuse, "plan", prefix + "fuse")
    for name in ("start", "run", "finish"):
        wrap(Executor, name, prefix + "execute")
    wrap(HostPlane, "carriable", prefix + "execute")
    wrap(communicator, "complete", prefix + "complete")
    wrap(Engine, "_turn", prefix + "cycle")
