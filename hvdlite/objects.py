"""Collectives on arbitrary picklable Python objects (cloudpickle), built on the byte collectives."""

from __future__ import annotations

from typing import Any

import cloudpickle
import numpy as np

from . import api
from .ops import Collective
from .process_sets import ProcessSet
from .runtime import current


def _base_name(name: str | None, collective: Collective, process_set: ProcessSet | None) -> str:
    if name is not None:
        return name + ".object"
    return current().communicators.of(process_set, collective, name).names.next(collective) + ".object"


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank of ``process_set`` (other ranks' ``obj`` is ignored)."""
    base = _base_name(name, Collective.BROADCAST, process_set)
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8) if current().topology.rank == root_rank else None
    length = np.array([0 if payload is None else payload.size], dtype=np.int64)
    length = api.broadcast(length, root_rank, name=base + ".size", process_set=process_set)
    buffer = payload if payload is not None else np.empty(int(length[0]), dtype=np.uint8)
    data = api.broadcast(buffer, root_rank, name=base + ".data", process_set=process_set)
    return cloudpickle.loads(data.tobytes()) if payload is None else obj


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet | None = None) -> list[Any]:
    """Every rank's ``obj`` (of ``process_set``), as a list in rank order."""
    base = _base_name(name, Collective.ALLGATHER, process_set)
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    sizes = api.allgather(np.array([payload.size], dtype=np.int64), name=base + ".size", process_set=process_set)
    data = api.allgather(payload, name=base + ".data", process_set=process_set)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [cloudpickle.loads(data[offsets[r] : offsets[r + 1]].tobytes()) for r in range(sizes.size)]
