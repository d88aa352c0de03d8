"""Horovod's ``horovod.tensorflow.functions`` object helpers, with its argument order.

Horovod's TensorFlow versions take a TF1 ``session`` (to run the graph ops they build) before
``name``; hvdlite's objects travel through the core on the host, so a session is accepted and not
needed. The argument order is kept so that positional calls mean the same thing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import objects
from ..process_sets import ProcessSet, global_process_set


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """``root_rank``'s ``obj`` (any picklable object) on every rank of ``process_set``."""
    return objects.broadcast_object(obj, root_rank, name, process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[Any], Any]:
    """A function that broadcasts its argument from ``root_rank`` (Horovod's TF1 helper)."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every rank's ``obj`` (of ``process_set``), as a list in rank order."""
    return objects.allgather_object(obj, name, process_set)
