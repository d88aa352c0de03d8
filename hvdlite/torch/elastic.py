"""``hvd.elastic`` for PyTorch: ``TorchState``, ``ElasticSampler`` and ``run`` (Horovod's API).

``TorchState(model, optimizer, **attributes)`` commits, restores and syncs models (their
``state_dict``), optimizers, learning-rate schedulers, ``ElasticSampler``s and any picklable
attribute. ``ElasticSampler`` shards a dataset like ``DistributedSampler`` and remembers how many
samples the job has processed this epoch, so a restored or re-synced state resumes the epoch where
its last commit was, with no sample seen twice or skipped. See :mod:`hvdlite.elastic` for how the
job re-forms, grows and shrinks.
"""

from __future__ import annotations

import copy
import importlib
import math
import random
import sys
from typing import Any

import torch

from .. import basics, objects
from ..elastic import ObjectState, State, run
from ..elastic.spares import before_ready
from ..errors import HorovodInternalError, HostsUpdatedInterrupt
from ..process_sets import global_process_set
from ..utils.loaded import is_instance
from .collectives.state import broadcast_optimizer_state, broadcast_parameters

# A warm spare waits for admission inside hvd.init(): what torch imports on first use (every optimizer's
# constructor imports torch._dynamo, 0.8 s here) it imports while it waits, not after it joined.
before_ready(lambda: importlib.import_module("torch._dynamo"))

# DiLoCo and fully_shard import DTensor (half a second): looked up only once a script imported them.
_DILOCO = ("hvdlite.torch.slow_links.diloco", "DiLoCo")


class ElasticSampler(torch.utils.data.Sampler):
    """Shards ``dataset`` across ranks and re-shards what is left of the epoch after a reset.

    Call ``record_batch(batch_idx, batch_size)`` after each batch and ``set_epoch(epoch)`` at the end
    of each epoch (it starts the next one from its first sample), as with Horovod's.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0  # samples of this epoch processed by the whole job
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.processed_num = epoch, 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count a batch of ``batch_size`` samples processed on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, batch_idx: int, indices: Any) -> None:
        self.record_batch(batch_idx, len(indices))

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.epoch, self.processed_num = state_dict["epoch"], state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Re-shard the epoch's unprocessed samples over the current ranks."""
        self.num_replicas, self.rank = basics.size(), basics.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)  # the same order on every rank
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = list(self.remaining_indices)
        indices += indices[: self.total_size - len(indices)]  # pad to a multiple of the ranks, as DistributedSampler
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


class _Handler:
    """Commits, restores and syncs one object that has ``state_dict``/``load_state_dict``."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        self.value.load_state_dict(objects.broadcast_object(self.value.state_dict(), 0))


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


def _averages_every_step(optimizer: torch.optim.Optimizer) -> bool:
    """A DistributedOptimizer that averages every step over the whole job (not local SGD, not a process set)."""
    reducer = getattr(optimizer, "_hvdlite_reducer", None)
    return (reducer is not None and not getattr(reducer, "local_sgd", None)
            and getattr(reducer, "process_set", global_process_set) is global_process_set)


def _is_fully_sharded(value: Any) -> bool:
    if "hvdlite.torch.fully_sharded" not in sys.modules:  # nothing was sharded
        return False
    from .fully_sharded.elastic import is_fully_sharded

    return is_fully_sharded(value)


def _handler_for(value: Any) -> Any:
    if _is_fully_sharded(value) or (isinstance(value, torch.optim.Optimizer) and any(
            getattr(p, "_hvdlite_fully_sharded", False) for g in value.param_groups for p in g["params"])):
        raise ValueError("TorchState: a fully sharded model and its optimizer are elastic state only as "
                         "TorchState(model=..., optimizer=...), given when the state is made: each rank holds "
                         "different shards, so they are committed and re-sharded together, not broadcast")
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if is_instance(value, *_DILOCO):
        from .slow_links.diloco_state import DiLoCoHandler

        return DiLoCoHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        if getattr(value, "_hvdlite_checkpoints", None) is not None:
            raise ValueError("TorchState: an optimizer with shard_optimizer_state=True cannot be elastic state yet "
                             "(re-sharding for a new world size is not built); use an unsharded DistributedOptimizer")
        return _OptimizerHandler(value)
    if isinstance(value, (torch.optim.lr_scheduler.LRScheduler, ElasticSampler)):
        return _Handler(value)
    return None


def _sharded_handlers(model: Any, optimizer: Any) -> dict[str, Any]:
    """The handlers of a fully sharded model and its optimizer (none for a replicated model)."""
    if not _is_fully_sharded(model):
        return {}
    from .fully_sharded.elastic import ShardedModelHandler, ShardedOptimizerHandler

    handlers = {"model": ShardedModelHandler(model, optimizer)}
    if optimizer is not None:
        handlers["optimizer"] = ShardedOptimizerHandler(optimizer)
    return handlers


class TorchState(ObjectState):
    """State of a PyTorch training process: ``model``, ``optimizer`` and any keyword attributes.

    Models, optimizers (a ``DiLoCo`` too: its outer state and its inner optimizer), LR schedulers and
    ElasticSamplers (as any keyword) are saved through their ``state_dict``; other attributes are deep-copied and broadcast as Python objects. A model that
    ``fully_shard`` sharded (given as ``model``, with the ``optimizer`` that steps its shards) is
    committed as shards, each rank's also kept by the next rank, and re-sharded for the new world
    when the job shrinks or grows (:mod:`hvdlite.torch.fully_sharded.elastic`).
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers = _sharded_handlers(model, optimizer)
        handlers.update({name: _handler_for(value) for name, value in kwargs.items() if name not in handlers})
        self._handlers = {name: handler for name, handler in handlers.items() if handler is not None}
        for name, handler in self._handlers.items():
            object.__setattr__(self, name, handler.value)
        plain = {name: value for name, value in kwargs.items() if name not in self._handlers}
        super().__init__(lambda obj: objects.broadcast_object(obj, 0), basics.rank, **plain)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        """Rank 0's state on every rank. Right after the world changed (``hvd.elastic.run`` sets
        ``reformed``), a replicated model and its optimizer are not broadcast when every rank holds
        the same commit made since the last sync: they are equal there (see :meth:`_replicas_alike`).
        A sync called by the training script always broadcasts."""
        skip = self._replicas_alike()
        self.reformed, self.commits_since_sync = False, 0
        for handler in self._handlers.values():
            if handler not in skip:
                handler.sync()
        super().sync()

    def _replicas_alike(self) -> list[Any]:
        """The model and optimizer handlers whose values are the same on every rank now, without a word.

        They are when every rank restored the same commit (:meth:`State.restored_alike`, collective)
        and every optimizer is a ``DistributedOptimizer`` that averages each step (no local SGD) over
        the whole job and all of the models' parameters: replicas that were equal at the sync and
        applied the same averaged updates.
        """
        models = [h for h in self._handlers.values() if type(h) is _ModelHandler]
        optimizers = [h for h in self._handlers.values() if type(h) is _OptimizerHandler]
        averaged = {id(p) for h in optimizers for group in h.value.param_groups for p in group["params"]}
        if not optimizers or not all(_averages_every_step(h.value) for h in optimizers) or not all(
                id(p) in averaged for h in models for p in h.value.parameters()):
            return []
        return [*models, *optimizers] if self.restored_alike() else []

    def on_reset(self) -> None:
        # The job re-formed: a DistributedOptimizer plans its requests afresh, as a joining rank's does.
        for handler in self._handlers.values():
            optimizer = handler.value.inner_optimizer if is_instance(handler.value, *_DILOCO) else handler.value
            reducer = getattr(optimizer, "_hvdlite_reducer", None)
            if reducer is not None:
                reducer.world_changed()
        super().on_reset()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:  # a new model/optimizer object: track it from now on
            handlers[name] = _handler_for(value) or handlers[name]
        super().__setattr__(name, value)


__all__ = ["State", "ObjectState", "TorchState", "ElasticSampler", "run", "HorovodInternalError",
           "HostsUpdatedInterrupt"]
