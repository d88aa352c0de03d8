"""Horovod's collectives on ``jax.Array``s and whole pytrees, outside ``jax.jit`` and inside it.

Every operation takes one array or a pytree of arrays. A pytree is one request group in the core
(negotiated together, small leaves fused into one buffer), and the result has the same structure.

*Outside jit* (concrete arrays) each leaf is viewed as NumPy, the core runs the collective, and
the results come back as ``jax.Array``s without copies on the CPU.

*Inside jit* (traced arrays) the collective becomes one ``jax.experimental.io_callback(...,
ordered=True)``: XLA calls back into Python at run time, in program order, so every rank issues
its collectives in the same sequence. ``pure_callback`` must not be used for collectives: XLA may
drop it when the result looks unused, or reorder it. Result shapes are fixed at trace time, so in
jit ``allgather`` needs the same first dimension on every rank and ``alltoall`` takes no splits.
A collective has no derivative (``io_callback`` has no JVP): reduce gradients, not the loss.

Unnamed collectives inside jit get a name derived from what they move (kind, structure, shapes,
dtypes, op), the same on every rank and every step, so the core's response cache answers them.
Outside jit unnamed collectives are numbered in call order, as in Horovod.

Every collective takes ``process_set=`` (default: every rank), as Horovod's do: it then runs among
that set's ranks only, and in jit the result shapes fixed at trace time (allgather's rows,
reducescatter's block) are the set's. Names are scoped per set by the core. ``root_rank`` is a rank
of the job. A rank outside the set gets the core's ``ProcessSetError`` at once: outside jit when it
calls, inside jit when the function is traced.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import io_callback

from ... import api
from ...core.communicators import Communicator
from ...core.runtime import before_shutdown, current
from ...errors import HvdliteError, UnsupportedOperationError
from ...ops import Collective, ReduceOp
from ...process_sets import ProcessSet, global_process_set
from ...training.broadcast import broadcast_arrays
from ...utils.buffers import aligned_empty
from ...utils.rows import scatter_rows
from .arrays import canonical_dtype, is_traced, to_jax, to_numpy

Host = Callable[[list[np.ndarray], str | None, list[np.ndarray] | None], list[np.ndarray]]
# The result shapes of a traced collective, from its inputs' and the communicator it runs on (its size, rank).
ResultSpecs = Callable[[list[jax.ShapeDtypeStruct], Communicator], list[jax.ShapeDtypeStruct]]
# Result buffers reused by in-jit allreduces, per (set, name, shapes): XLA copies a callback's results
# into its own buffers before the callback can run again, so one set per call site suffices, and
# reusing it spares the page faults of fresh memory on every step (measured ~14 ms per 42 MB here).
# Kept in the runtime, so shutdown() frees them.
_SCRATCH = "jax.scratch"

# A jitted step returns before XLA has run its callbacks, so a script's last step may still be queued
# when the script ends; atexit's shutdown must wait for it, or the step's collectives are never
# submitted and the peers that did submit them get "rank(s) [r] called shutdown() without submitting it".
before_shutdown(jax.effects_barrier)


class _RaisedToTheCaller(logging.Filter):
    """JAX logs every exception an io_callback raises, with its traceback, before it raises the
    failure to the jitted function's caller (whose ``JaxRuntimeError`` ends with the same message).
    hvdlite's own errors (a mismatch, a dead rank at every elastic survivor) reach the caller that
    way; the log would repeat each on stderr even where the caller catches it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], HvdliteError))


logging.getLogger("jax._src.callback").addFilter(_RaisedToTheCaller())


def _run(kind: str, tree: Any, name: str | None, host: Host, result_specs: ResultSpecs, detail: Any = (),
         reuse_outputs: bool = False, process_set: ProcessSet | None = None) -> Any:
    """Run ``host`` on ``tree``'s leaves, directly or through an ordered io_callback under a trace.

    Under a trace, ``process_set``'s communicator is looked up first: a rank outside the set gets
    the core's error while tracing, and the result shapes come from the set's size and this rank's
    place in it. ``reuse_outputs`` (for collectives whose results have their inputs' shapes) lets
    the in-jit path hand ``host`` persistent output buffers to write the results into.
    """
    leaves, treedef = jax.tree.flatten(tree)
    if not leaves:
        return tree
    if not any(is_traced(leaf) for leaf in leaves):
        results = host([to_numpy(leaf) for leaf in leaves], name, None)
        return jax.tree.unflatten(treedef, [to_jax(r, like) for r, like in zip(results, leaves, strict=True)])
    specs = [jax.ShapeDtypeStruct(np.shape(leaf), canonical_dtype(jax.numpy.result_type(leaf))) for leaf in leaves]
    if name is None:
        name = _traced_name(kind, treedef, specs, detail)
    target = current().communicators.of(process_set, Collective[kind.removeprefix("grouped_").upper()], name)
    out_specs = result_specs(specs, target)
    key = (target.process_set.process_set_id, name, tuple((s.shape, s.dtype.name) for s in specs))

    def callback(*arrays: Any) -> list[np.ndarray]:
        inputs = [np.asarray(a) for a in arrays]
        outputs = None
        if reuse_outputs and all(i.dtype == s.dtype for i, s in zip(inputs, specs, strict=True)):
            scratch = current().adapter_state.setdefault(_SCRATCH, {})
            outputs = scratch.get(key)
            if outputs is None:
                outputs = scratch[key] = [aligned_empty(s.shape, s.dtype) for s in specs]
        results = host(inputs, name, outputs)
        return [_as_spec(r, spec, name) for r, spec in zip(results, out_specs, strict=True)]

    results = io_callback(callback, out_specs, *leaves, ordered=True)
    return jax.tree.unflatten(treedef, list(results))


def run_on_host(tree: Any, name: str, host: Host, process_set: ProcessSet) -> Any:
    """``host`` (NumPy arrays in, arrays of the same shapes and dtypes out) on ``tree``'s leaves, now or,
    under a trace, as an ordered host callback: for exchanges that run several collectives (DiLoCo's)."""
    return _run("grouped_allreduce", tree, name, host, _same, process_set=process_set)


def _traced_name(kind: str, treedef: Any, specs: list[jax.ShapeDtypeStruct], detail: Any) -> str:
    signature = repr((kind, str(treedef), [(s.shape, s.dtype.name) for s in specs], detail))
    return f"jit.{kind}.{hashlib.sha1(signature.encode()).hexdigest()[:12]}"


def _as_spec(result: np.ndarray, spec: jax.ShapeDtypeStruct, name: str) -> np.ndarray:
    """A core result in the dtype XLA expects (Python numbers arrive as 64-bit without x64)."""
    if result.shape != spec.shape:
        raise UnsupportedOperationError(
            f"collective {name!r} inside jax.jit produced shape {result.shape}, but {spec.shape} was fixed at "
            "trace time; run it outside jit")
    return result if result.dtype == spec.dtype else result.astype(spec.dtype)


def _single_or_group(tree: Any) -> bool:
    return jax.tree.structure(tree).num_leaves == 1 and jax.tree.structure(tree).num_nodes == 1


def _same(specs: list[jax.ShapeDtypeStruct], _: Communicator) -> list[jax.ShapeDtypeStruct]:
    return specs


def _with_rows(kind: str, inputs: list[jax.ShapeDtypeStruct],
               rows: Callable[[int], int]) -> list[jax.ShapeDtypeStruct]:
    """``inputs`` with their first dimension ``rows(first dimension)``; scalars are refused."""
    for spec in inputs:
        if not spec.shape:
            raise UnsupportedOperationError(f"{kind} needs arrays with at least one dimension, got a scalar")
    return [jax.ShapeDtypeStruct((rows(s.shape[0]),) + s.shape[1:], s.dtype) for s in inputs]


# ---- allreduce -----------------------------------------------------------------------------------
def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, op: ReduceOp | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> Any:
    """Reduce an array, or every leaf of a pytree as one group, across the ranks of ``process_set``
    (default op: Average).

    ``average=`` is Horovod's deprecated spelling of ``op``.
    """
    single = _single_or_group(tensor)

    def host(arrays: list[np.ndarray], resolved_name: str | None, outputs: list[np.ndarray] | None) -> list[np.ndarray]:
        if single and outputs is None:
            return [api.allreduce(arrays[0], average, resolved_name, op, prescale_factor, postscale_factor,
                                  process_set)]
        if single:
            handle = api.allreduce_async(arrays[0], average, resolved_name, op, prescale_factor, postscale_factor,
                                         output=outputs[0], process_set=process_set)
            return [api.synchronize(handle)]
        return _grouped_allreduce(arrays, average, resolved_name, op, (prescale_factor, postscale_factor), outputs,
                                  process_set)

    detail = (str(op), average, prescale_factor, postscale_factor)
    return _run("allreduce", tensor, name, host, _same, detail, reuse_outputs=True, process_set=process_set)


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> list[Any]:
    """Reduce a list of arrays as one group (across the ranks of ``process_set``); returns a list."""
    tensors = list(tensors)

    def host(arrays: list[np.ndarray], resolved_name: str | None, outputs: list[np.ndarray] | None) -> list[np.ndarray]:
        return _grouped_allreduce(arrays, average, resolved_name, op, (prescale_factor, postscale_factor), outputs,
                                  process_set)

    detail = (str(op), average, prescale_factor, postscale_factor)
    return _run("grouped_allreduce", tensors, name, host, _same, detail, reuse_outputs=True, process_set=process_set)


def _grouped_allreduce(arrays: list[np.ndarray], average: bool | None, name: str | None, op: ReduceOp | None,
                       scales: tuple[float, float], outputs: list[np.ndarray] | None,
                       process_set: ProcessSet | None) -> list[np.ndarray]:
    """The core's grouped allreduce of ``arrays`` with (prescale, postscale) ``scales``, waited for."""
    handles = api.grouped_allreduce_async(arrays, average, name, op, *scales, outputs=outputs, process_set=process_set)
    return [api.synchronize(h) for h in handles]


# ---- allgather -----------------------------------------------------------------------------------
def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> Any:
    """Concatenate every rank's array (each leaf of a pytree) along the first dimension, in rank order
    (of ``process_set``'s ranks).

    Outside jit the first dimension may differ between ranks; inside jit it must be the same.
    """
    return _allgather("allgather", tensor, name, _single_or_group(tensor), process_set)


def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[Any]:
    """Allgather a list of arrays as one group; returns a list."""
    return _allgather("grouped_allgather", list(tensors), name, False, process_set)


def _allgather(kind: str, tree: Any, name: str | None, single: bool, process_set: ProcessSet | None) -> Any:
    def specs(inputs: list[jax.ShapeDtypeStruct], target: Communicator) -> list[jax.ShapeDtypeStruct]:
        return _with_rows(kind, inputs, lambda rows: target.size * rows)

    def host(arrays: list[np.ndarray], resolved_name: str | None, _: list[np.ndarray] | None) -> list[np.ndarray]:
        if single:
            return [api.allgather(arrays[0], resolved_name, process_set)]
        return api.grouped_allgather(arrays, resolved_name, process_set)

    def traced_host(arrays: list[np.ndarray], resolved_name: str | None, _: list[np.ndarray] | None) -> list[np.ndarray]:
        # Gather each rank's row counts with the data, so every rank can name the odd one out.
        rows = np.array([a.shape[0] for a in arrays], dtype=np.int64)
        *gathered, all_rows = api.grouped_allgather([*arrays, rows], resolved_name, process_set)
        _check_even_rows(kind, resolved_name, all_rows.reshape(-1, len(arrays)), process_set or global_process_set)
        return gathered

    leaves = jax.tree.leaves(tree)
    return _run(kind, tree, name, traced_host if any(is_traced(x) for x in leaves) else host, specs,
                process_set=process_set)


def _check_even_rows(kind: str, name: str | None, per_rank: np.ndarray, process_set: ProcessSet) -> None:
    """Refuse an in-jit allgather whose ranks (``process_set``'s, one row of ``per_rank`` each) gave
    different first dimensions, naming each rank of the job's."""
    if not (per_rank == per_rank[0]).all():
        counts = ", ".join(f"rank {r}: {rows.tolist()}" for r, rows in zip(process_set.ranks, per_rank, strict=True))
        raise UnsupportedOperationError(
            f"{kind} {name!r} inside jax.jit needs the same first dimension on every rank "
            f"(result shapes are fixed at trace time); first dimensions per rank: {counts}. "
            "Call it outside jit for uneven sizes")


# ---- broadcast -----------------------------------------------------------------------------------
def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:
    """``root_rank``'s array (or every leaf of its pytree) on every rank of ``process_set``.

    ``root_rank`` is a rank of the job (a member of the set), as in Horovod.
    """
    single = _single_or_group(tensor)

    def host(arrays: list[np.ndarray], resolved_name: str | None, _: list[np.ndarray] | None) -> list[np.ndarray]:
        return broadcast_arrays(arrays, root_rank, resolved_name, single, process_set)

    return _run("broadcast", tensor, name, host, _same, (root_rank,), process_set=process_set)


# ---- alltoall ------------------------------------------------------------------------------------
def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send the i-th block of rows to rank i; receive every rank's block for this rank.

    With a ``process_set``, i counts the set's ranks in order. Without ``splits`` the rows are
    divided equally and the received array is returned. With ``splits`` (rows to send to each
    rank; outside jit only) returns ``(received, received_splits)``.
    """
    if splits is None:
        def host(arrays: list[np.ndarray], resolved_name: str | None, _: list[np.ndarray] | None) -> list[np.ndarray]:
            return [api.alltoall(arrays[0], None, resolved_name, process_set)[0]]

        return _run("alltoall", tensor, name, host, _same, process_set=process_set)
    if is_traced(tensor) or is_traced(splits):
        raise UnsupportedOperationError(
            "alltoall with splits inside jax.jit: the received size is only known at run time; call it outside "
            "jit, or use equal splits (splits=None)")
    out, received = api.alltoall(to_numpy(tensor), np.asarray(splits).tolist(), name, process_set)
    return to_jax(out, tensor), to_jax(received.astype(np.int32), tensor)


# ---- reducescatter -------------------------------------------------------------------------------
def reducescatter(tensor: Any, op: ReduceOp | None = None, name: str | None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: ProcessSet = global_process_set) -> Any:
    """Reduce the array (each leaf of a pytree) across ``process_set``'s ranks and keep this rank's
    block of rows (default op: Average).

    With rows not divisible by the number of ranks, the first ranks get one extra row.
    """
    return _reducescatter("reducescatter", tensor, op, name, (prescale_factor, postscale_factor),
                          _single_or_group(tensor), process_set)


def grouped_reducescatter(tensors: Sequence[Any], op: ReduceOp | None = None, name: str | None = None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          process_set: ProcessSet = global_process_set) -> list[Any]:
    """Reducescatter a list of arrays as one group; returns a list."""
    return _reducescatter("grouped_reducescatter", list(tensors), op, name, (prescale_factor, postscale_factor),
                          False, process_set)


def _reducescatter(kind: str, tree: Any, op: ReduceOp | None, name: str | None, scales: tuple[float, float],
                   single: bool, process_set: ProcessSet | None) -> Any:
    def specs(inputs: list[jax.ShapeDtypeStruct], target: Communicator) -> list[jax.ShapeDtypeStruct]:
        return _with_rows(kind, inputs, lambda rows: scatter_rows(rows, target.size)[target.rank])

    def host(arrays: list[np.ndarray], resolved_name: str | None, _: list[np.ndarray] | None) -> list[np.ndarray]:
        if single:
            return [api.reducescatter(arrays[0], op, resolved_name, *scales, process_set=process_set)]
        return api.grouped_reducescatter(arrays, op, resolved_name, *scales, process_set=process_set)

    return _run(kind, tree, name, host, specs, (str(op), *scales), process_set=process_set)


# ---- barrier and join ----------------------------------------------------------------------------
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank (of ``process_set``) has called ``barrier()`` (a host call: not inside jit)."""
    api.barrier(process_set)


def join(process_set: ProcessSet = global_process_set) -> int:
    """Declare this rank out of data; others' allreduces (on ``process_set``) count it as zeros until
    every rank of the set joins.

    Returns the rank of the job that joined last (a host call: not inside jit).
    """
    return api.join(process_set)
