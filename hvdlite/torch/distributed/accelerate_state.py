"""Hugging Face Accelerate on hvdlite's backend: which backend and distributed type Accelerate picks.

Accelerate's ``PartialState._prepare_backend`` knows backends by name: on a machine without a GPU it
trains data-parallel only with ``cpu=True``, and then on ``"gloo"`` (``"hvdlite"`` asked is refused:
"Your assigned backend hvdlite is not available"). Without ``cpu=True`` it stays non-distributed
even when a process group exists: every rank trains alone, silently. Where hvdlite is in play (the
user names ``"hvdlite"``, hvdliterun's torchrun mode is on, or the default group runs on hvdlite),
:func:`choose` corrects that choice: a world of several ranks is always distributed, on ``"hvdlite"``
unless the user named another backend (which the torchrun mode runs on hvdlite anyway).

Installed by :func:`hvdlite.torch.distributed.register`, before or after ``accelerate`` is imported.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ...core import runtime
from ...lifecycle import init as start_hvdlite
from .process_group import BACKEND_NAME
from .rendezvous import publish

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
    if asked == BACKEND_NAME or getattr(c10d.init_process_group, "_hvdlite_routed", False):
        return True
    return dist.is_initialized() and dist.get_backend() == BACKEND_NAME


def _started() -> int:
    """Start hvdlite if it is not running (naming ``"hvdlite"`` to Accelerate is asking for it, as
    ``hvd.init()`` would); the world's size."""
    if not runtime.is_initialized():
        start_hvdlite()
        publish(runtime.current())
    return runtime.current().topology.size


def _corrected(prepare: Any, kinds: Any) -> Any:
    """Accelerate's ``_prepare_backend`` with :func:`choose` applied where hvdlite is in play."""
    if getattr(prepare, "_hvdlite", False):
        return prepare

    @functools.wraps(prepare)
    def prepare_backend(self: Any, cpu: bool = False, sagemaker_dp: bool = False,
                        backend: str | None = None) -> tuple[str | None, Any]:
        if sagemaker_dp or not _hvdlite_in_play(backend):
            return prepare(self, cpu, sagemaker_dp, backend)
        world = _started()  # before Accelerate reads the environment hvd.init() publishes
        chosen = prepare(self, cpu, sagemaker_dp, backend)
        return choose(chosen, backend, cpu, world, torch.cuda.is_available(), kinds)
    prepare_backend._hvdlite = True  # type: ignore[attr-defined]
    return prepare_backend


def _correct(module: ModuleType) -> None:
    state = module.PartialState
    state._prepare_backend = _corrected(state._prepare_backend, module.DistributedType)


class _OnImport(importlib.abc.MetaPathFinder):
    """Corrects ``accelerate.state`` as it is imported (hvdlite may be imported first)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _correct(module)
        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Correct Accelerate's choice in this process: now if it is imported, else when it is."""
    if _MODULE in sys.modules:
        _correct(sys.modules[_MODULE])
    elif not any(isinstance(finder, _OnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OnImport())
