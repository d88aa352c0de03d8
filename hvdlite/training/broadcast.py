"""Several arrays broadcast from one rank as one group (a model's parameters, an optimizer's state)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import api
from ..core.runtime import current
from ..core.work.naming import group_member_names
from ..ops import Collective
from ..process_sets import ProcessSet


def broadcast_arrays(arrays: Sequence[Any], root_rank: int, name: str | None,
                     single: bool = False, process_set: ProcessSet | None = None) -> list[np.ndarray]:
    """``root_rank``'s ``arrays`` on every rank, as new arrays.

    ``single``: one array, named exactly ``name``. Otherwise the members are named ``<name>.0``,
    ``<name>.1``, ... (one generated name for the group when ``name`` is None), and every member is
    submitted before any is waited for, so that the core negotiates them together. ``root_rank``
    is a rank of the job, a member of ``process_set`` (default: every rank).
    """
    if single:
        return [api.broadcast(arrays[0], root_rank, name, process_set=process_set)]
    base = current().communicators.of(process_set, Collective.BROADCAST, name).names.resolve(name, Collective.BROADCAST)
    handles = [api.broadcast_async(array, root_rank, member, process_set=process_set)
               for array, member in zip(arrays, group_member_names(base, len(arrays)), strict=True)]
    return [api.synchronize(handle) for handle in handles]
