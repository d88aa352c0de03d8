"""hvdliterun's torchrun mode (``hvdliterun --torch-backend hvdlite``): a script written for torchrun
(or one whose library starts torch.distributed from torchrun's variables) runs unchanged on
hvdlite's backend.

What the mode changes in each rank's Python process, before the script's first line (run from
``hvdlite/torch/bootstrap/sitecustomize.py``, which the launcher puts first on the ranks' ``PYTHONPATH``):

1. hvdlite starts (``hvd.init()``: MPI, the engine), as a script's own ``hvd.init()`` would.
2. torchrun's variables are set where unset (:func:`~.rendezvous.torchrun_variables`): ``RANK``,
   ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``,
   ``ROLE_*``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_*``.
3. ``init_process_group`` and ``new_group`` (and so ``new_subgroups``, device meshes) run the
   backends hvdlite stands for (:func:`routed`: ``gloo``, ``nccl``, ``mpi``, a device map of them such
   as ``"cpu:gloo,cuda:nccl"``, or none named) on ``"hvdlite"``; other names are left to torch.
4. Its children (DataLoader workers, helpers) inherit the variables but not the mode: the bootstrap
   leaves ``PYTHONPATH`` and ``HVDLITE_TORCH_BACKEND``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ...core.runtime import current
from ...lifecycle import init as start_hvdlite
from ...settings.config import environ, load_config, set_environ, unset_environ
from ...utils.bootstrap import without_bootstrap
from . import make_default, register
from .process_group import BACKEND_NAME
from .rendezvous import publish

STANDS_FOR = frozenset({"gloo", "nccl", "mpi", "undefined", BACKEND_NAME})  # the backends the mode replaces


def routed(backend: Any) -> Any:
    """The backend torch is asked for, as the mode runs it: ``"hvdlite"`` where hvdlite stands for
    every device's backend named (``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``); ``None`` stays
    None (torch's default, which ``hvd.init()`` made hvdlite); anything else unchanged."""
    if backend is None:
        return None
    names = [part.rpartition(":")[2].strip() for part in str(backend).lower().split(",")]
    return BACKEND_NAME if all(name in STANDS_FOR for name in names) else backend


def _routing(function: Callable[..., Any], position: int) -> Callable[..., Any]:
    """``function`` with its ``backend`` argument (keyword, or positional at ``position``) routed."""
    if getattr(function, "_hvdlite_routed", False):
        return function

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = routed(kwargs["backend"])
        elif len(args) > position:
            args = (*args[:position], routed(args[position]), *args[position + 1:])
        return function(*args, **kwargs)
    call._hvdlite_routed = True  # type: ignore[attr-defined]
    return call


def route_backends() -> None:
    """Make torch's group constructors run the backends hvdlite stands for on hvdlite (see :func:`routed`)."""
    for name, position in (("init_process_group", 0), ("new_group", 2)):
        wrapped = _routing(getattr(c10d, name), position)
        setattr(c10d, name, wrapped)  # torch's own callers (new_subgroups) look it up here
        setattr(dist, name, wrapped)


def _leave_children_alone() -> None:
    """Children inherit the rank's variables, not the mode (they must not start hvdlite again)."""
    kept = without_bootstrap(environ().get("PYTHONPATH", ""))
    if kept:
        set_environ({"PYTHONPATH": kept})
    else:
        unset_environ(["PYTHONPATH"])
    unset_environ(["HVDLITE_TORCH_BACKEND"])


def start() -> None:
    """The mode, in this process (see the module's docstring); nothing unless it is on."""
    if load_config().torch_backend != BACKEND_NAME:
        return
    _leave_children_alone()
    start_hvdlite()  # hvd.init(), in its parts: hvdlite.torch's package is above this folder
    register()
    publish(current(), everything=True)
    make_default()
    route_backends()
