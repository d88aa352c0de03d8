"""The core's collectives as TensorFlow ops, without gradients: each builds one host call.

Every function takes and returns ``tf.Tensor``s, works eagerly and inside ``tf.function``, and
sets the static shape of its results wherever it is known. :mod:`.differentiable` adds gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from ... import api
from ...core.runtime import current
from ...errors import ProcessSetError
from ...ops import Collective, ReduceOp
from ...process_sets import ProcessSet
from ...training.broadcast import broadcast_arrays
from ...utils.rows import scatter_rows
from .errors import as_tensorflow_error
from .tensors import graph_name, in_graph, run_on_host


def _wait(handles: Sequence[api.Handle]) -> list[np.ndarray]:
    return [api.synchronize(h) for h in handles]


def _label(kind: str, name: str | None) -> str:
    return f"{kind} of {name!r}" if name else kind


class _Place(NamedTuple):
    """Where this rank takes part in a collective: the request name, its rank and the size among the
    process set's ranks, and (in a graph) the refusal the op raises when it runs."""

    name: str | None
    rank: int
    size: int
    refusal: ProcessSetError | None = None

    def guard(self, run: Callable[..., list[np.ndarray]]) -> Callable[..., list[np.ndarray]]:
        """``run``, or for a refused collective a function that raises the refusal (in a graph TensorFlow
        raises it as ``InvalidArgumentError``, its message naming the set and the rank)."""
        if self.refusal is None:
            return run
        refusal = self.refusal

        def refuse(*arrays: np.ndarray) -> list[np.ndarray]:
            raise type(refusal)(*refusal.args)

        return refuse


def _place(process_set: ProcessSet | None, collective: Collective, name: str | None) -> _Place:
    """This rank's :class:`_Place` in a collective on ``process_set`` (default: the job).

    If this rank cannot take part (a set it is not in, one not registered), the core's clear error
    is raised now eagerly, also as TensorFlow's ``InvalidArgumentError``; in a graph the op is built
    anyway and raises ``InvalidArgumentError`` with that message each time it runs, as Horovod's op
    does. A graph's names are counted per process set, since only the set's ranks build its
    collectives (a refused op takes no name).
    """
    try:
        target = current().communicators.of(process_set, collective, name)
    except ProcessSetError as error:
        if not in_graph():
            raise as_tensorflow_error(error).with_traceback(error.__traceback__) from None
        size = len(process_set.ranks) if process_set is not None and process_set.ranks else 1
        return _Place(name, 0, size, error)
    return _Place(graph_name(name, target.process_set.process_set_id), target.rank, target.size)


def allreduce(tensors: Sequence[tf.Tensor], name: str | None, op: ReduceOp, prescale: float, postscale: float,
              single: bool = False, process_set: ProcessSet | None = None) -> list[tf.Tensor]:
    """Reduce ``tensors`` as one group (``single``: one tensor named exactly ``name``)."""
    place = _place(process_set, Collective.ALLREDUCE, name)
    base = place.name

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        if single:  # the core's blocking call: a named, cached small one takes the small-op path
            return [api.allreduce(arrays[0], None, base, op, prescale, postscale, process_set=process_set)]
        return _wait(api.grouped_allreduce_async(arrays, None, base, op, prescale, postscale,
                                                 process_set=process_set))

    results = run_on_host(place.guard(run), tensors, [t.dtype for t in tensors], _label("allreduce", base))
    for result, tensor in zip(results, tensors, strict=True):
        result.set_shape(tensor.shape)
    return results


def allgather(tensors: Sequence[tf.Tensor], name: str | None, single: bool = False,
              process_set: ProcessSet | None = None) -> list[tf.Tensor]:
    """Concatenate every rank's tensors along dimension 0 (its length is known only at run time)."""
    place = _place(process_set, Collective.ALLGATHER, name)
    base = place.name

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        if single:
            return _wait([api.allgather_async(arrays[0], base, process_set)])
        return _wait(api.grouped_allgather_async(arrays, base, process_set=process_set))

    results = run_on_host(place.guard(run), tensors, [t.dtype for t in tensors], _label("allgather", base))
    for result, tensor in zip(results, tensors, strict=True):
        if tensor.shape.rank is not None:
            result.set_shape([None] + tensor.shape.as_list()[1:])
    return results


def broadcast(tensors: Sequence[tf.Tensor], root_rank: int, name: str | None, single: bool = False,
              process_set: ProcessSet | None = None) -> list[tf.Tensor]:
    """``root_rank``'s ``tensors`` on every rank, as one group (``single``: one tensor named exactly ``name``)."""
    place = _place(process_set, Collective.BROADCAST, name)
    base = place.name

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        return broadcast_arrays(arrays, root_rank, base, single, process_set)

    results = run_on_host(place.guard(run), tensors, [t.dtype for t in tensors], _label("broadcast", base))
    for result, tensor in zip(results, tensors, strict=True):
        result.set_shape(tensor.shape)
    return results


def alltoall(tensor: tf.Tensor, splits: tf.Tensor | None, name: str | None,
             process_set: ProcessSet | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Send ``splits[r]`` rows to rank r; returns (received rows, rows received from each rank as int32)."""
    place = _place(process_set, Collective.ALLTOALL, name)
    base = place.name

    def run(array: np.ndarray, *split_array: np.ndarray) -> list[np.ndarray]:
        data, received = api.synchronize(api.alltoall_async(array, split_array[0] if split_array else None, base,
                                                            process_set))
        return [data, received.astype(np.int32)]

    if splits is not None and not in_graph():
        with tf.device("/CPU:0"):  # the counts are read on the host, wherever the data lives
            splits = tf.identity(splits)
    inputs = [tensor] if splits is None else [tensor, splits]
    data, received = run_on_host(place.guard(run), inputs, [tensor.dtype, tf.int32], _label("alltoall", base))
    if tensor.shape.rank is not None:
        data.set_shape([None] + tensor.shape.as_list()[1:])
    received.set_shape([place.size])
    return data, received


def reducescatter(tensors: Sequence[tf.Tensor], name: str | None, op: ReduceOp, prescale: float, postscale: float,
                  single: bool = False, process_set: ProcessSet | None = None) -> list[tf.Tensor]:
    """Reduce each tensor and keep this rank's block of rows (the first ``rows % size`` ranks get one more)."""
    place = _place(process_set, Collective.REDUCESCATTER, name)
    base = place.name

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        if single:
            return _wait([api.reducescatter_async(arrays[0], op, base, prescale, postscale,
                                                  process_set=process_set)])
        return _wait(api.grouped_reducescatter_async(arrays, op, base, prescale, postscale,
                                                     process_set=process_set))

    results = run_on_host(place.guard(run), tensors, [t.dtype for t in tensors], _label("reducescatter", base))
    for result, tensor in zip(results, tensors, strict=True):
        if tensor.shape.rank:
            rows = tensor.shape[0]
            mine = None if rows is None else scatter_rows(rows, place.size)[place.rank]
            result.set_shape([mine] + tensor.shape.as_list()[1:])
    return results


def join(process_set: ProcessSet | None = None) -> tf.Tensor:
    """Declare this rank out of data; the result is the rank that joined last (an int32 scalar)."""
    (result,) = run_on_host(lambda: [np.array(api.join(process_set), dtype=np.int32)], [], [tf.int32], "join")
    result.set_shape([])
    return result


def barrier(process_set: ProcessSet | None = None) -> tf.Tensor:
    """Wait for every rank of ``process_set``; returns an int32 zero so that a graph can depend on it."""
    current().communicators.of(process_set, Collective.BARRIER, None)  # fails at once outside the set
    (result,) = run_on_host(lambda: [np.array(api.barrier(process_set) or 0, dtype=np.int32)], [], [tf.int32],
                            "barrier")
    result.set_shape([])
    return result
