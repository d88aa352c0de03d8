"""DiLoCo as elastic state: :class:`DiLoCoHandler` (``hvd.elastic.TorchState(model, diloco)``)."""

from __future__ import annotations

import copy

from torch.distributed.tensor import DTensor

from ...training.diloco import root_outer_state
from ..collectives.state import broadcast_optimizer_state
from .diloco import DiLoCo


class DiLoCoHandler:
    """Commits, restores and syncs a DiLoCo object in ``hvd.elastic.TorchState``: its outer state
    (:meth:`DiLoCo.state_dict`) and its inner optimizer's state.

    A sync gives every rank rank 0's: a joining group receives the global parameters, the outer
    optimizer's state, the step counters and an exchange in flight, as the model handler gives it
    rank 0's parameters. int8's error feedback starts again from zero on every rank (each rank's
    residuals are its own and the world changed). A commit waits for an exchange in flight.
    """

    def __init__(self, diloco: DiLoCo) -> None:
        if any(isinstance(param, DTensor) for param in diloco.params):
            raise ValueError("TorchState: DiLoCo over fully sharded parameters cannot be elastic state yet (each "
                             "rank's global parameters are its own shard); use a replicated model inside each group")
        self.value = diloco
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy((self.value.state_dict(), self.value.inner_optimizer.state_dict()))

    def restore(self) -> None:
        # Copies again: torch's load_state_dict may keep the given tensors, which training then changes in place.
        outer, inner = copy.deepcopy(self._saved)
        self.value.load_state_dict(outer)
        self.value.inner_optimizer.load_state_dict(inner)

    def sync(self) -> None:
        self.value.load_state_dict(root_outer_state(self.value))
        broadcast_optimizer_state(self.value.inner_optimizer, root_rank=0)


__all__ = ["DiLoCoHandler"]
