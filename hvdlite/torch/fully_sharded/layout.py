"""How a unit's parameters are cut into per-rank shards and packed into one buffer per collective.

Every parameter is cut along dimension 0, as FSDP2 cuts it: with N ranks and ``d0`` rows, rank r
owns rows ``[r*c, (r+1)*c)`` with ``c = ceil(d0 / N)``; rows past ``d0`` are zero padding, so every
rank's shard has the same shape ``(c, *rest)`` and keeps the parameter's number of dimensions
(code that treats matrices and vectors differently, e.g. weight decay only for ``p.dim() >= 2``,
sees the same thing on a shard). A rank's *local* rows are the ones it owns, without the padding:
what its DTensor parameter holds. A 0-dim parameter (which ``Shard(0)`` cannot cut) is replicated:
every rank's block holds it, so the all-gather reads it from any rank and the averaging
reduce-scatter gives every rank the average of its gradient.

One unit makes one all-gather and one reduce-scatter: each rank's shards are packed one after the
other into a flat vector of ``unit.shard_numel`` elements, the same length on every rank. The
all-gather gives N such vectors (rank order), from which each full parameter is cut back out; the
reduce-scatter input is N vectors laid out the same way, rank r's vector holding the rows that rank
r owns. Every rank computes the same layout from the same module, so nothing is negotiated.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable

import torch


def common_dtype(dtypes: Iterable[torch.dtype]) -> torch.dtype:
    """The dtype that holds values of each of ``dtypes`` (bf16 and fp32: fp32; bf16 and fp16: fp32)."""
    return functools.reduce(torch.promote_types, dtypes)


@dataclasses.dataclass(frozen=True)
class ParamLayout:
    """One parameter's full shape and its place in the unit's per-rank vector."""

    name: str
    shape: torch.Size
    ranks: int
    offset: int  # where this parameter's shard starts in the per-rank vector

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_numel(self) -> int:
        return math.prod(self.shape[1:]) if self.shape else 1

    @property
    def rows_per_rank(self) -> int:
        return -(-self.rows // self.ranks)

    @property
    def shard_shape(self) -> torch.Size:
        return torch.Size((self.rows_per_rank, *self.shape[1:]))

    @property
    def shard_numel(self) -> int:
        return self.rows_per_rank * self.row_numel

    @property
    def replicated(self) -> bool:
        """A 0-dim parameter: held whole by every rank."""
        return not self.shape

    def owned_rows(self, rank: int) -> range:
        """The rows of the full parameter that ``rank``'s shard holds (fewer, or none, near the end)."""
        if self.replicated:
            return range(1)
        start = min(rank * self.rows_per_rank, self.rows)
        return range(start, min(start + self.rows_per_rank, self.rows))

    def local_shape(self, rank: int) -> torch.Size:
        """The shape of ``rank``'s local tensor (its rows, unpadded; a 0-dim parameter's own shape)."""
        return self.shape if self.replicated else torch.Size((len(self.owned_rows(rank)), *self.shape[1:]))

    def shard_of(self, full: torch.Tensor, rank: int) -> torch.Tensor:
        """``rank``'s shard (a new tensor, zero-padded) of the full tensor."""
        rows = self.owned_rows(rank)
        shard = full.new_zeros(self.shard_shape)
        shard[:len(rows)].copy_(full.reshape(self.rows, *self.shape[1:])[rows.start:rows.stop])
        return shard

    def local_of(self, full: torch.Tensor, rank: int) -> torch.Tensor:
        """``rank``'s local rows (a new tensor) of the full tensor."""
        return self.local_view(self.shard_of(full, rank), rank)

    def local_view(self, shard: torch.Tensor, rank: int) -> torch.Tensor:
        """The local rows of a padded shard-shaped tensor (a view)."""
        return shard.view(()) if self.replicated else shard[:len(self.owned_rows(rank))]

    def padded(self, local: torch.Tensor) -> torch.Tensor:
        """A local tensor zero-padded to the shard's shape (a new tensor), as every rank's is alike."""
        shard = local.new_zeros(self.shard_shape)
        shard.view(-1)[:local.numel()].copy_(local.reshape(-1))
        return shard


@dataclasses.dataclass(frozen=True)
class UnitLayout:
    """The layouts of one unit's parameters, in order, and the length of each rank's vector."""

    params: tuple[ParamLayout, ...]
    ranks: int

    @classmethod
    def plan(cls, named_shapes: list[tuple[str, torch.Size]], ranks: int) -> UnitLayout:
        params, offset = [], 0
        for name, shape in named_shapes:
            layout = ParamLayout(name, torch.Size(shape), ranks, offset)
            params.append(layout)
            offset += layout.shard_numel
        return cls(tuple(params), ranks)

    @property
    def shard_numel(self) -> int:
        """Elements in each rank's packed vector (all shards of the unit, padding included)."""
        return sum(p.shard_numel for p in self.params)

    def pack_shards(self, shards: list[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
        """This rank's shards (padded, or only its local rows: the padding is zeros), one after the
        other (cast to ``dtype``; by default to one that holds each shard's dtype exactly: an fp32
        norm beside bf16 weights is not rounded), as the all-gather's input."""
        out = shards[0].new_empty(self.shard_numel, dtype=dtype or common_dtype(shard.dtype for shard in shards))
        for layout, shard in zip(self.params, shards, strict=True):
            out[layout.offset:layout.offset + shard.numel()].copy_(shard.reshape(-1))
            out[layout.offset + shard.numel():layout.offset + layout.shard_numel].zero_()
        return out

    def _blocks(self, vector: torch.Tensor, layout: ParamLayout) -> list[tuple[range, torch.Tensor]]:
        """(rows rank r owns, their place in rank r's block of ``vector``) for every rank r."""
        by_rank = vector.view(self.ranks, self.shard_numel)
        blocks = []
        for rank in range(self.ranks):
            rows = layout.owned_rows(rank)
            piece = by_rank[rank, layout.offset:layout.offset + len(rows) * layout.row_numel]
            blocks.append((rows, piece.view(len(rows), *layout.shape[1:])))
        return blocks

    def copy_full(self, gathered: torch.Tensor, fulls: list[torch.Tensor]) -> None:
        """Write each full parameter from the all-gather's result (N packed vectors, rank order)."""
        for layout, full in zip(self.params, fulls, strict=True):
            by_row = full.view(layout.rows, *layout.shape[1:])
            for rows, piece in self._blocks(gathered, layout):
                by_row[rows.start:rows.stop].copy_(piece)

    def pack_gradients(self, grads: list[torch.Tensor | None], dtype: torch.dtype,
                       device: torch.device) -> torch.Tensor:
        """The reduce-scatter's input: rank r's block holds the rows of each gradient that r owns.
        A parameter without a gradient (unused in this pass) contributes zeros."""
        out = torch.zeros(self.ranks * self.shard_numel, dtype=dtype, device=device)
        for layout, grad in zip(self.params, grads, strict=True):
            if grad is None:
                continue
            by_row = grad.reshape(layout.rows, *layout.shape[1:])
            for rows, piece in self._blocks(out, layout):
                piece.copy_(by_row[rows.start:rows.stop])
        return out

    def split_shards(self, vector: torch.Tensor) -> list[torch.Tensor]:
        """A packed per-rank vector (the reduce-scatter's result) cut into shard-shaped views."""
        return [vector[p.offset:p.offset + p.shard_numel].view(p.shard_shape) for p in self.params]


__all__ = ["ParamLayout", "UnitLayout"]
