"""The moving calls of the hvdlite process group: all_gather (every form), gather, broadcast,
scatter and all-to-all, in torch's calling convention.

Roots arrive as ranks of the group (torch translates ``src`` / ``dst`` to ``group_src`` /
``group_dst``); the core's broadcast takes a job rank, so the group's member list translates back.
"""

from __future__ import annotations

from typing import Any

import torch

from ..collectives.async_ops import alltoall_async, broadcast_async_, grouped_allgather_async
from .checks import count_reason, numel_reason, root_reason
from .gathered import compact
from .group_calls import GroupCalls, copy_flat, copy_rows, rows_of
from .work import HvdliteWork


class GatherCalls(GroupCalls):
    """all_gather, gather, broadcast, scatter, all_to_all (every form torch calls)."""

    members: list[int]  # the job's ranks of the group, in the group's order

    # ---- allgather -----------------------------------------------------------------------------
    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> HvdliteWork:
        self._check("allgather", *(count_reason("all_gather", "tensor_list", outputs, self.size())
                                   for outputs in output_tensors))
        handles = [self._gather_rows(t) for t in input_tensors]

        def finish(results: list[Any]) -> list[Any]:
            for outputs, rows in zip(output_tensors, results, strict=True):
                copy_rows(outputs, rows)
            return output_tensors[0] if len(output_tensors) == 1 else output_tensors  # gloo's future value
        return HvdliteWork(handles, finish)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                            opts: Any = None) -> HvdliteWork:
        """``output_lists[r]``: rank r's tensors, one per input (torch's layout)."""
        self._check("allgather", count_reason("all_gather_coalesced", "output_tensor_lists", output_lists,
                                              self.size()))
        handle = self._start("allgather", input_list, lambda name: grouped_allgather_async(
            [rows_of(t) for t in input_list], name=name, process_set=self.process_set))

        def finish(results: list[Any]) -> list[list[torch.Tensor]]:
            for index, rows in enumerate(results[0]):  # input ``index``'s row from every rank
                copy_rows([outputs[index] for outputs in output_lists], rows)
            return output_lists
        return HvdliteWork([handle], finish)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> HvdliteWork:  # noqa: A002
        self._check("allgather", numel_reason("all_gather_into_tensor", "output_tensor", output,
                                              input.numel() * self.size()))
        handle = self._gather_rows(input)

        def finish(results: list[Any]) -> list[torch.Tensor]:
            copy_flat(output, results[0])
            return list(output.chunk(self.size()))  # gloo's future value: the output per rank
        return HvdliteWork([handle], finish)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> HvdliteWork:
        self._check("allgather", *(numel_reason("all_gather_into_tensor", "output_tensor", output,
                                                t.numel() * self.size()) for output, t in zip(outputs, inputs, strict=True)))
        handle = self._start("allgather", inputs, lambda name: grouped_allgather_async(
            [rows_of(t) for t in inputs], name=name, process_set=self.process_set))

        def finish(results: list[Any]) -> list[torch.Tensor]:
            for output, result in zip(outputs, results[0], strict=True):
                copy_flat(output, result)
            return outputs
        return HvdliteWork([handle], finish)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any) -> HvdliteWork:
        """Every rank gathers (the core has no rooted gather); the root keeps the rows."""
        root = opts.rootRank
        self._check("allgather", root_reason("gather", root, self.size()),
                    count_reason("gather", "gather_list", output_tensors[0], self.size()) if self.rank() == root else "")
        handle = self._gather_rows(input_tensors[0])

        def finish(results: list[Any]) -> list[list[torch.Tensor]]:
            if self.rank() == root:
                copy_rows(output_tensors[0], results[0])
            return output_tensors
        return HvdliteWork([handle], finish)

    # ---- broadcast, scatter, all-to-all --------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> HvdliteWork:
        root = opts.rootRank  # a rank of the group; the core takes the job's rank
        self._check("broadcast", root_reason("broadcast", root, self.size()))
        targets = [compact(t) for t in tensors]
        handles = [self._start("broadcast", [t], lambda name, t=t: broadcast_async_(
            t, self.members[root], name=name, process_set=self.process_set), f"r{root}") for t in targets]
        return HvdliteWork(handles, lambda results: tensors)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any) -> HvdliteWork:
        """An all-to-all in which only the root sends: one row to each rank."""
        output, root = output_tensors[0], opts.rootRank
        self._check("alltoall", root_reason("scatter", root, self.size()), *self._scatter_list_reasons(
            output, input_tensors[0] if self.rank() == root else None))
        if self.rank() == root:
            rows, splits = torch.stack([t.reshape(-1) for t in input_tensors[0]]), [1] * self.size()
        else:
            rows, splits = output.new_empty((0, output.numel())), [0] * self.size()
        handle = self._start("alltoall", [output], lambda name: alltoall_async(
            rows, splits, name=name, process_set=self.process_set), f"scatter{root}")
        return HvdliteWork([handle], lambda results: copy_flat(output, results[0][0]) or output_tensors)

    def _scatter_list_reasons(self, output: torch.Tensor, pieces: list[torch.Tensor] | None) -> list[str]:
        """Why the root's ``scatter_list`` cannot be scattered into ``output``-sized pieces, or ''."""
        if pieces is None:
            return []
        return [count_reason("scatter", "scatter_list", pieces, self.size())] + [
            numel_reason("scatter", f"scatter_list[{index}]", piece, output.numel())
            for index, piece in enumerate(pieces)]

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],  # noqa: A002
                      input_split_sizes: list[int], opts: Any = None) -> HvdliteWork:
        self._check("alltoall", count_reason("all_to_all_single", "input_split_sizes", input_split_sizes, self.size())
                    if input_split_sizes else "")
        handle = self._start("alltoall", [input], lambda name: alltoall_async(
            input, list(input_split_sizes) or None, name=name, process_set=self.process_set))

        def finish(results: list[Any]) -> torch.Tensor:
            data, received = results[0]
            if output_split_sizes and list(output_split_sizes) != received.tolist():
                raise ValueError(f"all_to_all_single on rank {self.rank()} of {self!r}: output_split_sizes "
                                 f"{list(output_split_sizes)}, but the ranks sent {received.tolist()} rows")
            copy_flat(output, data)
            return output
        return HvdliteWork([handle], finish)

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> HvdliteWork:
        self._check("alltoall", count_reason("all_to_all", "input_tensor_list", input_tensors, self.size()),
                    count_reason("all_to_all", "output_tensor_list", output_tensors, self.size()))
        flat = torch.cat([t.reshape(-1) for t in input_tensors])
        handle = self._start("alltoall", input_tensors, lambda name: alltoall_async(
            flat, [t.numel() for t in input_tensors], name=name, process_set=self.process_set))

        def finish(results: list[Any]) -> list[torch.Tensor]:
            data, received = results[0]
            for output, piece in zip(output_tensors, torch.split(data, received.tolist()), strict=True):
                copy_flat(output, piece)
            return output_tensors
        return HvdliteWork([handle], finish)

    # torch 2.13's names for the single-tensor forms (Python calls these; C++ the older ones)
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    all_to_all_single = alltoall_base
