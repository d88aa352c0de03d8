"""``hvd.elastic`` for TensorFlow: ``TensorFlowKerasState``, ``TensorFlowState`` and ``run`` (Horovod's API).

``state.commit()`` copies the tracked variables (a Keras model's weights and its optimizer's
variables, or a list of ``tf.Variable``) to host NumPy arrays, ``state.restore()`` assigns them
back, and ``state.sync()`` gives every rank rank 0's values; other keyword arguments are plain
attributes (see :mod:`hvdlite.elastic`). Eager TensorFlow 2 only: TF1 graph sessions are refused.

``run`` is :func:`hvdlite.elastic.run`, and also recognises a collective that failed inside a
``tf.function`` (Keras's ``fit`` runs its steps in one): TensorFlow re-raises it as
``tf.errors.OpError``, which becomes ``HorovodInternalError``, as Horovod's ``run`` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from ..elastic import FrameworkState, ObjectState, State
from ..elastic.retry import translating_run
from ..errors import HorovodInternalError, HostsUpdatedInterrupt
from .collectives.variables import broadcast_variables
from .gradients.averaging import averages_every_step
from .slow_links.diloco import DiLoCo
from .slow_links.diloco_state import DiLoCoHandler

run = translating_run((tf.errors.OpError,))


def _require_eager(what: str, session: Any = None) -> None:
    if session is not None or not tf.executing_eagerly():
        raise NotImplementedError(
            f"{what} works with eager TensorFlow 2 only; TF1 graph sessions are not supported by hvdlite")


class _VariablesState(FrameworkState):
    """Saves, restores and syncs the variables ``_variables()`` returns (the same list each time)."""

    def _variables(self) -> list[Any]:
        raise NotImplementedError

    def _save_values(self) -> None:
        self._saved_values = [np.array(variable.numpy(), copy=True) for variable in self._variables()]

    def _restore_values(self) -> None:
        variables = self._variables()
        if len(variables) != len(self._saved_values):
            raise ValueError(f"{type(self).__name__} committed {len(self._saved_values)} variables but now tracks "
                             f"{len(variables)}: variables were created after the commit (an optimizer built "
                             "late?); commit again after creating them")
        for variable, value in zip(variables, self._saved_values, strict=True):
            variable.assign(value)

    def _sync_values(self) -> None:
        broadcast_variables(self._variables(), root_rank=0)


def _build_optimizer(optimizer: Any, model: Any) -> None:
    """Create a Keras 3 optimizer's variables now, as its first ``apply`` would, so they can be saved."""
    if optimizer is None or getattr(optimizer, "built", True) or not model.trainable_variables:
        return
    import keras

    with keras.name_scope(optimizer.name):
        optimizer.build(model.trainable_variables)


class TensorFlowKerasState(_VariablesState):
    """State of a Keras model (its weights) and optimizer (its variables), plus keyword attributes.

    ``optimizer`` defaults to the model's compiled one; a :class:`~hvdlite.tensorflow.DiLoCo` object
    adds its outer state (global parameters, outer optimizer, step counters) to its inner
    optimizer's. The model must be built; an optimizer that has not been built yet is built now
    (its slots are created, as its first step would), so that its state is committed and synced
    from the start. ``backend`` is accepted for Horovod compatibility (Keras 3 has no sessions).
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        _require_eager(type(self).__name__)
        if not getattr(model, "built", True):
            raise ValueError("the model must be built before its state is tracked: call model.build(input_shape) "
                             "or run it on a batch first")
        self.model = model
        self._diloco = DiLoCoHandler(optimizer) if isinstance(optimizer, DiLoCo) else None
        if self._diloco is not None:  # its inner optimizer's variables are tracked with the model's
            optimizer = optimizer.inner_optimizer
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self.backend = backend
        _build_optimizer(self.optimizer, model)
        super().__init__(**kwargs)

    def _save_values(self) -> None:
        super()._save_values()
        if self._diloco is not None:
            self._diloco.save()

    def _restore_values(self) -> None:
        super()._restore_values()
        if self._diloco is not None:
            self._diloco.restore()

    def _sync_values(self) -> None:
        if not self._replicas_alike():
            super()._sync_values()
        self.reformed, self.commits_since_sync = False, 0
        if self._diloco is not None:
            self._diloco.sync()

    def _replicas_alike(self) -> bool:
        """Whether the model's weights and the optimizer's variables are the same on every rank now, as
        :meth:`hvdlite.torch.elastic.TorchState._replicas_alike` decides: every rank restored the same
        commit after a world change (collective), and the optimizer averages every step over the job
        (no DiLoCo, no local SGD). A sync the training script calls always broadcasts."""
        if self._diloco is not None or self.optimizer is None or not averages_every_step(self.optimizer):
            return False
        return self.restored_alike()

    def _variables(self) -> list[Any]:
        optimizer_variables = list(self.optimizer.variables) if self.optimizer is not None else []
        return list(self.model.weights) + optimizer_variables


class TensorFlowState(_VariablesState):
    """State of a list of ``tf.Variable`` objects, plus keyword attributes (eager TensorFlow 2).

    TensorFlow 2 keeps no global variable collection, so ``variables`` must be given.
    """

    def __init__(self, variables: Iterable[tf.Variable] | None = None, session: Any = None, **kwargs: Any) -> None:
        _require_eager(type(self).__name__, session)
        if variables is None:
            raise ValueError("TensorFlow 2 keeps no global variable collection: pass the variables to track, "
                             "e.g. TensorFlowState(model.variables)")
        self.variables = list(variables)
        self.session = session
        super().__init__(**kwargs)

    def _variables(self) -> list[Any]:
        return self.variables


__all__ = ["State", "ObjectState", "TensorFlowKerasState", "TensorFlowState", "run", "HorovodInternalError",
           "HostsUpdatedInterrupt"]
