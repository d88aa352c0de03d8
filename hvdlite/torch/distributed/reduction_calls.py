"""The reducing calls of the hvdlite process group: all_reduce (dense, expanded, sparse, coalesced),
reduce and the reduce-scatters, in torch's calling convention."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ...api import allreduce_async, small_allreduce_host
from ...core.work.naming import CallNames
from ...core.work.request import MappedHandle
from ...ops import ReduceOp
from ..collectives.async_ops import (
    allreduce_async_,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    reducescatter_async,
)
from ..collectives.tensors import plain_host_view
from .checks import count_reason, numel_reason, root_reason
from .gathered import bitwise_fold, compact, sparse_parts, sparse_sum
from .group_calls import GroupCalls, copy_flat, signature
from .reductions import core_reduction, plain_reduction
from .work import CompletedWork, HvdliteWork

_SCATTERED_OPS = (ReduceOp.SUM, ReduceOp.AVERAGE)  # what the core's reduce-scatter reduces with
# The work of every blocking call that ran at once: torch's caller only waits on it (torch's own
# all_reduce also accepts None there, "the backend has synced"); one object, as a call that ran
# costs its caller a fresh Work's construction (about 3 us at np=2) for nothing.
_RAN_AT_ONCE = CompletedWork()
_IN_PLACE_EXTRA = {op: f"{op.name}1.0" for op in ReduceOp}  # as the general path names them: the same calls


def _op_of(opts: Any) -> Any:
    return opts.reduceOp if hasattr(opts, "reduceOp") else opts


class ReductionCalls(GroupCalls):
    """all_reduce, reduce and reduce_scatter (every form torch calls)."""

    _in_place_names: dict[tuple, tuple[str, ...]]  # (dtype, shape, op) -> the call's names (CallNames.names_of)

    def allreduce(self, tensors: list[torch.Tensor] | torch.Tensor, opts: Any = None) -> HvdliteWork | CompletedWork:
        """torch's forms: (tensors, AllreduceOptions), (tensors, op) and (tensor, op), op SUM by
        default (DDP's join hook calls ``allreduce(tensor)``)."""
        if opts.__class__ is dist.AllreduceOptions:
            op = opts.reduceOp
        else:
            op = dist.ReduceOp.SUM if opts is None else _op_of(opts)
            if isinstance(tensors, torch.Tensor):
                tensors = [tensors]
        if len(tensors) == 1 and (array := plain_host_view(tensors[0])) is not None:
            core_op = plain_reduction(op)
            if core_op is not None:
                blocking = opts.__class__ is dist.AllreduceOptions and not opts.asyncOp  # torch waits at once
                return self._allreduce_in_place(tensors, array, core_op, blocking)
        if tensors[0].is_sparse:
            return self._sparse_allreduce(tensors, op)
        targets = [compact(t) for t in tensors]  # an expanded tensor: its distinct elements
        if bitwise_fold(op) is not None:
            handles = [self._reduced(t, op, "all_reduce") for t in targets]

            def finish(results: list[Any]) -> list[torch.Tensor]:
                for target, result in zip(targets, results, strict=True):
                    copy_flat(target, result)
                return tensors
            return HvdliteWork(handles, finish)
        core_op, scale = core_reduction(op, "all_reduce")
        handles = [self._start("allreduce", [t], lambda name, t=t: allreduce_async_(
            t, name=name, op=core_op, prescale_factor=scale, process_set=self.process_set), f"{core_op.name}{scale}")
            for t in targets]
        return HvdliteWork(handles, lambda results: tensors)

    def _allreduce_in_place(self, tensors: list[torch.Tensor], array: np.ndarray, op: ReduceOp,
                            blocking: bool) -> HvdliteWork | CompletedWork:
        """The common call (DDP's buckets, a loss, a flag): one contiguous CPU tensor, an op the
        core has, reduced in the tensor's own memory (``array``, a view of it). The general path's
        steps, without the ones that cannot apply here: it runs on every small call, whose cost is
        this Python.

        A blocking call (torch waits on the work at once: ``async_op=False``) runs now, on this
        thread, through the core's small-op path where it can: the same exchange, and the same
        result, as the engine's cycle, without a request, a handle or a hand-off; its work is one
        completed object that every such call returns (its value None: the tensor holds the result)."""
        key = (array.dtype, array.shape, op)
        names = self._in_place_names.get(key)
        if names is None:
            if len(self._in_place_names) > 1024:
                self._in_place_names.clear()
            names = self._in_place_names[key] = CallNames.names_of(
                "allreduce", signature("allreduce", tensors, _IN_PLACE_EXTRA[op]))  # the general path's names
        name = self._names.take_of(names)
        if blocking and small_allreduce_host(array, None, name, op, 1.0, 1.0, self.process_set):
            return _RAN_AT_ONCE
        handle = allreduce_async(array, None, name, op, output=array, process_set=self.process_set)
        self._names.used(name, (handle,))
        return HvdliteWork((handle,), lambda results: tensors)

    def _sparse_allreduce(self, tensors: list[torch.Tensor], op: Any) -> HvdliteWork:
        """gloo's sparse all_reduce: the sum of every rank's COO tensor, coalesced, in place."""
        self._check("allgather", "" if getattr(op, "op", op) == dist.ReduceOp.SUM else
                    f"all_reduce: sparse tensors are summed only, not reduced with {getattr(op, 'op', op)}",
                    "" if len(tensors) == 1 and tensors[0].is_sparse else "all_reduce: one sparse tensor per call")
        tensor = tensors[0]
        indices, values = sparse_parts(tensor)
        size = f"sparse{list(tensor.shape)}".replace(" ", "")
        handles = [self._concatenated(indices, size), self._concatenated(values, size)]

        def finish(results: list[Any]) -> list[torch.Tensor]:
            with torch.no_grad():
                tensor.copy_(sparse_sum(results[0], results[1], tensor))
            return tensors
        return HvdliteWork(handles, finish)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> HvdliteWork:
        if bitwise_fold(opts.reduceOp) is not None:
            return self.allreduce(tensors, opts)
        op, scale = core_reduction(opts.reduceOp, "all_reduce_coalesced")
        handle = self._start("allreduce", tensors, lambda name: grouped_allreduce_async_(
            tensors, name=name, op=op, prescale_factor=scale, process_set=self.process_set), f"{op.name}{scale}")
        return HvdliteWork([handle], lambda results: tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> HvdliteWork:
        """Every rank reduces (the core has no rooted reduce); the root keeps the result."""
        self._check("allreduce", root_reason("reduce", opts.rootRank, self.size()))
        tensor, root = tensors[opts.rootTensor], opts.rootRank
        handle = self._reduced(tensor, opts.reduceOp, "reduce")

        def finish(results: list[Any]) -> list[torch.Tensor]:
            if self.rank() == root:
                copy_flat(tensor, results[0])
            return tensors
        return HvdliteWork([handle], finish)

    # ---- reduce-scatter ------------------------------------------------------------------------
    def _reduce_scatter_rows(self, rows: torch.Tensor, opts: Any, call: str) -> Any:
        """A handle whose result is this rank's row of ``rows`` (one row per rank) reduced."""
        op = opts.reduceOp
        core_op = None if bitwise_fold(op) is not None else core_reduction(op, call)[0]
        if core_op not in _SCATTERED_OPS:  # the core reduce-scatters sums only: reduce everything, keep our row
            return MappedHandle(self._reduced(rows, op, call), lambda reduced: reduced[self.rank()])
        _, scale = core_reduction(op, call)
        return self._start("reducescatter", [rows], lambda name: reducescatter_async(
            rows, name=name, op=core_op, prescale_factor=scale, process_set=self.process_set),
            f"{core_op.name}{scale}")

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any) -> HvdliteWork:
        self._check("reducescatter", *(count_reason("reduce_scatter", "input_list", inputs, self.size())
                                       for inputs in input_tensors))
        handles = [self._reduce_scatter_list(inputs, opts) for inputs in input_tensors]

        def finish(results: list[Any]) -> list[torch.Tensor]:
            for output, result in zip(output_tensors, results, strict=True):
                copy_flat(output, result)
            return output_tensors
        return HvdliteWork(handles, finish)

    def _reduce_scatter_list(self, inputs: list[torch.Tensor], opts: Any) -> Any:
        """One rank's piece of ``inputs`` (rank r's piece is ``inputs[r]``) reduced over the group;
        pieces of different sizes are reduced together and cut."""
        if len({t.shape for t in inputs}) == 1:
            return self._reduce_scatter_rows(torch.stack([t.reshape(-1) for t in inputs]), opts, "reduce_scatter")
        sizes = [t.numel() for t in inputs]
        flat = torch.cat([t.reshape(-1) for t in inputs])
        start = sum(sizes[:self.rank()])
        return MappedHandle(self._reduced(flat, opts.reduceOp, "reduce_scatter"),
                            lambda reduced: reduced[start:start + sizes[self.rank()]])

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> HvdliteWork:  # noqa: A002
        self._check("reducescatter", numel_reason("reduce_scatter_tensor", "input", input,
                                                  output.numel() * self.size()))
        handle = self._reduce_scatter_rows(input.reshape(self.size(), -1), opts, "reduce_scatter_tensor")
        return HvdliteWork([handle], lambda results: copy_flat(output, results[0]) or output)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any) -> HvdliteWork:
        rows = [t.reshape(self.size(), -1) for t in inputs]
        core_op = None if bitwise_fold(opts.reduceOp) is not None else \
            core_reduction(opts.reduceOp, "reduce_scatter_tensor_coalesced")[0]
        if core_op not in _SCATTERED_OPS:
            handles = [self._reduce_scatter_rows(r, opts, "reduce_scatter_tensor_coalesced") for r in rows]
        else:
            _, scale = core_reduction(opts.reduceOp, "reduce_scatter_tensor_coalesced")
            handles = [self._start("reducescatter", rows, lambda name: grouped_reducescatter_async(
                rows, name=name, op=core_op, prescale_factor=scale, process_set=self.process_set),
                f"{core_op.name}{scale}")]

        def finish(results: list[Any]) -> list[torch.Tensor]:
            for output, result in zip(outputs, results if core_op not in _SCATTERED_OPS else results[0], strict=True):
                copy_flat(output, result)
            return outputs
        return HvdliteWork(handles, finish)

    # torch 2.13's names for the single-tensor forms (Python calls these; C++ the older ones)
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
