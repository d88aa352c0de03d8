"""Reductions the core has no op for, done as an allgather and a local fold: gloo's bitwise ops
(BAND, BOR, BXOR on integer and bool tensors) and its sparse all_reduce (a sum of COO tensors).

Each rank gathers every rank's data and folds it the same way, in rank order, so every rank gets
the same result; it costs ``size`` times the tensor's traffic, acceptable for what these serve
(masks and flags, embedding gradients), and the core's own reductions stay on their fast paths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

BITWISE: dict[Any, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    dist.ReduceOp.BAND: torch.bitwise_and,
    dist.ReduceOp.BOR: torch.bitwise_or,
    dist.ReduceOp.BXOR: torch.bitwise_xor,
}


def bitwise_fold(op: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """The fold of a bitwise ``op`` (torch's ``ReduceOp`` or its ``RedOpType``), or None."""
    return BITWISE.get(getattr(op, "op", op))


def bitwise_reason(call: str, op: Any, tensor: torch.Tensor) -> str:
    """Why ``tensor`` cannot be reduced with the bitwise ``op``, or '' (as gloo: integers and bool)."""
    if tensor.dtype == torch.bool or not (tensor.is_floating_point() or tensor.is_complex()):
        return ""
    return f"{call}: {getattr(op, 'op', op)} reduces integer and bool tensors, not {tensor.dtype}"


def fold_rows(rows: torch.Tensor, fold: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
              shape: torch.Size) -> torch.Tensor:
    """``rows`` (one flat row per rank) folded in rank order, in ``shape``."""
    result = rows[0].clone()
    for row in rows[1:]:
        result = fold(result, row)
    return result.view(shape)


def sparse_parts(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A COO tensor's (indices as rows: nnz x sparse_dim, values: nnz x dense shape), coalesced so
    each rank sends each index once."""
    coalesced = tensor.coalesce()
    return coalesced.indices().t().contiguous(), coalesced.values().contiguous()


def sparse_sum(indices: torch.Tensor, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Every rank's (indices, values) rows summed into one coalesced COO tensor of ``like``'s size."""
    return torch.sparse_coo_tensor(indices.t(), values, like.shape, dtype=like.dtype).coalesce()


def compact(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` without its broadcast dimensions (stride 0, as ``expand`` makes): a view of each
    distinct element once, which a reduction can write in place (torch refuses to write an expanded
    tensor; gloo reduces its memory, as this does)."""
    if tensor.is_contiguous() or all(stride or size <= 1 for stride, size in zip(tensor.stride(), tensor.shape,
                                                                                  strict=True)):
        return tensor
    return tensor[tuple(slice(0, 1) if stride == 0 and size > 1 else slice(None)
                        for stride, size in zip(tensor.stride(), tensor.shape, strict=True))]
