"""The gradient of each collective, exactly as Horovod computes it, for any framework's autograd.

- allreduce: an allreduce of the gradient with the same op and scale factors;
- allgather: this rank's rows of the gradient **averaged** over ranks (Horovod's choice; the
  mathematical gradient is their sum, ``size`` times larger);
- broadcast: the averaged gradient on the root rank, times zero elsewhere (the allreduce runs on every rank);
- alltoall: the gradient sent back along the rows each rank sent here;
- reducescatter: every rank's gradient block gathered, times ``size`` for Sum and as is for
  Average, times the scale factors (Horovod's choice again: ``size`` times the mathematical gradient,
  which is the gathered blocks for Sum and the gathered blocks divided by ``size`` for Average).

Horovod's users train with these (for instance models that allgather embeddings); a script moved
to hvdlite keeps its gradients, and so its learning rates, unchanged.

An adapter's autograd hook (a ``torch.autograd.Function``, a ``tf.custom_gradient``) calls these
with a :class:`GradientOps` holding blocking collectives and a few tensor operations on its own
tensors; the rules themselves are written only here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

from .. import basics
from ..ops import ReduceOp
from ..process_sets import ProcessSet, global_process_set


@dataclasses.dataclass(frozen=True)
class GradientOps:
    """What the gradient rules need from a framework, on that framework's tensors."""

    allreduce: Callable[[list[Any], ReduceOp, float, float], list[Any]]  # tensors, op, prescale, postscale
    allgather: Callable[[list[Any]], list[Any]]  # each tensor's rows from every rank, in rank order
    alltoall: Callable[[Any, Any], Any]  # (tensor, rows to send to each rank) -> the rows received
    zeros_like: Callable[[Any], Any]
    scale: Callable[[Any, float], Any]  # tensor times a Python float, in the tensor's dtype
    total: Callable[[Any], Any]  # the sum of a 1-D integer tensor, as a row index
    rows: Callable[[Any, Any, Any], Any]  # (tensor, start, stop) -> tensor[start:stop]
    # This rank's place among the collective's ranks, and how many they are (a process set's, or the job's).
    rank: Callable[[], int] = lambda: basics.rank()  # noqa: E731 - looked up at call time
    size: Callable[[], int] = lambda: basics.size()  # noqa: E731


def on_set(ops: GradientOps, process_set: ProcessSet | None) -> GradientOps:
    """``ops`` with its collectives run on ``process_set``'s ranks (its ``allreduce``, ``allgather``
    and ``alltoall`` take a ``process_set`` keyword), and ``rank``/``size`` the set's."""
    if process_set is None or process_set is global_process_set:
        return ops
    return dataclasses.replace(
        ops, allreduce=functools.partial(ops.allreduce, process_set=process_set),
        allgather=functools.partial(ops.allgather, process_set=process_set),
        alltoall=functools.partial(ops.alltoall, process_set=process_set), rank=process_set.rank,
        size=process_set.size)


def allreduce_grads(ops: GradientOps, grads: Sequence[Any], op: ReduceOp, prescale: float,
                    postscale: float) -> list[Any]:
    """Gradients of an allreduce (or a group of them) of the inputs with these arguments."""
    return ops.allreduce(list(grads), op, prescale, postscale)


def allgather_grad(ops: GradientOps, grad: Any, rows: Any) -> Any:
    """Gradient of an allgather whose input on this rank had ``rows`` rows (a 1-element integer tensor)."""
    (averaged,) = ops.allreduce([grad], ReduceOp.AVERAGE, 1.0, 1.0)
    (every,) = ops.allgather([rows])  # ranks may have gathered different row counts: find where ours start
    start = ops.total(every[: ops.rank()])
    return ops.rows(averaged, start, start + ops.total(rows))


def broadcast_grad(ops: GradientOps, grad: Any, root_rank: int) -> Any:
    """Gradient of a broadcast from ``root_rank``: only the root's input reaches the outputs."""
    (averaged,) = ops.allreduce([grad], ReduceOp.AVERAGE, 1.0, 1.0)
    if basics.rank() == root_rank:  # root_rank: a rank of the job
        return averaged
    # Times zero, as Horovod does, not new zeros: the result must depend on the allreduce on every
    # rank. A graph runs only what a fetched result depends on (TensorFlow's zeros_like of a known
    # shape is a constant), so zeros would let the other ranks skip the allreduce the root waits in.
    return ops.scale(averaged, 0.0)


def alltoall_grad(ops: GradientOps, grad: Any, received: Any) -> Any:
    """Gradient of an alltoall that received ``received[r]`` rows from rank r: the rows go back."""
    return ops.alltoall(grad, received)


def reducescatter_grads(ops: GradientOps, grads: Sequence[Any], op: ReduceOp, prescale: float,
                        postscale: float) -> list[Any]:
    """Gradients of a reducescatter (or a group of them) with these arguments."""
    factor = prescale * postscale * (ops.size() if op is ReduceOp.SUM else 1)
    gathered = ops.allgather(list(grads))
    return gathered if factor == 1.0 else [ops.scale(g, factor) for g in gathered]
