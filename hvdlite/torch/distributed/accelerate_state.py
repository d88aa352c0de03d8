"""Hugging Face Accelerate on hvdlite's backend: which backend and distributed type Accelerate picks.

Accelerate's ``PartialState._prepare_backend`` knows backends by name: on a machine without a GPU it
trains data-parallel only with ``cpu=True``, and then on ``"gloo"`` (``"hvdlite"`` asked is refused:
"Your assigned backend hvdlite is not available"). Without ``cpu=True`` it stays non-distributed
even when a process group exists: every rank trains alone, silently. Where hvdlite is in play (the
user names ``"hvdlite"``, hvdliterun's torchrun mode is on, the default group runs on hvdlite, or
``hvd.init()`` started several ranks),
:func:`choose` corrects that choice: a world of several ranks is always distributed, on ``"hvdlite"``
unless the user named another backend (which the torchrun mode runs on hvdlite anyway).

Installed by :func:`hvdlite.torch.distributed.register`, before or after ``accelerate`` is imported.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ...core import runtime
from ...utils.on_import import when_imported
from .process_group import BACKEND_NAME
from .started import started

_MODULE = "accelerate.state"
_DATA_PARALLEL = ("NO", "MULTI_CPU", "MULTI_GPU")  # the distributed types hvdlite's backend can stand for


def choose(chosen: tuple[str | None, Any], asked: str | None, cpu: bool, world: int, cuda: bool,
           kinds: Any) -> tuple[str | None, Any]:
    """Accelerate's ``(backend, distributed type)`` where hvdlite is in play. ``chosen``: what
    Accelerate picked; ``asked``: the backend the user named; ``kinds``: Accelerate's ``DistributedType``."""
    backend, kind = chosen
    if kind.name not in _DATA_PARALLEL or (kind is kinds.NO and world <= 1 and asked != BACKEND_NAME):
        return chosen
    if kind is kinds.NO:  # several ranks (or hvdlite named): never one rank training alone
        kind = kinds.MULTI_GPU if cuda and not cpu else kinds.MULTI_CPU
    return (BACKEND_NAME if asked in (None, BACKEND_NAME) else asked), kind


def _hvdlite_in_play(asked: str | None) -> bool:
    """``"hvdlite"`` named, the torchrun mode on, the default group on hvdlite, or hvdlite running on
    several ranks (``hvd.init()``): Accelerate left alone would train each of them alone."""
    if asked == BACKEND_NAME or getattr(c10d.init_process_group, "_hvdlite_routed", False):
        return True
    if dist.is_initialized() and dist.get_backend() == BACKEND_NAME:
        return True
    return runtime.is_initialized() and runtime.current().topology.size > 1


def _corrected(prepare: Any, kinds: Any) -> Any:
    """Accelerate's ``_prepare_backend`` with :func:`choose` applied where hvdlite is in play."""
    if getattr(prepare, "_hvdlite", False):
        return prepare

    @functools.wraps(prepare)
    def prepare_backend(self: Any, cpu: bool = False, sagemaker_dp: bool = False,
                        backend: str | None = None) -> tuple[str | None, Any]:
        if sagemaker_dp or not _hvdlite_in_play(backend):
            return prepare(self, cpu, sagemaker_dp, backend)
        world = started().topology.size  # before Accelerate reads the environment hvd.init() publishes
        chosen = prepare(self, cpu, sagemaker_dp, backend)
        return choose(chosen, backend, cpu, world, torch.cuda.is_available(), kinds)
    prepare_backend._hvdlite = True  # type: ignore[attr-defined]
    return prepare_backend


def _correct(module: ModuleType) -> None:
    state = module.PartialState
    state._prepare_backend = _corrected(state._prepare_backend, module.DistributedType)


def install() -> None:
    """Correct Accelerate's choice in this process: now if it is imported, else when it is."""
    when_imported(_MODULE, _correct)
