"""Collectives on arbitrary picklable Python objects (cloudpickle), built on the byte collectives."""

from __future__ import annotations

from typing import Any

import cloudpickle
import numpy as np

from . import api
from .core.runtime import current
from .core.work.naming import object_name
from .ops import Collective
from .process_sets import ProcessSet


def _base_name(name: str | None, collective: Collective, obj: Any) -> str:
    """``name.object``; unnamed, after the object's type as Horovod names them (not from the counter of
    unnamed calls, which a tensor collective that failed on one rank alone would have shifted)."""
    if name is not None:
        return name + ".object"
    return object_name(collective, type(obj).__name__)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank of ``process_set`` (other ranks' ``obj`` is ignored).

    Unnamed, the call is named after ``obj``'s type, as in Horovod: pass an object of the root's type
    on every rank (ranks that pass different types get a ``TensorMismatchError``), or a ``name``.
    """
    base = _base_name(name, Collective.BROADCAST, obj)
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8) if current().topology.rank == root_rank else None
    length = np.array([0 if payload is None else payload.size], dtype=np.int64)
    length = api.broadcast(length, root_rank, name=base + ".size", process_set=process_set)
    buffer = payload if payload is not None else np.empty(int(length[0]), dtype=np.uint8)
    data = api.broadcast(buffer, root_rank, name=base + ".data", process_set=process_set)
    return cloudpickle.loads(data.tobytes()) if payload is None else obj


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet | None = None) -> list[Any]:
    """Every rank's ``obj`` (of ``process_set``), as a list in rank order; unnamed, named after ``obj``'s
    type as in Horovod (so every rank passes the same type, or a ``name``)."""
    base = _base_name(name, Collective.ALLGATHER, obj)
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    sizes = api.allgather(np.array([payload.size], dtype=np.int64), name=base + ".size", process_set=process_set)
    data = api.allgather(payload, name=base + ".data", process_set=process_set)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [cloudpickle.loads(data[offsets[r] : offsets[r + 1]].tobytes()) for r in range(sizes.size)]
