"""Where each rank's shard of the parameters lies, for :mod:`hvdlite.torch.sharded.reducer`.

The trainable parameters of each param group are cut, in the optimizer's order and per dtype, into
buckets of about ``bucket_bytes``. A bucket is one flat vector (its parameters' elements one after
the other, zero-padded to a multiple of the number of ranks N); rank r owns the r-th of its N equal
slices. Cutting per bucket rather than across the whole model lets a bucket's gradients be
reduce-scattered as soon as backward has produced them. Every rank computes the same layout from
the same parameter list, so no negotiation is needed to agree on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch


@dataclasses.dataclass
class ShardBucket:
    """One bucket: its parameters, their flat length padded to ``size``, and this rank's slice."""

    index: int
    params: list[torch.Tensor]
    rank: int
    size: int
    shard: torch.nn.Parameter = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.numel = sum(p.numel() for p in self.params)
        self.per_rank = -(-self.numel // self.size)  # ceil: every rank's slice has the same length
        self.start = self.rank * self.per_rank
        first = self.params[0]
        self.shard = torch.nn.Parameter(torch.zeros(self.per_rank, dtype=first.dtype, device=first.device))
        self.copy_shard_from_params()

    @property
    def padded(self) -> int:
        """The bucket's flat length, a multiple of the number of ranks."""
        return self.per_rank * self.size

    def pieces(self) -> Iterator[tuple[torch.Tensor, slice, slice]]:
        """(parameter, its flat elements in this rank's slice, where they sit in the slice)."""
        offset, end = 0, self.start + self.per_rank
        for param in self.params:
            low, high = max(offset, self.start), min(offset + param.numel(), end)
            if low < high:
                yield param, slice(low - offset, high - offset), slice(low - self.start, high - self.start)
            offset += param.numel()

    def copy_shard_from_params(self) -> None:
        """Refresh the shard from the parameters (they may have been broadcast or loaded since)."""
        with torch.no_grad():
            for param, own, mine in self.pieces():
                self.shard[mine].copy_(param.reshape(-1)[own])

    def flat_gradients(self) -> torch.Tensor:
        """The bucket's gradients as one padded vector; a parameter without a gradient counts as zeros."""
        flat = torch.zeros(self.padded, dtype=self.shard.dtype, device=self.shard.device)
        offset = 0
        for param in self.params:
            if param.grad is not None:
                if param.grad.is_sparse:
                    raise ValueError(f"shard_optimizer_state: parameter of shape {tuple(param.shape)} has a "
                                     "sparse gradient; sharded optimizer state needs dense gradients")
                flat[offset:offset + param.numel()].copy_(param.grad.reshape(-1))
            offset += param.numel()
        return flat

    def copy_params_from(self, gathered: torch.Tensor) -> None:
        """Write every rank's updated slices (the bucket's padded vector) into the parameters."""
        with torch.no_grad():
            offset = 0
            for param in self.params:
                param.copy_(gathered[offset:offset + param.numel()].view(param.shape))
                offset += param.numel()

    def slice_of(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """This rank's slice of per-parameter tensors shaped like ``params`` (a loaded state entry)."""
        out = torch.zeros(self.per_rank, dtype=tensors[0].dtype)
        by_param = dict(zip(map(id, self.params), tensors, strict=True))
        for param, own, mine in self.pieces():
            out[mine] = by_param[id(param)].reshape(-1)[own]
        return out

    def split(self, gathered: torch.Tensor) -> list[torch.Tensor]:
        """The bucket's padded vector cut back into tensors shaped like its parameters."""
        sizes = [p.numel() for p in self.params]
        pieces = gathered[:self.numel].split(sizes)
        return [piece.reshape(p.shape).clone() for piece, p in zip(pieces, self.params, strict=True)]


def plan_shard_buckets(groups: list[list[torch.Tensor]], bucket_bytes: int, rank: int,
                       size: int) -> list[list[ShardBucket]]:
    """Each param group's trainable parameters cut into buckets (per dtype and device, in order)."""
    planned: list[list[ShardBucket]] = []
    index = 0
    for params in groups:
        buckets: list[ShardBucket] = []
        current: list[torch.Tensor] = []
        for param in params:
            fits = not current or ((param.dtype, param.device) == (current[0].dtype, current[0].device)
                                   and sum(p.numel() * p.element_size() for p in current) < bucket_bytes)
            if not fits:
                buckets.append(ShardBucket(index, current, rank, size))
                index, current = index + 1, []
            current.append(param)
        if current:
            buckets.append(ShardBucket(index, current, rank, size))
            index += 1
        planned.append(buckets)
    return planned


__all__ = ["ShardBucket", "plan_shard_buckets"]
