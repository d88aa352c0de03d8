"""DiLoCo for Keras 3: groups train on their own and exchange pseudo-gradients every H inner steps.

The same method, schedule, merge rule and checkpoint layout as torch's :class:`hvdlite.torch.DiLoCo`
(see :mod:`hvdlite.torch.slow_links.diloco` and :mod:`hvdlite.training.diloco`). The object is a Keras callback,
so ``model.fit`` runs it after every inner step::

    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                                     process_set=my_group), loss="mse")
    diloco = hvd.DiLoCo(model, model.optimizer, keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
                        sync_every=16, process_set=my_place)
    model.fit(x, y, callbacks=[diloco])
    diloco.sync()

In a custom training loop, ``diloco.apply(grads)`` (or ``apply_gradients``) replaces the inner
optimizer's. The outer optimizer, built by the user, steps the model's own variables, one fragment
at a time (Keras optimizers accept a subset of the variables they were built over, so the other
fragments' momentum is left alone; its ``iterations`` counts fragment syncs). The exchange runs on
the host (NumPy, :mod:`hvdlite.training.diloco_exchange`); with a ``delay`` it runs on a helper
thread during the next inner steps, as torch's does.

Checkpoints (:meth:`DiLoCo.state_dict`) are in the layout torch's and JAX's write
(:mod:`hvdlite.torch.slow_links.diloco`): ``{"format": "hvdlite.diloco/1", "sync_every", "fragments", "delay", "inner_steps", "syncs",
"global": {name: array}, "outer_optimizer": [the outer optimizer's variables' values], "in_flight":
None or {"fragment", "sent_at", "average": {name: array}, "anchor": {name: array} or None},
"residuals": {name: flat array}, "residuals_world_size"}`` with NumPy arrays, names being the
variables' positions and names ("0.kernel"). An exchange in flight is waited for and saved with its result; it lands at its
own step after a restore. int8's residuals are restored at the same number of ranks only. The model
and the inner optimizer are saved as usual, beside it.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from ...core.runtime import current
from ...process_sets import ProcessSet, global_process_set
from ...training.diloco import (
    FORMAT,
    DiLoCoSchedule,
    ScheduledExchanges,
    check_agreement,
    check_loadable,
    check_member,
    split_fragments,
)
from ...training.diloco_exchange import InFlight, average_deltas, check_compression, done, in_thread, settle


class DiLoCo(ScheduledExchanges, keras.callbacks.Callback):
    """DiLoCo (and streaming DiLoCo) around a Keras inner and outer optimizer (see the module's doc).

    ``model_or_variables``: a built Keras model (its trainable variables) or a list of variables.
    ``inner_optimizer`` makes every inner step (usually the model's compiled optimizer, a
    ``DistributedOptimizer`` over the group); ``outer_optimizer`` (DiLoCo: SGD, lr 0.7, momentum 0.9,
    Nesterov) steps on the pseudo-gradients averaged over ``process_set``, one fragment every
    ``sync_every / fragments`` inner steps, landing ``delay`` steps after it is sent.
    ``compression``: None, ``"bf16"`` or ``"int8"`` (with error feedback).
    """

    def __init__(self, model_or_variables: keras.Model | list[Any], inner_optimizer: keras.optimizers.Optimizer,
                 outer_optimizer: keras.optimizers.Optimizer, *, sync_every: int,
                 process_set: ProcessSet = global_process_set, fragments: int = 1, delay: int = 0,
                 compression: str | None = None) -> None:
        super().__init__()
        self.schedule = DiLoCoSchedule(sync_every, fragments, delay)
        self.compression = check_compression(compression)
        self.variables = _variables(model_or_variables)
        self._given_model = model_or_variables if isinstance(model_or_variables, keras.Model) else None
        # Position and name ("0.kernel"): Keras' paths ("sequential_3/dense_7/kernel") change with every
        # model built in the process, and a checkpoint must load into a model built again.
        self.names = [f"{index}.{variable.name}" for index, variable in enumerate(self.variables)]
        _check_optimizers(inner_optimizer, outer_optimizer)
        check_member(process_set)
        self.inner_optimizer, self.outer_optimizer, self.process_set = inner_optimizer, outer_optimizer, process_set
        self.fragments = split_fragments([int(np.prod(v.shape)) for v in self.variables], fragments, self.names)
        self._check_ranks_agree()
        if not outer_optimizer.built:
            outer_optimizer.build(self.variables)
        self.global_params = [np.array(variable.numpy()) for variable in self.variables]
        self.residuals: dict[str, np.ndarray] = {}  # int8's error feedback, per variable name
        self.inner_steps = 0
        self.syncs = 0
        self._in_flight: InFlight | None = None

    def regroup(self, process_set: ProcessSet, inner_process_set: ProcessSet | None = None) -> None:
        """Elastic: carry on in a re-formed job. Call it on every rank from a reset callback, with the
        new world's sets registered again (``hvd.add_process_set``; the old world's are gone):
        ``process_set``, the ranks pseudo-gradients are averaged over now, and ``inner_process_set``,
        the group an inner ``DistributedOptimizer`` averages gradients over now (None: leave it). The
        model's compiled training step is traced again at the next ``fit`` (a ``tf.function`` of a
        custom loop must be traced again by its owner). An exchange in flight belonged to the old
        world and is dropped; int8's error feedback starts again from zero. A joining rank builds its
        DiLoCo over the same sets instead."""
        from ..gradients.averaging import average_over

        check_member(process_set)
        if inner_process_set is not None:
            check_member(inner_process_set)
            average_over(self.inner_optimizer, inner_process_set)
            for model in (self._given_model, getattr(self, "_model", None)):  # the one given, the one fitting
                if model is not None:
                    model.train_function = None  # traced with the old set: fit traces it again
        self.process_set, self._in_flight, self.residuals = process_set, None, {}
        self._check_ranks_agree()

    # the inner step
    def apply(self, grads: list[Any], trainable_variables: list[Any] | None = None) -> None:
        """The inner optimizer's ``apply``, then DiLoCo's schedule (a custom training loop's step)."""
        self.inner_optimizer.apply(grads, trainable_variables)
        self.after_inner_step()

    def apply_gradients(self, grads_and_vars: Any) -> None:
        """The inner optimizer's ``apply_gradients``, then DiLoCo's schedule."""
        self.inner_optimizer.apply_gradients(grads_and_vars)
        self.after_inner_step()

    def on_train_begin(self, logs: dict | None = None) -> None:
        every = getattr(self.model, "steps_per_execution", 1)
        if int(every) != 1:
            raise ValueError(f"DiLoCo runs after every inner step: compile the model with steps_per_execution=1, "
                             f"not {int(every)}")

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.after_inner_step()

    def _send(self, fragment: int, background: bool | None = None) -> None:
        """Start averaging the fragment's pseudo-gradients ``global - local`` over the process set."""
        background = bool(self.schedule.delay) if background is None else background
        indices = self.fragments[fragment]
        locals_ = [np.array(self.variables[i].numpy()) for i in indices]
        deltas = [self.global_params[i] - local for i, local in zip(indices, locals_, strict=True)]
        names = [self.names[i] for i in indices]

        def exchange() -> list[np.ndarray]:
            residuals = [self.residuals.get(name, np.zeros(delta.size, np.float32))
                         for name, delta in zip(names, deltas, strict=True)] if self.compression == "int8" else None
            averages, new_residuals = average_deltas(deltas, residuals, self.compression, self.process_set,
                                                     f"diloco.{fragment}")
            self.residuals.update(zip(names, new_residuals or [], strict=False))
            return averages

        pending = in_thread(exchange) if background else done(exchange())
        self._in_flight = InFlight(fragment, self.inner_steps, locals_ if background else None, pending)

    def _land(self) -> None:
        """Apply the exchange in flight: the outer step on the fragment, then the merge rule."""
        flight, self._in_flight = self._in_flight, None
        averages = flight.pending.wait()
        indices = self.fragments[flight.fragment]
        variables = [self.variables[i] for i in indices]
        progress = None
        if flight.anchors is not None:  # local(now) - local(sent), kept across the outer step
            progress = [variable.numpy() - anchor for variable, anchor in zip(variables, flight.anchors, strict=True)]
        for i, variable in zip(indices, variables, strict=True):
            variable.assign(self.global_params[i])
        self.outer_optimizer.apply([keras.ops.convert_to_tensor(a) for a in averages], variables)
        for position, (i, variable) in enumerate(zip(indices, variables, strict=True)):
            self.global_params[i] = np.array(variable.numpy())
            if progress is not None:
                variable.assign(self.global_params[i] + progress[position])
        self.syncs += 1

    def _check_ranks_agree(self) -> None:
        """Refuse, on every rank of the set, a schedule, codec or variables that differ between ranks."""
        schedule = self.schedule
        check_agreement({"the schedule (sync_every, fragments, delay)": (schedule.sync_every, schedule.fragments,
                                                                        schedule.delay),
                         "compression": self.compression,
                         "the variables' names, shapes and dtypes": [
                             (name, tuple(v.shape), str(v.dtype)) for name, v in zip(self.names, self.variables,
                                                                                     strict=True)]},
                        self.process_set)

    # checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The outer state in the layout torch's and JAX's DiLoCo write (``hvdlite.diloco/1``)."""
        return _state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s outer state (at the same or another number of ranks)."""
        _load_state_dict(self, state)


def _variables(model_or_variables: keras.Model | list[Any]) -> list[Any]:
    """The trainable variables of a built model, or the given list; a ValueError if there are none."""
    if isinstance(model_or_variables, keras.Model):
        variables = list(model_or_variables.trainable_variables)
        if not variables:
            raise ValueError("DiLoCo needs a built model: its trainable variables do not exist yet; call "
                             "model.build(input_shape) or the model on a batch first")
        return variables
    variables = list(model_or_variables)
    if not variables:
        raise ValueError("DiLoCo was given no variables")
    return variables


def _check_optimizers(inner: Any, outer: Any) -> None:
    """Refuse optimizers DiLoCo cannot step: not Keras optimizers, an inner one that already does local
    SGD, or an outer one that is a DistributedOptimizer."""
    from ..gradients.averaging import is_distributed

    for role, optimizer in (("inner_optimizer", inner), ("outer_optimizer", outer)):
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"DiLoCo's {role} must be a keras.optimizers.Optimizer, got {type(optimizer).__name__}")
    inner_target = getattr(inner, "inner_optimizer", inner)  # a LossScaleOptimizer's
    if getattr(inner_target, "_hvdlite_local_sgd", None) is not None:
        raise ValueError("DiLoCo's inner_optimizer is a DistributedOptimizer with local_sgd_period set: DiLoCo "
                         "already trains locally between syncs; keep the inner optimizer synchronous (no local SGD)")
    if is_distributed(outer):
        raise ValueError("DiLoCo's outer_optimizer must be a plain Keras optimizer, not a DistributedOptimizer: "
                         "DiLoCo averages the pseudo-gradients itself, over process_set")


def _state_dict(diloco: DiLoCo) -> dict[str, Any]:
    """The checkpoint of ``diloco`` (:meth:`DiLoCo.state_dict`)."""
    schedule, flight, names = diloco.schedule, diloco._in_flight, diloco.names
    in_flight = None
    if flight is not None:
        averages = settle(flight)
        indices = diloco.fragments[flight.fragment]
        in_flight = {"fragment": flight.fragment, "sent_at": flight.sent_at,
                     "average": {names[i]: np.array(a) for i, a in zip(indices, averages, strict=True)},
                     "anchor": None if flight.anchors is None else
                     {names[i]: np.array(a) for i, a in zip(indices, flight.anchors, strict=True)}}
    return {"format": FORMAT, "sync_every": schedule.sync_every, "fragments": schedule.fragments,
            "delay": schedule.delay, "inner_steps": diloco.inner_steps, "syncs": diloco.syncs,
            "global": {name: np.array(value) for name, value in zip(names, diloco.global_params, strict=True)},
            "outer_optimizer": [np.array(v.numpy()) for v in diloco.outer_optimizer.variables],
            "in_flight": in_flight,
            "residuals": {name: np.array(value) for name, value in diloco.residuals.items()},
            "residuals_world_size": current().topology.size}


def _load_state_dict(diloco: DiLoCo, state: dict[str, Any]) -> None:
    """Restore ``diloco`` from :func:`_state_dict`'s checkpoint, checked first."""
    check_loadable(diloco.schedule, diloco.names, state)
    variables = diloco.outer_optimizer.variables
    if len(variables) != len(state["outer_optimizer"]):
        raise ValueError(f"DiLoCo checkpoint's outer optimizer has {len(state['outer_optimizer'])} variables, this "
                         f"one has {len(variables)}: was it saved with another outer optimizer?")
    for variable, value in zip(variables, state["outer_optimizer"], strict=True):
        variable.assign(value)
    diloco.global_params = [np.array(state["global"][name], dtype=mine.dtype).reshape(mine.shape)
                            for name, mine in zip(diloco.names, diloco.global_params, strict=True)]
    diloco.inner_steps, diloco.syncs = int(state["inner_steps"]), int(state["syncs"])
    diloco._in_flight = None
    flight = state["in_flight"]
    if flight is not None:
        names = [diloco.names[i] for i in diloco.fragments[flight["fragment"]]]
        averages = [np.array(flight["average"][name]) for name in names]
        anchors = None if flight["anchor"] is None else [np.array(flight["anchor"][name]) for name in names]
        diloco._in_flight = InFlight(flight["fragment"], flight["sent_at"], anchors, done(averages))
    diloco.residuals = {}  # error feedback starts again from zero at another number of ranks
    if state.get("residuals_world_size") == current().topology.size:
        diloco.residuals = {name: np.array(value) for name, value in state["residuals"].items()}


__all__ = ["DiLoCo"]
