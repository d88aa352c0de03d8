"""``ProcessGroupHvdlite``: a c10d process group whose collectives run on hvdlite's core.

torch calls a process group's collectives with its own calling convention (lists of tensors,
option structs, outputs passed in); each method here turns that into the core's collective on
the group's process set (``hvdlite.torch``'s ``_async`` forms: fusion, the response cache, shared
memory, NCCL for CUDA tensors) and returns an :class:`~.work.HvdliteWork` that writes torch's
outputs when the core delivers. Calls are unnamed: the core names them in call order, as torch
issues them in the same order on every rank, and a rank that called something else (another
shape, another op, a skipped call) gets the core's error naming each rank's value.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ...api import barrier as core_barrier
from ...core.work.naming import CallNames
from ...core.work.request import MappedHandle
from ...ops import ReduceOp
from ...process_sets import ProcessSet
from ..collectives.async_ops import (
    allgather_async,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    reducescatter_async,
)
from .p2p import PointToPoint
from .reductions import core_reduction
from .work import HvdliteWork, core_handles

BACKEND_NAME = "hvdlite"
_SCATTERED_OPS = (ReduceOp.SUM, ReduceOp.AVERAGE)  # what the core's reduce-scatter reduces with


_ROWS_MAY_DIFFER = ("allgather", "alltoall")  # ranks may bring different numbers of rows


def signature(kind: str, tensors: list[torch.Tensor], extra: str = "") -> str:
    """What must be the same on every rank for a call of ``kind`` (dtype[shape] of its tensors, a
    digest for several; ``extra``: the op, root), and so is part of its name."""
    first = 1 if kind in _ROWS_MAY_DIFFER else 0
    if len(tensors) == 1:
        t = tensors[0]
        return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape[first:])}{extra}".replace(" ", "")
    described = ";".join(f"{t.dtype}{list(t.shape[first:])}" for t in tensors)
    return f"{len(tensors)}x{zlib.crc32(described.encode()):08x}{extra}"


def _rows(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as one row (allgather concatenates rows; the flat layout is torch's)."""
    return tensor.reshape(1, -1)


def _copy_rows(outputs: list[torch.Tensor], rows: torch.Tensor) -> None:
    with torch.no_grad():
        for output, row in zip(outputs, rows, strict=True):
            output.copy_(row.view_as(output))


def _copy_flat(output: torch.Tensor, result: torch.Tensor) -> None:
    with torch.no_grad():
        output.view(-1).copy_(result.reshape(-1))


class ProcessGroupHvdlite(dist.ProcessGroup):
    """The ranks of ``process_set`` as a torch process group (``rank``: this rank's place in it)."""

    def __init__(self, process_set: ProcessSet, rank: int, size: int, p2p: PointToPoint | None,
                 names: CallNames) -> None:
        """``names``: the call names of ``process_set``, shared by every group over it (one sequence)."""
        super().__init__(rank, size)
        self.process_set = process_set
        self._p2p = p2p
        self._names = names
        self._group_name = ""

    def _start(self, kind: str, tensors: list[torch.Tensor], start: Callable[[str], Any], extra: str = "") -> Any:
        """``start(name)``'s handle, under the name of this call (see :class:`CallNames`)."""
        name = self._names.take(kind, signature(kind, tensors, extra))
        handle = start(name)
        self._names.used(name, core_handles(handle))
        return handle

    # ---- identity ------------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    def getGroupName(self) -> str:  # noqa: N802 - functional collectives look the group up by it
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def _device_types(self) -> list[torch.device]:
        """The devices whose tensors this group takes (torch's broadcast of a state dict asks): the
        CPU, and CUDA where torch has it."""
        return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])

    def __repr__(self) -> str:
        return f"ProcessGroupHvdlite(rank={self.rank()}, size={self.size()}, process_set={self.process_set!r})"

    # ---- reductions ----------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> HvdliteWork:
        op, scale = core_reduction(opts.reduceOp if hasattr(opts, "reduceOp") else opts, "all_reduce")
        handles = [self._start("allreduce", [t], lambda name, t=t: allreduce_async_(
            t, name=name, op=op, prescale_factor=scale, process_set=self.process_set), f"{op.name}{scale}")
            for t in tensors]
        return HvdliteWork(handles, lambda results: tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> HvdliteWork:
        op, scale = core_reduction(opts.reduceOp, "all_reduce_coalesced")
        handle = self._start("allreduce", tensors, lambda name: grouped_allreduce_async_(
            tensors, name=name, op=op, prescale_factor=scale, process_set=self.process_set), f"{op.name}{scale}")
        return HvdliteWork([handle], lambda results: tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> HvdliteWork:
        """Every rank reduces (the core has no rooted reduce); the root keeps the result."""
        op, scale = core_reduction(opts.reduceOp, "reduce")
        tensor, root = tensors[opts.rootTensor], opts.rootRank
        handle = self._start("allreduce", [tensor], lambda name: allreduce_async(
            tensor, name=name, op=op, prescale_factor=scale, process_set=self.process_set), f"{op.name}{scale}")

        def finish(results: list[Any]) -> list[torch.Tensor]:
            if self.rank() == root:
                _copy_flat(tensor, results[0])
            return tensors
        return HvdliteWork([handle], finish)

    # ---- allgather -----------------------------------------------------------------------------
    def _gather_rows(self, tensor: torch.Tensor) -> Any:
        return self._start("allgather", [tensor], lambda name: allgather_async(
            _rows(tensor), name=name, process_set=self.process_set))

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> HvdliteWork:
        handles = [self._gather_rows(t) for t in input_tensors]

        def finish(results: list[Any]) -> list[list[torch.Tensor]]:
            for outputs, rows in zip(output_tensors, results, strict=True):
                _copy_rows(outputs, rows)
            return output_tensors
        return HvdliteWork(handles, finish)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                            opts: Any = None) -> HvdliteWork:
        handle = self._start("allgather", input_list, lambda name: grouped_allgather_async(
            [_rows(t) for t in input_list], name=name, process_set=self.process_set))

        def finish(results: list[Any]) -> list[list[torch.Tensor]]:
            for outputs, rows in zip(output_lists, results[0], strict=True):
                _copy_rows(outputs, rows)
            return output_lists
        return HvdliteWork([handle], finish)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> HvdliteWork:  # noqa: A002
        handle = self._gather_rows(input)
        return HvdliteWork([handle], lambda results: _copy_flat(output, results[0]) or output)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> HvdliteWork:
        handle = self._start("allgather", inputs, lambda name: grouped_allgather_async(
            [_rows(t) for t in inputs], name=name, process_set=self.process_set))

        def finish(results: list[Any]) -> list[torch.Tensor]:
            for output, result in zip(outputs, results[0], strict=True):
                _copy_flat(output, result)
            return outputs
        return HvdliteWork([handle], finish)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any) -> HvdliteWork:
        """Every rank gathers (the core has no rooted gather); the root keeps the rows."""
        handle = self._gather_rows(input_tensors[0])

        def finish(results: list[Any]) -> list[list[torch.Tensor]]:
            if self.rank() == opts.rootRank:
                _copy_rows(output_tensors[0], results[0])
            return output_tensors
        return HvdliteWork([handle], finish)

    # ---- reduce-scatter ------------------------------------------------------------------------
    def _reduce_scatter_rows(self, rows: torch.Tensor, opts: Any, call: str) -> Any:
        """A handle whose result is this rank's row of ``rows`` (one row per rank) reduced."""
        op, scale = core_reduction(opts.reduceOp, call)
        if op not in _SCATTERED_OPS:  # the core reduce-scatters sums only: reduce everything, keep our row
            handle = self._start("allreduce", [rows], lambda name: allreduce_async(
                rows, name=name, op=op, prescale_factor=scale, process_set=self.process_set), f"{op.name}{scale}")
            return MappedHandle(handle, lambda reduced: reduced[self.rank()])
        return self._start("reducescatter", [rows], lambda name: reducescatter_async(
            rows, name=name, op=op, prescale_factor=scale, process_set=self.process_set), f"{op.name}{scale}")

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any) -> HvdliteWork:
        handles = [self._reduce_scatter_rows(torch.stack([t.reshape(-1) for t in inputs]), opts, "reduce_scatter")
                   for inputs in input_tensors]

        def finish(results: list[Any]) -> list[torch.Tensor]:
            for output, result in zip(output_tensors, results, strict=True):
                _copy_flat(output, result)
            return output_tensors
        return HvdliteWork(handles, finish)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> HvdliteWork:  # noqa: A002
        handle = self._reduce_scatter_rows(input.reshape(self.size(), -1), opts, "reduce_scatter_tensor")
        return HvdliteWork([handle], lambda results: _copy_flat(output, results[0]) or output)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any) -> HvdliteWork:
        op, scale = core_reduction(opts.reduceOp, "reduce_scatter_tensor_coalesced")
        rows = [t.reshape(self.size(), -1) for t in inputs]
        if op not in _SCATTERED_OPS:
            handles = [self._reduce_scatter_rows(r, opts, "reduce_scatter_tensor_coalesced") for r in rows]
        else:
            handles = [self._start("reducescatter", rows, lambda name: grouped_reducescatter_async(
                rows, name=name, op=op, prescale_factor=scale, process_set=self.process_set), f"{op.name}{scale}")]

        def finish(results: list[Any]) -> list[torch.Tensor]:
            for output, result in zip(outputs, results if op not in _SCATTERED_OPS else results[0], strict=True):
                _copy_flat(output, result)
            return outputs
        return HvdliteWork(handles, finish)

    # ---- broadcast, scatter, all-to-all --------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> HvdliteWork:
        handles = [self._start("broadcast", [t], lambda name, t=t: broadcast_async_(
            t, opts.rootRank, name=name, process_set=self.process_set), f"r{opts.rootRank}") for t in tensors]
        return HvdliteWork(handles, lambda results: tensors)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any) -> HvdliteWork:
        """An all-to-all in which only the root sends: one row to each rank."""
        output = output_tensors[0]
        if self.rank() == opts.rootRank:
            rows, splits = torch.stack([t.reshape(-1) for t in input_tensors[0]]), [1] * self.size()
        else:
            rows, splits = output.new_empty((0, output.numel())), [0] * self.size()
        handle = self._start("alltoall", [output], lambda name: alltoall_async(
            rows, splits, name=name, process_set=self.process_set), f"scatter{opts.rootRank}")
        return HvdliteWork([handle], lambda results: _copy_flat(output, results[0][0]) or output_tensors)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],  # noqa: A002
                      input_split_sizes: list[int], opts: Any = None) -> HvdliteWork:
        handle = self._start("alltoall", [input], lambda name: alltoall_async(
            input, list(input_split_sizes) or None, name=name, process_set=self.process_set))

        def finish(results: list[Any]) -> torch.Tensor:
            data, received = results[0]
            if output_split_sizes and list(output_split_sizes) != received.tolist():
                raise ValueError(f"all_to_all_single on rank {self.rank()} of {self!r}: output_split_sizes "
                                 f"{list(output_split_sizes)}, but the ranks sent {received.tolist()} rows")
            _copy_flat(output, data)
            return output
        return HvdliteWork([handle], finish)

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> HvdliteWork:
        flat = torch.cat([t.reshape(-1) for t in input_tensors])
        handle = self._start("alltoall", input_tensors, lambda name: alltoall_async(
            flat, [t.numel() for t in input_tensors], name=name, process_set=self.process_set))

        def finish(results: list[Any]) -> list[torch.Tensor]:
            data, received = results[0]
            for output, piece in zip(output_tensors, torch.split(data, received.tolist()), strict=True):
                _copy_flat(output, piece)
            return output_tensors
        return HvdliteWork([handle], finish)

    # torch 2.13's names for the single-tensor forms (Python calls these; C++ the older ones)
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base

    # ---- barrier and point-to-point ------------------------------------------------------------
    def barrier(self, opts: Any = None) -> HvdliteWork:
        core_barrier(self.process_set)
        return HvdliteWork.completed()

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int) -> dist.Work:
        return self._point_to_point("send").send(tensors, dst_rank, tag)

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int) -> dist.Work:
        return self._point_to_point("recv").recv(tensors, src_rank, tag)

    def _point_to_point(self, call: str) -> PointToPoint:
        if self._p2p is None:
            raise RuntimeError(f"{call} on the group of {self.process_set}: hvd.fully_shard made this group for its "
                               "DTensor parameters, with collectives only; for send/recv call "
                               f"dist.init_process_group('{BACKEND_NAME}') yourself before fully_shard")
        return self._p2p
